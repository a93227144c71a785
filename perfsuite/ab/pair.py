"""Both sides of an A/B comparison, and the order their repeats run in.

Repeats alternate in pairs, ABBA: pair 0 runs A then B, pair 1 B then A, and
so on. Within a pair both sides see nearly the same machine (a drift slower
than a pair cancels in its ratio), and across pairs whatever favours the
second run of a pair (a warm cache, a CPU clock that just ramped up) favours
A and B equally often: it widens the ratios' spread instead of shifting it,
which keeps the signed-rank test's symmetry assumption (``judge.paired``).

Each side runs in ``workers_per_side`` worker processes, and pairs rotate over
them two at a time (pairs 0-1 on the first worker of each side, 2-3 on the
second, ...), so each worker sees both orders. One process per side would
carry its own speed (where its weights landed in memory, its threads'
placement) into every pair of a test: an A/A calibration found side B, the
same code, slower in every pair by 3-7%, which no order can balance. Over
several processes that offset varies from pair to pair, so the signed-rank
test sees it as spread instead of a shift.

On a CPU, a busy runner is the usual case for A/B, and torch's threads are
what it breaks: two threads on two cores while a neighbour holds one of
them read 8 tok/s against 70 quiet, and the spread of those runs hid a 12-16%
change. So before a test's warm-ups the controller reads what other work
holds of the machine while every worker is idle, and gives every worker of
both sides one intra-op thread per core left free
(``contention.threads_for_cores_left``), the same for the whole test. Around
every timed run it reads the machine's CPU again, the workers' time counted
as the session's own, so each side's runs carry the share other work used
(``PairedRuns.reference_busy`` and ``current_busy``), as stored mode's
repeats do. Those readings are reported, not judged: both sides of a pair
ran on the same busy machine within seconds, which is what A/B is for.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import perfsuite
from perfsuite.ab import wire
from perfsuite.ab.trees import Trees
from perfsuite.ab.workers import Side, SideRunner, Worker, WorkerError
from perfsuite.adapters.registry import EngineSpec
from perfsuite.engine.types import Request, RunResult
from perfsuite.measure.contention import (
    CpuMeter,
    CpuSample,
    CpuUse,
    process_cpu_seconds,
    read_sample,
    threads_for_cores_left,
)
from perfsuite.measure.repeats import busy_shares

# What another copy needs beyond its weights: the KV cache and activations of a perf test's batch.
SECOND_COPY_MARGIN = 1.5
REFERENCE, CURRENT = "A", "B"
DEFAULT_WORKERS_PER_SIDE = 2
PAIRS_PER_WORKER_TURN = 2  # AB then BA on the same two workers, so a worker's turn is balanced
IDLE_READING_SECONDS = 1.0  # what other work holds, read before each test while every worker waits


class NoRoomForSecondCopy(WorkerError):
    """The device cannot hold a second copy of the model."""


@dataclass(frozen=True, slots=True)
class PairedRuns:
    """A test's timed repeats on both sides, pair by pair."""

    reference: tuple[RunResult, ...]  # side A
    current: tuple[RunResult, ...]  # side B
    order: tuple[str, ...]  # "AB" or "BA", per pair
    workers: tuple[int, ...] = ()  # which worker of each side ran the pair (empty: not recorded)
    reference_busy: tuple[float, ...] = ()  # other work's share of the machine's CPU during each A run
    current_busy: tuple[float, ...] = ()  # ... and each B run (empty: the machine could not be read)
    num_threads: int | None = None  # every worker's intra-op threads for the test; None: left as loaded

    def __post_init__(self) -> None:
        if not len(self.reference) == len(self.current) == len(self.order):
            raise ValueError("every pair has one run of each side")
        if self.workers and len(self.workers) != len(self.order):
            raise ValueError("one worker index per pair")
        if len(self.reference_busy) != len(self.current_busy) or len(self.reference_busy) not in (0, len(self.order)):
            raise ValueError("one CPU reading per run of each side, or none")


def pair_order(num_pairs: int) -> tuple[str, ...]:
    """ABBA ABBA...: A first in even pairs, B first in odd ones."""
    return tuple(REFERENCE + CURRENT if i % 2 == 0 else CURRENT + REFERENCE for i in range(num_pairs))


