"""The trend test beside the step search: a creep is flagged with its slope and start, noise and steps are not."""

from __future__ import annotations

import math
import random

import pytest
from history_builders import commit_of, series_of, step_values

from perfsuite.history.changes import detect
from perfsuite.history.trend import TrendPolicy, find_trend, new_trend, trend_beside_steps
from perfsuite.judge.stats import Direction


def creep_values(num_flat: int, num_creep: int, per_run: float, noise: float = 0.02, seed: int = 3) -> list[float]:
    """``num_flat`` runs around 100, then ``num_creep`` each ``per_run`` (relative) further from it, with noise."""
    rng = random.Random(seed)
    levels = [100.0] * num_flat + [100.0 * (1 + per_run * (i + 1)) for i in range(num_creep)]
    return [level * (1 + noise * rng.gauss(0, 1)) for level in levels]


def test_a_creep_is_flagged_with_its_slope_per_run_its_start_and_its_direction():
    series = series_of(creep_values(8, 12, per_run=-0.01))
    trend = find_trend(series).trend
    assert trend is not None
    assert trend.slope_low <= trend.slope_per_run <= trend.slope_high < 0
    assert -0.012 < trend.slope_per_run < -0.003, "12 runs of -1% in a window of 20: about -0.6% a run over it"
    assert trend.p_value <= TrendPolicy().max_p_value
    assert trend.is_regression and trend.kind == "regression", "throughput falling"
    assert 4 <= trend.start_index <= 11, "the slope starts near run 8"
    assert trend.start.commit == commit_of(trend.start_index) and trend.newest.commit == commit_of(19)
    assert trend.total_change == pytest.approx(trend.slope_per_run * 19)
    text = trend.describe()
    assert "per run" in text and trend.start.short_commit in text and "regression" in text


def test_a_rising_latency_is_a_regression_and_a_rising_throughput_an_improvement():
    values = creep_values(5, 15, per_run=0.01)
    latency = find_trend(series_of(values, Direction.LOWER_IS_BETTER)).trend
    throughput = find_trend(series_of(values)).trend
    assert latency is not None and throughput is not None
    assert latency.is_regression and not throughput.is_regression


def test_flat_noise_is_flagged_no_more_often_than_the_tests_size():
    """A/A: of 500 windows of 20 runs of 5% noise, at most the two one-sided sizes together show a trend (the step
    rule and the least change only take some away), and regressions no more than max_p_value."""
    policy = TrendPolicy()
    windows = (series_of(step_values(20, 0, step=0.0, noise=0.05, seed=seed)) for seed in range(500))
    trends = [find_trend(window, policy).trend for window in windows]
    flagged = [trend for trend in trends if trend is not None]
    assert len(flagged) <= (policy.max_p_value + policy.max_p_value_improvement) * 500
    assert sum(trend.is_regression for trend in flagged) <= policy.max_p_value * 500


@pytest.mark.parametrize("seed", [0, 6, 20])
def test_an_improvement_needs_a_smaller_p_value_than_a_regression(seed):
    """The gate is for regressions: a slope down of one-sided p 0.004-0.015 is a regression trend, the same slope up
    (the values mirrored about 100: the same ranks and fits) is no improvement until max_p_value_improvement allows."""
    policy = TrendPolicy()
    values = creep_values(10, 10, per_run=-0.006, seed=seed)
    regression = find_trend(series_of(values)).trend
    assert regression is not None and policy.max_p_value_improvement < regression.p_value <= policy.max_p_value
    mirrored = [200 - value for value in values]
    assert find_trend(series_of(mirrored)).trend is None
    improvement = find_trend(series_of(mirrored), TrendPolicy(max_p_value_improvement=policy.max_p_value)).trend
    assert improvement is not None and improvement.kind == "improvement"
    assert improvement.p_value == pytest.approx(regression.p_value)


