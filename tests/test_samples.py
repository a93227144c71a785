"""One rule for every stored sample (perfsuite.judge.samples): finite, never negative, 0 only where a run measures it."""

from __future__ import annotations

import pytest

from perfsuite.judge.catalogue import BUSY_SHARE, CAPACITY, GOODPUT, PROBE
from perfsuite.judge.samples import measurement_problem, sample_problem
from perfsuite.measure.summaries import DEVICE_MEMORY

ZERO_MEASURED = [GOODPUT, "median_ttft_ms", "median_tpot_ms", "median_e2el_ms", "tpot_ms", BUSY_SHARE, DEVICE_MEMORY,
                 "a_metric_of_a_newer_perfsuite"]  # fmt: skip
NEVER_ZERO = ["output_throughput", "request_throughput", CAPACITY, PROBE, "probe_seconds"]


@pytest.mark.parametrize("metric", ZERO_MEASURED)
def test_zero_is_a_measurement_of_goodput_latencies_shares_and_bytes(metric):
    assert sample_problem(metric, 0) is None and sample_problem(metric, 0.0) is None


@pytest.mark.parametrize("metric", NEVER_ZERO)
def test_zero_is_refused_where_no_run_measures_it(metric):
    assert sample_problem(metric, 0.0) == f"but {metric} must be above 0"
    assert sample_problem(metric, 1e-9) is None


@pytest.mark.parametrize("metric", ZERO_MEASURED + NEVER_ZERO)
@pytest.mark.parametrize(
    ("value", "problem"),
    [(-1e-9, "cannot be negative"), (float("nan"), "not a finite number"), (float("-inf"), "not a finite number"),
     (10**400, "not a finite number"), ("1.0", "not a number"), (None, "not a number"), (False, "not a number")],
)  # fmt: skip
def test_no_metric_takes_a_negative_or_non_finite_value_or_a_non_number(metric, value, problem):
    assert problem in sample_problem(metric, value)


def test_a_measurement_names_the_field_the_metric_and_the_first_bad_value():
    data = {"samples": {"output_throughput": [1.0, 2.0], "median_ttft_ms": [3.0, -4.0, "x"]}, "counters": {"n": 1}}
    expected = "samples['median_ttft_ms'] holds -4.0, but median_ttft_ms cannot be negative"
    assert measurement_problem(data) == expected
    assert measurement_problem({"reference_samples": {"tpot_ms": []}}, ["reference_samples"]) == (
        "reference_samples['tpot_ms'] is an empty list"
    )
    assert measurement_problem({"samples": {"output_throughput": [1.0]}, "counters": {"n": -1}}) == (
        "counters['n'] is -1, which is not an integer >= 0"
    )
