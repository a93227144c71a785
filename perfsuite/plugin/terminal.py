"""The ``perfsuite`` section of pytest's terminal summary: one row per compared metric, then the session's notes.

The verdict table is ``report.verdict_table``'s, the one ``perfsuite compare``
prints and the HTML report shows.

The section's last line says how many of the planned comparisons were
judged and, when not all were, why and what to do (``judge.tally``): on a
machine without matching baselines, the one line to read.

Below the verdicts, a second small table gives each test's KV cache and
device memory (``report.table.memory_table``, when any test recorded them):
measurements to read, not verdicts, so they get columns of their own rather
than widening every row of the verdict table. Below it, the same for the prefix cache
(``report.table.prefix_cache_table``, when any test looked anything up): hit rate, evictions, and TTFT of
the requests that hit and missed.

After the warnings, the change points at the head of the session's run
history (``perfsuite.history.head``): one line each, red where
``--perf-fail-on-change-point`` makes it fail the session (a step an earlier
session reported is shown as such and fails nothing again), and always a line
saying how many series were searched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from perfsuite.plugin.session import PerfSession
from perfsuite.report.table import memory_table, prefix_cache_table, utilization_table
from perfsuite.report.verdict_table import verdict_table


@dataclass(frozen=True, slots=True)
class WrittenFiles:
    """What the session wrote at its end: None where a file could not be written (or nothing was to be)."""

    results: Path | None
    report: Path | None
    history: str | None = None  # where the session was appended to the run history
    summary: Path | None = None  # the Markdown summary for a pull request (and $GITHUB_STEP_SUMMARY when set)


def write_summary(
    write: Callable[..., None],
    perf_session: PerfSession,
    written: WrittenFiles,
    output_error: str | None,
    history_error: str | None = None,
    ran: bool = True,
) -> None:
    """The verdict table, the warnings and late regressions, where the results, report and history are; last, what
    was judged.

    ``ran``: the session ran its tests (its exit status is "passed" or "failed"); one stopped by a usage error or
    an interruption has no judged line, which would count its tests as not measured.
    """
    _write_results(write, perf_session, written, output_error, history_error)
    tally = perf_session.tally()
    if not ran or not tally.num_planned:
        return
    if perf_session.options.save_baseline:
        write(
            f"perfsuite: --perf-save-baseline: judged {tally.num_judged} of {tally.num_planned} planned comparisons "
            "against the earlier baselines (shown, failing nothing)"
        )
    elif perf_session.fails_strict:
        write(
            f"perfsuite: --perf-strict fails this session: {tally.num_planned - tally.num_judged} of "
            f"{tally.num_planned} planned comparisons were not judged",
            red=True,
            bold=True,
        )
        write(tally.line(), red=True, bold=True)
    else:
        write(tally.line(), **({"green": True} if tally.all_judged else {"yellow": True, "bold": True}))


def _write_results(
    write: Callable[..., None],
    perf_session: PerfSession,
    written: WrittenFiles,
    output_error: str | None,
    history_error: str | None,
) -> None:
    if perf_session.results:
        _write_tables(write, perf_session)
    _write_notes(write, perf_session)
    for error in (output_error, history_error):
        if error is not None:
            write(f"perfsuite error: {error}", red=True, bold=True)
    if not perf_session.results:
        return
    options = perf_session.options
    num_metrics = len(perf_session.compared_metrics)
    if perf_session.against is not None:
        where = "; both sides of each test on one Ray node" if perf_session.cluster is not None else ""
        write(
            f"A/B: A = REF {perf_session.against.label}, B = the current tree, side by side; "
            f"{perf_session.repeats} pairs per test in ABBA order over {options.against_workers} worker(s) a side"
            f"{where}; no baselines read or written"
        )
    write(
        f"profile {options.profile.name}, {perf_session.repeats} repeats, alpha {options.policy.alpha} "
        f"(Benjamini-Hochberg over {perf_session.num_planned_comparisons} comparisons of {num_metrics} metrics, "
        f"and apart over MFU's and MBU's rates where measured), "
        f"min effect {options.policy.min_effect:.0%}; {_where_the_results_are(perf_session, written)}"
    )
    if written.report is not None:
        write(f"report: {written.report}")
    if written.summary is not None:
        write(f"summary: {written.summary}")
    if written.history is not None:
        write(f"history: {written.history}")


def _write_tables(write: Callable[..., None], perf_session: PerfSession) -> None:
    """The verdict table, then the memory, prefix cache and utilization tables of the runs that have them."""
    write(verdict_table(perf_session.results, paired=perf_session.against is not None).text())
    tables = (
        memory_table(perf_session.results),
        prefix_cache_table(perf_session.results),
        utilization_table(perf_session.results),
    )
    for table in tables:
        if table is not None:
            write(table)


def _write_notes(write: Callable[..., None], perf_session: PerfSession) -> None:
    """What the session recorded besides the verdicts: completions, warnings, late regressions, change points."""
    for recorded in perf_session.determinism:  # recorded, never judged: shown, failing nothing
        write(f"unique completions: {recorded.test_id} ({recorded.engine_name}): {recorded.completions.describe()}")
    for counted in perf_session.instructions:  # --perf-instructions: judged by a threshold alone
        write(f"instructions: {counted.describe()}", red=counted.regressed, bold=counted.regressed)
    for warning in perf_session.warnings:
        write(f"warning: {warning}", yellow=True)
    for late in perf_session.late_regressions:
        write(f"regression found by the session-wide correction at session end: {late}", red=True, bold=True)
    _write_change_points(write, perf_session)


def _write_change_points(write: Callable[..., None], perf_session: PerfSession) -> None:
    """Always a line: each change point at the head of the session's series, then what was searched."""
    check = perf_session.head_check
    if check is None:
        return
    from perfsuite.history.head import HEAD_WARNING_PREFIX, TREND_WARNING_PREFIX  # loaded already: session end

    failing = set(perf_session.failing_change_points)
    for change in check.changes:
        line = change.describe()
        if line in failing:
            write(f"{HEAD_WARNING_PREFIX}{line} (fails the session: --perf-fail-on-change-point)", red=True, bold=True)
        elif change.change_point.is_regression and not change.is_new:
            write(f"{HEAD_WARNING_PREFIX}{line} (fails nothing again)", yellow=True)
        elif change.change_point.is_regression:
            write(f"{HEAD_WARNING_PREFIX}{line} (fails nothing: --perf-fail-on-change-point is off)", yellow=True)
        else:
            write(f"{HEAD_WARNING_PREFIX}{line}")
    for trend in check.trends:
        write(f"{TREND_WARNING_PREFIX}{trend.describe()}", yellow=trend.trend.is_regression)
    write(check.summary())


def _where_the_results_are(perf_session: PerfSession, written: WrittenFiles) -> str:
    if written.results is not None:
        return f"results in {written.results}"
    return f"nothing written to {perf_session.results_path} (see the error above)"
