"""The paged engine's decode step with static shapes, captured per batch-size bucket.

A decode-only step (every chunk one token) of ``n`` running requests runs
as a step of ``bucket_for(n)`` rows (``perfsuite.engine.decode_buckets``):
each row's token, position and block table, padded to the engine's longest
table. Keys are read through a fixed width of ``max_blocks_per_seq *
block_size`` cells, masked past each row's position, so the shapes depend
only on the bucket and the engine, never on which requests run. On CUDA
one ``torch.cuda.CUDAGraph`` per bucket is captured when the engine is built
(largest first, sharing one memory pool), and a step costs a copy of its
inputs and a replay instead of a launch per kernel.

Padding rows repeat the first row: the same token at the same position
through the same table, so they compute the same keys and values and write
them to the same cell. A duplicate write of equal values is harmless, and
no cell outside the scheduled requests' is touched; padding with a dummy
row would need a cell of its own in the pool (vLLM's ``-1`` slot, skipped by
its kernel), which the block manager would then have to keep out.

On CPU (``decode_mode="static"``) the same ``forward`` runs eagerly, so the
math that CUDA captures, padding included, is the math the CPU tests check.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from perfsuite.engine.decode_buckets import bucket_for, decode_buckets
from perfsuite.engine.layers import Decoder, PagedKVCache, grouped_query_attention, tile_mask
from perfsuite.engine.types import ScheduledChunk

NUM_WARMUP_RUNS = 3  # on a side stream before capture, as for the slot engine's step (static_decode)
NUM_FIXED_COLUMNS = 2  # token id, position; the block table follows


class _CapturedBucket:
    """One bucket's graph and the static buffers its replays read and write."""

    __slots__ = ("graph", "inputs", "next_tokens")

    def __init__(self, graph, inputs: torch.Tensor, next_tokens: torch.Tensor) -> None:
        self.graph = graph  # torch.cuda.CUDAGraph, or a stand-in in the CPU tests
        self.inputs = inputs  # [rows, 2 + max_blocks_per_seq]
        self.next_tokens = next_tokens  # [rows]

    def replay(self, inputs: torch.Tensor) -> torch.Tensor:
        self.inputs.copy_(inputs, non_blocking=True)
        self.graph.replay()
        return self.next_tokens


