"""A bounded cache of captured decode steps, keyed by batch shape.

A CUDA graph bakes in the shapes and addresses of every tensor it touches,
so one captured decode step serves every engine whose KV cache has its shape
(rows, ``max_seq_len``, dtype), provided they run over the same cache tensors.
Each captured step holds a private memory pool besides its cache, so only the
most recently used few are kept; the caller releases what ``put`` displaces.

Pure Python: what a captured step holds and how its memory goes back to the
device is ``perfsuite.engine.static_decode``'s business.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

# A perf session's engines come in a few shapes (batch sizes x cache lengths);
# more than this are captured again when they come back, which costs a capture
# at engine build time, never inside a timed run.
DEFAULT_MAX_GRAPHS = 4

Step = TypeVar("Step")


@dataclass(frozen=True, slots=True)
class DecodeShape:
    """What a captured decode step is specialised to, besides its cache's addresses."""

    num_slots: int
    max_seq_len: int
    dtype: str  # "torch.bfloat16": the name, so that this module needs no torch

    def __str__(self) -> str:
        return f"{self.num_slots} rows x {self.max_seq_len} tokens, {self.dtype}"


class GraphCache(Generic[Step]):
    """At most ``max_graphs`` captured steps, the least recently used evicted first."""

    def __init__(self, max_graphs: int = DEFAULT_MAX_GRAPHS) -> None:
        if max_graphs < 1:
            raise ValueError(f"max_graphs must be >= 1, got {max_graphs}")
        self.max_graphs = max_graphs
        self.num_evictions = 0
        self._steps: OrderedDict[DecodeShape, Step] = OrderedDict()

    def __len__(self) -> int:
        return len(self._steps)

    def __contains__(self, shape: DecodeShape) -> bool:
        return shape in self._steps

    def shapes(self) -> list[DecodeShape]:
        """The cached shapes, least recently used first."""
        return list(self._steps)

    def get(self, shape: DecodeShape) -> Step | None:
        """The step captured for ``shape``, now the most recently used; None when there is none."""
        step = self._steps.get(shape)
        if step is not None:
            self._steps.move_to_end(shape)
        return step

    def put(self, shape: DecodeShape, step: Step) -> list[Step]:
        """Keep ``step`` for ``shape`` as the most recently used; return the steps it displaced, to be released.

        Those are the step ``shape`` held before (another cache of that shape)
        and the least recently used ones beyond ``max_graphs``.
        """
        displaced = []
        previous = self._steps.pop(shape, None)
        if previous is not None and previous is not step:
            displaced.append(previous)
        self._steps[shape] = step
        while len(self._steps) > self.max_graphs:
            displaced.append(self._steps.popitem(last=False)[1])
            self.num_evictions += 1
        return displaced
