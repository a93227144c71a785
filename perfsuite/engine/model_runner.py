"""The model runner: the only engine code that turns scheduled chunks into tensors.

It turns a ``SchedulerOutput`` into tensors, runs one forward pass of the
decoder (``perfsuite.engine.layers``) over an engine's KV cache and returns
the greedy token of every chunk that samples. The cache is either slots of a
fixed shape (gpt-fast style: ``[layers, slots, kv_heads, max_seq_len,
head_dim]``, updated by index) or, for the paged engine, a pool of blocks
(``[layers, num_blocks, block_size, kv_heads, head_dim]``) that each request
reaches through its block table.

Tokens are packed: the projections and the MLP, which are almost all the
work, see ``[num_tokens, hidden]`` with no padding whatever the mix of prompt
and decode lengths. Only attention groups the tokens per request, because
each query must see its own request's keys up to its own position. Where
perfsuite's kernel is built (``perfsuite.engine.paged_attention``) it reads
each token's keys in place, from a paged pool through block tables or from
slots, each slot's KV head a block of its own: every decode token, and the
prompts while they read at most ``in_place_prefill_max_keys`` keys in all
(then the whole step is one call a layer). Longer prompts, and every group
without the kernel, run SDPA over their rows' keys, padded to the longest.

Every index tensor of a step (token ids, positions, where each token's K/V
is written, block tables, ...) is written into one host buffer, pinned on
CUDA, and copied to the device once without blocking: a step makes one
host-to-device copy, not one blocking copy per index.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from perfsuite.engine.c_library import Unavailable
from perfsuite.engine.kv_memory import KVLayout
from perfsuite.engine.layer_ops import LayerOps, load_layer_ops
from perfsuite.engine.layers import (
    Attend,
    Decoder,
    HeadLayout,
    KVCache,
    PagedKVCache,
    grouped_query_attention,
    tile_mask,
)
from perfsuite.engine.paged_attention import PagedAttention, load_paged_attention
from perfsuite.engine.paged_decode import PagedDecodeStep
from perfsuite.engine.static_decode import StaticDecodeStep
from perfsuite.engine.types import DecodeMode, ScheduledChunk, SchedulerOutput
from perfsuite.engine.work import ModelShape

# A prompt group's tokens attend through the in-place kernel, each a row over its own keys, while they read at most
# this many keys in all (the sum over its tokens of each one's position + 1); past it, SDPA over the group padded to
# its longest prompt. SDPA costs about 1 ms a layer however small the group, and its matrix products only pay that
# back on long prompts: on SmolLM2 (2 AMD EPYC cores, bench/prefill_attention.py) the kernel's whole prompt step was
# 3-14% faster up to 16,896 keys read, 3-4% at about 66,000, and 1.5-7% slower from 131,328; one prompt of 256
# (32,896) came out within 1% either way in two runs.
IN_PLACE_PREFILL_MAX_KEYS = 32768


@dataclass(frozen=True, slots=True)
class _AttentionGroup:
    """Chunks attended together: all decode chunks, or all prefill chunks.

    A slot cache reads the rows' keys from ``slots``; a paged one gathers
    them block by block through ``block_tables`` (``PagedKVCache.keys_of_rows``).
    """

    token_index: torch.Tensor | None  # [num_group_tokens] positions in the packed batch; None: all, in order
    slots: torch.Tensor | slice | None  # which cache slots, a view when contiguous; None for a paged cache
    num_rows: int
    max_query_len: int
    max_key_len: int
    query_rows: torch.Tensor | None  # [num_group_tokens] row of each token, None for decode
    query_cols: torch.Tensor | None  # [num_group_tokens] column of each token
    mask: torch.Tensor | None  # [rows, 1, max_query_len, max_key_len] bool, True = may attend; None: read in place
    # Paged and gathered: [rows, max_blocks], each row's blocks padded with block 0. Read in place by the kernel:
    # each token's (_per_token_tables), and key_lengths the keys each sees.
    block_tables: torch.Tensor | None = None
    key_lengths: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class _Batch:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    token_slots: torch.Tensor  # [T] each token's slot, or for a paged cache its pool cell (vLLM's slot_mapping)
    sample_index: torch.Tensor  # [num_sampling_chunks] packed index of each sampled token
    groups: tuple[_AttentionGroup, ...]
    per_token: _PerTokenKeys | None = None  # batch-invariant mode: every token attends alone
    # Where the in-place kernel stores the step's keys and values (PagedAttention.store), each token's first KV
    # head's element offset into a layer's cache, and one head's stride; None: torch's indexed stores.
    store_offsets: torch.Tensor | None = None
    store_head_stride: int = 0


@dataclass(frozen=True, slots=True)
class _PerTokenKeys:
    """Batch-invariant attention's indices: each token is a row of the in-place kernel, over its own keys only.

    A paged pool's rows read their request's block table; a slot cache is read
    as a pool of one block per (slot, KV head), ``max_seq_len`` tokens long,
    and each token is ``kv_heads`` rows, one per KV head (with the query heads
    it serves), whose table is ``slot * kv_heads + kv_head``.
    """

    tables: torch.Tensor  # [rows, width] the token's request's blocks; slots: [T * kv_heads, 1]
    lengths: torch.Tensor  # [rows] the token's position + 1: the keys it sees


class _HostIndices:
    """Integer index lists gathered on the host, then sent to the device as one tensor in one copy."""

    def __init__(self) -> None:
        self._values: list[int] = []
        self._spans: list[tuple[int, int]] = []

    def add(self, values: Sequence[int]) -> int:
        """Queue ``values``; the returned handle names their tensor after ``upload``."""
        self._spans.append((len(self._values), len(values)))
        self._values.extend(values)
        return len(self._spans) - 1

    def host_tensor(self, device: torch.device) -> torch.Tensor:
        """Every value queued so far in one host tensor, pinned when it is bound for CUDA."""
        host = torch.tensor(self._values, dtype=torch.long)
        # Pinned memory makes the copy asynchronous; the caching host allocator keeps the buffer alive until
        # the copy has run, so it may go out of scope after. Pinning costs a page-locked allocation: only CUDA
        # gains from it.
        return host.pin_memory() if device.type == "cuda" else host

    def upload(self, device: torch.device) -> list[torch.Tensor]:
        """One tensor per ``add``, views of a single device copy (pinned and non-blocking on CUDA)."""
        flat = self.host_tensor(device).to(device, non_blocking=True)
        return list(flat.split([length for _, length in self._spans]))


@dataclass(frozen=True, slots=True)
class _GroupPlan:
    """One attention group's index lists on the host, before the step's single copy."""

    num_rows: int
    max_query_len: int
    max_key_len: int
    slots: list[int]
    token_index: int  # handles into _HostIndices
    # SDPA's: the handles of each token's query row and column, and of every (row, column)'s position
    # ([rows * max_query_len], _padded_queries); and a slot cache's slot index. None where the kernel reads in place.
    padded_queries: tuple[int, int, int] | None
    slot_index: int | None
    block_tables: int | None  # [rows * max_blocks] paged and gathered; read in place: _per_token_tables'
    key_lengths: int | None  # read in place: each kernel row's keys (_per_token_tables); else None
    num_table_columns: int
    tokens_in_order: bool  # the group's tokens are 0, 1, ... of the step: with no other group, no index is needed


class ModelRunner:
    """Runs scheduled chunks of one model over an engine's per-slot KV cache.

    The runner holds the weights (a ``Decoder``); every engine built on it
    shares them and brings its own ``KVCache`` from ``new_kv_cache``.

    ``decode_mode`` picks how steps whose chunks are all one token run (see
    ``DecodeMode``); other steps always take the packed path.
    ``pack_weights`` also gives each projection a copy of its weight for
    the faster of two kernels at decode-sized products, timed per shape at
    load, where it can (float32 on the CPU; ``perfsuite.engine.projection``);
    False keeps only plain ``F.linear``. ``paged_attention`` lets a paged
    decode step attend over the pool's blocks in place, with perfsuite's C
    kernel, where it can be built (``perfsuite.engine.paged_attention``);
    False, or no C compiler, gathers each row's blocks first. The kernel also
    takes a prompt group (a slot cache's or a pool's) while its tokens read at
    most ``in_place_prefill_max_keys`` keys in all, each token a row over its
    own; a larger one goes to SDPA over the group padded to its longest prompt,
    whose matrix products win once there is enough work to amortise them.
    ``layer_ops``
    lets a float32 CPU decoder run each layer's norms, residual adds, rotary
    embedding and activation fused in C (``perfsuite.engine.layer_ops``);
    False, or no C compiler, keeps torch's operators.

    ``batch_invariant``: a request's tokens (and their log-probabilities) are
    the same bits whatever else is in the batch, however many rows, wherever
    its rows sit, however its prompt was split (``check_batch_invariance``
    says where this can hold, and the constructor raises its reason where it
    cannot). Every projection runs oneDNN at every row count
    (``batch_invariant_projection``), and every token attends alone, through
    the in-place C kernel over exactly its own keys, in prefill as in decode.
    ``logprobs``: each step also keeps its sampled tokens' log-probabilities
    in ``last_logprobs`` (one per sampling chunk, in order), which the engine
    puts in its records; off, nothing is computed for them.
    """

    def __init__(
        self,
        model,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        decode_mode: DecodeMode | str = DecodeMode.PACKED,
        pack_weights: bool = True,
        paged_attention: bool = True,
        layer_ops: bool = True,
        batch_invariant: bool = False,
        logprobs: bool = False,
        in_place_prefill_max_keys: int = IN_PLACE_PREFILL_MAX_KEYS,
    ) -> None:
        decode_mode = DecodeMode.parse(decode_mode)
        device = torch.device(device) if device is not None else model.device
        dtype = dtype or model.dtype
        if batch_invariant or logprobs:
            _check_packed(decode_mode, "batch_invariant" if batch_invariant else "logprobs")
        if batch_invariant:
            problem = check_batch_invariance(device, dtype, paged_attention)
            if problem is not None:
                raise ValueError(f"batch-invariant mode is not available here: {problem}")
        decoder = Decoder.from_hf(model, device, dtype, pack_weights=pack_weights, batch_invariant=batch_invariant)
        self._layer_ops = _layer_ops(decoder, wanted=layer_ops)
        if isinstance(self._layer_ops, LayerOps):
            decoder = dataclasses.replace(decoder, layer_ops=self._layer_ops)
        self.decoder = decoder
        # What the engine counts each step's FLOPs and bytes by (perfsuite.engine.work).
        self.model_shape = ModelShape.from_config(model.config, self.decoder.dtype.itemsize)
        self.num_forward_passes = 0
        self.batch_invariant = batch_invariant
        self.logprobs = logprobs
        self.last_logprobs: tuple[float, ...] | None = None  # the last step's, under logprobs
        self._wants_paged_attention = paged_attention
        self.in_place_prefill_max_keys = _checked_prompt_key_budget(in_place_prefill_max_keys)
        self.static_decode = _static_decode(self.decoder, decode_mode)

    @property
    def device(self) -> torch.device:
        return self.decoder.device

    @functools.cached_property
    def _paged_attention(self) -> PagedAttention | Unavailable:
        """Built on the first step, not at load (it also stores every step's keys and values, ``_store``)."""
        if not self._wants_paged_attention:
            return Unavailable("turned off (paged_attention=False)")
        if not PagedAttention.supports(self.decoder.embed):
            return Unavailable(
                f"the kernel is for float32 and float64 on the CPU, not {self.decoder.dtype} on {self.device.type}"
            )
        return load_paged_attention()

    @property
    def paged_attention(self) -> str:
        """How a decode step, and a prompt group within ``in_place_prefill_max_keys``, attends (paged or slot cache):
        "in place" (perfsuite's kernel), or "gather: <why not in place>"."""
        kernel = self._paged_attention
        return "in place" if isinstance(kernel, PagedAttention) else f"gather: {kernel.reason}"

    @property
    def paged_attention_fallback(self) -> str | None:
        """Why a paged decode gathers though the kernel was wanted, and the fix; None where it attends in place, was
        told not to, or the kernel does not apply (the dtype or device)."""
        kernel = self._paged_attention
        if isinstance(kernel, PagedAttention) or kernel.fix is None:
            return None
        return f"{kernel.reason}; {kernel.fix}"

    @property
    def layer_ops(self) -> str:
        """How a layer's norms, rotary embedding and activation run: "fused" (perfsuite's C operators), or
        "torch: <why not fused>"."""
        ops = self._layer_ops
        return "fused" if isinstance(ops, LayerOps) else f"torch: {ops.reason}"

    @property
    def kv_layout(self) -> KVLayout:
        """One token's keys and values in the caches it makes: engines check a cache fits the device first."""
        heads = self.decoder.heads
        return KVLayout(len(self.decoder.layers), heads.num_kv_heads, heads.head_dim, self.decoder.dtype.itemsize)

    @property
    def max_context(self) -> int:
        return self.decoder.max_context

    def new_kv_cache(self, num_slots: int, max_seq_len: int) -> KVCache:
        """An engine's cache; under ``cuda-graph`` its decode step is captured here, at engine build."""
        if self.static_decode is not None:
            return self.static_decode.new_kv_cache(num_slots, max_seq_len)
        return self.decoder.new_kv_cache(num_slots, max_seq_len)

    def new_paged_kv_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        """A paged engine's pool; ``with_paged_decode`` then gives it a decode step of static shapes."""
        return self.decoder.new_paged_kv_cache(num_blocks, block_size)

    def with_paged_decode(self, kv_cache: PagedKVCache, *, max_num_seqs: int, max_seq_len: int) -> PagedKVCache:
        """Under ``static`` or ``cuda-graph``, the pool with its engine's decode step (bucketed by rows up to
        ``max_num_seqs``, keys up to ``max_seq_len``), captured here, at engine build, under ``cuda-graph``."""
        if self.static_decode is None:
            return kv_cache
        step = PagedDecodeStep(
            self.decoder,
            kv_cache,
            max_num_seqs=max_num_seqs,
            max_blocks_per_seq=min(-(-max_seq_len // kv_cache.block_size), kv_cache.num_blocks),
            use_cuda_graph=self.static_decode.use_cuda_graph,
        )
        return dataclasses.replace(kv_cache, decode_step=step)

    # -- one step -----------------------------------------------------------

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput, kv_cache: KVCache | PagedKVCache) -> list[int]:
        """Run every chunk; return the greedy token of each sampling chunk, in order."""
        if self.static_decode is not None and self.static_decode.handles(output.chunks):
            if isinstance(kv_cache, KVCache):
                sampled = self.static_decode(output.chunks, kv_cache)
            elif kv_cache.decode_step is not None:
                sampled = kv_cache.decode_step(output.chunks)
            else:  # a pool made without with_paged_decode
                sampled = self._packed_step(output.chunks, kv_cache)
        else:
            sampled = self._packed_step(output.chunks, kv_cache)
        self.num_forward_passes += 1
        return sampled

    def _packed_step(self, chunks: tuple[ScheduledChunk, ...], kv_cache: KVCache | PagedKVCache) -> list[int]:
        batch = self._prepare(chunks, kv_cache)
        attend = self._attend_alone if self.batch_invariant else self._attend_grouped
        hidden = self.decoder.forward(batch.input_ids, batch.positions, attend(batch, kv_cache))  # [T, hidden]
        return self._sample(hidden[batch.sample_index])

    def _sample(self, hidden: torch.Tensor) -> list[int]:
        """The greedy token after each of hidden [N, hidden]; under ``logprobs``, their log-probabilities kept."""
        if hidden.shape[0] == 0:
            self.last_logprobs = () if self.logprobs else None
            return []
        if not self.logprobs:
            return self.decoder.greedy_tokens(hidden).tolist()
        tokens, logprobs = self.decoder.greedy_tokens_and_logprobs(hidden)
        self.last_logprobs = tuple(logprobs.tolist())
        return tokens.tolist()

    def _store(
        self, layer_index: int, k: torch.Tensor, v: torch.Tensor, batch: _Batch, kv_cache: KVCache | PagedKVCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the step's keys and values into the cache; the layer's cache tensors (a paged pool's cells).

        Where the in-place kernel runs and takes the cache's dtype, its ``store`` copies them (two C copies a layer,
        where torch's indexed stores were two dispatches of about 10 us), at ``batch.store_offsets``.
        """
        if isinstance(kv_cache, PagedKVCache):
            k_cache, v_cache = kv_cache.token_rows(layer_index)  # [cells, kv_heads, head_dim]
        else:
            k_cache, v_cache = kv_cache.keys[layer_index], kv_cache.values[layer_index]
        if batch.store_offsets is not None:
            kernel = self._paged_attention
            assert isinstance(kernel, PagedAttention), "store offsets are planned only for the kernel"
            kernel.store(k_cache, v_cache, k, v, batch.store_offsets, batch.store_head_stride)
        elif isinstance(kv_cache, PagedKVCache):
            k_cache[batch.token_slots] = k
            v_cache[batch.token_slots] = v
        else:
            k_cache[batch.token_slots, :, batch.positions] = k
            v_cache[batch.token_slots, :, batch.positions] = v
        return k_cache, v_cache

    def _attend_alone(self, batch: _Batch, kv_cache: KVCache | PagedKVCache) -> Attend:
        """Batch-invariant attention: each token a row of the in-place kernel over its own keys 0..its position.

        The kernel computes a row by itself, in one order that depends only on
        its number of keys, so a token's output is the same bits whatever the
        other rows, padding or chunking. A slot cache [slots, kv_heads,
        max_seq_len, head_dim] is one pool of ``slots * kv_heads`` blocks of
        one KV head each, and a token's query heads are ``kv_heads`` rows of
        the heads that share one (one kernel call a layer, each head's
        arithmetic as it would be in a call of its own).
        """
        kernel, per_token = self._paged_attention, batch.per_token
        # The constructor checked the kernel builds (check_batch_invariance), and _prepare plans every token alone.
        assert isinstance(kernel, PagedAttention) and per_token is not None
        if isinstance(kv_cache, PagedKVCache):

            def attend_paged(layer_index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                self._store(layer_index, k, v, batch, kv_cache)
                return kernel(q, *kv_cache.layer_pools(layer_index), per_token.tables, per_token.lengths)

            return attend_paged
        heads = self.decoder.heads

        def attend_slots(layer_index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k_cache, v_cache = self._store(layer_index, k, v, batch, kv_cache)
            return _attend_slots_in_place(kernel, heads, q, k_cache, v_cache, per_token.tables, per_token.lengths)

        return attend_slots

    def _attend_grouped(self, batch: _Batch, kv_cache: KVCache | PagedKVCache) -> Attend:
        """Each attention group's queries over its rows' keys: read in place by the kernel, or by SDPA at once,
        padded to the group's longest."""
        heads = self.decoder.heads
        group_size = heads.num_heads // heads.num_kv_heads
        masks = [None if group.mask is None else tile_mask(group.mask, group_size) for group in batch.groups]
        kernel = self._paged_attention
        in_place = kernel if isinstance(kernel, PagedAttention) else None  # for the groups planned for it

        def attend(layer_index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k_cache, v_cache = self._store(layer_index, k, v, batch, kv_cache)
            if batch.groups[0].token_index is None:  # one group of every token in order: nothing to scatter
                return self._attend(batch.groups[0], masks[0], layer_index, kv_cache, q, k_cache, v_cache, in_place)
            attended = torch.empty_like(q)  # [T, heads, head_dim]
            for group, mask in zip(batch.groups, masks):
                attended[group.token_index] = self._attend(
                    group, mask, layer_index, kv_cache, q, k_cache, v_cache, in_place
                )
            return attended

        return attend

    def _attend(
        self,
        group: _AttentionGroup,
        mask: torch.Tensor | None,
        layer_index: int,
        kv_cache: KVCache | PagedKVCache,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        in_place: PagedAttention | None,
    ) -> torch.Tensor:
        """``group``'s queries over its rows' keys and values: read in place by ``in_place`` where the group was
        planned for it (``_reads_in_place``), else by SDPA over a slot cache's views or a paged pool's blocks
        gathered (``keys_of_rows``)."""
        group_q = q if group.token_index is None else q[group.token_index]  # [group_tokens, heads, head_dim]
        if group.key_lengths is not None:
            assert in_place is not None and group.block_tables is not None
            if isinstance(kv_cache, PagedKVCache):
                keys, values = kv_cache.layer_pools(layer_index)
                return in_place(group_q, keys, values, group.block_tables, group.key_lengths)
            heads = self.decoder.heads
            return _attend_slots_in_place(in_place, heads, group_q, k_cache, v_cache, group.block_tables,
                                          group.key_lengths)  # fmt: skip
        assert mask is not None, "a group SDPA reads has its mask"
        keys, values = _group_keys(group, layer_index, kv_cache, k_cache, v_cache)
        if group.query_rows is None:
            queries = group_q.unsqueeze(1)  # [rows, 1, heads, head_dim]
        else:
            heads = self.decoder.heads
            queries = group_q.new_zeros(group.num_rows, group.max_query_len, heads.num_heads, heads.head_dim)
            queries[group.query_rows, group.query_cols] = group_q
        out = grouped_query_attention(queries, keys, values, mask)  # [rows, queries, heads, head_dim]
        if group.query_rows is None:
            return out.squeeze(1)
        return out[group.query_rows, group.query_cols]

    # -- tensors from chunks ------------------------------------------------

    def _prepare(self, chunks: tuple[ScheduledChunk, ...], kv_cache: KVCache | PagedKVCache) -> _Batch:
        block_size = kv_cache.block_size if isinstance(kv_cache, PagedKVCache) else None
        input_ids: list[int] = []
        positions: list[int] = []
        token_slots: list[int] = []
        sample_index: list[int] = []
        offset_chunks: list[tuple[int, ScheduledChunk]] = []  # each chunk with its first token's offset in the step
        decode_chunks: list[tuple[int, ScheduledChunk]] = []
        prefill_chunks: list[tuple[int, ScheduledChunk]] = []
        for chunk in chunks:
            _check_fits(chunk, kv_cache)
            offset = len(input_ids)
            chunk_positions = _positions(chunk)
            input_ids.extend(chunk.token_ids)
            positions.extend(chunk_positions)
            if block_size is None:
                token_slots.extend([chunk.slot] * chunk.num_tokens)
            else:
                table = chunk.block_table
                token_slots.extend(table[p // block_size] * block_size + p % block_size for p in chunk_positions)
            if chunk.samples:
                sample_index.append(offset + chunk.num_tokens - 1)
            offset_chunks.append((offset, chunk))
            (decode_chunks if chunk.num_tokens == 1 else prefill_chunks).append((offset, chunk))
        indices = _HostIndices()
        handles = [indices.add(values) for values in (input_ids, positions, token_slots, sample_index)]
        store = self._plan_store(kv_cache, token_slots, positions, indices)
        if self.batch_invariant:  # every token attends alone: no groups, no masks
            tables, lengths, width = _per_token_tables(chunks, indices, block_size, self.decoder.heads.num_kv_heads)
            tensors = indices.upload(self.device)
            per_token = _PerTokenKeys(tensors[tables].view(-1, width), tensors[lengths])
            return _batch(tensors, handles, (), per_token, store)
        plans = self._plan_groups(offset_chunks, decode_chunks, prefill_chunks, indices, block_size)
        tensors = indices.upload(self.device)
        groups = tuple(self._attention_group(plan, tensors, block_size, alone=len(plans) == 1) for plan in plans)
        return _batch(tensors, handles, groups, store=store)

    def _plan_groups(
        self,
        offset_chunks: list[tuple[int, ScheduledChunk]],
        decode_chunks: list[tuple[int, ScheduledChunk]],
        prefill_chunks: list[tuple[int, ScheduledChunk]],
        indices: _HostIndices,
        block_size: int | None,
    ) -> list[_GroupPlan]:
        """The step's attention groups: one of every token in step order where the kernel reads them all in place;
        else the prompts through SDPA, and the decode chunks in place where the kernel is built."""
        num_kv_heads = self.decoder.heads.num_kv_heads
        if self._reads_in_place(prefill_chunks):
            return [self._plan_group(offset_chunks, indices, block_size, num_kv_heads, True)]
        return [
            self._plan_group(group_chunks, indices, block_size, num_kv_heads, in_place)
            for group_chunks, in_place in ((decode_chunks, self._reads_in_place([])), (prefill_chunks, False))
            if group_chunks
        ]

    def _reads_in_place(self, prefill_chunks: list[tuple[int, ScheduledChunk]]) -> bool:
        """Whether the kernel reads the keys of decode chunks and of ``prefill_chunks`` in place: wherever it is
        built, while the prompts' tokens read at most ``in_place_prefill_max_keys`` keys in all."""
        if not isinstance(self._paged_attention, PagedAttention):
            return False
        return sum(_keys_read(chunk) for _, chunk in prefill_chunks) <= self.in_place_prefill_max_keys

    def _plan_store(
        self, kv_cache: KVCache | PagedKVCache, token_slots: list[int], positions: list[int], indices: _HostIndices
    ) -> tuple[int, int] | None:
        """Where the kernel stores the step's keys and values (``PagedAttention.store``): the handle of each token's
        offset into a layer's cache, and a KV head's stride; None where torch's indexed stores do it."""
        if not (isinstance(self._paged_attention, PagedAttention) and PagedAttention.supports(kv_cache.keys)):
            return None
        heads = self.decoder.heads
        if isinstance(kv_cache, PagedKVCache):  # [cells, kv_heads, head_dim]
            cell = heads.num_kv_heads * heads.head_dim
            return indices.add([slot * cell for slot in token_slots]), heads.head_dim
        row = kv_cache.max_seq_len * heads.head_dim  # [slots, kv_heads, max_seq_len, head_dim]
        slot_size = heads.num_kv_heads * row
        offsets = [slot * slot_size + position * heads.head_dim for slot, position in zip(token_slots, positions)]
        return indices.add(offsets), row

    @staticmethod
    def _plan_group(
        offset_chunks: list[tuple[int, ScheduledChunk]],
        indices: _HostIndices,
        block_size: int | None,
        num_kv_heads: int,
        in_place: bool,
    ) -> _GroupPlan:
        """``in_place``: the kernel reads the group's keys, each token a row (``_per_token_tables``); else SDPA
        over its rows padded to the longest, a paged pool's blocks gathered through its rows' block tables, a slot
        cache's rows in slot order (a slice where they are contiguous)."""
        if not in_place:
            offset_chunks = sorted(offset_chunks, key=lambda item: item[1].slot)
        chunks = [chunk for _, chunk in offset_chunks]
        max_query_len = max(chunk.num_tokens for chunk in chunks)
        token_index = [offset + i for offset, chunk in offset_chunks for i in range(chunk.num_tokens)]
        padded_queries = slot_index = lengths = tables = None
        width = 0
        if in_place:
            tables, lengths, width = _per_token_tables(chunks, indices, block_size, num_kv_heads)
        else:  # SDPA's padded queries, over a slot cache's slots or a pool's blocks gathered
            rows, cols, positions = _padded_queries(offset_chunks, max_query_len)
            padded_queries = indices.add(rows), indices.add(cols), indices.add(positions)
            if block_size is None:
                slot_index = indices.add([chunk.slot for chunk in chunks])
            else:
                tables, width = _padded_block_tables(chunks, indices)
        return _GroupPlan(
            num_rows=len(chunks),
            max_query_len=max_query_len,
            max_key_len=max(chunk.start_position + chunk.num_tokens for chunk in chunks),
            slots=[chunk.slot for chunk in chunks],
            token_index=indices.add(token_index),
            padded_queries=padded_queries,
            slot_index=slot_index,
            block_tables=tables,
            key_lengths=lengths,
            num_table_columns=width,
            tokens_in_order=token_index == list(range(len(token_index))),
        )

    def _attention_group(
        self, plan: _GroupPlan, tensors: list[torch.Tensor], block_size: int | None, *, alone: bool
    ) -> _AttentionGroup:
        slots: torch.Tensor | slice | None = None
        mask = block_tables = key_lengths = query_rows = query_cols = None
        if plan.padded_queries is None:  # read in place
            assert plan.block_tables is not None and plan.key_lengths is not None
            block_tables = tensors[plan.block_tables].view(-1, plan.num_table_columns)
            key_lengths = tensors[plan.key_lengths]
        else:
            rows_handle, cols_handle, positions_handle = plan.padded_queries
            if plan.max_query_len > 1:  # a decode group's queries are one a row, none padded
                query_rows, query_cols = tensors[rows_handle], tensors[cols_handle]
            query_pos = tensors[positions_handle].view(plan.num_rows, plan.max_query_len)
            key_pos = torch.arange(plan.max_key_len, device=self.device)
            mask = (key_pos[None, None, :] <= query_pos[:, :, None]).unsqueeze(1)
            if block_size is None:
                assert plan.slot_index is not None, "a slot group SDPA reads has its slots"
                slots = _as_slice_if_contiguous(plan.slots) or tensors[plan.slot_index]
            else:
                assert plan.block_tables is not None, "a paged group's plan has its block tables"
                block_tables = tensors[plan.block_tables].view(plan.num_rows, plan.num_table_columns)
        return _AttentionGroup(
            token_index=None if alone and plan.tokens_in_order else tensors[plan.token_index],
            slots=slots,
            num_rows=plan.num_rows,
            max_query_len=plan.max_query_len,
            max_key_len=plan.max_key_len,
            query_rows=query_rows,
            query_cols=query_cols,
            mask=mask,
            block_tables=block_tables,
            key_lengths=key_lengths,
        )


def _batch(
    tensors: list[torch.Tensor],
    handles: list[int],
    groups: tuple[_AttentionGroup, ...],
    per_token: _PerTokenKeys | None = None,
    store: tuple[int, int] | None = None,
) -> _Batch:
    """The step's batch from its uploaded tensors; ``handles`` name its input ids, positions, slots and samples,
    ``store`` its store offsets' handle and head stride (``_plan_store``)."""
    input_ids, positions, token_slots, sample_index = (tensors[handle] for handle in handles)
    if store is None:
        return _Batch(input_ids, positions, token_slots, sample_index, groups, per_token)
    offsets, head_stride = store
    return _Batch(input_ids, positions, token_slots, sample_index, groups, per_token, tensors[offsets], head_stride)


def _padded_queries(
    offset_chunks: list[tuple[int, ScheduledChunk]], max_query_len: int
) -> tuple[list[int], list[int], list[int]]:
    """A group's tokens as SDPA's padded queries: each token's (row, column), and every (row, column)'s position,
    the padded ones included ([rows * max_query_len]). A decode group (one query a row) needs no rows or columns:
    they stay empty."""
    query_rows: list[int] = []
    query_cols: list[int] = []
    # Query (row, col) sits at position start + col; it sees keys 0..that
    # position of its own request. Padded query columns reuse the row's last
    # position so no row is ever fully masked (which would give NaN).
    query_positions: list[int] = []
    for row, (_, chunk) in enumerate(offset_chunks):
        if max_query_len > 1:
            query_rows.extend([row] * chunk.num_tokens)
            query_cols.extend(range(chunk.num_tokens))
        last = chunk.start_position + chunk.num_tokens - 1
        query_positions.extend(min(chunk.start_position + col, last) for col in range(max_query_len))
    return query_rows, query_cols, query_positions


def _padded_block_tables(chunks: list[ScheduledChunk], indices: _HostIndices) -> tuple[int, int]:
    """A gathered paged group's block tables, padded to its widest: (their handle, their width)."""
    width = max(len(chunk.block_table) for chunk in chunks)
    return indices.add([block for chunk in chunks for block in _padded(chunk.block_table, width)]), width


def _per_token_tables(
    chunks: Sequence[ScheduledChunk], indices: _HostIndices, block_size: int | None, num_kv_heads: int
) -> tuple[int, int, int]:
    """The in-place kernel's rows for ``chunks``' tokens, each over its own keys 0..its position: (tables' handle,
    lengths' handle, table width).

    A pool's row is a token, its table its request's blocks padded to the
    widest (past its length never read). A slot cache [slots, kv_heads,
    max_seq_len, head_dim] is read as a pool of ``slots * kv_heads`` blocks of
    ``max_seq_len`` cells of one KV head each: a token is ``kv_heads`` rows,
    their one block ``slot * kv_heads + kv_head`` (``_attend_slots_in_place``).
    """
    if block_size is None:
        tables = [
            chunk.slot * num_kv_heads + kv_head
            for chunk in chunks
            for _ in range(chunk.num_tokens)
            for kv_head in range(num_kv_heads)
        ]
        lengths = [position + 1 for chunk in chunks for position in _positions(chunk) for _ in range(num_kv_heads)]
        return indices.add(tables), indices.add(lengths), 1
    width = max(len(chunk.block_table) for chunk in chunks)
    tables = []
    for chunk in chunks:
        padded = _padded(chunk.block_table, width)
        tables.extend(block for _ in range(chunk.num_tokens) for block in padded)
    lengths = [position + 1 for chunk in chunks for position in _positions(chunk)]
    return indices.add(tables), indices.add(lengths), width


def _positions(chunk: ScheduledChunk) -> range:
    return range(chunk.start_position, chunk.start_position + chunk.num_tokens)


def _padded(block_table: tuple[int, ...], width: int) -> tuple[int, ...]:
    return (*block_table, *[0] * (width - len(block_table)))


def _keys_read(chunk: ScheduledChunk) -> int:
    """The keys ``chunk``'s tokens read in all, each its request's keys 0..its position."""
    return chunk.num_tokens * chunk.start_position + chunk.num_tokens * (chunk.num_tokens + 1) // 2


def _attend_slots_in_place(
    kernel: PagedAttention,
    heads: HeadLayout,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    lengths: torch.Tensor,
) -> torch.Tensor:
    """q [T, heads, head_dim] over a layer's slot cache [slots, kv_heads, max_seq_len, head_dim], read in place as
    ``slots * kv_heads`` blocks of one KV head each: a row per (token, KV head), holding the ``group`` query heads
    that share it (HF's order: KV head j serves query heads j * group ...), its block in ``tables``."""
    one_head_blocks = (-1, k_cache.shape[-2], 1, heads.head_dim)
    rows = q.contiguous().view(-1, heads.num_heads // heads.num_kv_heads, heads.head_dim)  # [T * kv_heads, group, d]
    return kernel(rows, k_cache.view(one_head_blocks), v_cache.view(one_head_blocks), tables, lengths).view(q.shape)


def _group_keys(
    group: _AttentionGroup,
    layer_index: int,
    kv_cache: KVCache | PagedKVCache,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``group``'s rows' keys and values [rows, kv_heads, keys, head_dim]: slots' views, or a paged pool's blocks."""
    if isinstance(kv_cache, PagedKVCache):
        assert group.block_tables is not None, "a paged group carries its rows' block tables"
        return kv_cache.keys_of_rows(layer_index, group.block_tables, group.max_key_len)
    return k_cache[group.slots, :, : group.max_key_len], v_cache[group.slots, :, : group.max_key_len]


def _check_fits(chunk: ScheduledChunk, kv_cache: KVCache | PagedKVCache) -> None:
    """A chunk past its cache would write out of bounds (slots) or into another request's block (paged)."""
    end = chunk.start_position + chunk.num_tokens
    if isinstance(kv_cache, KVCache) and end > kv_cache.max_seq_len:
        raise ValueError(
            f"chunk of {chunk.request_id!r} reaches position {end} beyond the cache's max_seq_len "
            f"{kv_cache.max_seq_len}"
        )
    if isinstance(kv_cache, PagedKVCache) and end > len(chunk.block_table) * kv_cache.block_size:
        raise ValueError(
            f"chunk of {chunk.request_id!r} reaches position {end} beyond its {len(chunk.block_table)} blocks of "
            f"{kv_cache.block_size} tokens; the scheduler must grow its block table first"
        )


def check_batch_invariance(device: torch.device, dtype: torch.dtype, paged_attention: bool = True) -> str | None:
    """Why ``ModelRunner(batch_invariant=True)`` cannot be batch invariant on ``device`` in ``dtype``; None if it can.

    On a CPU it needs float32 (oneDNN's product, ``batch_invariant_projection``)
    and perfsuite's in-place attention kernel (a C compiler). On CUDA torch has
    no batch-invariant eager operators: cuBLAS picks its GEMM kernel and
    split-K reduction by the batch's shape, and SDPA its kernel and tiling by
    the padded lengths; only ``torch.compile``'s Triton kernels honour
    ``torch._inductor.config.batch_invariant``, and this runner is eager.
    """
    if device.type == "cuda":
        return (
            f"on CUDA, torch {torch.__version__} has no batch-invariant eager operators (cuBLAS picks its GEMM "
            "kernel and split-K reduction by the number of rows, SDPA its tiling by the padded lengths; only "
            "torch.compile'd Triton kernels honour torch._inductor.config.batch_invariant); run it on a CPU"
        )
    if device.type != "cpu":
        return f"it runs on a CPU only, not {device.type}"
    if dtype != torch.float32:
        return f"it needs float32 (oneDNN's product, the CPU kernel found batch invariant), not {dtype}"
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return "this torch was built without oneDNN, whose product is the CPU kernel found batch invariant"
    if not paged_attention:
        return "it attends through perfsuite's in-place C kernel, turned off here (paged_attention=False)"
    kernel = load_paged_attention()
    if isinstance(kernel, Unavailable):
        reason = f"{kernel.reason}; {kernel.fix}" if kernel.fix else kernel.reason
        return f"it attends through perfsuite's in-place C kernel, which could not be built: {reason}"
    return None


def _layer_ops(decoder: Decoder, *, wanted: bool) -> LayerOps | Unavailable:
    """The fused layer operators for ``decoder``, or why it keeps torch's."""
    if not wanted:
        return Unavailable("turned off (layer_ops=False)")
    if not LayerOps.supports(decoder.embed):
        return Unavailable(
            f"the fused operators are for float32 on the CPU, not {decoder.dtype} on {decoder.device.type}"
        )
    return load_layer_ops()


def _checked_prompt_key_budget(max_keys: int) -> int:
    if max_keys < 0:
        raise ValueError(f"in_place_prefill_max_keys must be 0 or more (0 sends every prompt to SDPA), got {max_keys}")
    return max_keys


def _static_decode(decoder: Decoder, decode_mode: DecodeMode) -> StaticDecodeStep | None:
    """The static-shape decode step of ``static`` and ``cuda-graph``; None under ``packed``."""
    if decode_mode is DecodeMode.PACKED:
        return None
    return StaticDecodeStep(decoder, use_cuda_graph=decode_mode is DecodeMode.CUDA_GRAPH)


def _check_packed(decode_mode: DecodeMode, knob: str) -> None:
    if decode_mode is not DecodeMode.PACKED:
        raise ValueError(
            f"{knob}=True runs the packed decode path, not decode_mode {decode_mode.value!r} (its static steps "
            f"pad rows and attend over every slot); leave decode_mode at {DecodeMode.PACKED.value!r}"
        )


def _as_slice_if_contiguous(slots: list[int]) -> slice | None:
    """A slice selects a view of the cache; an index tensor would copy it."""
    if slots == list(range(slots[0], slots[0] + len(slots))):
        return slice(slots[0], slots[0] + len(slots))
    return None
