"""Paged KV accounting: a pool of fixed-size blocks and one block table per request.

Pure Python (nano-vllm's ``block_manager.py``, vLLM v1's KV cache manager
without prefix caching; ``perfsuite.engine.prefix_cache`` adds it). The tensors live in ``perfsuite.engine.layers``'s
``PagedKVCache``; this module only decides which blocks a request's tokens
go to. Token ``p`` of a request sits in block ``table[p // block_size]`` at
offset ``p % block_size``.

Methods come in check/act pairs: ``can_allocate``/``allocate`` for a request
that holds nothing yet, ``can_append``/``append_slots`` to grow a table, and
``free``. The prefix-cache hooks (``cached_prefix``, ``cache_computed_blocks``)
find nothing and cache nothing here, so the scheduler drives both managers
the same way. An act whose check fails raises: the scheduler decides what to do
when memory runs out (queue or preempt), never this module.
"""

from __future__ import annotations

from collections.abc import Sequence

from perfsuite.engine.free_ids import FreeIds

_NOTHING_TO_GROW = "holds no blocks to grow; give it its first blocks with allocate"


class BlockManager:
    """Hands out ``num_blocks`` blocks of ``block_size`` tokens each.

    The lowest free block is handed out first, so block use is deterministic
    and a run replays block for block.
    """

    has_prefix_cache = False

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be an integer >= 1, got {num_blocks!r}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1 (tokens per block), got {block_size!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free_blocks = FreeIds(num_blocks)
        self._tables: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_token_slots(self) -> int:
        return self.num_blocks * self.block_size

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def fits(self, num_tokens: int) -> bool:
        """Whether ``num_tokens`` tokens of one request fit the whole pool (else it can never run)."""
        return self.num_blocks_for(num_tokens) <= self.num_blocks

    def free_block_ids(self) -> set[int]:
        """The blocks on the free list (for checks: it costs the pool's size)."""
        return self._free_blocks.ids()

    def block_table(self, request_id: str) -> tuple[int, ...]:
        return tuple(self._table(request_id, "has no block table; allocate blocks for it first"))

    def owners(self) -> dict[str, tuple[int, ...]]:
        return {request_id: tuple(table) for request_id, table in self._tables.items()}

    # -- check/act pairs ----------------------------------------------------

    def cached_prefix(self, token_ids: Sequence[int]) -> tuple[int, ...]:
        """Blocks that already hold the KV of ``token_ids``' first full blocks: none without a prefix cache."""
        return ()

    def cache_computed_blocks(self, request_id: str, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """Make ``request_id``'s full computed blocks findable by ``cached_prefix``: nothing to do without one."""

    def full_block_hashes(self, token_ids: Sequence[int], first: int, stop: int) -> list[bytes]:
        """The chained hashes of ``token_ids``' full blocks ``first`` to ``stop``: none without a prefix cache."""
        return []

    @property
    def num_evicted_blocks(self) -> int:
        """Cached blocks evicted so far to make room (always 0 without a prefix cache)."""
        return 0

    def num_blocks_taken(self, num_tokens: int, cached_blocks: tuple[int, ...] = ()) -> int:
        """How far ``num_free_blocks`` drops when a request is allocated ``num_tokens`` over ``cached_blocks``."""
        return self.num_blocks_for(num_tokens)

    def can_allocate(self, num_tokens: int, cached_blocks: tuple[int, ...] = ()) -> bool:
        """Whether a request that holds no blocks can get blocks for ``num_tokens`` tokens now."""
        return self.num_blocks_taken(num_tokens, cached_blocks) <= self.num_free_blocks

    def allocate(self, request_id: str, num_tokens: int, cached_blocks: tuple[int, ...] = ()) -> tuple[int, ...]:
        """A new block table holding ``num_tokens`` tokens for ``request_id``, starting with ``cached_blocks``.

        ``cached_blocks`` (from ``cached_prefix``) are shared, not copied: the
        request's first tokens are already computed in them.
        """
        if request_id in self._tables:
            raise RuntimeError(
                f"request {request_id!r} already holds blocks {self._tables[request_id]}; "
                "grow its table with append_slots, or free it before allocating again"
            )
        if not self.can_allocate(num_tokens, cached_blocks):
            raise RuntimeError(
                f"cannot allocate {num_tokens} tokens ({self.num_blocks_for(num_tokens)} blocks of "
                f"{self.block_size}) for {request_id!r}: {self.num_free_blocks} blocks free; call can_allocate first"
            )
        self._tables[request_id] = self._share(request_id, cached_blocks)
        return self.append_slots(request_id, num_tokens)

    def can_append(self, request_id: str, num_tokens: int) -> bool:
        """Whether ``request_id``'s table can grow to hold ``num_tokens`` tokens in all."""
        table = self._table(request_id, _NOTHING_TO_GROW)
        return self.num_blocks_for(num_tokens) - len(table) <= self.num_free_blocks

    def append_slots(self, request_id: str, num_tokens: int) -> tuple[int, ...]:
        """Grow ``request_id``'s table to hold ``num_tokens`` tokens in all (a table never shrinks)."""
        table = self._table(request_id, _NOTHING_TO_GROW)
        if not self.can_append(request_id, num_tokens):
            raise RuntimeError(
                f"cannot grow {request_id!r} to {num_tokens} tokens: it needs "
                f"{self.num_blocks_for(num_tokens) - len(table)} more blocks, {self.num_free_blocks} are free; "
                "call can_append first and preempt a request when it says no"
            )
        while len(table) < self.num_blocks_for(num_tokens):
            table.append(self._take_free_block())
        return tuple(table)

    def free(self, request_id: str) -> None:
        """Return every block of ``request_id`` to the pool (the last first: it is the least likely to be shared)."""
        table = self._table(
            request_id, "holds no blocks: it was never allocated or is freed already; free each request once"
        )
        for block in reversed(table):
            self._release_block(block)
        del self._tables[request_id]
        self._forget(request_id)

    # -- what a prefix cache changes ------------------------------------------

    def _share(self, request_id: str, cached_blocks: tuple[int, ...]) -> list[int]:
        if cached_blocks:
            raise RuntimeError(f"{type(self).__name__} has no prefix cache; {request_id!r} cannot share blocks")
        return []

    def _take_free_block(self) -> int:
        return self._free_blocks.pop()

    def _release_block(self, block: int) -> None:
        self._free_blocks.push(block)

    def _forget(self, request_id: str) -> None:
        """Drop what the manager kept about ``request_id`` besides its table."""

    def _table(self, request_id: str, problem: str) -> list[int]:
        table = self._tables.get(request_id)
        if table is None:
            raise RuntimeError(f"request {request_id!r} {problem}")
        return table
