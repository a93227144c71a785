"""The report's history section: each test's trend over stored runs, per series, with its change points.

A panel per test of this run: the series (``perfsuite.history.series``) of
its headline metric (output throughput; a capacity test's capacity) among
the stored runs of the same fingerprint and run configuration as this one,
each point a run's median over its repeats, rescaled by the machine probe.
Each change point (``perfsuite.history.changes``) is a dashed line between
the two runs it separates, and a row of the table beneath: its commit range
as ``abc1234..def5678`` text (perfsuite knows no repository URL to link it
to; ``git log abc1234..def5678`` lists the candidates). Without Apache Otava
the trends are drawn and a note says how to get the change points.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perfsuite.history.changes import ChangePoint, ChangePointPolicy, ChangePointsUnavailable, detect
from perfsuite.history.series import SERIES_METRICS, Series, build_series, headline_metric
from perfsuite.judge.results import Results, TestResult
from perfsuite.report import plots

if TYPE_CHECKING:
    from perfsuite.history.trend import Trend

UNITS = {"output_throughput": "tok/s", "capacity_under_slo": "req/s"}  # what headline_metric picks


@dataclass(frozen=True, slots=True)
class ChangeRow:
    """One change point, ready to show."""

    test: str
    metric: str
    commit_range: str
    dates: str
    change: str
    p_value: str
    kind: str  # "regression" or "improvement"


@dataclass(frozen=True, slots=True)
class HistorySection:
    caption: str
    svg: str
    changes: tuple[ChangeRow, ...]
    note: str | None = None  # why change points are not marked


def history_section(
    results: Results, history: Sequence[Results], max_runs: int, policy: ChangePointPolicy = ChangePointPolicy()
) -> HistorySection | None:
    """None when no test of ``results`` has two stored runs in its series."""
    ordered = _runs_up_to(results, history, max_runs)
    headline = {name: SERIES_METRICS[name] for name in UNITS}
    all_series = build_series(ordered, {test.test_id for test in results.tests}, headline)
    shown: list[Series] = []
    trends: list[plots.Trend] = []
    rows: list[ChangeRow] = []
    note: str | None = None
    for test in results.tests:
        series = _series_of(test, all_series, results)
        if series is None or len(series.points) < 2:
            continue
        change_points, head_is_a_step = _change_points(series, policy, note is None)
        if isinstance(change_points, str):
            note, change_points = change_points, ()
        slope = None if head_is_a_step else _trend_at_the_head(series)
        shown.append(series)
        trends.append(_trend(test, series, change_points, results, slope))
        rows.extend(_row(test, series, change) for change in change_points)
        rows.extend([_slope_row(test, series, slope)] if slope is not None else [])
    if not trends:
        return None
    runs = sorted({point.created_at for series in shown for point in series.points})
    caption = (
        f"{len(runs)} runs on this machine ({runs[0]} to {runs[-1]}). One panel per test: its runs of the same "
        "machine fingerprint and run configuration, each the median over its repeats rescaled by the machine probe "
        "(a server in another process: as measured). Dashed: change points (Apache Otava, p < "
        f"{policy.max_p_value:g}), listed below. A band: a trend over the newest runs (Mann-Kendall and Sen's "
        "slope, its 95% interval), listed below too."
    )
    if results.against is not None:
        caption += " This A/B session is not a point of them: it measured REF and the current tree side by side."
    svg = plots.history_figure(trends, y_label="median, probe-normalised")
    return HistorySection(caption, svg, tuple(rows), note)


def _change_points(
    series: Series, policy: ChangePointPolicy, searchable: bool
) -> tuple[tuple[ChangePoint, ...] | str, bool]:
    """The series' change points and whether one is at the head; or, instead of them, why none are marked."""
    if not searchable:
        return (), False
    try:
        detection = detect(series, policy)
    except ChangePointsUnavailable as error:
        return f"Change points not marked: {error}.", False
    return detection.change_points, detection.head is not None


def _runs_up_to(results: Results, history: Sequence[Results], max_runs: int) -> list[Results]:
    """Stored runs before this one, one per ``created_at`` (a store may hold this run already), then this one."""
    created = results.created_at or ""
    earlier = {run.created_at or "": run for run in history if (run.created_at or "") < created}
    return [*[earlier[key] for key in sorted(earlier)][-(max_runs - 1) :], results]


def _series_of(test: TestResult, all_series: Sequence[Series], results: Results) -> Series | None:
    metric = headline_metric(test)
    environment = test.measurement.environment or results.environment
    if environment is None:
        return None
    fingerprint = environment.fingerprint()
    return next(
        (
            s
            for s in all_series
            if (s.key.test_id, s.key.metric, s.key.fingerprint, s.key.configuration)
            == (test.test_id, metric, fingerprint, test.measurement.configuration)
        ),
        None,
    )


def _trend(
    test: TestResult, series: Series, change_points: Sequence[ChangePoint], results: Results, slope: Trend | None
) -> plots.Trend:
    name = test.test_id.rpartition("::")[2]
    x = tuple(float(i) for i in range(1, len(series.points) + 1))
    steps = tuple(
        plots.Step(change.index + 0.5, f"{change.relative_change:+.1%}", change.is_regression)
        for change in change_points
    )
    last_is_this_run = series.points[-1].created_at == (results.created_at or "")
    line = plots.Series(f"{name} ({UNITS[series.key.metric]})", x, series.values)
    return plots.Trend(line, steps, last_is_this_run, None if slope is None else _band(series, slope))


def _trend_at_the_head(series: Series) -> Trend | None:
    from perfsuite.history.trend import find_trend  # numpy and scipy, only where a series is long enough to draw

    return find_trend(series).trend


def _band(series: Series, slope: Trend) -> plots.SlopeBand:
    """The trend over its window's runs (finite points only, as the test took them), at run numbers from 1."""
    finite = [index for index, point in enumerate(series.points) if math.isfinite(point.value)][-slope.num_runs :]
    x = tuple(float(index + 1) for index in finite)
    ends = [tuple(slope.fitted(j, s) for j in range(len(x))) for s in (slope.slope_low, slope.slope_high)]
    low = tuple(map(min, *ends))
    high = tuple(map(max, *ends))
    fitted = tuple(slope.fitted(j) for j in range(len(x)))
    return plots.SlopeBand(x, fitted, low, high, f"{slope.slope_per_run:+.2%}/run", slope.is_regression)


def _slope_row(test: TestResult, series: Series, slope: Trend) -> ChangeRow:
    return ChangeRow(
        test=test.test_id.rpartition("::")[2],
        metric=series.key.metric,
        commit_range=slope.commit_range,
        dates=f"{slope.start.created_at} .. {slope.newest.created_at}",
        change=f"trend {slope.slope_per_run:+.2%} per run (95% CI {slope.slope_low:+.2%}..{slope.slope_high:+.2%})",
        p_value=f"{slope.p_value:.2g}",
        kind=slope.kind,
    )


def _row(test: TestResult, series: Series, change: ChangePoint) -> ChangeRow:
    return ChangeRow(
        test=test.test_id.rpartition("::")[2],
        metric=series.key.metric,
        commit_range=change.commit_range,
        dates=f"{change.last_before.created_at} .. {change.first_after.created_at}",
        change=f"{change.relative_change:+.1%}",
        p_value=f"{change.p_value:.2g}",
        kind=change.kind,
    )
