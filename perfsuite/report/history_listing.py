"""``perfsuite history show`` as text: each series of a run history, its values and its change points.

A series (``perfsuite.history.series``) is one test's metric among the runs
of one fingerprint and run configuration; each is listed with those two in
short form, its runs as a table (commit, date, value), and its change points
(``perfsuite.history.changes``): commit range, size, p-value, and whether
it is a regression for that metric; then the trend test of its newest runs
(``perfsuite.history.trend``): a creep's slope per run, its interval, since
which run, and its p-value.
"""

from __future__ import annotations

from collections.abc import Sequence

from perfsuite.history.changes import ChangePoint, Detection
from perfsuite.history.trend import find_trend
from perfsuite.report.table import format_table

VALUE_HEADERS = ("commit", "date", "value")


def history_listing(detections: Sequence[Detection]) -> str:
    """Every series in ``detections``, one block each, separated by blank lines."""
    return "\n\n".join(_block(detection) for detection in detections)


def _block(detection: Detection) -> str:
    series = detection.series
    key = series.key
    lines = [
        f"{key.test_id}  {key.metric} ({series.direction.value} is better)",
        f"fingerprint {key.fingerprint_label}, {key.configuration_label}, {len(series.points)} runs; "
        f"{series.normalization}",
        _indented(format_table(VALUE_HEADERS, [[p.short_commit, p.created_at, p.value] for p in series.points])),
    ]
    if detection.num_skipped:
        lines.append(f"  {detection.num_skipped} runs without a finite value left out of the search")
    lines.extend(_change_lines(detection))
    lines.append(_trend_line(detection))
    return "\n".join(lines)


def _change_lines(detection: Detection) -> list[str]:
    if detection.not_searched is not None:
        return [f"change points: not searched ({detection.not_searched})"]
    if not detection.change_points:
        return ["change points: none"]
    head = detection.head
    return [f"change points: {len(detection.change_points)}"] + [
        f"  {_change(change)}{'  (at the head)' if change is head else ''}" for change in detection.change_points
    ]


def _trend_line(detection: Detection) -> str:
    """The trend over the newest runs, as the session's verdict would give it beside the steps."""
    search = find_trend(detection.series)
    if search.not_searched is not None:
        return f"trend: not tested ({search.not_searched})"
    if search.trend is None:
        return f"trend: none over the newest {min(len(detection.series.points), search.policy.window_runs)} runs"
    note = "  (a step is at the head: the step is the verdict)" if detection.head is not None else ""
    return f"trend: {search.trend.describe()}{note}"


def _change(change: ChangePoint) -> str:
    return (
        f"{change.commit_range}  {change.relative_change:+.1%}  p={change.p_value:.2g}  {change.kind}  "
        f"(mean {change.mean_before:.4g} -> {change.mean_after:.4g}; runs {change.last_before.created_at} .. "
        f"{change.first_after.created_at})"
    )


def _indented(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())
