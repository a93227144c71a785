"""A decode step with static shapes, so that CUDA can replay it as a graph.

When every chunk of a step is one token, the step can run over a fixed
batch: one row per cache slot, attending over the slot's whole
``max_seq_len`` with a mask built from its position (gpt-fast's layout). The
shapes then depend only on the cache, never on which requests are running,
so one captured ``torch.cuda.CUDAGraph`` per cache replays every such step
and a step costs a few launches instead of one per kernel.

A row whose slot is not in the step still computes, and its output is
ignored. Its K/V write stores back the entry already in the cache, so a free
slot or one whose prefill is half done keeps every bit; the cache stays the
packed path's own tensors, which prefill one request and decode it here.

On CPU the same ``forward`` runs eagerly: the math that CUDA captures is the
math the CPU tests check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from perfsuite.engine.layers import Decoder, KVCache
from perfsuite.engine.types import ScheduledChunk

# Runs on a side stream before capture, as PyTorch's CUDA graph notes ask, so
# lazy initialisation (cuBLAS workspaces, kernel selection) is not captured.
NUM_WARMUP_RUNS = 3


@dataclass(frozen=True, slots=True)
class _CapturedStep:
    graph: torch.cuda.CUDAGraph
    inputs: torch.Tensor  # [3, num_slots] the static buffer that replays read
    next_tokens: torch.Tensor  # [num_slots] the static buffer that replays write

    def replay(self, inputs: torch.Tensor) -> torch.Tensor:
        self.inputs.copy_(inputs)
        self.graph.replay()
        return self.next_tokens


class StaticDecodeStep:
    """Runs decode-only steps of ``decoder`` over all slots of a ``KVCache``.

    With ``use_cuda_graph`` the step is captured once per cache (its tensors'
    addresses and shape, which is what a graph bakes in) and replayed after.
    """

    def __init__(self, decoder: Decoder, *, use_cuda_graph: bool = False) -> None:
        if use_cuda_graph and decoder.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, the model is on {decoder.device}")
        self.decoder = decoder
        self.use_cuda_graph = use_cuda_graph
        self.num_captures = 0
        self._captured: dict[tuple[int, int, int, int], _CapturedStep] = {}

    @staticmethod
    def handles(chunks: Sequence[ScheduledChunk]) -> bool:
        """Whether every chunk is one token: a decode token, or one token of a prompt."""
        return bool(chunks) and all(chunk.num_tokens == 1 for chunk in chunks)

    @torch.inference_mode()
    def __call__(self, chunks: Sequence[ScheduledChunk], kv_cache: KVCache) -> list[int]:
        """The greedy token of each sampling chunk, in chunk order, as ``ModelRunner.execute``."""
        inputs = self._slot_inputs(chunks, kv_cache)
        if self.use_cuda_graph:
            next_tokens = self._captured_step(kv_cache).replay(inputs)
        else:
            next_tokens = self.forward(inputs.to(self.decoder.device), kv_cache)
        tokens = next_tokens.tolist()
        return [tokens[chunk.slot] for chunk in chunks if chunk.samples]

    def _slot_inputs(self, chunks: Sequence[ScheduledChunk], kv_cache: KVCache) -> torch.Tensor:
        """Token, position and is-scheduled flag of every slot's row; rows not scheduled stay 0."""
        token_ids, positions, is_scheduled = ([0] * kv_cache.num_slots for _ in range(3))
        for chunk in chunks:
            if chunk.start_position >= kv_cache.max_seq_len:
                raise ValueError(
                    f"chunk of {chunk.request_id!r} reaches position {chunk.start_position + 1} "
                    f"beyond the cache's max_seq_len {kv_cache.max_seq_len}"
                )
            token_ids[chunk.slot] = chunk.token_ids[0]
            positions[chunk.slot] = chunk.start_position
            is_scheduled[chunk.slot] = 1
        return torch.tensor((token_ids, positions, is_scheduled), dtype=torch.long)  # [3, num_slots]

    # -- capture ------------------------------------------------------------

    def _captured_step(self, kv_cache: KVCache) -> _CapturedStep:
        key = (kv_cache.keys.data_ptr(), kv_cache.values.data_ptr(), kv_cache.num_slots, kv_cache.max_seq_len)
        if key not in self._captured:
            self._captured[key] = self._capture(kv_cache)
        return self._captured[key]

    def _capture(self, kv_cache: KVCache) -> _CapturedStep:
        # All rows unscheduled: warm-up runs store back what the cache holds.
        inputs = torch.zeros(3, kv_cache.num_slots, dtype=torch.long, device=self.decoder.device)
        side_stream = torch.cuda.Stream(self.decoder.device)
        side_stream.wait_stream(torch.cuda.current_stream(self.decoder.device))
        with torch.cuda.stream(side_stream):
            for _ in range(NUM_WARMUP_RUNS):
                self.forward(inputs, kv_cache)
        torch.cuda.current_stream(self.decoder.device).wait_stream(side_stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            next_tokens = self.forward(inputs, kv_cache)
        self.num_captures += 1
        return _CapturedStep(graph, inputs, next_tokens)

    # -- the static-shape math ----------------------------------------------

    def forward(self, inputs: torch.Tensor, kv_cache: KVCache) -> torch.Tensor:
        """One decode token for every slot's row; no host sync, so CUDA can capture it."""
        token_ids, positions, is_scheduled = inputs[0], inputs[1], inputs[2] != 0  # each [num_slots]
        rows = torch.arange(kv_cache.num_slots, device=inputs.device)
        mask = self._mask(positions, kv_cache.max_seq_len)

        def attend(layer_index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k_cache, v_cache = kv_cache.keys[layer_index], kv_cache.values[layer_index]
            self._store(k_cache, rows, positions, is_scheduled, k)
            self._store(v_cache, rows, positions, is_scheduled, v)
            attended = F.scaled_dot_product_attention(
                q.unsqueeze(2), k_cache, v_cache, attn_mask=mask, enable_gqa=True
            )  # [num_slots, heads, 1, head_dim]
            return attended.squeeze(2)

        hidden = self.decoder.forward(token_ids, positions, attend)  # [num_slots, hidden]
        return self.decoder.greedy_tokens(hidden)

    @staticmethod
    def _mask(positions: torch.Tensor, max_seq_len: int) -> torch.Tensor:
        """Each row sees its slot's keys up to its own position; later ones are stale or empty."""
        key_positions = torch.arange(max_seq_len, device=positions.device)
        return (key_positions[None, :] <= positions[:, None])[:, None, None, :]  # [num_slots, 1, 1, max_seq_len]

    @staticmethod
    def _store(cache: torch.Tensor, rows, positions, is_scheduled, new: torch.Tensor) -> None:
        """Write each scheduled row's entry; an unscheduled row writes back what is there."""
        old = cache[rows, :, positions]  # [num_slots, kv_heads, head_dim]
        cache[rows, :, positions] = torch.where(is_scheduled[:, None, None], new, old)
