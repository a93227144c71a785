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

The runs themselves are ``perfsuite.measure.capacity_runs``'s, the loop
over the searches ``perfsuite.measure.repeats.search_capacity`` (here and on
a Ray actor alike); the session's measurer (``plugin.measurers``) runs it,
and this module makes what the session records of it. Under
``--perf-ray`` the whole test (warm-ups, start, every search) is one typed
``CapacityRequest`` to one actor, which runs them on its node and reads the
probe and the CPU meter there; its probes' requests are ``requests_at(1.0)``
with the arrival offsets divided by each rate, so ``requests_at`` must make
exactly that (``perf_workload_factory(..., rate=rate)`` does; anything else
fails the test, saying where it differs).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from perfsuite.judge.catalogue import CAPACITY
from perfsuite.judge.results import TestResult
from perfsuite.judge.run_config import RunConfiguration, knobs
from perfsuite.measure.capacity import CapacityRecord, CapacitySearch, SteadyState
from perfsuite.measure.metrics import SLO
from perfsuite.measure.summaries import SizingParameters, summarise
from perfsuite.plugin.measurers import CapacityTimings
from perfsuite.plugin.session import CapacityEntry

MIN_PROBE_REQUESTS = 16  # after a fifth is discarded as the ramp, halves of 6-7 requests to compare queues


def probe_size(num_requests: int) -> int:
    """Requests per probe for a profile of ``num_requests``: four times as many, at least 16."""
    return max(MIN_PROBE_REQUESTS, 4 * num_requests)


NO_SLO = "a capacity is the highest rate at which an SLO holds: give one, e.g. --perf-slo ttft=2s,tpot=500ms"


def skip_without_slo(options: Any) -> None:
    """Skip a capacity test before it builds anything when the session has no ``--perf-slo``."""
    if options.slo is None:
        pytest.skip(NO_SLO)


def capacity_entry(
    test_id: str,
    timings: CapacityTimings,
    slo: SLO,
    parameters: SizingParameters,
    configuration: RunConfiguration,
) -> CapacityEntry:
    """The searches' capacities as the samples, the runs at each capacity as the repeats: what the session records."""
    searches = timings.searches
    notes = [f"search {i + 1}: {s.stopped}" for i, s in enumerate(searches) if not s.within_tolerance]
    record = CapacityRecord.of(searches, slo, notes)
    measured = summarise(timings.at_capacity, (), slo)
    measured = dataclasses.replace(
        measured, samples={CAPACITY: tuple(s.requests_per_second for s in searches), **measured.samples}
    )
    return CapacityEntry(test_id, measured, record, parameters, configuration, timings.environment, timings.node)


def capacity_configuration(
    base: RunConfiguration, search: CapacitySearch, slo: str, steady_state: SteadyState
) -> RunConfiguration:
    """A timed test's configuration, with what the search was searched against among its knobs (readable when
    they differ). ``base``'s workload digest is of the arrival offsets at 1 req/s, which every probe scales."""
    steady = (
        f"ramp={steady_state.ramp_share:g},growth={steady_state.queue_growth:g},slack={steady_state.queue_slack_gaps:g}"
    )
    extra = {"capacity_slo": slo, "capacity_search": search.label, "capacity_steady_state": steady}
    return dataclasses.replace(base, engine_knobs=knobs({**dict(base.engine_knobs), **extra}))


def capacity_extra_info(result: TestResult, slo: str) -> dict[str, object]:
    """What pytest-benchmark's JSON carries of a capacity test's result."""
    record = result.capacity
    assert record is not None, "a capacity test's result carries its capacity"
    return {
        "engine": result.measurement.engine_name,
        "parameters": dataclasses.asdict(result.measurement.parameters),
        "capacity_under_slo": record.requests_per_second,
        "capacity_under_slo_per_device": record.requests_per_second_per_device,
        **({} if record.concurrency is None else {"capacity_concurrency": record.concurrency}),
        "slo": slo,
        "baseline": result.judgement.baseline_status,
    }
