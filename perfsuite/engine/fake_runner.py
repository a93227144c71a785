"""A deterministic stand-in for the model runner, in pure Python.

The next token is a hash of the whole sequence so far, so any scheduling
mistake (a token skipped, computed twice, or written to another request's
slot) changes the outputs. It also enforces the cache contract directly: a
chunk must start exactly where its slot's computed tokens end, so a running
sequence's cache is never recomputed or overwritten by another request.

Over a paged cache every cell of every block remembers which request wrote
it; a chunk reads its sequence back through its block table, so a block
shared by two tables, a cell never written, or one overwritten by another
request fails the chunk that reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from perfsuite.engine.kv_memory import KVLayout
from perfsuite.engine.types import ScheduledChunk, SchedulerOutput


def next_token(token_ids: Sequence[int], vocab_size: int) -> int:
    value = 17
    for token in token_ids:
        value = (value * 1_000_003 + token + 1) % 2_147_483_647
    return value % vocab_size


@dataclass(slots=True)
class FakeKVCache:
    num_slots: int
    max_seq_len: int
    tokens: list[list[int]] = field(default_factory=list)
    owners: list[str | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tokens = [[] for _ in range(self.num_slots)]
        self.owners = [None] * self.num_slots


@dataclass(slots=True)
class FakePagedKVCache:
    num_blocks: int
    block_size: int
    cells: list[list[tuple[str, int] | None]] = field(default_factory=list)  # [block][offset] = (writer, token)

    def __post_init__(self) -> None:
        self.cells = [[None] * self.block_size for _ in range(self.num_blocks)]

    def write(self, chunk: ScheduledChunk) -> None:
        for position, token in enumerate(chunk.token_ids, start=chunk.start_position):
            block, offset = self._cell(chunk, position)
            self.cells[block][offset] = (chunk.request_id, token)

    def read(self, chunk: ScheduledChunk) -> list[int]:
        """The chunk's sequence so far, read back through its block table."""
        tokens = []
        for position in range(chunk.start_position + chunk.num_tokens):
            block, offset = self._cell(chunk, position)
            cell = self.cells[block][offset]
            if cell is None or cell[0] != chunk.request_id:
                raise AssertionError(
                    f"{chunk.request_id!r} reads position {position} from block {block}, which holds {cell}: "
                    "a block shared, lost, or never filled"
                )
            tokens.append(cell[1])
        return tokens

    def _cell(self, chunk: ScheduledChunk, position: int) -> tuple[int, int]:
        index = position // self.block_size
        if index >= len(chunk.block_table):
            raise AssertionError(
                f"{chunk.request_id!r} position {position} is past its {len(chunk.block_table)} blocks"
            )
        return chunk.block_table[index], position % self.block_size


class FakeRunner:
    """``kv_layout`` (and ``device``) make it stand in for a model of that shape in the engines' memory check."""

    def __init__(self, vocab_size: int = 97, on_execute=None, kv_layout: KVLayout | None = None,
                 device: str = "cpu") -> None:  # fmt: skip
        self.vocab_size = vocab_size
        self.kv_layout = kv_layout
        self.device = device
        self.num_forward_passes = 0
        self._on_execute = on_execute  # e.g. a sleep, to fake a slower model

    def new_kv_cache(self, num_slots: int, max_seq_len: int) -> FakeKVCache:
        return FakeKVCache(num_slots, max_seq_len)

    def new_paged_kv_cache(self, num_blocks: int, block_size: int) -> FakePagedKVCache:
        return FakePagedKVCache(num_blocks, block_size)

    def execute(self, output: SchedulerOutput, kv_cache: FakeKVCache | FakePagedKVCache) -> list[int]:
        if isinstance(kv_cache, FakePagedKVCache):
            sampled = self._execute_paged(output, kv_cache)
        else:
            sampled = self._execute_slots(output, kv_cache)
        self.num_forward_passes += 1
        if self._on_execute is not None:
            self._on_execute(output)
        return sampled

    def _execute_paged(self, output: SchedulerOutput, kv_cache: FakePagedKVCache) -> list[int]:
        sampled = []
        for chunk in output.chunks:
            kv_cache.write(chunk)
        for chunk in output.chunks:  # after every write, so a block two chunks share shows
            tokens = kv_cache.read(chunk)
            if chunk.samples:
                sampled.append(next_token(tokens, self.vocab_size))
        return sampled

    def _execute_slots(self, output: SchedulerOutput, kv_cache: FakeKVCache) -> list[int]:
        sampled = []
        for chunk in output.chunks:
            if chunk.is_padding:
                continue
            if chunk.start_position == 0:
                kv_cache.tokens[chunk.slot] = []
                kv_cache.owners[chunk.slot] = chunk.request_id
            slot_tokens = kv_cache.tokens[chunk.slot]
            if kv_cache.owners[chunk.slot] != chunk.request_id:
                raise AssertionError(
                    f"{chunk.request_id!r} wrote slot {chunk.slot} owned by {kv_cache.owners[chunk.slot]!r}"
                )
            if chunk.start_position != len(slot_tokens):
                raise AssertionError(
                    f"{chunk.request_id!r} chunk starts at {chunk.start_position} but slot {chunk.slot} "
                    f"holds {len(slot_tokens)} computed tokens: the cache would be recomputed or skipped"
                )
            if chunk.start_position + chunk.num_tokens > kv_cache.max_seq_len:
                raise AssertionError(f"{chunk.request_id!r} overflows slot {chunk.slot}")
            slot_tokens.extend(chunk.token_ids)
            if chunk.samples:
                sampled.append(next_token(slot_tokens, self.vocab_size))
        return sampled


def fake_reference(prompt: Sequence[int], params, eos_token_id: int | None, vocab_size: int) -> tuple[int, ...]:
    """What an unbatched greedy decoder over the fake model produces."""
    tokens = list(prompt)
    output: list[int] = []
    while True:
        token = next_token(tokens, vocab_size)
        tokens.append(token)
        output.append(token)
        if params.finish_reason(token, len(output), eos_token_id) is not None:
            return tuple(output)
