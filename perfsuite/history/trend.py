"""Trends of a series: a slow creep at its head, by how much per run and since when.

The step search (``perfsuite.history.changes``) finds levels that stepped; a
creep is a slope, and while it goes on the best split trails the newest runs,
so the step verdict finds it late or not at all. This is the test beside it:
over the newest ``TrendPolicy.window_runs`` runs, a Mann-Kendall test (is
each run more often above or below the runs before it than chance allows?)
and Sen's slope (the median of the slopes between every two runs), both
rank-based, so one slow session among them moves neither much.

A step is no slope: a window that one step (two levels) fits clearly better
than a flat level followed by a line (as many parameters: a level, a slope,
where it starts) is left to the step search, so a machine that became
faster, or a merge that cost 10% at once, is reported as the step it is.
"Clearly": the step's squared error is at least ``step_margin`` (10%) under
the slope's. A staircase creep in noise is often fitted as well by one step
as by a line, by chance; a true step wins by far more.

A trend is flagged only when it is significant *and* large. Significant:
the one-sided Mann-Kendall p the way it goes is at most ``max_p_value`` for
a regression and ``max_p_value_improvement`` for an improvement. The gate is
there for regressions, so its false-alarm budget is spent on them; an
improvement needs stronger evidence, and is reported later or not at all.
Large: its fitted change over the window is at least
``min_total_change``, so a significant but tiny slope is not one. Values are
taken relative to the window's median, so the slope reads "-0.7% per run".
"Since when" is where the slope starts: the run after which a flat level and
then a straight line fit the window best. Like a step, a trend is a verdict
once (``new_trend``): a trend the same way flagged by one of the previous
``repeat_runs`` sessions' own searches is the same trend.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

import numpy as np
from scipy.stats import norm

from perfsuite.history.changes import Detection
from perfsuite.history.series import Series, SeriesPoint
from perfsuite.judge.stats import Direction


@dataclass(frozen=True, slots=True)
class TrendPolicy:
    """The thresholds of the trend test (docs/change-points.md, Trends, says why each).

    ``window_runs``: the newest runs tested. ``min_runs``: with fewer
    finite runs nothing is tested. ``max_p_value``: the one-sided
    Mann-Kendall p of a regression; ``max_p_value_improvement``: of an
    improvement (module docstring: why they differ). ``min_total_change``:
    the least fitted change over the window, relative to its median. ``confidence``: of the slope's
    interval. ``repeat_runs``: how far back a trend the same way is the same.
    ``step_margin``: how much better (a share of the slope fit's squared
    error) one step must fit the window to take it from the trend test.
    """

    window_runs: int = 20
    min_runs: int = 10
    max_p_value: float = 0.02
    max_p_value_improvement: float = 0.0025
    min_total_change: float = 0.05
    confidence: float = 0.95
    repeat_runs: int = 8
    step_margin: float = 0.1

    def __post_init__(self) -> None:
        if not 4 <= self.min_runs <= self.window_runs:
            raise ValueError(
                f"min_runs={self.min_runs} with window_runs={self.window_runs}: a trend needs at least 4 runs "
                "and no more than the window holds; give 4 <= min_runs <= window_runs"
            )
        if not 0 <= self.step_margin < 1:
            raise ValueError(f"step_margin={self.step_margin}: a share of the slope fit's squared error, 0 <= it < 1")
        for name in ("max_p_value", "max_p_value_improvement", "confidence"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: it must lie between 0 and 1")


@dataclass(frozen=True, slots=True)
class Trend:
    """A slope over the newest runs: per run, relative to the window's median level."""

    start: SeriesPoint  # the first run of the slope (the onset fit)
    start_index: int  # its index in ``Series.points``
    newest: SeriesPoint
    num_runs: int  # runs tested: the window
    runs_since_start: int  # from ``start`` to ``newest``, both included
    slope_per_run: float  # Sen's slope: -0.007 is 0.7% of the level lower each run
    intercept: float  # the fitted line at the window's first run, relative to ``level``: median of value - slope x run
    slope_low: float  # its confidence interval
    slope_high: float
    p_value: float  # one-sided Mann-Kendall, the way the trend goes
    level: float  # the window's median
    direction: Direction

    @property
    def total_change(self) -> float:
        """The fitted change over the window, relative to its level: what ``min_total_change`` bounds."""
        return self.slope_per_run * (self.num_runs - 1)

    def fitted(self, position: float, slope: float | None = None) -> float:
        """The line at ``position`` runs from the window's first, in the series' units; another ``slope`` (an end of
        the interval) turns the line about the window's middle."""
        middle = (self.num_runs - 1) / 2
        at_middle = self.intercept + self.slope_per_run * middle
        return self.level * (at_middle + (self.slope_per_run if slope is None else slope) * (position - middle))

    @property
    def is_regression(self) -> bool:
        return self.slope_per_run < 0 if self.direction is Direction.HIGHER_IS_BETTER else self.slope_per_run > 0

    @property
    def kind(self) -> str:
        return "regression" if self.is_regression else "improvement"

    @property
    def commit_range(self) -> str:
        """From the first run of the slope to the newest: the commits in it include the causes."""
        return f"{self.start.short_commit}..{self.newest.short_commit}"

    def describe(self) -> str:
        return (
            f"trend {self.slope_per_run:+.2%} per run (95% CI {self.slope_low:+.2%}..{self.slope_high:+.2%}) "
            f"({self.kind}) since {self.start.short_commit} ({self.start.created_at}), "
            f"{self.runs_since_start} runs; {self.total_change:+.1%} fitted over the newest {self.num_runs} runs, "
            f"p={self.p_value:.2g} (one-sided)"
        )


