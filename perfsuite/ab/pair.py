"""Both sides of an A/B comparison, and the order their repeats run in.

Repeats alternate in pairs, ABBA: pair 0 runs A then B, pair 1 B then A, and
so on. Within a pair both sides see nearly the same machine (a drift slower
than a pair cancels in its ratio), and across pairs whatever favours the
second run of a pair (a warm cache, a CPU clock that just ramped up) favours
A and B equally often: it widens the ratios' spread instead of shifting it,
which keeps the signed-rank test's symmetry assumption (``judge.paired``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from perfsuite.ab import wire
from perfsuite.ab.trees import Trees
from perfsuite.ab.workers import EngineSpec, Side, SideRunner, Worker, WorkerError
from perfsuite.engine.types import Request, RunResult

# What a second copy needs beyond its weights: the KV cache and activations of a perf test's batch.
SECOND_COPY_MARGIN = 1.5
REFERENCE, CURRENT = "A", "B"


class NoRoomForSecondCopy(WorkerError):
    """The device cannot hold a second copy of the model."""


@dataclass(frozen=True, slots=True)
class PairedRuns:
    """A test's timed repeats on both sides, pair by pair."""

    reference: tuple[RunResult, ...]  # side A
    current: tuple[RunResult, ...]  # side B
    order: tuple[str, ...]  # "AB" or "BA", per pair

    def __post_init__(self) -> None:
        if not len(self.reference) == len(self.current) == len(self.order):
            raise ValueError("every pair has one run of each side")


def pair_order(num_pairs: int) -> tuple[str, ...]:
    """ABBA ABBA...: A first in even pairs, B first in odd ones."""
    return tuple(REFERENCE + CURRENT if i % 2 == 0 else CURRENT + REFERENCE for i in range(num_pairs))


class ABRunner:
    """The reference's worker (A) and the current tree's (B), each with the model loaded once."""

    def __init__(self, trees: Trees, load: wire.Load, timeout: float, start: Callable[[Side], Worker] = Worker):
        self.trees = trees
        self.current = SideRunner(Side(CURRENT, "the current tree", trees.current), load, timeout, start)
        self.reference = SideRunner(Side(REFERENCE, f"REF {trees.reference_label}", trees.reference),
                                    load, timeout, start)  # fmt: skip

    @property
    def loaded(self) -> wire.Loaded:
        """What the current tree's worker loaded: the model's limits the workloads are built for."""
        self.current.worker()
        return self.current.loaded

    def start(self) -> None:
        """The current side first: once it holds a copy, is there room for the reference's?"""
        self.current.worker()
        check_room_for_second_copy(self.current.loaded)
        self.reference.worker()

    def tokenize(self, text: str) -> tuple[int, ...]:
        return self.current.tokenize(text)

    def side(self, label: str) -> SideRunner:
        return self.reference if label == REFERENCE else self.current

    def build(self, spec: EngineSpec) -> tuple[wire.Built, wire.Built]:
        return self.reference.build(spec), self.current.build(spec)

    def run_pairs(
        self,
        spec: EngineSpec,
        requests: Sequence[Request],
        max_concurrency: int | None,
        num_warmups: int,
        num_pairs: int,
    ) -> PairedRuns:
        """``num_warmups`` discarded runs a side, then ``num_pairs`` pairs in ABBA order."""
        encoded = tuple(wire.encode(r) for r in requests)
        order = (REFERENCE + CURRENT,) * num_warmups + pair_order(num_pairs)
        runs: dict[str, list[RunResult]] = {REFERENCE: [], CURRENT: []}
        for pair_index, labels in enumerate(order):
            for label in labels:
                result = wire.decode(RunResult, self.side(label).run(spec, encoded, max_concurrency))
                if pair_index >= num_warmups:
                    runs[label].append(result)
        return PairedRuns(tuple(runs[REFERENCE]), tuple(runs[CURRENT]), order[num_warmups:])

    def close(self) -> None:
        try:
            self.reference.close()
        finally:
            self.current.close()


def check_room_for_second_copy(loaded: wire.Loaded) -> None:
    if loaded.free_bytes is None:
        return
    needed = int(SECOND_COPY_MARGIN * loaded.model_bytes)
    if loaded.free_bytes < needed:
        raise NoRoomForSecondCopy(
            f"{loaded.device} has {_gib(loaded.free_bytes)} free after loading one copy of the model "
            f"({_gib(loaded.model_bytes)}); --perf-against runs a second copy for the reference and needs about "
            f"{_gib(needed)}: use a smaller --perf-dtype or a larger device, or compare with stored baselines "
            "(drop --perf-against)"
        )


def different_output_lengths(paired: PairedRuns) -> list[str]:
    """Requests whose number of tokens differs between runs: a side that did less would look faster.

    Every run of both sides is held to side A's first run, so a side that
    cuts one repeat short is caught as well as one that always does.
    """
    expected = _token_counts(paired.reference[0])
    found = []
    for label, runs in (("A", paired.reference), ("B", paired.current)):
        for index, run in enumerate(runs):
            counts = _token_counts(run)
            found += [
                f"{request_id}: {counts.get(request_id)} tokens in {label}'s repeat {index + 1}, "
                f"{expected.get(request_id)} in A's first"
                for request_id in sorted(set(expected) | set(counts))
                if counts.get(request_id) != expected.get(request_id)
            ]
    return found


def _token_counts(run: RunResult) -> dict[str, int]:
    return {record.request_id: record.num_output_tokens for record in run.records}


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.2f} GiB"
