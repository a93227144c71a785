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
    head_step,
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


OLD_HEAD_RULE = ChangePointPolicy(min_after_runs=1)  # any run after the step will do, as before issue 24's item 5


@pytest.mark.parametrize("num_back_to_normal", [0, 1])
def test_one_outlying_session_is_no_step_at_the_head(num_back_to_normal):
    """A 30% slow session, newest or followed by one run back at the old level: one run holds it, not two."""
    values = step_values(20, 0, step=0.0, noise=0.01, seed=2) + [70.0] + [100.0] * num_back_to_normal
    assert head_change(series_of(values), OLD_HEAD_RULE) is not None, "the old rule reported it"
    assert head_change(series_of(values)) is None


def test_a_step_is_at_the_head_once_two_runs_hold_it():
    values = step_values(20, 2, step=-0.10, noise=0.01)
    assert head_change(series_of(values[:21])) is None
    change = head_change(series_of(values))
    assert change is not None and change.index == 20 and change.relative_change == pytest.approx(-0.10, abs=0.02)


def test_min_after_runs_must_fit_within_the_head():
    with pytest.raises(ValueError, match="give 1 <= min_after_runs <= head_runs"):
        ChangePointPolicy(head_runs=5, min_after_runs=6)
    with pytest.raises(ValueError, match="min_after_runs=0"):
        ChangePointPolicy(min_after_runs=0)
    with pytest.raises(ValueError, match="give 1 <= min_after_runs_improvement <= head_runs"):
        ChangePointPolicy(head_runs=5, min_after_runs_improvement=6)
    with pytest.raises(ValueError, match="min_before_runs=0: a step needs at least one run before it"):
        ChangePointPolicy(min_before_runs=0)


@pytest.mark.parametrize("num_flat", [5, 6, 7, 8])
def test_a_fast_first_run_of_a_new_series_is_no_step_down_at_the_head(num_flat):
    """One fast session and then a flat level: the runs after it are no regression, while fewer than
    min_before_runs stand before the split. Under a head of 8 runs every series of 6 to 9 runs showed one."""
    values = [125.0] + step_values(num_flat, 0, step=0.0, noise=0.01, seed=num_flat)
    split = detect(series_of(values)).change_points
    assert split and split[-1].index == 1 and split[-1].is_regression, "Otava splits after the fast run"
    assert head_change(series_of(values), ChangePointPolicy(min_before_runs=1)) is not None, "what it reported"
    assert head_change(series_of(values)) is None


def test_the_runs_before_a_step_are_those_since_the_change_point_before_it():
    levels = [100.0] * 12 + [80.0] * 3 + [64.0] * 3
    detection = detect(series_of([level * factor for level, factor in zip(levels, step_values(18, 0, 0.0, 0.01))]))
    assert [point.index for point in detection.change_points] == [12, 15]
    assert [detection.runs_before(point) for point in detection.change_points] == [12, 3]
    assert detection.head is None, "three runs between the two steps are no level to step from"
    assert dataclasses.replace(detection, policy=ChangePointPolicy(min_before_runs=3)).head is not None


def test_an_improvement_waits_for_one_run_more_than_a_regression():
    """The gate is for regressions: a regression is at the head once two runs hold it, an improvement three."""
    for step, kind in ((-0.10, "regression"), (0.10, "improvement")):
        values = step_values(20, 3, step=step, noise=0.01)
        held = [head_change(series_of(values[: 20 + after])) is not None for after in (1, 2, 3)]
        assert held == ([False, True, True] if kind == "regression" else [False, False, True]), kind
        assert head_step(detect(series_of(values))).is_new == (kind == "improvement"), "first at run 2 or at run 3"


def _head_step(values):
    return head_step(detect(series_of(values)))


def test_a_step_is_new_at_the_first_session_that_finds_it_and_not_at_the_next():
    values = step_values(20, 3, step=-0.10, noise=0.01)
    first, second = _head_step(values[:22]), _head_step(values)
    assert first.is_new and first.change_point.index == 20
    assert not second.is_new and second.change_point.index == 20
    assert second.first_reported.commit == commit_of(21), "the session that found it"
    assert _head_step(step_values(20, 0, step=0.0, noise=0.01)) is None


@pytest.mark.parametrize(
    ("seed", "end", "earlier_index", "index"),
    [(16, 24, 19, 20), (55, 25, 22, 20)],  # 6% steps in 2% noise where the best split moved as runs were added
)
def test_a_split_that_moves_one_run_back_or_a_few_forward_is_the_same_step(seed, end, earlier_index, index):
    values = step_values(20, 5, step=-0.06, noise=0.02, seed=seed)
    assert _head_step(values[: end - 1]).change_point.index == earlier_index
    step = _head_step(values[:end])
    assert step.change_point.index == index and not step.is_new
    assert step.first_reported.commit == commit_of(end - 2)


def test_a_split_more_than_one_run_later_than_the_reported_one_is_a_new_step():
    values = step_values(20, 5, step=-0.06, noise=0.02, seed=26)
    assert _head_step(values[:24]).change_point.index == 20
    step = _head_step(values)
    assert step.change_point.index == 23 and step.is_new