class PagedDecodeStep:
    """Decode-only steps of one paged engine's pool, bucketed by rows; captured at build with ``use_cuda_graph``."""

    def __init__(
        self,
        decoder: Decoder,
        kv_cache: PagedKVCache,
        *,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        use_cuda_graph: bool = False,
    ) -> None:
        if use_cuda_graph and not self._can_capture_on(decoder.device):
            raise ValueError(f"CUDA graphs need a CUDA device, the model is on {decoder.device}")
        if max_blocks_per_seq < 1:
            raise ValueError(f"max_blocks_per_seq must be >= 1, got {max_blocks_per_seq}")
        self.decoder = decoder
        self.pool = PagedKVCache(kv_cache.keys, kv_cache.values)  # the tensors, not the step that holds this
        self.block_size = kv_cache.block_size
        self.max_blocks_per_seq = max_blocks_per_seq
        self.buckets = decode_buckets(max_num_seqs)
        self.use_cuda_graph = use_cuda_graph
        self.captured: dict[int, _CapturedBucket] = {}
        self.num_steps = 0
        if use_cuda_graph:
            self._capture_every_bucket()

    @torch.inference_mode()
    def __call__(self, chunks: Sequence[ScheduledChunk]) -> list[int]:
        """The greedy token of each sampling chunk, in chunk order, as ``ModelRunner.execute``."""
        inputs = self.row_inputs(chunks)
        self.num_steps += 1
        if self.use_cuda_graph:
            # Pinned, so the copy into the graph's buffer does not block (the host allocator keeps it until done)
            pinned = inputs.pin_memory() if self.decoder.device.type == "cuda" else inputs
            next_tokens = self.captured[inputs.shape[0]].replay(pinned)
        else:
            next_tokens = self.forward(inputs.to(self.decoder.device))
        tokens = next_tokens[: len(chunks)].tolist()
        return [token for token, chunk in zip(tokens, chunks) if chunk.samples]

    def row_inputs(self, chunks: Sequence[ScheduledChunk]) -> torch.Tensor:
        """[bucket, 2 + max_blocks_per_seq] on the host: token, position, block table; padding repeats row 0."""
        width = NUM_FIXED_COLUMNS + self.max_blocks_per_seq
        rows = []
        for chunk in chunks:
            table = chunk.block_table
            if not table or chunk.start_position >= len(table) * self.block_size:
                raise ValueError(
                    f"chunk of {chunk.request_id!r} at position {chunk.start_position} is past its "
                    f"{len(table)} blocks of {self.block_size} tokens; the scheduler must grow its block table first"
                )
            if len(table) > self.max_blocks_per_seq:
                raise ValueError(
                    f"chunk of {chunk.request_id!r} holds {len(table)} blocks, more than the "
                    f"{self.max_blocks_per_seq} this engine's decode step was built for (its max_seq_len)"
                )
            rows.append([chunk.token_ids[0], chunk.start_position, *table, *[0] * (width - 2 - len(table))])
        bucket = bucket_for(self.buckets, len(rows))
        rows.extend([rows[0]] * (bucket - len(rows)))
        return torch.tensor(rows, dtype=torch.long)

    # -- capture ------------------------------------------------------------

    def _capture_every_bucket(self) -> None:
        """Largest bucket first: the smaller ones then fit in the memory pool it reserved."""
        pool = self._new_pool()
        with torch.inference_mode():  # as every later step runs
            for rows in sorted(self.buckets, reverse=True):
                inputs = self._idle_inputs(rows)
                graph, next_tokens = self._record(inputs, pool)
                self.captured[rows] = _CapturedBucket(graph, inputs, next_tokens)

    def _idle_inputs(self, rows: int) -> torch.Tensor:
        """Every row token 0 at position 0 of block 0: what warm-up and capture write there, no request reads
        before writing it itself (a cell is read only at positions its own request has already filled)."""
        width = NUM_FIXED_COLUMNS + self.max_blocks_per_seq
        return torch.zeros(rows, width, dtype=torch.long, device=self.decoder.device)

    @staticmethod
    def _can_capture_on(device: torch.device) -> bool:
        return device.type == "cuda"

    @staticmethod
    def _new_pool():
        return torch.cuda.graph_pool_handle()

    def _record(self, inputs: torch.Tensor, pool):
        device = self.decoder.device
        side_stream = torch.cuda.Stream(device)
        side_stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side_stream):
            for _ in range(NUM_WARMUP_RUNS):
                self.forward(inputs)
        torch.cuda.current_stream(device).wait_stream(side_stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            next_tokens = self.forward(inputs)
        return graph, next_tokens

    # -- the static-shape math ----------------------------------------------

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """One decode token for every row of ``inputs``; no host sync, so CUDA can capture it."""
        token_ids, positions = inputs[:, 0], inputs[:, 1]  # [rows]
        tables = inputs[:, NUM_FIXED_COLUMNS:]  # [rows, max_blocks_per_seq]
        block_size = self.block_size
        cells = tables.gather(1, (positions // block_size)[:, None]).squeeze(1) * block_size + positions % block_size
        key_positions = torch.arange(self.max_blocks_per_seq * block_size, device=inputs.device)
        heads = self.decoder.heads
        mask = (key_positions[None, :] <= positions[:, None])[:, None, None, :]  # [rows, 1, 1, keys]
        mask = tile_mask(mask, heads.num_heads // heads.num_kv_heads)  # once for all layers
        pool = self.pool

        def attend(layer_index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k_cells, v_cells = pool.token_rows(layer_index)  # [cells, kv_heads, head_dim], views
            k_cells[cells] = k
            v_cells[cells] = v
            keys, values = pool.keys_of_rows(layer_index, tables, key_positions.shape[0])  # the full width
            return grouped_query_attention(q.unsqueeze(1), keys, values, mask).squeeze(1)

        hidden = self.decoder.forward(token_ids, positions, attend)  # [rows, hidden]
        return self.decoder.greedy_tokens(hidden)
