"""The decoder itself: its weights, its KV cache and the math of one layer.

Both decode paths run the model through ``Decoder.forward``: the packed path
(``perfsuite.engine.model_runner``) over the tokens of any mix of chunks, the
static path (``perfsuite.engine.static_decode``) over one row per cache slot.
They differ only in how a layer stores its keys and values and attends, which
each passes in as ``Attend``; the norms, rotary embedding, projections and MLP
are written once, here.

The weights are read from a Hugging Face ``LlamaForCausalLM`` and follow its
numerics (RMSNorm in float32, rotary tables in float32), so greedy outputs
match the unbatched reference that runs the Hugging Face model itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from perfsuite.engine.projection import SHARED_CHOICES, KernelChooser, Projection, batch_invariant_projection

if TYPE_CHECKING:
    from perfsuite.engine.layer_ops import LayerOps
    from perfsuite.engine.types import ScheduledChunk

SUPPORTED_MODEL_TYPES = ("llama",)

# (layer_index, q [T, heads, head_dim], k and v [T, kv_heads, head_dim]) -> attended [T, heads, head_dim].
# Stores the layer's new keys and values in the cache, then attends over it.
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class KVCache:
    """Keys and values of every slot. An engine owns one; the runner fills it."""

    keys: torch.Tensor  # [layers, slots, kv_heads, max_seq_len, head_dim]
    values: torch.Tensor

    @property
    def num_slots(self) -> int:
        return self.keys.shape[1]

    @property
    def max_seq_len(self) -> int:
        return self.keys.shape[3]


@dataclass(frozen=True, slots=True)
class PagedKVCache:
    """Keys and values in fixed-size blocks, one pool per layer; requests find theirs through block tables."""

    keys: torch.Tensor  # [layers, num_blocks, block_size, kv_heads, head_dim]
    values: torch.Tensor
    # The engine's bucketed static-shape decode step over these tensors (perfsuite.engine.paged_decode), set by
    # ModelRunner.with_paged_decode under decode_mode static or cuda-graph; it lives and dies with the pool.
    decode_step: Callable[[Sequence[ScheduledChunk]], list[int]] | None = None
    # Each layer's (keys, values, key cells, value cells) views, made once: taken at every layer of every step
    # they were four selects and two flattens, 180 dispatches a step of SmolLM2's 30 layers.
    _layer_views: tuple[tuple[torch.Tensor, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        views = tuple((k, v, k.flatten(0, 1), v.flatten(0, 1)) for k, v in zip(self.keys, self.values, strict=True))
        object.__setattr__(self, "_layer_views", views)

    @property
    def num_blocks(self) -> int:
        return self.keys.shape[1]

    @property
    def block_size(self) -> int:
        return self.keys.shape[2]

    def keys_of_rows(
        self, layer_index: int, block_tables: torch.Tensor, num_keys: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's first ``num_keys`` keys and values, [rows, kv_heads, num_keys, head_dim], through its blocks.

        ``block_tables`` [rows, max_blocks] may be padded with any block: positions past a row's own are for the
        mask to hide. Whole blocks are gathered (``index_select``), not cell by cell: block_size times fewer
        indices, and each copy a block's contiguous run; on CPU that halved the gather (bench/step_profile.py).
        """
        num_blocks = min(block_tables.shape[1], -(-num_keys // self.block_size))  # the blocks those keys fill
        rows, blocks = block_tables.shape[0], block_tables[:, :num_blocks].flatten()
        cells = (rows, num_blocks * self.block_size, *self.keys.shape[3:])
        keys, values, _, _ = self._layer_views[layer_index]
        return (
            keys.index_select(0, blocks).view(cells)[:, :num_keys].transpose(1, 2),
            values.index_select(0, blocks).view(cells)[:, :num_keys].transpose(1, 2),
        )

    def layer_pools(self, layer_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's keys and values [num_blocks, block_size, kv_heads, head_dim], contiguous views."""
        keys, values, _, _ = self._layer_views[layer_index]
        return keys, values

    def token_rows(self, layer_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's keys and values with one row per token cell, [num_blocks * block_size, kv_heads, head_dim].

        Cell ``block * block_size + offset`` is the index vLLM calls a slot; a view, no copy.
        """
        _, _, key_cells, value_cells = self._layer_views[layer_index]
        return key_cells, value_cells


PROJECTIONS = ("qkv", "out", "gate_up", "down")  # LayerWeights' projections, each one shape across the layers


@dataclass(frozen=True, slots=True)
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: Projection  # [(heads + 2 * kv_heads) * head_dim, hidden], with the biases if the model has them
    out: Projection  # [hidden, heads * head_dim]
    post_norm: torch.Tensor  # [hidden]
    gate_up: Projection  # [2 * intermediate, hidden]
    down: Projection  # [hidden, intermediate]


@dataclass(frozen=True, slots=True)
class HeadLayout:
    """How the fused query-key-value projection splits into attention heads (grouped-query attention)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int

    def split_qk_and_v(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys together [T, heads + kv_heads, head_dim] (rotated as one) and v [T, kv_heads, head_dim]."""
        num_tokens = qkv.shape[0]
        num_q_and_k = (self.num_heads + self.num_kv_heads) * self.head_dim
        q_and_k, v = qkv.split((num_q_and_k, self.num_kv_heads * self.head_dim), dim=-1)
        return (
            q_and_k.view(num_tokens, self.num_heads + self.num_kv_heads, self.head_dim),
            v.view(num_tokens, self.num_kv_heads, self.head_dim),
        )


def grouped_query_attention(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Masked attention of queries [rows, q_len, heads, head_dim] over keys and values [rows, kv_heads, keys, head_dim].

    ``mask`` [rows, 1, q_len, keys] is True where a query may attend (or
    that mask as ``tile_mask`` gives it, made once for all layers); the
    result is [rows, q_len, heads, head_dim].

    Why not ``scaled_dot_product_attention(..., attn_mask=mask, enable_gqa=True)``:
    on CUDA that pair falls back to the math kernel, which also materialises
    K/V repeated per query head. Repeating K/V ourselves (repeat_interleave)
    would keep a fused kernel but copy the whole cache read each layer, and
    ``is_causal`` cannot express rows that start at different positions.
    Instead the query heads that share a KV head (HF's ``repeat_kv`` order:
    KV head j serves query heads j * group ... j * group + group - 1) are
    folded into the query length: [rows, kv_heads, group * q_len, head_dim]
    against that KV head's own keys, with the mask tiled over the group. K/V
    are never copied, only the small queries (for a decode, q_len 1, not even
    those: the fold is a view), and SDPA with a mask and equal head counts
    keeps the fused memory-efficient kernel on CUDA (flash attention takes no
    mask). On CPU it is measured by bench/step_formulation.py.
    """
    rows, q_len, num_heads, head_dim = queries.shape
    num_kv_heads = keys.shape[1]
    group = num_heads // num_kv_heads
    folded = (
        queries.view(rows, q_len, num_kv_heads, group, head_dim)
        .permute(0, 2, 3, 1, 4)
        .reshape(rows, num_kv_heads, group * q_len, head_dim)
    )
    if mask.shape[2] != group * q_len:
        mask = tile_mask(mask, group)
    out = F.scaled_dot_product_attention(folded, keys, values, attn_mask=mask)  # [rows, kv_heads, group * q_len, d]
    return (
        out.view(rows, num_kv_heads, group, q_len, head_dim)
        .permute(0, 3, 1, 2, 4)
        .reshape(rows, q_len, num_heads, head_dim)
    )


def tile_mask(mask: torch.Tensor, group: int) -> torch.Tensor:
    """``mask`` [rows, 1, q_len, keys] for ``grouped_query_attention``'s folded queries, [rows, 1, group * q_len, keys].

    A decode's single query row broadcasts over the group as it is.
    """
    return mask.repeat(1, 1, group, 1) if group > 1 and mask.shape[2] > 1 else mask


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Hugging Face's LlamaRMSNorm normalises in float32 whatever the model
    # dtype (float64 included); doing the same keeps greedy choices equal.
    # The conversions are skipped where they would be no-ops: each is a dispatch, 60 a decode step.
    as_float = hidden if hidden.dtype == torch.float32 else hidden.to(torch.float32)
    normed = as_float * torch.rsqrt(as_float.pow(2).mean(-1, keepdim=True) + eps)
    return weight * (normed if hidden.dtype == torch.float32 else normed.to(hidden.dtype))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of x [T, heads, head_dim] with cos and ``signed_sin`` [T, 1, head_dim].

    Hugging Face's ``x * cos + rotate_half(x) * sin``, where rotate_half is
    ``cat(-x2, x1)``: here ``roll(x) = cat(x2, x1)`` times a sine whose first
    half is negated (``Decoder.signed_sin_table``). Negation is exact, so the
    result is the same bits in four operations instead of seven.
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def decoder_layer(
    layer: LayerWeights,
    layer_index: int,
    hidden: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    heads: HeadLayout,
    eps: float,
    attend: Attend,
) -> torch.Tensor:
    """One pre-norm Llama layer over hidden [T, hidden_size]: attention, then the gated MLP, each residual."""
    normed = rms_norm(hidden, layer.input_norm, eps)
    q_and_k, v = heads.split_qk_and_v(layer.qkv(normed))
    q, k = apply_rotary(q_and_k, cos, sin).split((heads.num_heads, heads.num_kv_heads), dim=1)
    attended = attend(layer_index, q, k, v)
    hidden = hidden + layer.out(attended.reshape(hidden.shape[0], -1))
    normed = rms_norm(hidden, layer.post_norm, eps)
    gate, up = layer.gate_up(normed).chunk(2, dim=-1)
    return hidden + layer.down(F.silu(gate) * up)


@dataclass(frozen=True, slots=True)
class Decoder:
    """A Llama-architecture decoder's weights on one device, and its forward pass."""

    embed: torch.Tensor  # [vocab, hidden]
    layers: tuple[LayerWeights, ...]
    final_norm: torch.Tensor  # [hidden]
    lm_head: Projection  # [vocab, hidden]
    cos_table: torch.Tensor  # [max_context, head_dim]
    signed_sin_table: torch.Tensor  # [max_context, head_dim], its first half negated (apply_rotary)
    heads: HeadLayout
    rms_norm_eps: float
    # The norms, residual adds, rotary embedding and activation fused in C (perfsuite.engine.layer_ops), where
    # ModelRunner could build them for a float32 CPU decoder; None: torch's operators (decoder_layer).
    layer_ops: LayerOps | None = None

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def max_context(self) -> int:
        return self.cos_table.shape[0]

    @classmethod
    def from_hf(
        cls,
        model,
        device: torch.device,
        dtype: torch.dtype,
        *,
        pack_weights: bool = True,
        batch_invariant: bool = False,
    ) -> Decoder:
        """The weights of a Hugging Face ``LlamaForCausalLM``, moved to ``device`` as ``dtype``.

        With ``pack_weights`` each projection also gets a copy of its weight
        for the faster of two kernels at decode-sized products, timed over
        all the layers' weights of a shape the first time a model of that
        shape loads on this machine, where it can (``perfsuite.engine.projection``:
        float32 on the CPU; the choice is kept in ``KernelChoiceFile``). With
        ``batch_invariant`` every projection runs oneDNN at every row count instead
        (``batch_invariant_projection``), and nothing is timed.
        """
        config = model.config
        heads = _head_layout(config)

        def moved(t: torch.Tensor) -> torch.Tensor:
            return t.detach().to(device=device, dtype=dtype)

        decoder = model.model
        kernels = _projection_kernels(pack_weights=pack_weights, batch_invariant=batch_invariant)
        layers = _layer_weights(decoder.layers, moved, kernels)
        cos_table, signed_sin_table = _rotary_tables(decoder.rotary_emb, config.max_position_embeddings, device, dtype)
        return cls(
            embed=moved(decoder.embed_tokens.weight),
            layers=layers,
            final_norm=moved(decoder.norm.weight),
            lm_head=_projections([(moved(model.lm_head.weight), None)], kernels)[0],
            cos_table=cos_table,
            signed_sin_table=signed_sin_table,
            heads=heads,
            rms_norm_eps=config.rms_norm_eps,
        )

    def new_kv_cache(self, num_slots: int, max_seq_len: int) -> KVCache:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        if not 2 <= max_seq_len <= self.max_context:
            raise ValueError(
                f"max_seq_len must be in 2..{self.max_context} (the model's max_position_embeddings), got {max_seq_len}"
            )
        shape = (len(self.layers), num_slots, self.heads.num_kv_heads, max_seq_len, self.heads.head_dim)
        return KVCache(
            keys=torch.zeros(shape, device=self.device, dtype=self.dtype),
            values=torch.zeros(shape, device=self.device, dtype=self.dtype),
        )

    def new_paged_kv_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        shape = (len(self.layers), num_blocks, block_size, self.heads.num_kv_heads, self.heads.head_dim)
        return PagedKVCache(
            keys=torch.zeros(shape, device=self.device, dtype=self.dtype),
            values=torch.zeros(shape, device=self.device, dtype=self.dtype),
        )

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """The last layer's hidden states [T, hidden] of token_ids [T] at positions [T]."""
        hidden = self.embed[token_ids]  # [T, hidden], a copy: the fused layers add into it in place
        if self.layer_ops is not None:
            return self._fused_forward(hidden, positions, attend, self.layer_ops)
        cos = self.cos_table[positions].unsqueeze(1)  # [T, 1, head_dim]
        sin = self.signed_sin_table[positions].unsqueeze(1)
        for layer_index, layer in enumerate(self.layers):
            hidden = decoder_layer(layer, layer_index, hidden, cos, sin, self.heads, self.rms_norm_eps, attend)
        return hidden

    def _fused_forward(
        self, hidden: torch.Tensor, positions: torch.Tensor, attend: Attend, ops: LayerOps
    ) -> torch.Tensor:
        """``decoder_layer`` over every layer with its elementwise work in ``ops``: each residual add is fused with
        the norm after it (the MLP's with the next layer's input norm), the rotary embedding done in place."""
        heads, eps, num_tokens = self.heads, self.rms_norm_eps, hidden.shape[0]
        positions = positions.to(torch.int64).contiguous()  # no copy when it already is
        mlp_out = None
        for layer_index, layer in enumerate(self.layers):
            if mlp_out is None:
                normed = ops.rms_norm(hidden, layer.input_norm, eps)
            else:
                normed = ops.add_rms_norm(hidden, mlp_out, layer.input_norm, eps)
            q_and_k, v = heads.split_qk_and_v(layer.qkv(normed))
            ops.rotary_(q_and_k, positions, self.cos_table, self.signed_sin_table)
            q, k = q_and_k.split((heads.num_heads, heads.num_kv_heads), dim=1)
            attended = attend(layer_index, q, k, v)
            normed = ops.add_rms_norm(hidden, layer.out(attended.reshape(num_tokens, -1)), layer.post_norm, eps)
            mlp_out = layer.down(ops.silu_and_mul(layer.gate_up(normed)))
        return hidden if mlp_out is None else hidden.add_(mlp_out)

    @property
    def projection_kernels(self) -> dict[str, str]:
        """Each projection's kernel for decode-sized products ("plain": ``F.linear`` only), as chosen at load."""
        projections = {name: getattr(self.layers[0], name) for name in PROJECTIONS} | {"lm_head": self.lm_head}
        return {name: str(p.kernel or "plain") for name, p in projections.items()}

    @property
    def projection_rows(self) -> dict[str, str]:
        """The rows each projection's kernel takes, as chosen at load ("1..": every product; "": plain only)."""
        projections = {name: getattr(self.layers[0], name) for name in PROJECTIONS} | {"lm_head": self.lm_head}
        return {
            name: f"{p.min_rows}..{'' if p.max_rows is None else p.max_rows}" if p.kernel else ""
            for name, p in projections.items()
        }

    @property
    def projection_panel_rows(self) -> dict[str, int]:
        """The rows each projection runs on ``small_gemm`` (1 to this; 0: none), as chosen at load."""
        projections = {name: getattr(self.layers[0], name) for name in PROJECTIONS} | {"lm_head": self.lm_head}
        return {name: p.panel_max_rows for name, p in projections.items()}

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The next token's logits [N, vocab] after each of hidden [N, hidden]."""
        if self.layer_ops is not None:
            return self.lm_head(self.layer_ops.rms_norm(hidden.contiguous(), self.final_norm, self.rms_norm_eps))
        return self.lm_head(rms_norm(hidden, self.final_norm, self.rms_norm_eps))

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor:
        """The most likely next token [N] after each of hidden [N, hidden]."""
        return self.logits(hidden).argmax(dim=-1)

    def greedy_tokens_and_logprobs(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``greedy_tokens`` and each one's log-probability [N] (the log-softmax of its logit, in the model dtype)."""
        logits = self.logits(hidden)  # [N, vocab]
        tokens = logits.argmax(dim=-1)
        return tokens, logits.log_softmax(dim=-1).gather(1, tokens[:, None]).squeeze(1)


def _head_layout(config) -> HeadLayout:
    """A Hugging Face config's attention heads; any model type but a supported one is refused here."""
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"perfsuite's model runner supports {SUPPORTED_MODEL_TYPES} decoders, got model_type "
            f"{config.model_type!r}; use a Llama-architecture model (SmolLM2, Llama, TinyLlama)"
        )
    num_heads = config.num_attention_heads
    return HeadLayout(
        num_heads=num_heads,
        num_kv_heads=config.num_key_value_heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // num_heads,
    )


def _layer_weights(
    hf_layers, moved: Callable[[torch.Tensor], torch.Tensor], kernels: KernelChooser | str | None
) -> tuple[LayerWeights, ...]:
    """Every Hugging Face layer's weights, each projection's layers built together on their kernel."""
    raw = [_projection_weights(layer, moved) for layer in hf_layers]
    built = {name: _projections([weights[name] for weights in raw], kernels) for name in PROJECTIONS}
    return tuple(
        LayerWeights(
            input_norm=moved(layer.input_layernorm.weight),
            post_norm=moved(layer.post_attention_layernorm.weight),
            **{name: built[name][index] for name in PROJECTIONS},
        )
        for index, layer in enumerate(hf_layers)
    )


def _projection_weights(layer, moved: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, tuple]:
    """A Hugging Face layer's projections as (weight, bias), query-key-value and gate-up each fused into one."""
    attn, mlp = layer.self_attn, layer.mlp
    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    biases = [p.bias for p in projections]
    qkv_bias = None if biases[0] is None else moved(torch.cat(biases))
    return {
        "qkv": (moved(torch.cat([p.weight for p in projections])), qkv_bias),
        "out": (moved(attn.o_proj.weight), None),
        "gate_up": (moved(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])), None),
        "down": (moved(mlp.down_proj.weight), None),
    }


BATCH_INVARIANT = "batch-invariant"  # Decoder.from_hf's projections under batch_invariant: oneDNN at every row count


def _projection_kernels(*, pack_weights: bool, batch_invariant: bool) -> KernelChooser | str | None:
    """What ``_projections`` builds on: ``BATCH_INVARIANT``, a chooser timing packed weights, or None (plain)."""
    if batch_invariant:
        return BATCH_INVARIANT
    return KernelChooser(chosen=SHARED_CHOICES) if pack_weights else None


def _projections(weights: list[tuple], kernels: KernelChooser | str | None) -> list[Projection]:
    """One shape's projections, every layer's: on the kernel chosen for them, batch invariant, or plain."""
    if kernels is None:
        return [Projection.of(weight, bias, kernel=None) for weight, bias in weights]
    if kernels == BATCH_INVARIANT:
        return [batch_invariant_projection(weight, bias) for weight, bias in weights]
    assert isinstance(kernels, KernelChooser), f"unknown projection kernels {kernels!r}"
    return kernels.projections(weights)


def _rotary_tables(
    rotary, max_context: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = rotary.inv_freq.to(device=device, dtype=torch.float32)
    positions = torch.arange(max_context, device=device, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)  # [max_context, head_dim]
    scaling = getattr(rotary, "attention_scaling", 1.0)
    sin = angles.sin() * scaling
    half = sin.shape[-1] // 2
    signed_sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)  # apply_rotary's roll needs the sign here
    return (angles.cos() * scaling).to(dtype), signed_sin.to(dtype)
