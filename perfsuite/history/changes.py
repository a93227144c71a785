"""Change points of a series: where its level stepped, by how much, and whether the newest runs are a step.

A change point is an index of a series (``perfsuite.history.series``) where
the runs before and the runs after have different means: a commit in that
range changed the speed, once, and it stayed changed. One run against one
baseline cannot see ten merges that each cost 2%; the series can.

The detection is Apache Otava's (``apache-otava``, the Apache incubating
successor of DataStax's Hunter): ``otava.analysis.compute_change_points``,
the method of Fleming et al., "Hunter: Using Change Point Detection to Hunt
for Performance Regressions" (ICPE 2023). E-Divisive means (Matteson and
James) proposes splits window by window, at a relaxed p-value, and a merge
step then drops, weakest first, every split whose two neighbouring segments
a two-sided Student's t-test does not tell apart at ``max_p_value`` or whose
relative change is within ``min_magnitude``; each survivor's p-value and
means are those of its neighbouring segments. Why Otava and not MongoDB's
``signal-processing-algorithms``: that one's last release (2.1.6, December
2024) pins numpy<2 and ships as an sdist with a C extension to compile.
Otava's declared dependencies (BigQuery, Slack, PostgreSQL clients, a
numpy==2.2 pin, scipy<1.17) are for its own command line and conflict with
ours, while ``otava.analysis`` needs only numpy and scipy: it is installed
with ``--no-deps`` (``make install`` does), and where it is missing the
functions here raise ``ChangePointsUnavailable`` naming that command.

A change point *at the head* is one whose "after" segment is made of the
newest runs only (``ChangePointPolicy.head_runs`` of them at most): the
last few sessions stepped away from the ones before. It is a verdict of its
own (``head_change``); later, once more runs follow it, it is history.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from perfsuite.history.series import Series, SeriesPoint
from perfsuite.judge.stats import Direction

OTAVA_REQUIREMENT = "apache-otava==0.8.0"
INSTALL_OTAVA = f'pip install --no-deps "{OTAVA_REQUIREMENT}"'


class ChangePointsUnavailable(RuntimeError):
    """Apache Otava is not installed: the message names the command that installs it."""


@dataclass(frozen=True, slots=True)
class ChangePointPolicy:
    """The thresholds of the detection, in one place for the calibration (issue 24, item 5) to tune.

    ``max_p_value``: Otava's default, as in Fleming et al. The t-test's p is
    taken after the split was chosen to fit the data, so it is optimistic:
    on simulated flat series of 30 runs with 3% noise, about 2% of series
    showed a change point somewhere at 0.001, and 24% at 0.01.
    ``min_magnitude``: a step within 1% of the mean is not reported, however
    significant many runs make it; this machine's sessions move by a few
    percent from one to the next. ``window_len``: Otava's default; a series
    longer than it is searched window by window (half a window per step).
    ``min_points``: with fewer runs nothing is searched (the result says so):
    a head step then has at least five runs before it to stand against.
    ``head_runs``: a change point is at the head while at most this many of
    the newest runs make its "after" segment; a 10% step in 3% noise is found
    within three to five runs.
    """

    max_p_value: float = 0.001
    min_magnitude: float = 0.01
    window_len: int = 50
    min_points: int = 6
    head_runs: int = 5


@dataclass(frozen=True, slots=True)
class ChangePoint:
    """A step in a series: ``index`` is the first point after it, in ``Series.points``."""

    index: int
    last_before: SeriesPoint
    first_after: SeriesPoint
    mean_before: float  # over the segment since the previous change point
    mean_after: float  # over the segment up to the next one
    p_value: float  # two-sided t-test of those two segments
    direction: Direction  # which way is better for the metric

    @property
    def relative_change(self) -> float:
        """mean after / mean before - 1: +0.1 is 10% higher after the step."""
        if self.mean_before == 0:
            return math.copysign(math.inf, self.mean_after) if self.mean_after else 0.0
        return self.mean_after / self.mean_before - 1

    @property
    def is_regression(self) -> bool:
        change = self.relative_change
        return change < 0 if self.direction is Direction.HIGHER_IS_BETTER else change > 0

    @property
    def kind(self) -> str:
        return "regression" if self.is_regression else "improvement"

    @property
    def commit_range(self) -> str:
        """``abc1234..def5678``: the commits in it, ``git log abc1234..def5678``, include the cause."""
        return f"{self.last_before.short_commit}..{self.first_after.short_commit}"

    def describe(self) -> str:
        return (
            f"{self.relative_change:+.1%} ({self.kind}) between {self.commit_range} "
            f"({self.last_before.created_at} .. {self.first_after.created_at}), "
            f"mean {self.mean_before:.4g} -> {self.mean_after:.4g}, p={self.p_value:.2g}"
        )


@dataclass(frozen=True, slots=True)
class Detection:
    """A series' change points, oldest first, or why it was not searched."""

    series: Series
    policy: ChangePointPolicy
    change_points: tuple[ChangePoint, ...] = ()
    not_searched: str | None = None  # too few runs, say
    num_skipped: int = 0  # points without a finite value, left out of the search

    @property
    def head(self) -> ChangePoint | None:
        """The newest change point, when it is at the head (module docstring)."""
        if not self.change_points:
            return None
        newest = self.change_points[-1]
        return newest if len(self.series.points) - newest.index <= self.policy.head_runs else None


def detect(series: Series, policy: ChangePointPolicy = ChangePointPolicy()) -> Detection:
    """``series``' change points under ``policy``; ``ChangePointsUnavailable`` without Otava."""
    usable = [(index, point) for index, point in enumerate(series.points) if math.isfinite(point.value)]
    num_skipped = len(series.points) - len(usable)
    if len(usable) < policy.min_points:
        reason = f"{len(usable)} runs, fewer than the {policy.min_points} a search needs"
        return Detection(series, policy, not_searched=reason, num_skipped=num_skipped)
    values = [point.value for _, point in usable]
    if max(values) == min(values):  # nothing to split; a t-test of two constant segments has no variance
        return Detection(series, policy, num_skipped=num_skipped)
    compute_change_points = _otava()
    steps, _ = compute_change_points(
        values, window_len=policy.window_len, max_pvalue=policy.max_p_value, min_magnitude=policy.min_magnitude
    )
    change_points = tuple(_change_point(step, usable, series) for step in sorted(steps, key=lambda s: s.index))
    return Detection(series, policy, change_points, num_skipped=num_skipped)


def head_change(series: Series, policy: ChangePointPolicy = ChangePointPolicy()) -> ChangePoint | None:
    """The change point whose "after" segment is the newest ``policy.head_runs`` runs or fewer; None: none."""
    return detect(series, policy).head


def _change_point(step, usable: Sequence[tuple[int, SeriesPoint]], series: Series) -> ChangePoint:
    """Otava's change point (an index into the finite values) as one of ``series``' points."""
    index, first_after = usable[int(step.index)]
    return ChangePoint(
        index=index,
        last_before=usable[int(step.index) - 1][1],
        first_after=first_after,
        mean_before=float(step.stats.mean_1),
        mean_after=float(step.stats.mean_2),
        p_value=float(step.stats.pvalue),
        direction=series.direction,
    )


def _otava():
    try:
        from otava.analysis import compute_change_points
    except ImportError as error:
        raise ChangePointsUnavailable(
            f"change points need Apache Otava, which is not installed ({error}); install it with "
            f"`{INSTALL_OTAVA}` (--no-deps: its declared dependencies are for its own command line, and "
            "perfsuite needs only numpy and scipy, which it has)"
        ) from None
    return compute_change_points
