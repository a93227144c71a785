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
newest runs only (``ChangePointPolicy.head_runs`` of them at most, and at
least ``runs_to_hold`` holding it, with ``min_before_runs`` before it): the
last few sessions stepped away from the ones before. It is a verdict of its
own, once: ``head_step`` says whether an earlier session's own search
already had the same step at its head (``HeadStep.first_reported``). Later,
once more runs follow it, it is history.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

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
    the newest runs make its "after" segment. A 10% step in 3% noise is found
    within three to five runs, but a creep is no step: while it goes on, the
    best split falls in the middle of the slope, so its "after" segment is
    longer than the runs since the creep became significant. On SmolLM2
    sessions of this machine a creep of 2% every three sessions was first
    split 7 runs back, 5 runs after it passed 10% (docs/change-points.md,
    Calibration); with 5 the head verdict found it 18 runs late.
    ``min_after_runs``: a regression is at the head only once at least this
    many runs after it hold it (each nearer the level after it than the level
    before). One slow session is an outlier, not a level shift, and the
    per-run verdict already judges it against its baseline; a step that stays
    is still there one run later, well inside the five runs the creep target
    allows. ``min_after_runs_improvement``: the same for an improvement. The
    gate is there for regressions, and an improvement reported a run later
    costs nothing, so it waits for one more run: two fast sessions in a row
    (a quiet spell of a shared machine) are then no step.
    ``min_before_runs``: a change point is at the head only with at least
    this many runs before it, since the series' start or the change point
    before it. One or two runs at the start of a new series are no level to
    step from: with a head of 8 runs, a series of 6 to 10 runs whose first
    run or two were fast otherwise showed the runs after them as a step down.
    """

    max_p_value: float = 0.001
    min_magnitude: float = 0.01
    window_len: int = 50
    min_points: int = 6
    head_runs: int = 8
    min_after_runs: int = 2
    min_after_runs_improvement: int = 3
    min_before_runs: int = 5

    def __post_init__(self) -> None:
        for name in ("min_after_runs", "min_after_runs_improvement"):
            if not 1 <= getattr(self, name) <= self.head_runs:
                raise ValueError(
                    f"{name}={getattr(self, name)} with head_runs={self.head_runs}: a change point at the head "
                    f"has between {name} and head_runs runs after it; give 1 <= {name} <= head_runs"
                )
        if self.min_before_runs < 1:
            raise ValueError(
                f"min_before_runs={self.min_before_runs}: a step needs at least one run before it; give 1 or more"
            )

    def runs_to_hold(self, is_regression: bool) -> int:
        """How many runs after a change point must hold it before it is at the head: ``min_after_runs`` for a
        regression, ``min_after_runs_improvement`` for an improvement."""
        return self.min_after_runs if is_regression else self.min_after_runs_improvement


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

    def runs_after(self, change_point: ChangePoint) -> int:
        """Points of the series from ``change_point``'s first "after" point to the newest, both included."""
        return len(self.series.points) - change_point.index

    def runs_holding(self, change_point: ChangePoint) -> int:
        """Runs after ``change_point`` nearer the level after it than the level before: those that show the step."""
        after = (point.value for point in self.series.points[change_point.index :] if math.isfinite(point.value))
        return sum(abs(v - change_point.mean_after) < abs(v - change_point.mean_before) for v in after)

    def runs_before(self, change_point: ChangePoint) -> int:
        """Finite runs from the change point before ``change_point`` (or the series' start) up to it: its level."""
        start = max((point.index for point in self.change_points if point.index < change_point.index), default=0)
        return sum(math.isfinite(point.value) for point in self.series.points[start : change_point.index])

    @property
    def head(self) -> ChangePoint | None:
        """The newest change point, when it is at the head, enough runs after it hold it (``runs_to_hold``) and at
        least ``min_before_runs`` runs stand before it.

        Held: nearer the level after the step than the level before. One
        outlying session, newest or followed by runs back at the old level,
        holds a step alone, so it is never one.
        """
        if not self.change_points:
            return None
        newest, policy = self.change_points[-1], self.policy
        at_head = self.runs_after(newest) <= policy.head_runs and self.runs_before(newest) >= policy.min_before_runs
        return newest if at_head and self.runs_holding(newest) >= policy.runs_to_hold(newest.is_regression) else None


@dataclass(frozen=True, slots=True)
class HeadStep:
    """A change point at the head, and whether it is new: a verdict once, at the first session that finds it."""

    change_point: ChangePoint
    first_reported: SeriesPoint | None = None  # the earlier session whose own search had it at its head; None: new

    @property
    def is_new(self) -> bool:
        return self.first_reported is None


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


def head_step(detection: Detection) -> HeadStep | None:
    """The searched series' change point at the head, and the earlier session that first reported it, if one did.

    No state is kept between sessions: what an earlier session reported is
    what its own search (the series up to it) had at its head, so each
    session that could have seen the step, from the first with
    ``runs_to_hold`` runs after it on, is searched again; that costs
    nothing unless the newest search found a head. The same step is one of
    the same kind (regression or not) whose first "after" point is at most
    one run before this one's, or anywhere after it: the runs from this step
    on are now one level, so an earlier split among them was this step seen
    sooner, and as runs are added the best split can move, by one run back
    or by a few forward. A step more than one run before it is another step.
    """
    series, policy, head = detection.series, detection.policy, detection.head
    if head is None:
        return None
    for end in range(head.index + policy.runs_to_hold(head.is_regression) - 1, len(series.points)):
        earlier = detect(replace(series, points=series.points[:end]), policy).head
        if earlier is not None and earlier.index >= head.index - 1 and earlier.is_regression == head.is_regression:
            return HeadStep(head, first_reported=series.points[end - 1])
    return HeadStep(head)


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
