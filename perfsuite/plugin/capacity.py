"""The capacity test's measurement: R capacity searches over rate or concurrency probes, judged like throughput.

``perf.measure_capacity(engine, requests_at)`` runs the searches of
``perfsuite.measure.capacity``, by ``--perf-capacity-by`` (or ``by=``):

- by rate, each probe serves ``requests_at(rate)`` (the same seeded
  requests, their Poisson arrival offsets scaled to the rate) once, open loop;
- by concurrency, each probe serves the same requests all due at once, at
  most c in flight (a closed loop, as ``timed_run(..., max_concurrency=c)``);
  the search starts at the power of two at or below half the probe's
  requests (a probe at high concurrency is quick, at low concurrency slow,
  so shrinking from above is the cheaper side) and its ceiling is the
  probe's requests (all of them in flight: the offline run).

Samples for the significance test: a search gives one number, so a test
makes R independent searches (R: the session's repeats), each its own
bracketing and bisection from the same start, with no probe reused. The R
capacities are the samples the one-sided Mann-Whitney test compares with the
baseline's, as R throughputs are for the throughput tests: each search is a
repeat. Warm-starting a search from the previous one's answer would cost fewer
probes but tie a side's searches to its first, and a first search that
happened to land high would make a whole side look faster.

The start is the power of two at or below the engine's offline request
throughput (all the probe's requests at t0, measured once after the
warm-up), so every search, of this run and of the baseline, probes rates on
one grid (``measure.capacity``). Offline is the most a batching engine can
serve, so the start is near the answer and mostly above it: a probe at rate r
takes n / r seconds, so shrinking costs about the last probe's time and
climbing from far below would cost about the first's (16 requests at 1 req/s:
16 s). Around each search the machine probe is taken (before and after),
and the CPU meter runs: a search during which other work used the machine
makes the test noisy (not re-run: a search is long). A probe whose load
generator fell behind its schedule (``perfsuite.measure.send_lag``) fails:
its latencies are not the engine's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from perfsuite.engine import Request, RunResult
from perfsuite.judge.baselines import BaselineError, OutputError
from perfsuite.judge.catalogue import CAPACITY
from perfsuite.judge.results import TestResult
from perfsuite.judge.run_config import RunConfiguration, knobs
from perfsuite.measure.capacity import (
    BY_CONCURRENCY,
    CapacityError,
    CapacityRecord,
    CapacitySearch,
    SteadyState,
    closed_loop_outcome,
    probe_outcome,
    search_capacity,
)
from perfsuite.measure.contention import CpuMeter, CpuUse, contention_reason
from perfsuite.measure.metrics import run_metrics
from perfsuite.measure.send_lag import send_lag
from perfsuite.measure.summaries import Repeats, summarise

if TYPE_CHECKING:
    from perfsuite.adapters.protocol import BatchingEngine

MIN_PROBE_REQUESTS = 16  # after a fifth is discarded as the ramp, halves of 6-7 requests to compare queues
MAX_PROBE_SECONDS = 60.0  # the search floor: no probe's arrivals may take longer than this


def probe_size(num_requests: int) -> int:
    """Requests per probe for a profile of ``num_requests``: four times as many, at least 16."""
    return max(MIN_PROBE_REQUESTS, 4 * num_requests)


def start_rate(offline_request_throughput: float) -> float:
    """The power of two at or below the offline request throughput (module docstring)."""
    if not offline_request_throughput > 0 or not math.isfinite(offline_request_throughput):
        return 1.0
    return 2.0 ** math.floor(math.log2(offline_request_throughput))


def start_concurrency(num_requests: int) -> int:
    """The power of two at or below half the probe's requests, at least 1 (module docstring)."""
    return 2 ** max(0, math.floor(math.log2(max(1, num_requests // 2))))


class MachineProbe(Protocol):
    """The recorder's machine probe around each search (``plugin.recorder._BracketingProbe``)."""

    def take(self) -> None: ...
    def starting_run(self) -> None: ...
    def per_run(self) -> tuple[float, ...]: ...


NO_SLO = "a capacity is the highest rate at which an SLO holds: give one, e.g. --perf-slo ttft=2s,tpot=500ms"


def skip_without_slo(options: Any) -> None:
    """Skip a capacity test before it builds anything when the session has no ``--perf-slo``."""
    if options.slo is None:
        pytest.skip(NO_SLO)


def measure_capacity(
    recorder: Any,  # plugin.recorder.PerfRecorder, which calls this (and so is not imported here)
    engine: BatchingEngine,
    requests_at: Callable[[float], Sequence[Request]],
    probes: MachineProbe,
    in_process: bool,
    *,
    by: str | None = None,
    target_share: float | None = None,
    tolerance: float | None = None,
    steady_state: SteadyState = SteadyState(),
    repeats: int | None = None,
) -> TestResult:
    """R capacity searches of ``engine`` (module docstring), recorded and judged against the baseline.

    ``by``: "rate" or "concurrency"; None: the session's ``--perf-capacity-by``.
    """
    from perfsuite.measure.timing import timed_run

    session, options = recorder.session, recorder.session.options
    slo = options.slo
    if slo is None:
        pytest.skip(NO_SLO)
    if session.against is not None:
        pytest.skip("capacity under --perf-against is not supported yet: its workers run fixed workloads")
    repeats = repeats or session.repeats
    offline = [dataclasses.replace(r, arrival_time=0.0) for r in requests_at(1.0)]
    device = recorder.backend.device
    for _ in range(options.profile.warmup_runs):
        timed_run(engine, offline, device)
    # the first run after the warm-up, all requests at t0: where to start
    start = start_rate(run_metrics(timed_run(engine, offline, device)).request_throughput)
    defaults = CapacitySearch()
    search = CapacitySearch(
        target_share=defaults.target_share if target_share is None else target_share,
        tolerance=defaults.tolerance if tolerance is None else tolerance,
        start_rate=start,
        min_rate=min(start, max(start / 16, len(offline) / MAX_PROBE_SECONDS)),
        max_rate=max(defaults.max_rate, start),
        by=by or options.capacity_by,
        start_concurrency=start_concurrency(len(offline)),
        max_concurrency=len(offline),
    )
    unloaded_outcomes: list = []

    def unloaded():
        """The requests one at a time (a closed loop of one), once per test: can any rate pass?"""
        if not unloaded_outcomes:
            run = timed_run(engine, offline, device, max_concurrency=1)
            outcome = probe_outcome(run, len(offline) / run.duration, slo, steady_state)
            unloaded_outcomes.append(dataclasses.replace(outcome, steady=True, note="one request at a time"))
        return unloaded_outcomes[0]

    searches, at_capacity, uses = [], [], []

    def one_search() -> None:
        runs: dict[float, RunResult] = {}  # by the point probed: a rate, or a concurrency

        def probe_rate(rate: float):
            runs[rate] = timed_run(engine, requests_at(rate), device)
            sends = send_lag(runs[rate])  # None: the engine does not record its sends
            bound = sends is not None and sends.is_client_bound
            return probe_outcome(runs[rate], rate, slo, steady_state, not bound, sends.describe() if bound else "")

        def probe_concurrency(concurrency: int):
            runs[concurrency] = timed_run(engine, offline, device, max_concurrency=concurrency)
            return closed_loop_outcome(runs[concurrency], concurrency, slo, steady_state)

        by_concurrency = search.by == BY_CONCURRENCY
        probe = probe_concurrency if by_concurrency else probe_rate
        probes.starting_run()
        with CpuMeter() as meter:
            try:
                capacity = search_capacity(probe, search, unloaded=None if by_concurrency else unloaded)
            except CapacityError as error:
                pytest.fail(f"{recorder.test_id}: no capacity under SLO {slo.label}: {error}", pytrace=False)
        uses.append(meter.use if in_process and recorder.backend.probe is not None else None)
        searches.append(capacity)
        at_capacity.append(runs[capacity.found_at])

    benchmark = recorder.benchmark
    benchmark.pedantic(one_search, setup=probes.take, rounds=repeats, iterations=1, warmup_rounds=0)
    while len(searches) < repeats:  # --benchmark-disable runs the target only once
        probes.take()
        one_search()
    probes.take()

    noisy = contention_reason(uses, options.busy_threshold)
    notes = [f"search {i + 1}: {s.stopped}" for i, s in enumerate(searches) if not s.within_tolerance]
    record = CapacityRecord.of(searches, slo, notes)
    measured = summarise(Repeats(tuple(at_capacity), probes.per_run(), _shares(uses), noisy), (), slo)
    measured = dataclasses.replace(
        measured, samples={CAPACITY: tuple(s.requests_per_second for s in searches), **measured.samples}
    )
    requests = requests_at(1.0)
    parameters = recorder._sizing(engine, requests, None, None)
    configuration = _configuration(recorder, engine, requests, search, slo.label, steady_state, repeats)
    try:
        result = session.record_capacity(recorder.test_id, measured, record, parameters, configuration)
    except (OutputError, BaselineError) as error:
        recorder.fail_unrecorded(error)
    recorder.result = result
    benchmark.extra_info.update(
        {
            "engine": result.measurement.engine_name,
            "parameters": dataclasses.asdict(result.measurement.parameters),
            "capacity_under_slo": record.requests_per_second,
            "capacity_under_slo_per_device": record.requests_per_second_per_device,
            **({} if record.concurrency is None else {"capacity_concurrency": record.concurrency}),
            "slo": slo.label,
            "baseline": result.judgement.baseline_status,
        }
    )
    return result


def _configuration(
    recorder: PerfRecorder,
    engine: BatchingEngine,
    requests: Sequence[Request],
    search: CapacitySearch,
    slo: str,
    steady_state: SteadyState,
    repeats: int,
) -> RunConfiguration:
    """The recorder's, with what the search was searched against among its knobs (readable when they differ)."""
    base = recorder._configuration(engine, requests, None, None, repeats)
    steady = f"ramp={steady_state.ramp_share:g},growth={steady_state.queue_growth:g},slack={steady_state.queue_slack_gaps:g}"
    extra = {"capacity_slo": slo, "capacity_search": search.label, "capacity_steady_state": steady}
    # base's workload digest is of the arrival offsets at 1 req/s, which every probe scales to its rate
    return dataclasses.replace(base, engine_knobs=knobs({**dict(base.engine_knobs), **extra}))


def _shares(uses: Sequence[CpuUse | None]) -> tuple[float, ...]:
    return tuple(use.busy_share for use in uses if use is not None)
