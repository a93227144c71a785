"""Change points of a series (Apache Otava): where a level stepped, its commit range, size and direction."""

from __future__ import annotations

import dataclasses
import math
import sys

import pytest

from history_builders import commit_of, series_of, stamp_of, step_values
from perfsuite.history.changes import (
    INSTALL_OTAVA,
    ChangePoint,
    ChangePointPolicy,
    ChangePointsUnavailable,
    detect,
    head_change,
)
from perfsuite.judge.stats import Direction


@pytest.fixture
def without_otava(monkeypatch):
    """As in an environment where apache-otava is not installed: importing it fails."""
    monkeypatch.setitem(sys.modules, "otava.analysis", None)


def test_a_10_percent_drop_in_noise_is_found_at_its_index_with_its_commit_range():
    series = series_of(step_values(15, 10, step=-0.10))
    (change,) = detect(series).change_points
    assert change.index == 15
    assert change.last_before.commit == commit_of(14) and change.first_after.commit == commit_of(15)
    assert change.commit_range == f"{commit_of(14)[:7]}..{commit_of(15)[:7]}"
    assert change.relative_change == pytest.approx(-0.10, abs=0.02)
    assert change.relative_change == pytest.approx(change.mean_after / change.mean_before - 1)
    assert change.p_value < ChangePointPolicy().max_p_value
    assert change.is_regression and change.kind == "regression", "throughput: lower is worse"
    assert "-" in change.describe() and change.commit_range in change.describe()


def test_a_rise_is_a_regression_for_a_latency_and_an_improvement_for_throughput():
    values = step_values(12, 8, step=0.10)
    latency = detect(series_of(values, Direction.LOWER_IS_BETTER)).change_points[0]
    throughput = detect(series_of(values)).change_points[0]
    assert latency.is_regression and not throughput.is_regression
    assert throughput.kind == "improvement"


def test_a_flat_noisy_series_has_no_change_point():
    detection = detect(series_of(step_values(30, 0, step=0.0, noise=0.03, seed=5)))
    assert detection.change_points == () and detection.not_searched is None


def test_a_short_series_is_not_searched_and_says_why(without_otava):
    """Nothing is searched, so Otava is not even needed."""
    detection = detect(series_of([100.0, 100.0, 100.0, 90.0, 90.0]))
    assert detection.change_points == ()
    assert detection.not_searched == "5 runs, fewer than the 6 a search needs"


def test_a_constant_series_has_no_change_point(without_otava):
    assert detect(series_of([42.0] * 20)).change_points == ()


def test_points_without_a_finite_value_are_skipped_and_indices_stay_the_series():
    values = step_values(10, 8, step=-0.15)
    values[3] = math.nan
    values[12] = math.inf
    detection = detect(series_of(values))
    assert detection.num_skipped == 2
    (change,) = detection.change_points
    assert change.index == 10 and change.first_after.created_at == stamp_of(10)
    too_few = detect(series_of([100.0, math.nan, 100.0, 100.0, 90.0, math.nan, 90.0]))
    assert too_few.not_searched.startswith("5 runs") and too_few.num_skipped == 2


def test_a_step_in_the_newest_runs_is_at_the_head():
    series = series_of(step_values(20, 3, step=-0.10))
    change = head_change(series)
    assert change is not None and change.index == 20 and change.is_regression


def test_a_step_further_back_is_history_not_the_head():
    series = series_of(step_values(12, 10, step=-0.10))
    assert detect(series).change_points[0].index == 12
    assert head_change(series) is None
    assert head_change(series, ChangePointPolicy(head_runs=10)) is not None, "within a wider head it would be"


def test_the_policy_thresholds_decide():
    series = series_of(step_values(15, 10, step=-0.03, noise=0.01))
    assert len(detect(series).change_points) == 1
    assert detect(series, ChangePointPolicy(min_magnitude=0.05)).change_points == (), "smaller than min_magnitude"
    assert detect(series, ChangePointPolicy(min_points=30)).not_searched is not None


def test_the_relative_change_from_a_mean_of_zero_is_unbounded():
    point = series_of([0.0])
    change = ChangePoint(1, point.points[0], point.points[0], 0.0, 2.0, 0.0001, Direction.LOWER_IS_BETTER)
    assert change.relative_change == math.inf and change.is_regression
    assert dataclasses.replace(change, mean_after=0.0).relative_change == 0.0


def test_without_otava_a_search_names_the_pip_command(without_otava):
    with pytest.raises(ChangePointsUnavailable, match="apache-otava") as raised:
        detect(series_of(step_values(15, 10, step=-0.10)))
    assert INSTALL_OTAVA in str(raised.value) and "--no-deps" in INSTALL_OTAVA
