"""The ids ``0 .. size - 1`` (KV blocks, cache slots, timeline rows), handed out lowest free first.

Pure Python, and lazy: ids never handed out are one counter, and only those
given back are kept, in a heap. Building a pool costs the same whatever its
size; as ``list(range(size))`` a pool of a billion blocks was a billion
Python ints (some 36 GB) before its first use.
"""

from __future__ import annotations

import heapq


class FreeIds:
    """A free list of ``size`` ids; ``pop`` gives the lowest free id, ``push`` gives one back."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._num_never_used = size
        self._given_back: list[int] = []  # a heap; every id in it is below the ids never used

    def __len__(self) -> int:
        return len(self._given_back) + self._num_never_used

    def pop(self) -> int:
        if self._given_back:
            return heapq.heappop(self._given_back)
        if not self._num_never_used:
            raise IndexError(f"all {self.size} ids are in use")
        self._num_never_used -= 1
        return self.size - self._num_never_used - 1

    def push(self, id_: int) -> None:
        heapq.heappush(self._given_back, id_)

    def ids(self) -> set[int]:
        """Every free id (for checks: it costs the pool's size)."""
        return {*self._given_back, *range(self.size - self._num_never_used, self.size)}
