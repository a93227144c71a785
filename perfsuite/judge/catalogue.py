"""The metric catalogue and what judging needs besides statistics: which samples are compared and which way
is better, speed normalisation by the machine probe, exact counter changes, and a comparison's stored shape.

One place for both the ``pytest --perf`` session and ``perfsuite compare``.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from perfsuite.judge.stats import Comparison, CounterChange, Direction, Verdict, compare_counters
from perfsuite.measure.summaries import GOODPUT

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

# Seconds of measure.machine_probe around each repeat. A change to what the probe
# times must rename this key (it was "probe_seconds" for the memory part alone, taken
# before the repeat): baselines with the old key then lose their probe
# and are compared as measured, instead of being rescaled by a foreign unit.
PROBE = "probe_bracket_seconds"

# Other work's share of the machine's CPU time during each repeat (perfsuite.measure.contention); stored, never compared.
BUSY_SHARE = "cpu_busy_share"

NORMALISED = "each repeat rescaled by its machine probe over the baseline's median probe"

RAW_SERVER_FIGURES = (
    "none: a server in another process (runs_in_process = False) may run on another machine, which this "
    "machine's probe says nothing about; its figures are stored and compared as measured"
)

def normalize_to_machine_speed(
    baseline: dict[str, Sequence[float]], current: dict[str, Sequence[float]]
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
        for name, direction in ALL_METRICS.items():
            if name in side and len(side[name]) == len(slowdowns):
                side[name] = [
                    value * k if direction is Direction.HIGHER_IS_BETTER else value / k
                    for value, k in zip(side[name], slowdowns)
                ]
    return base, cur

def exact_counter_changes(
    baseline: dict[str, int], current: dict[str, int], arrival_rate: float | None
) -> list[CounterChange]:
    """Counter changes, where counters are exact.

    With wall-clock arrivals the number of steps depends on the machine's
    speed, so those runs' counters are not compared.
    """
    return [] if arrival_rate else compare_counters(baseline, current)

def comparison_json(comparison: Comparison) -> dict[str, Any]:
    """The shape results.json stores a comparison in."""
    return {
        **dataclasses.asdict(comparison),
        "direction": comparison.direction.value,
        "verdict": comparison.verdict.value,
    }

def comparison_from_json(data: dict[str, Any]) -> Comparison:
    return Comparison(**{**data, "direction": Direction(data["direction"]), "verdict": Verdict(data["verdict"])})
