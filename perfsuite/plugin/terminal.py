"""The ``perfsuite`` section of pytest's terminal summary: one row per compared metric, then the session's notes.

Below the verdicts, a second small table gives each test's KV cache and
device memory (``report.table.memory_table``, when any test recorded them):
measurements to read, not verdicts, so they get columns of their own rather
than widening every row of the verdict table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from perfsuite.judge.stats import Verdict
from perfsuite.judge.results import TestResult
from perfsuite.plugin.session import PerfSession
from perfsuite.report.table import format_table, memory_table

VERDICT_COLUMNS = ["test", "metric", "baseline", "current", "change", "ratio CI", "p (BH)", "MDE", "verdict"]
PAIRED_COLUMNS = ["test", "metric", "A: REF", "B: current", "pair ratio", "ratio CI", "p (BH)", "MDE", "verdict"]


@dataclass(frozen=True, slots=True)
class WrittenFiles:
    """What the session wrote at its end: None where a file could not be written (or nothing was to be)."""

    results: Path | None
    report: Path | None


def write_summary(
    write: Callable[..., None], perf_session: PerfSession, written: WrittenFiles, output_error: str | None
) -> None:
    """The verdict table, the warnings and late regressions, and where the results and report are."""
    if perf_session.results:
        columns = VERDICT_COLUMNS if perf_session.against is None else PAIRED_COLUMNS
        write(format_table(columns, verdict_rows(perf_session.results)))
        table = memory_table(perf_session.results)
        if table is not None:
            write(table)
    for warning in perf_session.warnings:
        write(f"warning: {warning}", yellow=True)
    for late in perf_session.late_regressions:
        write(f"regression found by the session-wide correction at session end: {late}", red=True, bold=True)
    if output_error is not None:
        write(f"perfsuite error: {output_error}", red=True, bold=True)
    if not perf_session.results:
        return
    options = perf_session.options
    num_metrics = len(perf_session.compared_metrics)
    if perf_session.against is not None:
        write(f"A/B: A = REF {perf_session.against.label}, B = the current tree, side by side; "
              f"{perf_session.repeats} pairs per test in ABBA order over {options.against_workers} worker(s) a side; "
              "no baselines read or written")  # fmt: skip
    write(
        f"profile {options.profile.name}, {perf_session.repeats} repeats, alpha {options.policy.alpha} "
        f"(Benjamini-Hochberg over {perf_session.num_planned_comparisons} comparisons of {num_metrics} metrics), "
        f"min effect {options.policy.min_effect:.0%}; {_where_the_results_are(perf_session, written)}"
    )
    if written.report is not None:
        write(f"report: {written.report}")


def _where_the_results_are(perf_session: PerfSession, written: WrittenFiles) -> str:
    if written.results is not None:
        return f"results in {written.results}"
    return f"nothing written to {perf_session.results_path} (see the error above)"


def verdict_rows(results: Sequence[TestResult]) -> list[list]:
    rows = []
    for result in results:
        name = result.test_id.rpartition("::")[2]
        if not result.comparisons and result.capacity is not None:  # a capacity test: its one metric, req/s
            rows.append([name, "capacity_under_slo", "-", f"{result.capacity.requests_per_second:.4g}",
                         "-", "-", "-", "-", result.baseline_status])
        elif not result.comparisons:
            rows.append([name, "output_throughput", "-", f"{result.summary.output_throughput:.4g}",
                         "-", "-", "-", "-", result.baseline_status])
        for c in result.comparisons:
            mde = f"{c.min_detectable_effect:.0%}" if c.min_detectable_effect is not None else "none"
            verdict = "noisy: inconclusive" if c.verdict is Verdict.NOISY else c.verdict.value
            rows.append([name, c.metric, f"{c.baseline_median:.4g}", f"{c.current_median:.4g}",
                         f"{c.change_percent:+.1f}%", f"[{c.ci_low:.3f}, {c.ci_high:.3f}]",
                         f"{c.p_adjusted:.3g}", mde, verdict])
        for change in result.counter_changes:
            rows.append([name, change.name, change.baseline, change.current, "exact", "-", "-", "-",
                         "counter changed"])
    return rows

