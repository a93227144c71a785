"""Judging a test: machine-speed normalisation, verdicts, results.json."""

from __future__ import annotations

import pytest

from perfsuite.judge.catalogue import METRICS, PROBE, normalize_to_machine_speed
from perfsuite.judge.stats import Verdict, compare


def samples(throughput, latency, probe):
    values = {name: [] for name in METRICS}
    for t, l in zip(throughput, latency):
        for name, direction in METRICS.items():
            values[name].append(t if direction.value == "higher" else l)
    return {**values, PROBE: list(probe)}


def test_a_uniformly_slower_machine_cancels_out():
    baseline = samples([100, 101, 99, 100.5, 99.5], [10, 9.9, 10.1, 10, 10.05], [1.0] * 5)
    # The whole machine runs 30% slower: the workload and the probe alike.
    slow = samples([v / 1.3 for v in baseline["output_throughput"]], [v * 1.3 for v in baseline["median_ttft_ms"]],
                   [1.3] * 5)
    raw = compare("output_throughput", baseline["output_throughput"], slow["output_throughput"],
                  METRICS["output_throughput"])
    assert raw.verdict is Verdict.REGRESSED
    base, current = normalize_to_machine_speed(baseline, slow)
    for name, direction in METRICS.items():
        assert current[name] == pytest.approx(base[name])
        assert compare(name, base[name], current[name], direction).verdict is not Verdict.REGRESSED


def test_a_slower_engine_on_the_same_machine_still_regresses():
    baseline = samples([100, 101, 99, 100.5, 99.5], [10, 9.9, 10.1, 10, 10.05], [1.0, 1.02, 0.98, 1.0, 1.01])
    slower = samples([v / 1.5 for v in baseline["output_throughput"]], [v * 1.5 for v in baseline["median_ttft_ms"]],
                     baseline[PROBE])
    base, current = normalize_to_machine_speed(baseline, slower)
    assert compare("output_throughput", base["output_throughput"], current["output_throughput"],
                   METRICS["output_throughput"]).verdict is Verdict.REGRESSED
    assert compare("median_e2el_ms", base["median_e2el_ms"], current["median_e2el_ms"],
                   METRICS["median_e2el_ms"]).verdict is Verdict.REGRESSED


def test_each_repeat_is_put_on_the_baselines_machine_speed():
    # The machine speed changes from repeat to repeat; the engine does not.
    speeds = [1.0, 1.25, 0.8, 1.1, 0.9]
    baseline = samples([100 / k for k in speeds], [10 * k for k in speeds], speeds)
    current = samples([100 / k for k in reversed(speeds)], [10 * k for k in reversed(speeds)], reversed(speeds))
    base, cur = normalize_to_machine_speed(baseline, current)
    for name in METRICS:
        expected = 100 if METRICS[name].value == "higher" else 10
        assert base[name] == pytest.approx([expected] * 5) and cur[name] == pytest.approx([expected] * 5), name


def test_without_probes_samples_pass_unchanged():
    baseline = {"output_throughput": [1.0, 2.0]}
    current = {"output_throughput": [3.0, 4.0], PROBE: [1.0, 1.0]}
    assert normalize_to_machine_speed(baseline, current) == (baseline, current)