def pair_workers(num_pairs: int, workers_per_side: int) -> tuple[int, ...]:
    """Which worker of each side runs each pair: two pairs (AB, BA) per worker, in rotation."""
    if workers_per_side < 1:
        raise ValueError(f"workers_per_side must be >= 1, got {workers_per_side}")
    return tuple((i // PAIRS_PER_WORKER_TURN) % workers_per_side for i in range(num_pairs))


class ABRunner:
    """The reference's workers (A) and the current tree's (B), each with the model loaded once."""

    def __init__(
        self,
        trees: Trees,
        load: wire.Load,
        timeout: float,
        start: Callable[[Side], Worker] = Worker,
        workers_per_side: int = DEFAULT_WORKERS_PER_SIDE,
        read_cpu: Callable[..., CpuSample | None] = read_sample,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if workers_per_side < 1:
            raise ValueError(f"workers_per_side must be >= 1, got {workers_per_side}")
        self.trees = trees
        self._read_cpu = read_cpu
        self._sleep = sleep

        # A project that installs perfsuite: both sides run this perfsuite, over the two trees of the project.
        installed = None if trees.perfsuite_in_trees else Path(perfsuite.__file__).resolve().parent.parent

        def sides(label: str, description: str, tree) -> tuple[SideRunner, ...]:
            numbers = range(1, workers_per_side + 1) if workers_per_side > 1 else (None,)
            return tuple(
                SideRunner(Side(label, description, tree, number, installed), load, timeout, start)
                for number in numbers
            )

        self.currents = sides(CURRENT, "the current tree", trees.current)
        self.references = sides(REFERENCE, f"REF {trees.reference_label}", trees.reference)

    @property
    def workers_per_side(self) -> int:
        return len(self.currents)

    @property
    def loaded(self) -> wire.Loaded:
        """What the current tree's first worker loaded: the model's limits the workloads are built for."""
        return self.currents[0].loaded_model()

    def start(self) -> None:
        """One current worker first: once it holds a copy, is there room for all the others?"""
        check_room_for_other_copies(self.currents[0].loaded_model(), 2 * self.workers_per_side - 1)
        for side_runner in self.currents[1:] + self.references:
            side_runner.worker()

    def tokenize(self, text: str) -> tuple[int, ...]:
        return self.currents[0].tokenize(text)

    def side(self, label: str, worker: int = 0) -> SideRunner:
        return (self.references if label == REFERENCE else self.currents)[worker]

    def build(self, spec: EngineSpec) -> tuple[wire.Built, wire.Built]:
        """Build the engine in every worker; what the first of each side built, A's then B's."""
        for side_runner in self.references + self.currents:
            side_runner.build(spec)
        return self.references[0].build(spec), self.currents[0].build(spec)

    def run_pairs(
        self,
        spec: EngineSpec,
        requests: Sequence[Request],
        max_concurrency: int | None,
        num_warmups: int,
        num_pairs: int,
        threads: int | None = None,
    ) -> PairedRuns:
        """``num_warmups`` discarded runs per worker, then ``num_pairs`` pairs in ABBA order over the workers.

        ``threads``: every worker's intra-op threads for this test; None picks
        them on a CPU from the cores other work leaves free (module docstring)
        and leaves them as loaded on an accelerator.
        """
        encoded = tuple(wire.encode(r) for r in requests)
        for side_runner in self.references + self.currents:
            side_runner.worker()  # a side that died since the last test starts again before the machine is read
        threads = self.choose_threads() if threads is None else threads
        if threads is not None:
            for side_runner in self.references + self.currents:
                side_runner.set_threads(threads)
        self._warm_up(spec, encoded, max_concurrency, num_warmups)
        workers = pair_workers(num_pairs, self.workers_per_side)
        runs: dict[str, list[RunResult]] = {REFERENCE: [], CURRENT: []}
        uses: dict[str, list[CpuUse | None]] = {REFERENCE: [], CURRENT: []}
        order = pair_order(num_pairs)
        for labels, worker in zip(order, workers):
            for label in labels:
                with self._meter() as meter:
                    result = self.side(label, worker).run(spec, encoded, max_concurrency)
                runs[label].append(wire.decode(RunResult, result))
                uses[label].append(meter.use)
        busy = {label: busy_shares(readings) for label, readings in uses.items()}
        if len(busy[REFERENCE]) != num_pairs or len(busy[CURRENT]) != num_pairs:
            busy = {REFERENCE: (), CURRENT: ()}  # a reading failed: none rather than some misaligned
        return PairedRuns(
            tuple(runs[REFERENCE]), tuple(runs[CURRENT]), order, workers, busy[REFERENCE], busy[CURRENT], threads
        )

    def _warm_up(self, spec: EngineSpec, encoded: tuple[Any, ...], max_concurrency: int | None, runs: int) -> None:
        """``runs`` discarded runs on every worker, both sides in turn."""
        for worker in range(self.workers_per_side):
            for _ in range(runs):
                for label in REFERENCE + CURRENT:
                    self.side(label, worker).run(spec, encoded, max_concurrency)

    def choose_threads(self) -> int | None:
        """One thread per core other work leaves free, read while every worker is idle; None off the CPU."""
        if self.loaded.device != "cpu":
            return None
        with self._meter() as meter:
            self._sleep(IDLE_READING_SECONDS)
        return threads_for_cores_left(meter.use, len(os.sched_getaffinity(0)))

    def _meter(self) -> CpuMeter:
        """A CPU meter that counts every worker's time as the session's own, beside the controller's."""
        return CpuMeter(read=partial(self._read_cpu, own_seconds=self._own_cpu_seconds))

    def _own_cpu_seconds(self) -> float:
        pids = [side_runner.pid for side_runner in self.references + self.currents]
        return time.process_time() + sum(process_cpu_seconds(pid) or 0.0 for pid in pids if pid is not None)

    def close(self) -> None:
        errors = []
        for side_runner in self.references + self.currents:
            try:
                side_runner.close()
            except Exception as error:  # close them all, then say what went wrong
                errors.append(error)
        if errors:
            raise errors[0]


def check_room_for_other_copies(loaded: wire.Loaded, num_other_copies: int = 1) -> None:
    """Refuse before starting them when the device cannot hold the other workers' copies of the model."""
    if loaded.free_bytes is None or num_other_copies < 1:
        return
    needed = int(SECOND_COPY_MARGIN * loaded.model_bytes * num_other_copies)
    if loaded.free_bytes < needed:
        copies = "a second copy" if num_other_copies == 1 else f"{num_other_copies} more copies"
        fewer = "" if num_other_copies == 1 else "use --perf-against-workers 1, "
        raise NoRoomForSecondCopy(
            f"{loaded.device} has {_gib(loaded.free_bytes)} free after loading one copy of the model "
            f"({_gib(loaded.model_bytes)}); --perf-against runs {copies} (one per worker) and needs about "
            f"{_gib(needed)}: {fewer}use a smaller --perf-dtype or a larger device, or compare with stored baselines "
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
