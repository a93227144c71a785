"""A session's own change-point verdict: did its runs step away from the history before them?

After a ``pytest --perf`` session, each series its tests belong to
(``perfsuite.history.series``: same test, metric, fingerprint and run
configuration) is searched over the earlier sessions and this one; a change
point whose "after" segment is this session and at most a few before it
(``perfsuite.history.changes.head_step``) is reported. A single run
compared with a baseline cannot see a slow creep; this verdict can. It is
shown always; ``--perf-fail-on-change-point`` makes a new regression among
them fail the session (off until the thresholds are calibrated). A step an
earlier session already reported is still shown, with that session, but is
no verdict again: it failed (or could have failed) that session once.

Beside the steps, each series' newest runs are tested for a trend
(``perfsuite.history.trend.trend_beside_steps``): a creep that no split
shows yet. A trend is shown, among the warnings with its own prefix, and is
a verdict once like a step; it fails no session (yet).

An A/B session (``--perf-against``) is no point of any series
(``perfsuite.history.series`` says why): nothing is checked for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perfsuite.history.changes import ChangePoint, ChangePointPolicy, ChangePointsUnavailable, detect, head_step
from perfsuite.history.series import SeriesKey, SeriesPoint, build_series
from perfsuite.history.trend import Trend, trend_beside_steps
from perfsuite.judge.results import Results

# results.json keeps each head change point among its warnings, after this prefix.
HEAD_WARNING_PREFIX = "change point at the head: "
TREND_WARNING_PREFIX = "trend at the head: "


@dataclass(frozen=True, slots=True)
class HeadChange:
    """A change point at the head of one of the session's series."""

    key: SeriesKey
    change_point: ChangePoint
    num_runs: int  # points in the series, this session's included
    first_reported: SeriesPoint | None = None  # the earlier session that reported the same step; None: new

    @property
    def is_new(self) -> bool:
        return self.first_reported is None

    def describe(self) -> str:
        key = self.key
        text = (
            f"{key.test_id} {key.metric} (fingerprint {key.fingerprint_label}, {key.configuration_label}, "
            f"{self.num_runs} runs): {self.change_point.describe()}"
        )
        if self.first_reported is None:
            return text
        earlier = self.first_reported
        return f"{text}; still at the head, first reported at session {earlier.short_commit} ({earlier.created_at})"


@dataclass(frozen=True, slots=True)
class HeadTrend:
    """A trend over the newest runs of one of the session's series."""

    key: SeriesKey
    trend: Trend
    num_runs: int
    first_reported: SeriesPoint | None = None  # the earlier session that flagged it first; None: new

    @property
    def is_new(self) -> bool:
        return self.first_reported is None

    def describe(self) -> str:
        key = self.key
        text = f"{key.test_id} {key.metric} (fingerprint {key.fingerprint_label}, {self.num_runs} runs): "
        text += self.trend.describe()
        if self.first_reported is None:
            return text
        return f"{text}; first reported at session {self.first_reported.short_commit}"


@dataclass(frozen=True, slots=True)
class HeadCheck:
    """What the head search over one session's series found, and what it could not search."""

    changes: tuple[HeadChange, ...] = ()
    num_series: int = 0  # series with this session's point
    num_too_short: int = 0  # of them, with too few runs to search
    num_earlier_sessions: int = 0
    not_checked: str | None = None  # why nothing was searched: an A/B session (the terminal says so)
    unavailable: str | None = None  # Otava is missing, or the history unreadable: a warning, with the fix
    trends: tuple[HeadTrend, ...] = ()

    @property
    def regressions(self) -> tuple[HeadChange, ...]:
        return tuple(change for change in self.changes if change.change_point.is_regression)

    @property
    def new_regressions(self) -> tuple[HeadChange, ...]:
        """The regressions no earlier session reported: the verdicts of this one."""
        return tuple(change for change in self.regressions if change.is_new)

    @property
    def warnings(self) -> tuple[str, ...]:
        """What results.json records among its warnings: each head change point, or why none was searched."""
        found = tuple(HEAD_WARNING_PREFIX + change.describe() for change in self.changes)
        found += tuple(TREND_WARNING_PREFIX + trend.describe() for trend in self.trends)
        return found + ((f"change points not checked: {self.unavailable}",) if self.unavailable else ())

    def summary(self) -> str:
        """One line for the terminal, whatever was found."""
        if self.not_checked or self.unavailable:
            return f"change points: not checked: {self.not_checked or self.unavailable}"
        searched = self.num_series - self.num_too_short
        short = f"; {self.num_too_short} with too few runs to search" if self.num_too_short else ""
        found = f"{len(self.changes)} at the head" if self.changes else "none at the head"
        num_reported = sum(not change.is_new for change in self.changes)
        if num_reported:
            found += f" ({len(self.changes) - num_reported} new, {num_reported} reported by an earlier session)"
        num_new_trends = sum(trend.is_new for trend in self.trends)
        trends = f"; trends: {len(self.trends)} at the head ({num_new_trends} new)" if self.trends else ""
        return (
            f"change points: {found} of {searched} series searched{short} "
            f"({self.num_earlier_sessions} earlier sessions in the history){trends}"
        )


def check_head(
    history: Sequence[Results], session: Results, policy: ChangePointPolicy = ChangePointPolicy()
) -> HeadCheck:
    """The head change points of ``session``'s series over ``history`` (oldest first) and ``session``.

    Only series that ``session`` is a point of are searched. A stored copy
    of ``session`` itself (same time and commit) is left out of ``history``,
    so it is not counted twice.
    """
    if session.against is not None:
        return HeadCheck(not_checked="an A/B session (--perf-against) is no point of a stored series")
    earlier = [run for run in history if (run.created_at, run.commit) != (session.created_at, session.commit)]
    own_keys = {series.key for series in build_series([session]) if series.points}
    test_ids = {key.test_id for key in own_keys}
    own = [series for series in build_series([*earlier, session], test_ids) if series.key in own_keys]
    changes, trends, num_too_short = [], [], 0
    for series in own:
        try:
            detection = detect(series, policy)
            step = head_step(detection)
        except ChangePointsUnavailable as error:
            return HeadCheck(num_series=len(own), num_earlier_sessions=len(earlier), unavailable=str(error))
        num_too_short += detection.not_searched is not None
        if step is not None:
            changes.append(HeadChange(series.key, step.change_point, len(series.points), step.first_reported))
        trend = trend_beside_steps(detection)
        if trend is not None:
            trends.append(HeadTrend(series.key, trend.trend, len(series.points), trend.first_reported))
    return HeadCheck(tuple(changes), len(own), num_too_short, len(earlier), trends=tuple(trends))
