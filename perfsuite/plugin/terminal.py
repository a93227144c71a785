"""The ``perfsuite`` section of pytest's terminal summary: one row per compared metric, then the session's notes.

The verdict table is ``report.verdict_table``'s, the one ``perfsuite compare``
prints and the HTML report shows.

The section's last line says how many of the planned comparisons were
judged and, when not all were, why and what to do (``judge.tally``): on a
machine without matching baselines, the one line to read.

Below the verdicts, a second small table gives each test's KV cache and
device memory (``report.table.memory_table``, when any test recorded them):
measurements to read, not verdicts, so they get columns of their own rather
than widening every row of the verdict table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from perfsuite.plugin.session import PerfSession
from perfsuite.report.table import memory_table
from perfsuite.report.verdict_table import verdict_table


@dataclass(frozen=True, slots=True)
class WrittenFiles:
    """What the session wrote at its end: None where a file could not be written (or nothing was to be)."""

    results: Path | None
    report: Path | None


def write_summary(
    write: Callable[..., None],
    perf_session: PerfSession,
    written: WrittenFiles,
    output_error: str | None,
    ran: bool = True,
) -> None:
    """The verdict table, the warnings and late regressions, where the results and report are; last, what was judged.

    ``ran``: the session ran its tests (its exit status is "passed" or "failed"); one stopped by a usage error or
    an interruption has no judged line, which would count its tests as not measured.
    """
    _write_results(write, perf_session, written, output_error)
    tally = perf_session.tally()
    if not ran or not tally.num_planned:
        return
    if perf_session.options.save_baseline:
        write(f"perfsuite: --perf-save-baseline: judged {tally.num_judged} of {tally.num_planned} planned comparisons "
              "against the earlier baselines (shown, failing nothing)")  # fmt: skip
    elif perf_session.fails_strict:
        write(f"perfsuite: --perf-strict fails this session: {tally.num_planned - tally.num_judged} of "
              f"{tally.num_planned} planned comparisons were not judged", red=True, bold=True)  # fmt: skip
        write(tally.line(), red=True, bold=True)
    else:
        write(tally.line(), **({"green": True} if tally.all_judged else {"yellow": True, "bold": True}))


def _write_results(
    write: Callable[..., None], perf_session: PerfSession, written: WrittenFiles, output_error: str | None
) -> None:
    if perf_session.results:
        write(verdict_table(perf_session.results, paired=perf_session.against is not None).text())
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

