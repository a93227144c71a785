"""A decode step with static shapes, so that CUDA can replay it as a graph.

When every chunk of a step is one token, the step can run over a fixed
batch: one row per cache slot, attending over the slot's whole
``max_seq_len`` with a mask built from its position (gpt-fast's layout). The
shapes then depend only on the cache, never on which requests are running,
so one captured ``torch.cuda.CUDAGraph`` per cache shape replays every such
step and a step costs a few launches instead of one per kernel. The width
attended is the engine's own ``max_seq_len``, so an engine sized for short
requests decodes over a short cache whatever else the session runs.

A row whose slot is not in the step still computes, and its output is
ignored. Its K/V write stores back the entry already in the cache, so a free
slot or one whose prefill is half done keeps every bit; the cache stays the
packed path's own tensors, which prefill one request and decode it here.

On CPU the same ``forward`` runs eagerly: the math that CUDA captures is the
math the CPU tests check.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Sequence

import torch

from perfsuite.engine.graph_cache import DEFAULT_MAX_GRAPHS, DecodeShape, GraphCache
from perfsuite.engine.layers import Decoder, KVCache, grouped_query_attention
from perfsuite.engine.types import ScheduledChunk

# Runs on a side stream before capture, as PyTorch's CUDA graph notes ask, so
# lazy initialisation (cuBLAS workspaces, kernel selection) is not captured.
NUM_WARMUP_RUNS = 3


class _LeasedKVCache(KVCache):
    """An engine's handle on a captured step's cache tensors.

    A plain subclass, without ``__slots__``, so that a weak reference tells
    when the engine holding it is gone and another may take the tensors.
    """


class _CapturedStep:
    """A decode step captured over one KV cache's tensors, and who last took them."""

    __slots__ = ("_tenant", "graph", "inputs", "keys", "next_tokens", "values")

    # None once released: the graph cache has dropped the step, and nothing replays it again.
    inputs: torch.Tensor | None
    next_tokens: torch.Tensor | None
    keys: torch.Tensor | None
    values: torch.Tensor | None

    def __init__(self, graph, inputs: torch.Tensor, next_tokens: torch.Tensor, kv_cache: KVCache) -> None:
        self.graph = graph  # torch.cuda.CUDAGraph
        self.inputs = inputs  # [3, num_slots] the static buffer that replays read
        self.next_tokens = next_tokens  # [num_slots] the static buffer that replays write
        self.keys, self.values = kv_cache.keys, kv_cache.values
        self._tenant = _reference(kv_cache)

    def serves(self, kv_cache: KVCache) -> bool:
        """Whether replays read and write exactly this cache's tensors."""
        return kv_cache.keys is self.keys and kv_cache.values is self.values

    @property
    def is_leased(self) -> bool:
        """Whether an engine holding this step's cache may still run."""
        return self._tenant() is not None

    def lease(self) -> KVCache:
        """The cache tensors, handed to a new engine; the step now follows that engine's life."""
        assert self.keys is not None and self.values is not None, "a released step is never leased"
        kv_cache = _LeasedKVCache(self.keys, self.values)
        self._tenant = weakref.ref(kv_cache)
        return kv_cache

    def replay(self, inputs: torch.Tensor) -> torch.Tensor:
        assert self.inputs is not None and self.next_tokens is not None, "a released step is never replayed"
        self.inputs.copy_(inputs)
        self.graph.replay()
        return self.next_tokens

    def release(self) -> None:
        """Drop the graph and its buffers; its private memory pool is free once nothing else holds them."""
        self.graph.reset()
        self.graph = self.inputs = self.next_tokens = self.keys = self.values = None


def _reference(kv_cache: KVCache) -> Callable[[], KVCache | None]:
    try:
        return weakref.ref(kv_cache)
    except TypeError:  # a cache built outside new_kv_cache (no weak references): never handed to another engine
        return lambda: kv_cache