@dataclass(frozen=True, slots=True)
class TrendSearch:
    """The trend test of a series' newest runs: the trend flagged, or none, or why nothing was tested."""

    series: Series
    policy: TrendPolicy
    trend: Trend | None = None
    not_searched: str | None = None  # too few runs, say


@dataclass(frozen=True, slots=True)
class NewTrend:
    """A trend at the head, and the earlier session whose own search flagged it first, if one did."""

    trend: Trend
    first_reported: SeriesPoint | None = None

    @property
    def is_new(self) -> bool:
        return self.first_reported is None


def find_trend(series: Series, policy: TrendPolicy = TrendPolicy()) -> TrendSearch:
    """The trend over ``series``' newest runs, if one is flagged (module docstring: when)."""
    usable = [(index, point) for index, point in enumerate(series.points) if math.isfinite(point.value)]
    window = usable[-policy.window_runs :]
    if len(window) < policy.min_runs:
        reason = f"{len(window)} runs, fewer than the {policy.min_runs} a trend test needs"
        return TrendSearch(series, policy, not_searched=reason)
    level = statistics.median(point.value for _, point in window)
    if level <= 0:
        return TrendSearch(series, policy, not_searched=f"the level is {level:.4g}: a slope relative to it is none")
    values = np.array([point.value / level for _, point in window])
    score, variance, slopes = _kendall(values)
    p_value = float(norm.sf((abs(score) - 1) / math.sqrt(variance))) if score and variance else 1.0
    regression = score < 0 if series.direction is Direction.HIGHER_IS_BETTER else score > 0
    slope = float(np.median(slopes))
    low, high = _slope_interval(slopes, variance, policy.confidence)
    max_p_value = policy.max_p_value if regression else policy.max_p_value_improvement
    large = abs(slope) * (len(window) - 1) >= policy.min_total_change
    same_way = slope * score > 0  # the p judged is that of the slope's own direction
    if p_value > max_p_value or not large or not same_way or low <= 0 <= high:
        return TrendSearch(series, policy)
    onset, slope_error = _onset(values)
    if _step_error(values) <= slope_error * (1 - policy.step_margin):  # one step explains it clearly better: a step's
        return TrendSearch(series, policy)
    start_index, start = window[onset]
    intercept = float(np.median(values - slope * np.arange(len(values))))
    trend = Trend(
        start, start_index, window[-1][1], len(window), len(window) - onset, slope, intercept, low, high, p_value,
        level, series.direction,
    )  # fmt: skip
    return TrendSearch(series, policy, trend)


def new_trend(series: Series, policy: TrendPolicy = TrendPolicy()) -> NewTrend | None:
    """The trend at ``series``' head, and the earlier session that flagged a trend the same way first, if any.

    Each of the ``repeat_runs`` sessions before the newest is searched as it
    was, over its own series up to it; the oldest of them that flagged a
    trend the same way (regression or not) is the one that reported it.
    """
    trend = find_trend(series, policy).trend
    if trend is None:
        return None
    first = None
    for end in range(len(series.points) - 1, max(0, len(series.points) - 1 - policy.repeat_runs), -1):
        earlier = find_trend(replace(series, points=series.points[:end]), policy).trend
        if earlier is not None and earlier.is_regression == trend.is_regression:
            first = series.points[end - 1]
    return NewTrend(trend, first)


def trend_beside_steps(detection: Detection, policy: TrendPolicy = TrendPolicy()) -> NewTrend | None:
    """The trend verdict beside the step search's ``detection`` of the same series: none while a step is at the
    head (the step search reports that change, as the step it is), else ``new_trend``."""
    return None if detection.head is not None else new_trend(detection.series, policy)


def _kendall(values: np.ndarray) -> tuple[float, float, np.ndarray]:
    """Mann-Kendall's S, its variance (ties corrected), and the slope between every two runs."""
    first, second = np.triu_indices(len(values), k=1)
    score = float(np.sign(values[second] - values[first]).sum())
    n = len(values)
    _, ties = np.unique(values, return_counts=True)
    variance = (n * (n - 1) * (2 * n + 5) - float((ties * (ties - 1) * (2 * ties + 5)).sum())) / 18
    return score, variance, (values[second] - values[first]) / (second - first)


def _slope_interval(slopes: np.ndarray, variance: float, confidence: float) -> tuple[float, float]:
    """Sen's confidence interval: the order statistics of the pair slopes that Mann-Kendall's variance gives."""
    ordered = np.sort(slopes)
    spread = norm.ppf(0.5 + confidence / 2) * math.sqrt(variance)
    lower = int(max(0, math.floor((len(ordered) - spread) / 2)))
    upper = int(min(len(ordered) - 1, math.ceil((len(ordered) + spread) / 2)))
    return float(ordered[lower]), float(ordered[upper])


def _onset(values: np.ndarray) -> tuple[int, float]:
    """Where the slope starts, and the squared error of that fit: a flat level, then a line (least squares).

    The newest three runs are always on the slope; onset 0 is a straight line.
    """
    positions = np.arange(len(values), dtype=float)
    best, best_error = 0, math.inf
    for onset in range(len(values) - 2):
        design = np.column_stack([np.ones_like(positions), np.maximum(0.0, positions - onset)])
        coefficients = np.linalg.lstsq(design, values, rcond=None)[0]
        error = float(((design @ coefficients - values) ** 2).sum())
        if error < best_error - 1e-12:
            best, best_error = onset, error
    return best, best_error


def _step_error(values: np.ndarray) -> float:
    """The squared error of the best single step (two levels, at least two runs each): as many parameters as
    ``_onset``'s fit, so neither wins by having more."""
    return min(
        float(
            ((values[:split] - values[:split].mean()) ** 2).sum()
            + ((values[split:] - values[split:].mean()) ** 2).sum()
        )
        for split in range(2, len(values) - 1)
    )
