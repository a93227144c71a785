"""The model runner: the only engine code that imports torch.

It turns a ``SchedulerOutput`` into tensors, runs one forward pass of a
Llama-architecture decoder over a KV cache with a fixed shape per slot
(gpt-fast style: ``[layers, slots, kv_heads, max_seq_len, head_dim]``, updated
by index) and returns the greedy token of every chunk that samples.

Tokens are packed: the projections and the MLP, which are almost all the
work, see ``[num_tokens, hidden]`` with no padding whatever the mix of prompt
and decode lengths. Only attention groups the tokens per slot, because each
query must see its own slot's keys up to its own position.

The weights are read from a Hugging Face ``LlamaForCausalLM`` and follow its
numerics (RMSNorm in float32, rotary tables in float32), so greedy outputs
match the unbatched reference that runs the Hugging Face model itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from perfsuite.engine.types import ScheduledChunk, SchedulerOutput

SUPPORTED_MODEL_TYPES = ("llama",)
# packed: every step as packed tokens. static: decode-only steps over all
# slots with static shapes (perfsuite.engine.static_decode). cuda-graph: the
# static step captured once and replayed.
DECODE_MODES = ("packed", "static", "cuda-graph")


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
class _LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: torch.Tensor  # [(heads + 2 * kv_heads) * head_dim, hidden]
    qkv_bias: torch.Tensor | None
    out: torch.Tensor  # [hidden, heads * head_dim]
    post_norm: torch.Tensor  # [hidden]
    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    down: torch.Tensor  # [hidden, intermediate]


@dataclass(frozen=True, slots=True)
class _AttentionGroup:
    """Chunks attended together: all decode chunks, or all prefill chunks."""

    token_index: torch.Tensor  # [num_group_tokens] positions in the packed batch
    slots: torch.Tensor | slice  # which cache slots, a view when contiguous
    num_rows: int
    max_query_len: int
    max_key_len: int
    query_rows: torch.Tensor | None  # [num_group_tokens] row of each token, None for decode
    query_cols: torch.Tensor | None  # [num_group_tokens] column of each token
    mask: torch.Tensor  # [rows, 1, max_query_len, max_key_len] bool, True = may attend


@dataclass(frozen=True, slots=True)
class _Batch:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    token_slots: torch.Tensor  # [T]
    sample_index: torch.Tensor  # [num_sampling_chunks] packed index of each sampled token
    groups: tuple[_AttentionGroup, ...]


class ModelRunner:
    """Runs scheduled chunks of one model over an engine's per-slot KV cache.

    The runner holds the weights; every engine built on it shares them and
    brings its own ``KVCache`` from ``new_kv_cache``.

    ``pad_rows``: on CPU, a projection over 2..7 packed token rows is padded
    to 8 rows, because oneDNN runs those shapes slower than 8 rows
    (bench/gemm_rows.py). In-flight batching meets them whenever few requests
    are running; static batching never does, as its finished rows stay in
    the batch as padding. None computes exactly the rows there are.

    ``decode_mode`` picks how steps whose chunks are all one token run (see
    ``DECODE_MODES``); other steps always take the packed path.
    """

    def __init__(
        self,
        model,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        decode_mode: str = "packed",
    ) -> None:
        config = model.config
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"perfsuite's model runner supports {SUPPORTED_MODEL_TYPES} decoders, got model_type "
                f"{config.model_type!r}; use a Llama-architecture model (SmolLM2, Llama, TinyLlama)"
            )
        self.device = torch.device(device) if device is not None else model.device
        self.dtype = dtype or model.dtype
        self.max_context = config.max_position_embeddings
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.rms_norm_eps = config.rms_norm_eps
        self.num_forward_passes = 0
        self._load_weights(model)
        self._build_rotary_tables(model)
        self.static_decode = self._static_decode_step(decode_mode)

    def new_kv_cache(self, num_slots: int, max_seq_len: int) -> KVCache:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        if not 2 <= max_seq_len <= self.max_context:
            raise ValueError(
                f"max_seq_len must be in 2..{self.max_context} (the model's max_position_embeddings), "
                f"got {max_seq_len}"
            )
        shape = (len(self.layers), num_slots, self.num_kv_heads, max_seq_len, self.head_dim)
        return KVCache(
            keys=torch.zeros(shape, device=self.device, dtype=self.dtype),
            values=torch.zeros(shape, device=self.device, dtype=self.dtype),
        )

    # -- set-up -------------------------------------------------------------

    def _static_decode_step(self, decode_mode: str):
        if decode_mode not in DECODE_MODES:
            raise ValueError(f"unknown decode_mode {decode_mode!r}; choose one of {', '.join(DECODE_MODES)}")
        if decode_mode == "packed":
            return None
        from perfsuite.engine.static_decode import StaticDecodeStep  # it imports this module

        return StaticDecodeStep(self, use_cuda_graph=decode_mode == "cuda-graph")

    def _tensor(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(device=self.device, dtype=self.dtype)

    def _load_weights(self, model) -> None:
        decoder = model.model
        self.embed = self._tensor(decoder.embed_tokens.weight)
        self.final_norm = self._tensor(decoder.norm.weight)
        self.lm_head = self._tensor(model.lm_head.weight)
        self.layers = []
        for layer in decoder.layers:
            attn, mlp = layer.self_attn, layer.mlp
            projections = (attn.q_proj, attn.k_proj, attn.v_proj)
            biases = [p.bias for p in projections]
            self.layers.append(
                _LayerWeights(
                    input_norm=self._tensor(layer.input_layernorm.weight),
                    qkv=self._tensor(torch.cat([p.weight for p in projections])),
                    qkv_bias=None if biases[0] is None else self._tensor(torch.cat(biases)),
                    out=self._tensor(attn.o_proj.weight),
                    post_norm=self._tensor(layer.post_attention_layernorm.weight),
                    gate_up=self._tensor(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
                    down=self._tensor(mlp.down_proj.weight),
                )
            )

    def _build_rotary_tables(self, model) -> None:
        rotary = model.model.rotary_emb
        inv_freq = rotary.inv_freq.to(device=self.device, dtype=torch.float32)
        positions = torch.arange(self.max_context, device=self.device, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)  # [max_context, head_dim]
        scaling = getattr(rotary, "attention_scaling", 1.0)
        self.cos_table = (angles.cos() * scaling).to(self.dtype)
        self.sin_table = (angles.sin() * scaling).to(self.dtype)

    # -- one step -----------------------------------------------------------

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput, kv_cache: KVCache) -> list[int]:
        """Run every chunk; return the greedy token of each sampling chunk, in order."""
        if self.static_decode is not None and self.static_decode.handles(output.chunks):
            self.num_forward_passes += 1
            return self.static_decode(output.chunks, kv_cache)
        batch = self._prepare(output.chunks, kv_cache.max_seq_len)
        hidden = self.embed[batch.input_ids]  # [T, hidden]
        cos = self.cos_table[batch.positions].unsqueeze(1)  # [T, 1, head_dim]
        sin = self.sin_table[batch.positions].unsqueeze(1)
        for layer_index, layer in enumerate(self.layers):
            k_cache, v_cache = kv_cache.keys[layer_index], kv_cache.values[layer_index]
            hidden = self._decoder_layer(layer, k_cache, v_cache, hidden, batch, cos, sin)
        self.num_forward_passes += 1
        if batch.sample_index.numel() == 0:
            return []
        last = self._rms_norm(hidden[batch.sample_index], self.final_norm)
        logits = last @ self.lm_head.T  # [num_sampling_chunks, vocab]
        return logits.argmax(dim=-1).tolist()

    def _decoder_layer(self, layer: _LayerWeights, k_cache, v_cache, hidden, batch: _Batch, cos, sin):
        num_tokens = hidden.shape[0]
        normed = self._rms_norm(hidden, layer.input_norm)
        qkv = F.linear(normed, layer.qkv, layer.qkv_bias)
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        q = qkv[:, :q_size].view(num_tokens, self.num_heads, self.head_dim)
        k = qkv[:, q_size : q_size + kv_size].view(num_tokens, self.num_kv_heads, self.head_dim)
        v = qkv[:, q_size + kv_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k_cache[batch.token_slots, :, batch.positions] = k
        v_cache[batch.token_slots, :, batch.positions] = v
        attended = torch.empty_like(q)  # [T, heads, head_dim]
        for group in batch.groups:
            attended[group.token_index] = self._attend(group, q, k_cache, v_cache)
        hidden = hidden + F.linear(attended.view(num_tokens, q_size), layer.out)
        normed = self._rms_norm(hidden, layer.post_norm)
        gate, up = F.linear(normed, layer.gate_up).chunk(2, dim=-1)
        return hidden + F.linear(F.silu(gate) * up, layer.down)

    def _attend(self, group: _AttentionGroup, q, k_cache, v_cache) -> torch.Tensor:
        keys = k_cache[group.slots, :, : group.max_key_len]  # [rows, kv_heads, keys, head_dim]
        values = v_cache[group.slots, :, : group.max_key_len]
        group_q = q[group.token_index]  # [group_tokens, heads, head_dim]
        if group.query_rows is None:
            queries = group_q.unsqueeze(1)  # [rows, 1, heads, head_dim]
        else:
            queries = group_q.new_zeros(group.num_rows, group.max_query_len, self.num_heads, self.head_dim)
            queries[group.query_rows, group.query_cols] = group_q
        out = F.scaled_dot_product_attention(
            queries.transpose(1, 2), keys, values, attn_mask=group.mask, enable_gqa=True
        )  # [rows, heads, queries, head_dim]
        out = out.transpose(1, 2)
        if group.query_rows is None:
            return out.squeeze(1)
        return out[group.query_rows, group.query_cols]

    def _rms_norm(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # Hugging Face's LlamaRMSNorm normalises in float32 whatever the model
        # dtype (float64 included); doing the same keeps greedy choices equal.
        as_float = hidden.to(torch.float32)
        variance = as_float.pow(2).mean(-1, keepdim=True)
        return weight * (as_float * torch.rsqrt(variance + self.rms_norm_eps)).to(hidden.dtype)

    # -- tensors from chunks ------------------------------------------------

    def _prepare(self, chunks: tuple[ScheduledChunk, ...], max_seq_len: int) -> _Batch:
        input_ids: list[int] = []
        positions: list[int] = []
        token_slots: list[int] = []
        sample_index: list[int] = []
        decode_chunks: list[tuple[int, ScheduledChunk]] = []
        prefill_chunks: list[tuple[int, ScheduledChunk]] = []
        for chunk in chunks:
            if chunk.start_position + chunk.num_tokens > max_seq_len:
                raise ValueError(
                    f"chunk of {chunk.request_id!r} reaches position {chunk.start_position + chunk.num_tokens} "
                    f"beyond the cache's max_seq_len {max_seq_len}"
                )
            offset = len(input_ids)
            input_ids.extend(chunk.token_ids)
            positions.extend(range(chunk.start_position, chunk.start_position + chunk.num_tokens))
            token_slots.extend([chunk.slot] * chunk.num_tokens)
            if chunk.samples:
                sample_index.append(offset + chunk.num_tokens - 1)
            (decode_chunks if chunk.num_tokens == 1 else prefill_chunks).append((offset, chunk))
        groups = tuple(
            self._attention_group(group_chunks)
            for group_chunks in (decode_chunks, prefill_chunks)
            if group_chunks
        )
        return _Batch(
            input_ids=self._long(input_ids),
            positions=self._long(positions),
            token_slots=self._long(token_slots),
            sample_index=self._long(sample_index),
            groups=groups,
        )

    def _attention_group(self, offset_chunks: list[tuple[int, ScheduledChunk]]) -> _AttentionGroup:
        offset_chunks = sorted(offset_chunks, key=lambda item: item[1].slot)
        chunks = [chunk for _, chunk in offset_chunks]
        slots = [chunk.slot for chunk in chunks]
        max_query_len = max(chunk.num_tokens for chunk in chunks)
        key_lens = [chunk.start_position + chunk.num_tokens for chunk in chunks]
        max_key_len = max(key_lens)
        token_index: list[int] = []
        query_rows: list[int] = []
        query_cols: list[int] = []
        # Query (row, col) sits at position start + col; it sees keys 0..that
        # position of its own slot. Padded query columns reuse the row's last
        # position so no row is ever fully masked (which would give NaN).
        query_positions = []
        for row, (offset, chunk) in enumerate(offset_chunks):
            token_index.extend(range(offset, offset + chunk.num_tokens))
            query_rows.extend([row] * chunk.num_tokens)
            query_cols.extend(range(chunk.num_tokens))
            last = chunk.start_position + chunk.num_tokens - 1
            query_positions.append(
                [min(chunk.start_position + col, last) for col in range(max_query_len)]
            )
        query_pos = self._long(query_positions)  # [rows, max_query_len]
        key_pos = torch.arange(max_key_len, device=self.device)
        mask = (key_pos[None, None, :] <= query_pos[:, :, None]).unsqueeze(1)
        is_decode = max_query_len == 1
        return _AttentionGroup(
            token_index=self._long(token_index),
            slots=_as_slice_if_contiguous(slots) or self._long(slots),
            num_rows=len(chunks),
            max_query_len=max_query_len,
            max_key_len=max_key_len,
            query_rows=None if is_decode else self._long(query_rows),
            query_cols=None if is_decode else self._long(query_cols),
            mask=mask,
        )

    def _long(self, values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _as_slice_if_contiguous(slots: list[int]) -> slice | None:
    """A slice selects a view of the cache; an index tensor would copy it."""
    if slots == list(range(slots[0], slots[0] + len(slots))):
        return slice(slots[0], slots[0] + len(slots))
    return None
