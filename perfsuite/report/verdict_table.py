"""The verdict table, one for the terminal, ``perfsuite compare`` and the report: a row per compared metric.

``verdict_table`` turns a session's ``TestResult``s into typed rows; each
row's ``cells`` are its text, which the terminal and ``perfsuite compare``
print through ``report.table.format_table`` and the HTML report puts in its
``<td>``s, so the three cannot drift apart. Besides a compared metric, a row
is a capacity test with nothing compared (its capacity, req/s), any other
test with nothing compared (its output throughput), or an exact counter that
changed. Whether the session was A/B (``--perf-against``) only renames the
sides in the header.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perfsuite.judge.results import Verdict
from perfsuite.judge.tally import status_reason, verdict_reason
from perfsuite.report.table import format_table

if TYPE_CHECKING:
    from perfsuite.judge.results import TestResult
    from perfsuite.judge.stats import Comparison

VERDICTS = ("regressed", "noisy", "improved", "unchanged", "inconclusive")  # the worst news first
NO_VERDICT = "no baseline"


class RowKind(enum.Enum):
    COMPARED = "compared"  # one metric judged against the baseline, or against side A
    CAPACITY = "capacity"  # a capacity test with nothing compared: its capacity under the SLO
    NOT_COMPARED = "not compared"  # any other test with nothing compared: its output throughput
    COUNTER_CHANGED = "counter changed"  # an exact counter that differs: no statistics, any change shows


@dataclass(frozen=True, slots=True)
class VerdictCells:
    """A row of the table as text, or its header."""

    test: str
    metric: str
    baseline: str
    current: str
    change: str
    ratio_ci: str
    p_adjusted: str
    mde: str
    verdict: str


STORED_HEADERS = VerdictCells("test", "metric", "baseline", "current", "change", "ratio CI", "p (BH)", "MDE", "verdict")
PAIRED_HEADERS = dataclasses.replace(STORED_HEADERS, baseline="A: REF", current="B: current", change="pair ratio")


@dataclass(frozen=True, slots=True)
class VerdictRow:
    """One line of the verdict table; the statistics are None where the row is not a compared metric."""

    test_id: str
    kind: RowKind
    metric: str
    baseline: float | None  # a median over the repeats (or pairs), or a counter
    current: float | None
    status: str  # what the verdict cell says when nothing was judged: the baseline status, or "counter changed"
    verdict: Verdict | None = None
    change_percent: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_adjusted: float | None = None
    min_detectable_effect: float | None = None

    @property
    def test_name(self) -> str:
        return self.test_id.rpartition("::")[2]

    @property
    def category(self) -> str:
        """What the report colours and filters the row by: a verdict, "changed" (a counter), or "none"."""
        if self.verdict is not None:
            return self.verdict.value
        return "changed" if self.kind is RowKind.COUNTER_CHANGED else "none"

    @property
    def why_not_judged(self) -> str | None:
        """None where the row has a verdict that judged; else why not (no baseline, noisy, a counter)."""
        if self.kind is RowKind.COUNTER_CHANGED:
            return "an exact counter: shown, never judged"
        if self.verdict is None:
            return status_reason(self.status)
        return verdict_reason(self.verdict)

    @property
    def cells(self) -> VerdictCells:
        if self.kind is not RowKind.COMPARED:
            change = "exact" if self.kind is RowKind.COUNTER_CHANGED else "-"
            return VerdictCells(
                self.test_name,
                self.metric,
                format_figure(self.baseline),
                format_figure(self.current),
                change,
                "-",
                "-",
                "-",
                self.status,
            )
        assert self.verdict is not None  # a compared row carries its verdict
        return VerdictCells(
            test=self.test_name,
            metric=self.metric,
            baseline=format_figure(self.baseline),
            current=format_figure(self.current),
            change=f"{self.change_percent:+.1f}%",
            ratio_ci=f"[{self.ci_low:.3f}, {self.ci_high:.3f}]",
            p_adjusted=f"{self.p_adjusted:.3g}",
            # None: not even complete separation of the samples could have flagged a slowdown
            mde="none" if self.min_detectable_effect is None else f"{self.min_detectable_effect:.0%}",
            verdict="noisy: inconclusive" if self.verdict is Verdict.NOISY else self.verdict.value,
        )


@dataclass(frozen=True, slots=True)
class VerdictTable:
    """The header (the sides named as A and B in an A/B session) and the rows, in the order they are shown."""

    headers: VerdictCells
    rows: tuple[VerdictRow, ...]

    def text(self) -> str:
        """The plain-text table the terminal and ``perfsuite compare`` print."""
        return format_table(dataclasses.astuple(self.headers), [dataclasses.astuple(row.cells) for row in self.rows])


def verdict_table(results: Sequence[TestResult], paired: bool) -> VerdictTable:
    """Each test's compared metrics (or what it measured, when nothing was compared), then its changed counters."""
    rows = [row for result in results for row in _rows_of(result)]
    return VerdictTable(PAIRED_HEADERS if paired else STORED_HEADERS, tuple(rows))


def overall_verdict(rows: Sequence[VerdictRow]) -> str:
    """The worst news first: any regression makes the whole run regressed; counters never decide it."""
    seen = {row.verdict.value for row in rows if row.verdict is not None}
    return next((verdict for verdict in VERDICTS if verdict in seen), NO_VERDICT)


def format_figure(value: float | None) -> str:
    """About four significant figures, without an exponent for the large ones (``12,345``); ``-`` for none."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


def _rows_of(result: TestResult) -> list[VerdictRow]:
    test_id, status = result.test_id, result.judgement.baseline_status
    rows = [_compared_row(test_id, status, c) for c in result.judgement.comparisons]
    if not result.judgement.comparisons:
        rows.append(_uncompared_row(result, status))
    rows += [
        VerdictRow(test_id, RowKind.COUNTER_CHANGED, change.name, change.baseline, change.current, "counter changed")
        for change in result.judgement.counter_changes
    ]
    return rows


def _compared_row(test_id: str, status: str, c: Comparison) -> VerdictRow:
    return VerdictRow(
        test_id,
        RowKind.COMPARED,
        c.metric,
        c.baseline_median,
        c.current_median,
        status,
        verdict=c.verdict,
        change_percent=c.change_percent,
        ci_low=c.ci_low,
        ci_high=c.ci_high,
        p_adjusted=c.p_adjusted,
        min_detectable_effect=c.min_detectable_effect,
    )


def _uncompared_row(result: TestResult, status: str) -> VerdictRow:
    """A test judged on nothing: its capacity, or else its output throughput, shown without a verdict."""
    if result.capacity is not None:
        capacity = result.capacity.requests_per_second
        return VerdictRow(result.test_id, RowKind.CAPACITY, "capacity_under_slo", None, capacity, status)
    throughput = result.measurement.summary.output_throughput
    return VerdictRow(result.test_id, RowKind.NOT_COMPARED, "output_throughput", None, throughput, status)
