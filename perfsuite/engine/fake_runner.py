"""A deterministic stand-in for the model runner, in pure Python.

The next token is a hash of the whole sequence so far, so any scheduling
mistake (a token skipped, computed twice, or written to another request's
slot) changes the outputs. It also enforces the cache contract directly: a
chunk must start exactly where its slot's computed tokens end, so a running
sequence's cache is never recomputed or overwritten by another request.

Over a paged cache every cell holds its token and, as its "keys and
values", the hash state of the whole sequence up to it, computed when the
cell is written from the state before it (read through the writer's block
table). As in a real model, a cell's KV depends on every token before it:
a block shared by requests with the same prefix is read correctly by all
of them (prefix caching), while a cell never written, one overwritten by
another request, or a block reused under another prefix breaks the chain
and fails the chunk that reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from perfsuite.engine.kv_memory import KVLayout
from perfsuite.engine.types import ScheduledChunk, SchedulerOutput

_INITIAL_STATE = 17


def _next_state(state: int, token: int) -> int:
    return (state * 1_000_003 + token + 1) % 2_147_483_647


def next_token(token_ids: Sequence[int], vocab_size: int) -> int:
    value = _INITIAL_STATE
    for token in token_ids:
        value = _next_state(value, token)
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
    cells: list[list[tuple[int, int] | None]] = field(default_factory=list)  # [block][offset] = (token, state)

    def __post_init__(self) -> None:
        self.cells = [[None] * self.block_size for _ in range(self.num_blocks)]

    def write(self, chunk: ScheduledChunk) -> None:
        """Compute the chunk's cells from the state before it, as attention reads the keys before a position."""
        state = self._state_before(chunk, chunk.start_position)
        for position, token in enumerate(chunk.token_ids, start=chunk.start_position):
            block, offset = self._cell(chunk, position)
            state = _next_state(state, token)
            self.cells[block][offset] = (token, state)

    def read(self, chunk: ScheduledChunk) -> list[int]:
        """The chunk's sequence so far, read back through its block table, each cell checked against its prefix."""
        tokens = []
        state = _INITIAL_STATE
        for position in range(chunk.start_position + chunk.num_tokens):
            token, state = self._checked_cell(chunk, position, state)
            tokens.append(token)
        own = tuple(tokens[chunk.start_position :])
        if own != chunk.token_ids:
            raise AssertionError(
                f"{chunk.request_id!r} wrote {chunk.token_ids} from position {chunk.start_position} but reads back "
                f"{own}: a block two requests write at once"
            )
        return tokens

    def _state_before(self, chunk: ScheduledChunk, position: int) -> int:
        if position == 0:
            return _INITIAL_STATE
        block, offset = self._cell(chunk, position - 1)
        cell = self.cells[block][offset]
        if cell is None:
            raise AssertionError(
                f"{chunk.request_id!r} starts at {position} but position {position - 1} was never computed"
            )
        return cell[1]

    def _checked_cell(self, chunk: ScheduledChunk, position: int, state_before: int) -> tuple[int, int]:
        block, offset = self._cell(chunk, position)
        cell = self.cells[block][offset]
        if cell is None or cell[1] != _next_state(state_before, cell[0]):
            raise AssertionError(
                f"{chunk.request_id!r} reads position {position} from block {block}, which holds {cell}: "
                "a cell never filled, overwritten, or computed under another prefix"
            )
        return cell

    def _cell(self, chunk: ScheduledChunk, position: int) -> tuple[int, int]:
        index = position // self.block_size
        if index >= len(chunk.block_table):
            raise AssertionError(
                f"{chunk.request_id!r} position {position} is past its {len(chunk.block_table)} blocks"
            )
        return chunk.block_table[index], position % self.block_size


class FakeRunner:
    """``kv_layout`` (and ``device``) make it stand in for a model of that shape in the engines' memory check."""

    def __init__(
        self, vocab_size: int = 97, on_execute=None, kv_layout: KVLayout | None = None, device: str = "cpu"
    ) -> None:
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
