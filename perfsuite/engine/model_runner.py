"""The model runner: the only engine code that turns scheduled chunks into tensors.

It turns a ``SchedulerOutput`` into tensors, runs one forward pass of the
decoder (``perfsuite.engine.layers``) over a KV cache with a fixed shape per
slot (gpt-fast style: ``[layers, slots, kv_heads, max_seq_len, head_dim]``,
updated by index) and returns the greedy token of every chunk that samples.

Tokens are packed: the projections and the MLP, which are almost all the
work, see ``[num_tokens, hidden]`` with no padding whatever the mix of prompt
and decode lengths. Only attention groups the tokens per slot, because each
query must see its own slot's keys up to its own position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from perfsuite.engine.layers import Decoder, KVCache
from perfsuite.engine.static_decode import StaticDecodeStep
from perfsuite.engine.types import DecodeMode, ScheduledChunk, SchedulerOutput


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

    The runner holds the weights (a ``Decoder``); every engine built on it
    shares them and brings its own ``KVCache`` from ``new_kv_cache``.

    ``decode_mode`` picks how steps whose chunks are all one token run (see
    ``DecodeMode``); other steps always take the packed path.
    """

    def __init__(
        self,
        model,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        decode_mode: DecodeMode | str = DecodeMode.PACKED,
    ) -> None:
        decode_mode = DecodeMode.parse(decode_mode)
        device = torch.device(device) if device is not None else model.device
        self.decoder = Decoder.from_hf(model, device, dtype or model.dtype)
        self.num_forward_passes = 0
        self.static_decode = (
            None
            if decode_mode is DecodeMode.PACKED
            else StaticDecodeStep(self.decoder, use_cuda_graph=decode_mode is DecodeMode.CUDA_GRAPH)
        )

    @property
    def device(self) -> torch.device:
        return self.decoder.device

    @property
    def max_context(self) -> int:
        return self.decoder.max_context

    def new_kv_cache(self, num_slots: int, max_seq_len: int) -> KVCache:
        """An engine's cache; under ``cuda-graph`` its decode step is captured here, at engine build."""
        if self.static_decode is not None:
            return self.static_decode.new_kv_cache(num_slots, max_seq_len)
        return self.decoder.new_kv_cache(num_slots, max_seq_len)

    # -- one step -----------------------------------------------------------

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput, kv_cache: KVCache) -> list[int]:
        """Run every chunk; return the greedy token of each sampling chunk, in order."""
        if self.static_decode is not None and self.static_decode.handles(output.chunks):
            sampled = self.static_decode(output.chunks, kv_cache)
        else:
            sampled = self._packed_step(output.chunks, kv_cache)
        self.num_forward_passes += 1
        return sampled

    def _packed_step(self, chunks: tuple[ScheduledChunk, ...], kv_cache: KVCache) -> list[int]:
        batch = self._prepare(chunks, kv_cache.max_seq_len)

        def attend(layer_index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k_cache, v_cache = kv_cache.keys[layer_index], kv_cache.values[layer_index]
            k_cache[batch.token_slots, :, batch.positions] = k
            v_cache[batch.token_slots, :, batch.positions] = v
            attended = torch.empty_like(q)  # [T, heads, head_dim]
            for group in batch.groups:
                attended[group.token_index] = self._attend(group, q, k_cache, v_cache)
            return attended

        hidden = self.decoder.forward(batch.input_ids, batch.positions, attend)  # [T, hidden]
        if batch.sample_index.numel() == 0:
            return []
        return self.decoder.greedy_tokens(hidden[batch.sample_index]).tolist()

    def _attend(self, group: _AttentionGroup, q, k_cache, v_cache) -> torch.Tensor:
        keys = k_cache[group.slots, :, : group.max_key_len]  # [rows, kv_heads, keys, head_dim]
        values = v_cache[group.slots, :, : group.max_key_len]
        group_q = q[group.token_index]  # [group_tokens, heads, head_dim]
        if group.query_rows is None:
            queries = group_q.unsqueeze(1)  # [rows, 1, heads, head_dim]
        else:
            heads = self.decoder.heads
            queries = group_q.new_zeros(group.num_rows, group.max_query_len, heads.num_heads, heads.head_dim)
            queries[group.query_rows, group.query_cols] = group_q
        out = F.scaled_dot_product_attention(
            queries.transpose(1, 2), keys, values, attn_mask=group.mask, enable_gqa=True
        )  # [rows, heads, queries, head_dim]
        out = out.transpose(1, 2)
        if group.query_rows is None:
            return out.squeeze(1)
        return out[group.query_rows, group.query_cols]

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


def _as_slice_if_contiguous(slots: list[int]) -> slice | None:
    """A slice selects a view of the cache; an index tensor would copy it."""
    if slots == list(range(slots[0], slots[0] + len(slots))):
        return slice(slots[0], slots[0] + len(slots))
    return None
