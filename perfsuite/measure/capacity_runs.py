"""One capacity test's runs on one machine: the warm-ups, the start, the unloaded probe, then each search.

The pytest process runs them for an engine it holds (``perfsuite.plugin.capacity``);
under ``--perf-ray`` a measurement actor runs them on its node
(``perfsuite.cluster.actor``), so every run of a test, and every probe of each of
its searches, comes from one node. Both hand ``CapacityRuns`` a function that
times one run of the engine, and both judge and record what it found the same
way. Pure Python: the run function brings the engine, the device and torch.

The start is the power of two at or below the engine's offline request
throughput (all the probe's requests at t0, measured once after the
warm-up), so every search, of this run and of the baseline, probes rates on
one grid (``measure.capacity``); see ``plugin.capacity`` for why.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from perfsuite.engine.types import Request, RunResult
from perfsuite.measure.capacity import (
    BY_CONCURRENCY,
    BY_RATE,
    Capacity,
    CapacitySearch,
    ProbeOutcome,
    SteadyState,
    closed_loop_outcome,
    probe_outcome,
    search_capacity,
)
from perfsuite.measure.metrics import SLO, run_metrics
from perfsuite.measure.send_lag import send_lag

MAX_PROBE_SECONDS = 60.0  # the search floor: no probe's arrivals may take longer than this
RATE_SCALING_TOLERANCE = 1e-9  # relative: the same draws divided by the rate, up to float rounding

# Times one run: the requests, at most this many in flight (None: as they arrive).
RunOnce = Callable[[Sequence[Request], int | None], RunResult]


@dataclass(frozen=True, slots=True)
class SearchChoices:
    """What a test chose of its searches (None: the default); the start and the bounds come from the engine."""

    by: str = BY_RATE
    target_share: float | None = None
    tolerance: float | None = None


def start_rate(offline_request_throughput: float) -> float:
    """The power of two at or below the offline request throughput (module docstring)."""
    if not offline_request_throughput > 0 or not math.isfinite(offline_request_throughput):
        return 1.0
    return 2.0 ** math.floor(math.log2(offline_request_throughput))


def start_concurrency(num_requests: int) -> int:
    """The power of two at or below half the probe's requests, at least 1 (``plugin.capacity``)."""
    return 2 ** max(0, math.floor(math.log2(max(1, num_requests // 2))))


def search_from(start: float, num_requests: int, choices: SearchChoices) -> CapacitySearch:
    """The search of a test whose offline run set ``start`` (req/s), over probes of ``num_requests``."""
    defaults = CapacitySearch()
    return CapacitySearch(
        target_share=defaults.target_share if choices.target_share is None else choices.target_share,
        tolerance=defaults.tolerance if choices.tolerance is None else choices.tolerance,
        start_rate=start,
        min_rate=min(start, max(start / 16, num_requests / MAX_PROBE_SECONDS)),
        max_rate=max(defaults.max_rate, start),
        by=choices.by,
        start_concurrency=start_concurrency(num_requests),
        max_concurrency=num_requests,
    )


def scaled_to(requests: Sequence[Request], rate: float) -> list[Request]:
    """Requests whose arrival offsets are those at 1 req/s (``requests``) divided by ``rate``."""
    return [dataclasses.replace(r, arrival_time=r.arrival_time / rate) for r in requests]


def rate_scaling_mismatch(at_one: Sequence[Request], at_rate: Sequence[Request], rate: float) -> str | None:
    """Where ``at_rate`` is not ``at_one`` with its arrival offsets divided by ``rate``; None when it is."""
    if len(at_one) != len(at_rate):
        return f"{len(at_rate)} requests at {rate:g} req/s, {len(at_one)} at 1 req/s"
    for one, other in zip(at_one, at_rate):
        expected = one.arrival_time / rate
        if not math.isclose(other.arrival_time, expected, rel_tol=RATE_SCALING_TOLERANCE, abs_tol=1e-12):
            return f"request {other.request_id!r} arrives at {other.arrival_time:g} s, not {expected:g} s"
        if dataclasses.replace(other, arrival_time=one.arrival_time) != one:
            return f"request {other.request_id!r} differs in more than its arrival time"
    return None


class CapacityRuns:
    """A test's searches of one engine: ``prepare`` once (warm-ups and the start), then ``one_search`` per repeat.

    ``requests_at(rate)``: the probe's requests, arrivals at ``rate`` req/s.
    A search that finds no capacity raises ``measure.capacity.CapacityError``.
    """

    def __init__(
        self,
        run: RunOnce,
        requests_at: Callable[[float], Sequence[Request]],
        slo: SLO,
        steady_state: SteadyState,
        choices: SearchChoices,
    ) -> None:
        self._run = run
        self._requests_at = requests_at
        self._slo = slo
        self._steady_state = steady_state
        self._choices = choices
        self._offline = [dataclasses.replace(r, arrival_time=0.0) for r in requests_at(1.0)]
        self._unloaded: ProbeOutcome | None = None
        self.search: CapacitySearch | None = None

    def prepare(self, warmup_runs: int) -> CapacitySearch:
        """The warm-ups (discarded), then the first run after them, all requests at t0: where to start."""
        for _ in range(warmup_runs):
            self._run(self._offline, None)
        start = start_rate(run_metrics(self._run(self._offline, None)).request_throughput)
        self.search = search_from(start, len(self._offline), self._choices)
        return self.search

    def one_search(self) -> tuple[Capacity, RunResult]:
        """A whole search, bracketing and bisecting from the start: its capacity, and the run probed there."""
        search = self.search
        if search is None:
            raise RuntimeError("call CapacityRuns.prepare before the searches")
        runs: dict[float, RunResult] = {}  # by the point probed: a rate, or a concurrency
        slo, steady_state = self._slo, self._steady_state

        def probe_rate(rate: float) -> ProbeOutcome:
            runs[rate] = self._run(self._requests_at(rate), None)
            sends = send_lag(runs[rate])  # None: the engine does not record its sends
            if sends is not None and sends.is_client_bound:  # the client fell behind: the load was not offered
                return probe_outcome(runs[rate], rate, slo, steady_state, False, sends.describe())
            return probe_outcome(runs[rate], rate, slo, steady_state, True, "")

        def probe_concurrency(concurrency: int) -> ProbeOutcome:
            runs[concurrency] = self._run(self._offline, concurrency)
            return closed_loop_outcome(runs[concurrency], concurrency, slo, steady_state)

        if search.by == BY_CONCURRENCY:
            capacity = search_capacity(probe_concurrency, search)
        else:
            capacity = search_capacity(probe_rate, search, unloaded=self._unloaded_probe)
        return capacity, runs[capacity.found_at]

    def _unloaded_probe(self) -> ProbeOutcome:
        """The requests one at a time (a closed loop of one), once per test: can any rate pass?"""
        if self._unloaded is None:
            run = self._run(self._offline, 1)
            outcome = probe_outcome(run, len(self._offline) / run.duration, self._slo, self._steady_state)
            self._unloaded = dataclasses.replace(outcome, steady=True, note="one request at a time")
        return self._unloaded
