"""Batching bugs planted in perfsuite's engines: what the correctness kit catches (bench/correctness_power.py).

Each mutant is a ``Mutant``: a name, where the bug lives (``runner``: a
``ModelRunner`` subclass, checked by ``runner_equivalence_test`` under the
static, in-flight and paged schedulers; ``engine``: a patch of perfsuite's
engine bookkeeping while a ready test runs: ``runner_equivalence_test`` over
perfsuite's runner, and ``equivalence_test`` of the registered ``engine``).

None of them is the mutant of tests/test_equivalence.py (positions shifted past
4, an open mask, slots flipped, block tables reversed) or of
tests/test_prefix_equivalence.py (prefix-cache books).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from perfsuite.engine import block_manager, kv_cache
from perfsuite.engine.free_ids import FreeIds
from perfsuite.engine.model_runner import ModelRunner


@dataclass(frozen=True)
class Mutant:
    name: str
    level: str  # "runner" or "engine"
    bug: str  # what is wrong, in a few words
    runner: type[ModelRunner] | None = None  # level "runner"
    patch: Callable[[], contextlib.AbstractContextManager] | None = None  # level "engine"
    engine: str | None = None  # level "engine": the registered engine whose ready test runs


# -- runner-level --------------------------------------------------------------------------------------------------


def _replace_batch(batch, **fields):
    return dataclasses.replace(batch, **fields)


class JoiningPositions(ModelRunner):
    """A prompt that joins a batch of decoding requests gets position ids one too high (its rotary, and where a slot
    cache writes its keys)."""

    def _prepare(self, chunks, kv_cache):
        batch = super()._prepare(chunks, kv_cache)
        if not any(not c.is_prefill for c in chunks):
            return batch
        positions, offset = batch.positions.clone(), 0
        for chunk in chunks:
            if chunk.is_prefill and chunk.start_position == 0:
                positions[offset : offset + chunk.num_tokens] += 1
            offset += chunk.num_tokens
        limit = getattr(kv_cache, "max_seq_len", self.max_context) - 1
        return _replace_batch(batch, positions=positions.clamp(max=limit))


class ChunkedPrefillOffByOne(ModelRunner):
    """The second and later chunks of a chunked prompt start one position early (over the last key written)."""

    def execute(self, output, kv_cache):
        chunks = tuple(
            dataclasses.replace(c, start_position=c.start_position - 1)
            if c.is_prefill and c.start_position > 0 and c.num_tokens > 1
            else c
            for c in output.chunks
        )
        return super().execute(dataclasses.replace(output, chunks=chunks), kv_cache)


class SwappedOutputs(ModelRunner):
    """In a step where a request's prompt ends beside decoding requests, the first two sampled tokens trade places."""

    def execute(self, output, kv_cache):
        sampled = super().execute(output, kv_cache)
        sampling = [c for c in output.chunks if c.samples]
        if len(sampled) >= 2 and any(c.is_prefill for c in sampling) and any(not c.is_prefill for c in sampling):
            sampled[0], sampled[1] = sampled[1], sampled[0]
        return sampled


class WrongRowSampled(ModelRunner):
    """In a packed batch of several chunks, a prompt chunk is sampled after its first token, not its last."""

    def _prepare(self, chunks, kv_cache):
        batch = super()._prepare(chunks, kv_cache)
        if len(chunks) < 2:
            return batch
        rows, offset = [], 0
        for chunk in chunks:
            if chunk.samples:
                rows.append(offset if chunk.num_tokens > 1 else offset + chunk.num_tokens - 1)
            offset += chunk.num_tokens
        return _replace_batch(batch, sample_index=torch.tensor(rows, device=batch.sample_index.device))


# -- engine-level --------------------------------------------------------------------------------------------------


class RoundRobinSlots(FreeIds):
    """Slots handed out in turn, 0, 1, ..., wrapping to 0 after the last, whether or not the next is still held.

    Right until the pool wraps: a request then gets the slot of one that is
    still running when requests finish out of order.
    """

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self._turn = 0

    def pop(self) -> int:
        super().pop()  # keep the count of free slots right
        slot, self._turn = self._turn % self.size, self._turn + 1
        return slot


@contextlib.contextmanager
def round_robin_slots() -> Iterator[None]:
    original = kv_cache.FreeIds
    kv_cache.FreeIds = RoundRobinSlots
    try:
        yield
    finally:
        kv_cache.FreeIds = original


class BlockHandedOutTwice(FreeIds):
    """Every other time a block that was given back is reused, it is handed out without leaving the free list, so
    the next request to grow gets it too: two requests write one block. Right until a block is given back."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self._keep = False

    def pop(self) -> int:
        if self._given_back and self._keep:
            self._keep = False
            return self._given_back[0]
        self._keep = bool(self._given_back)
        return super().pop()


@contextlib.contextmanager
def blocks_handed_out_twice() -> Iterator[None]:
    original = block_manager.FreeIds
    block_manager.FreeIds = BlockHandedOutTwice
    try:
        yield
    finally:
        block_manager.FreeIds = original


class StaleTableManager(block_manager.BlockManager):
    """A preempted request's block table is not cleared: on re-admission its chunks still walk its old blocks first,
    though another request may hold them by then (the manager's own books stay right)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._stale: dict[str, tuple[int, ...]] = {}

    def free(self, request_id: str) -> None:
        self._stale[request_id] = super().block_table(request_id)
        super().free(request_id)

    def block_table(self, request_id: str) -> tuple[int, ...]:
        table, stale = super().block_table(request_id), self._stale.get(request_id, ())
        return stale[: len(table)] + table[len(stale) :]


@contextlib.contextmanager
def stale_block_tables() -> Iterator[None]:
    from perfsuite.engine import engine

    original = engine.BlockManager
    engine.BlockManager = StaleTableManager
    try:
        yield
    finally:
        engine.BlockManager = original


MUTANTS = (
    Mutant("joining-positions", "runner", "a joining prompt placed one position late", runner=JoiningPositions),
    Mutant("chunked-prefill-off-by-one", "runner", "a prompt's later chunks start one early",
           runner=ChunkedPrefillOffByOne),
    Mutant("swapped-outputs", "runner", "two requests' tokens swapped in a join step", runner=SwappedOutputs),
    Mutant("wrong-row-sampled", "runner", "a packed prompt sampled after its first token", runner=WrongRowSampled),
    Mutant("slot-reuse-after-wrap", "engine", "slots handed out round-robin, held or not", patch=round_robin_slots,
           engine="inflight"),
    Mutant("reused-block-twice", "engine", "a reused block handed to two requests", patch=blocks_handed_out_twice,
           engine="paged"),
    Mutant("stale-block-table", "engine", "a preempted request's old blocks reused on re-admission",
           patch=stale_block_tables, engine="paged"),
)  # fmt: skip
