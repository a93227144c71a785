"""The metric catalogue and what judging needs besides statistics: which samples are compared and which way
is better, speed normalisation by the machine probe, and exact counter changes.

One place for both the ``pytest --perf`` session and ``perfsuite compare`` (``perfsuite.judge.judge``).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Collection, Mapping, Sequence

from perfsuite.engine.types import EngineCounters
from perfsuite.judge.stats import CounterChange, Direction, compare_counters
from perfsuite.measure.summaries import BUSY_SHARE, GOODPUT, PROBE
from perfsuite.measure.utilization import DECODE_BYTES_PER_SECOND, PREFILL_FLOPS_PER_SECOND

__all__ = [  # PROBE, BUSY_SHARE and GOODPUT are the sample keys measure.summaries writes
    "ALL_METRICS",
    "BUSY_SHARE",
    "CAPACITY",
    "CAPACITY_METRICS",
    "GOODPUT",
    "METRICS",
    "NORMALISED",
    "POSITIVE_SAMPLES",
    "PROBE",
    "RAW_SERVER_FIGURES",
    "UTILIZATION_METRICS",
    "exact_counter_changes",
    "normalize_to_machine_speed",
    "zero_is_measured",
]

# Per-repeat samples compared against the baseline. Repeats, not requests,
# are the independent units: requests of one run share its conditions.
# Request throughput is reported but not compared: the workload is seeded, so
# it is output throughput times a constant, and comparing both would spend the
# significance budget twice on one signal.
METRICS: dict[str, Direction] = {
    "output_throughput": Direction.HIGHER_IS_BETTER,
    "median_ttft_ms": Direction.LOWER_IS_BETTER,
    "median_tpot_ms": Direction.LOWER_IS_BETTER,
    "median_e2el_ms": Direction.LOWER_IS_BETTER,
}

# Goodput is compared too when the session has an SLO (--perf-slo) and the
# baseline was measured against the same SLO.
ALL_METRICS: dict[str, Direction] = {**METRICS, GOODPUT: Direction.HIGHER_IS_BETTER}

# How close to the machine (perfsuite.measure.utilization), compared wherever both sides counted the engine's
# work (perfsuite's own engines; a peer or a server counts none). Judged through MFU's and MBU's numerators, the
# achieved rates, rescaled by the machine probe like throughput: at one workload on one machine class a drop in
# MBU is a drop in decode GB/s, and MBU's denominator is a peak measured once per session, whose own few percent
# of noise would shift every repeat of a session the same way and pass for a change.
UTILIZATION_METRICS: dict[str, Direction] = {
    PREFILL_FLOPS_PER_SECOND: Direction.HIGHER_IS_BETTER,
    DECODE_BYTES_PER_SECOND: Direction.HIGHER_IS_BETTER,
}

# A capacity test (perfsuite/suites/test_capacity.py) makes one sample per search: the highest Poisson rate, in
# requests/s, at which the SLO held (perfsuite.measure.capacity). Its only compared metric.
CAPACITY = "capacity_under_slo"
CAPACITY_METRICS: dict[str, Direction] = {CAPACITY: Direction.HIGHER_IS_BETTER}

# Samples that are never 0 (perfsuite.judge.samples says why 0 is a measurement for every other one),
# besides the machine probe: PROBE, and "probe_seconds" in older baselines.
POSITIVE_SAMPLES = frozenset({"output_throughput", "request_throughput", CAPACITY})
_PROBE_PREFIX = "probe"


def zero_is_measured(metric: str) -> bool:
    """Whether 0 is a value a run can measure for ``metric``: goodput and latencies yes; throughput, capacity
    and the machine probe no (``perfsuite.judge.samples``)."""
    return metric not in POSITIVE_SAMPLES and not metric.startswith(_PROBE_PREFIX)


NORMALISED = "each repeat rescaled by its machine probe over the baseline's median probe"

RAW_SERVER_FIGURES = (
    "none: a server in another process (runs_in_process = False) may run on another machine, which this "
    "machine's probe says nothing about; its figures are stored and compared as measured"
)


def normalize_to_machine_speed(
    baseline: Mapping[str, Sequence[float]], current: Mapping[str, Sequence[float]]
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Put every repeat, baseline and current alike, on the baseline's typical machine speed.

    Each repeat carries the machine probe taken around it (the geometric mean
    of the readings just before and just after it). A repeat whose
    probe took k times the baseline's median probe ran on a machine k times
    slower: its throughput is multiplied and its latencies divided by k.
    Repeat by repeat rather than by one factor per side, because this VM's
    speed changes within seconds: on the ci workload it took the spread of
    repeats from 13% to 7% (bench/calibrate.py), and bench/probe_drift.py
    found a probe after the repeat as well as before it cuts what is left of a
    decode step's drift by a fifth. Without probes on both
    sides, samples pass as they are.
    """
    base = {name: list(values) for name, values in baseline.items()}
    cur = {name: list(values) for name, values in current.items()}
    if not base.get(PROBE) or not cur.get(PROBE):
        return base, cur
    reference = statistics.median(base[PROBE])
    for side in (base, cur):
        slowdowns = [probe / reference for probe in side[PROBE]]
        for name, direction in {**ALL_METRICS, **CAPACITY_METRICS, **UTILIZATION_METRICS}.items():
            if name in side and len(side[name]) == len(slowdowns):
                side[name] = [
                    value * k if direction is Direction.HIGHER_IS_BETTER else value / k
                    for value, k in zip(side[name], slowdowns)
                ]
    return base, cur


def exact_counter_changes(
    baseline: EngineCounters,
    current: EngineCounters,
    arrival_rate: float | None,
    unrecorded: Collection[str] = (),
) -> list[CounterChange]:
    """Counter changes, where counters are exact.

    With wall-clock arrivals the number of steps depends on the machine's
    speed, so those runs' counters are not compared. Nor is a counter either
    side's file did not record (``unrecorded``: a file older than the
    counter, read as its default 0, says nothing about what was counted).
    """
    if arrival_rate:
        return []
    skipped = set(unrecorded)
    return compare_counters(
        *({k: v for k, v in dataclasses.asdict(side).items() if k not in skipped} for side in (baseline, current))
    )
