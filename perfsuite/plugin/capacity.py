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

The runs themselves are ``perfsuite.measure.capacity_runs``'s. Under
``--perf-ray`` the whole test (warm-ups, start, every search) is one typed
``CapacityRequest`` to one actor, which runs them on its node and reads the
probe and the CPU meter there; its probes' requests are ``requests_at(1.0)``
with the arrival offsets divided by each rate, so ``requests_at`` must make
exactly that (``perf_workload_factory(..., rate=rate)`` does; anything else
fails the test, saying where it differs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from perfsuite.engine import Request, RunResult
from perfsuite.judge.baselines import BaselineError, OutputError
from perfsuite.judge.catalogue import CAPACITY
from perfsuite.judge.results import TestResult
from perfsuite.judge.run_config import RunConfiguration, knobs
from perfsuite.measure.capacity import Capacity, CapacityError, CapacityRecord, CapacitySearch, SteadyState
from perfsuite.measure.capacity_runs import (
    CapacityRuns,
    SearchChoices,
    rate_scaling_mismatch,
)
from perfsuite.measure.contention import CpuMeter, CpuUse, contention_reason
from perfsuite.measure.environment import Environment
from perfsuite.measure.summaries import Repeats, summarise

if TYPE_CHECKING:
    from perfsuite.adapters.protocol import BatchingEngine

MIN_PROBE_REQUESTS = 16  # after a fifth is discarded as the ramp, halves of 6-7 requests to compare queues
RATE_CHECKED = 2.0  # under --perf-ray, requests_at(RATE_CHECKED) must be requests_at(1.0) scaled to it


def probe_size(num_requests: int) -> int:
    """Requests per probe for a profile of ``num_requests``: four times as many, at least 16."""
    return max(MIN_PROBE_REQUESTS, 4 * num_requests)


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
    choices = SearchChoices(by or options.capacity_by, target_share, tolerance)
    if session.cluster is not None:
        return _measure_on_cluster(recorder, engine, requests_at, choices, steady_state, repeats)
    device = recorder.backend.device

    def run(requests: Sequence[Request], max_concurrency: int | None) -> RunResult:
        return timed_run(engine, requests, device, max_concurrency=max_concurrency)

    runs = CapacityRuns(run, requests_at, slo, steady_state, choices)
    search = runs.prepare(options.profile.warmup_runs)
    searches, at_capacity, uses = [], [], []

    def one_search() -> None:
        probes.starting_run()
        with CpuMeter() as meter:
            try:
                capacity, at = runs.one_search()
            except CapacityError as error:
                pytest.fail(f"{recorder.test_id}: no capacity under SLO {slo.label}: {error}", pytrace=False)
        uses.append(meter.use if in_process and recorder.backend.probe is not None else None)
        searches.append(capacity)
        at_capacity.append(at)

    benchmark = recorder.benchmark
    benchmark.pedantic(one_search, setup=probes.take, rounds=repeats, iterations=1, warmup_rounds=0)
    while len(searches) < repeats:  # --benchmark-disable runs the target only once
        probes.take()
        one_search()
    probes.take()

    noisy = contention_reason(uses, options.busy_threshold)
    measured = Repeats(tuple(at_capacity), probes.per_run(), _shares(uses), noisy)
    return _record(recorder, engine, requests_at(1.0), search, tuple(searches), measured, steady_state, repeats)


def _measure_on_cluster(
    recorder: Any,
    engine: BatchingEngine,
    requests_at: Callable[[float], Sequence[Request]],
    choices: SearchChoices,
    steady_state: SteadyState,
    repeats: int,
) -> TestResult:
    """``--perf-ray``: the whole test on one actor, one typed request; a retry after its node died is all of it."""
    from perfsuite.cluster.pool import ClusterError
    from perfsuite.cluster.wire import CapacityRequest
    from perfsuite.plugin.cluster import ClusterEngine

    session, options, test_id = recorder.session, recorder.session.options, recorder.test_id
    recorder._require_factory_engine(engine, ClusterEngine, "--perf-ray", "an actor builds it by name on its node")
    requests = tuple(requests_at(1.0))
    mismatch = rate_scaling_mismatch(requests, requests_at(RATE_CHECKED), RATE_CHECKED)
    if mismatch is not None:
        pytest.fail(
            f"{test_id}: under --perf-ray the actor makes each probe's requests from requests_at(1.0), their "
            f"arrival offsets divided by the rate, but requests_at({RATE_CHECKED:g}) is not that: {mismatch}; make "
            "requests_at(rate) with perf_workload_factory(..., rate=rate), or run this test without --perf-ray",
            pytrace=False,
        )
    request = CapacityRequest(
        test_id,
        engine.knobs,
        requests,
        options.slo,
        steady_state,
        choices,
        options.profile.warmup_runs,
        repeats,
        options.busy_threshold,
    )
    try:
        delivered = session.cluster.measure(request)
    except ClusterError as error:
        recorder.fail_unrecorded(error)
    result = delivered.result
    if not result.runs_in_process:
        pytest.fail(
            f"{test_id}: {engine.name} measures a server in another process; measure it without --perf-ray",
            pytrace=False,
        )
    if delivered.retried_after is not None:
        session.warnings.append(f"{test_id}: measured on node {result.node} after {delivered.retried_after}")
    if result.no_capacity is not None:
        pytest.fail(
            f"{test_id}: no capacity under SLO {options.slo.label} (on node {result.node}): {result.no_capacity}",
            pytrace=False,
        )
    measured = Repeats(result.at_capacity, result.probes, result.busy_shares, result.noisy)
    return _record(
        recorder,
        engine,
        requests,
        result.search,
        result.searches,
        measured,
        steady_state,
        repeats,
        environment=result.environment,
        node=str(result.node),
    )


def _record(
    recorder: Any,
    engine: BatchingEngine,
    requests: Sequence[Request],
    search: CapacitySearch,
    searches: tuple[Capacity, ...],
    at_capacity: Repeats,
    steady_state: SteadyState,
    repeats: int,
    environment: Environment | None = None,
    node: str | None = None,
) -> TestResult:
    """The searches' capacities as the samples, the runs at each capacity as the repeats; judged and stored."""
    session, slo = recorder.session, recorder.session.options.slo
    notes = [f"search {i + 1}: {s.stopped}" for i, s in enumerate(searches) if not s.within_tolerance]
    record = CapacityRecord.of(searches, slo, notes)
    measured = summarise(at_capacity, (), slo)
    measured = dataclasses.replace(
        measured, samples={CAPACITY: tuple(s.requests_per_second for s in searches), **measured.samples}
    )
    parameters = recorder._sizing(engine, requests, None, None)
    configuration = _configuration(recorder, engine, requests, search, slo.label, steady_state, repeats)
    try:
        result = session.record_capacity(
            recorder.test_id, measured, record, parameters, configuration, environment=environment, node=node
        )
    except (OutputError, BaselineError) as error:
        recorder.fail_unrecorded(error)
    recorder.result = result
    if recorder.benchmark is None:  # --perf-ray: nothing was timed in this process
        return result
    recorder.benchmark.extra_info.update(
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
    recorder: PerfRecorder,  # noqa: F821 (an import would be a circle; the measurement-path refactor removes this)
    engine: BatchingEngine,
    requests: Sequence[Request],
    search: CapacitySearch,
    slo: str,
    steady_state: SteadyState,
    repeats: int,
) -> RunConfiguration:
    """The recorder's, with what the search was searched against among its knobs (readable when they differ)."""
    base = recorder._configuration(engine, requests, None, None, repeats)
    steady = (
        f"ramp={steady_state.ramp_share:g},growth={steady_state.queue_growth:g},slack={steady_state.queue_slack_gaps:g}"
    )
    extra = {"capacity_slo": slo, "capacity_search": search.label, "capacity_steady_state": steady}
    # base's workload digest is of the arrival offsets at 1 req/s, which every probe scales to its rate
    return dataclasses.replace(base, engine_knobs=knobs({**dict(base.engine_knobs), **extra}))


def _shares(uses: Sequence[CpuUse | None]) -> tuple[float, ...]:
    return tuple(use.busy_share for use in uses if use is not None)