class StaticDecodeStep:
    """Runs decode-only steps of ``decoder`` over all slots of a ``KVCache``.

    With ``use_cuda_graph`` the step is captured when an engine's cache is
    made (``new_kv_cache``, from the engine's constructor), so no request
    pays for a capture. Captured steps are kept by shape (rows,
    ``max_seq_len``, dtype) in a ``GraphCache`` of at most ``max_graphs``,
    each with the cache tensors it was captured over: an engine of a shape
    whose last engine is gone takes that cache and its graph, capturing
    nothing, so a session that builds an engine per test keeps at most
    ``max_graphs`` graphs and their memory pools.
    """

    def __init__(self, decoder: Decoder, *, use_cuda_graph: bool = False, max_graphs: int = DEFAULT_MAX_GRAPHS) -> None:
        if use_cuda_graph and not self._can_capture_on(decoder.device):
            raise ValueError(f"CUDA graphs need a CUDA device, the model is on {decoder.device}")
        self.decoder = decoder
        self.use_cuda_graph = use_cuda_graph
        self.num_captures = 0
        self.graphs: GraphCache[_CapturedStep] = GraphCache(max_graphs)

    @staticmethod
    def handles(chunks: Sequence[ScheduledChunk]) -> bool:
        """Whether every chunk is one token: a decode token, or one token of a prompt."""
        return bool(chunks) and all(chunk.num_tokens == 1 for chunk in chunks)

    def new_kv_cache(self, num_slots: int, max_seq_len: int) -> KVCache:
        """A new engine's KV cache; with CUDA graphs, its decode step is captured (or found) here."""
        if not self.use_cuda_graph:
            return self.decoder.new_kv_cache(num_slots, max_seq_len)
        shape = self.shape_of(num_slots, max_seq_len)
        step = self.graphs.get(shape)
        if step is not None and step.is_leased:
            gc.collect()  # an engine dropped inside a reference cycle is gone only once collected
        if step is None or step.is_leased:
            kv_cache = self.decoder.new_kv_cache(num_slots, max_seq_len)  # ordinary tensors, as in the other modes
            with torch.inference_mode():  # as every later step runs
                step = self._capture(kv_cache)
            self._keep(shape, step)
        return step.lease()

    def shape_of(self, num_slots: int, max_seq_len: int) -> DecodeShape:
        return DecodeShape(num_slots, max_seq_len, str(self.decoder.dtype))

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
        shape = self.shape_of(kv_cache.num_slots, kv_cache.max_seq_len)
        step = self.graphs.get(shape)
        if step is None or not step.serves(kv_cache):
            # Evicted, or its shape's graph now serves another engine's cache
            # (two engines of one shape alive at once): capture over this one.
            step = self._capture(kv_cache)
            self._keep(shape, step)
        return step

    def _keep(self, shape: DecodeShape, step: _CapturedStep) -> None:
        displaced = self.graphs.put(shape, step)
        if not displaced:
            return
        while displaced:
            displaced.pop().release()
        if self.decoder.device.type == "cuda":
            torch.cuda.empty_cache()  # hand the released pools back to the device, not just to PyTorch's cache

    def _capture(self, kv_cache: KVCache) -> _CapturedStep:
        # All rows unscheduled: warm-up runs store back what the cache holds.
        inputs = torch.zeros(3, kv_cache.num_slots, dtype=torch.long, device=self.decoder.device)
        graph, next_tokens = self._record(inputs, kv_cache)
        self.num_captures += 1
        return _CapturedStep(graph, inputs, next_tokens, kv_cache)

    def _record(self, inputs: torch.Tensor, kv_cache: KVCache):
        """A ``torch.cuda.CUDAGraph`` of ``forward`` over ``inputs`` and ``kv_cache``, and its output buffer."""
        device = self.decoder.device
        side_stream = torch.cuda.Stream(device)
        side_stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side_stream):
            for _ in range(NUM_WARMUP_RUNS):
                self.forward(inputs, kv_cache)
        torch.cuda.current_stream(device).wait_stream(side_stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # a private memory pool per graph, so evicting one frees its pool
            next_tokens = self.forward(inputs, kv_cache)
        return graph, next_tokens

    @staticmethod
    def _can_capture_on(device: torch.device) -> bool:
        return device.type == "cuda"

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
            # Query heads folded per KV head, not enable_gqa with a mask (the math kernel on CUDA, K/V repeated)
            attended = grouped_query_attention(
                q.unsqueeze(1), k_cache, v_cache, mask
            )  # [num_slots, 1, heads, head_dim]
            return attended.squeeze(1)

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