def test_a_staircase_creep_that_one_step_fits_nearly_as_well_is_still_a_trend():
    """+2% every 3 runs in 5% noise (the simulation's creep): one step fits this window within 10% of the slope's
    squared error; with no margin the step rule took it from the trend test, and the step search does not find it."""
    rng = random.Random(0)
    values = [100 / 1.02 ** (i // 3) * (1 + 0.05 * rng.gauss(0, 1)) for i in range(20)]
    assert find_trend(series_of(values), TrendPolicy(step_margin=0.0)).trend is None
    trend = find_trend(series_of(values)).trend
    assert trend is not None and trend.is_regression
    assert not detect(series_of(values)).change_points, "found by the trend test alone"


def test_a_significant_but_tiny_slope_is_no_trend():
    """0.1% per run in 0.1% noise is significant, and 2% over the window: under min_total_change."""
    series = series_of(creep_values(0, 20, per_run=-0.001, noise=0.001))
    assert find_trend(series, TrendPolicy(min_total_change=1.0)).trend is None
    assert find_trend(series, TrendPolicy(min_total_change=0.01)).trend is not None, "the effect size decides"


@pytest.mark.parametrize("num_after", [3, 5, 8, 12])
def test_a_step_is_no_trend(num_after):
    """A 10% drop fits two levels better than a line: left to the step search, which finds it."""
    series = series_of(step_values(20 - num_after, num_after, step=-0.10, noise=0.02, seed=4))
    assert find_trend(series).trend is None
    assert detect(series).change_points[-1].index == 20 - num_after


def test_while_a_step_is_at_the_head_the_trend_verdict_is_the_steps():
    series = series_of(step_values(14, 3, step=-0.10, noise=0.02, seed=4))
    detection = detect(series)
    assert detection.head is not None
    assert trend_beside_steps(detection) is None


def test_a_trend_is_new_once_and_then_reported_by_the_session_that_first_flagged_it():
    values = creep_values(6, 20, per_run=-0.01, seed=5)
    firsts = [end for end in range(10, len(values) + 1) if find_trend(series_of(values[:end])).trend is not None]
    first = firsts[0]
    assert new_trend(series_of(values[:first])).is_new
    later = new_trend(series_of(values[: first + 1]))
    assert later is not None and not later.is_new
    assert later.first_reported is not None and later.first_reported.commit == commit_of(first - 1)


@pytest.mark.parametrize("num_runs", [0, 1, 9])
def test_too_few_runs_are_not_tested_and_say_why(num_runs):
    search = find_trend(series_of([100.0 - i for i in range(num_runs)]))
    assert search.trend is None
    assert search.not_searched == f"{num_runs} runs, fewer than the 10 a trend test needs"


def test_points_without_a_finite_value_are_left_out_and_indices_stay_the_series():
    values = creep_values(6, 14, per_run=-0.01, seed=5)
    values[10] = math.nan
    trend = find_trend(series_of(values)).trend
    assert trend is not None and trend.newest.commit == commit_of(19)
    assert find_trend(series_of([math.nan] * 12)).not_searched == "0 runs, fewer than the 10 a trend test needs"


def test_a_constant_series_has_no_trend():
    assert find_trend(series_of([100.0] * 20)).trend is None


def test_a_level_at_or_under_zero_is_not_tested():
    assert find_trend(series_of([0.0] * 20)).not_searched == "the level is 0: a slope relative to it is none"


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"min_runs": 3}, "min_runs=3"),
        ({"min_runs": 30}, "min_runs=30"),
        ({"max_p_value": 0}, "max_p_value=0"),
        ({"max_p_value_improvement": 1.0}, "max_p_value_improvement=1.0: it must lie between 0 and 1"),
        ({"step_margin": 1.0}, "step_margin=1.0"),
        ({"step_margin": -0.1}, "step_margin=-0.1"),
        ({"step_margin": math.nan}, "step_margin=nan"),
    ],
)
def test_a_policy_that_cannot_work_is_refused_with_the_fix(changes, named):
    with pytest.raises(ValueError, match=named):
        TrendPolicy(**changes)
