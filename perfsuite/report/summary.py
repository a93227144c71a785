"""The session's verdicts as Markdown, for a pull request: GitHub's job summary and ``reports/summary.md``.

The rows are ``report.verdict_table``'s, the ones the terminal and the HTML
report show; here each keeps the columns a reviewer reads on the pull
request's page: test, metric, change with its ratio's confidence interval,
verdict, and why it was not judged. ``perfsuite summary results.json`` prints
the same text, and the workflow ``perfsuite init`` writes posts the file.

``write_summary_files`` writes ``summary.md`` beside the report (a temporary
file, then a rename) and, when ``$GITHUB_STEP_SUMMARY`` names a file, appends
to it, as GitHub Actions expects of every step that adds to the job summary.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from perfsuite.judge.baselines import OutputError, cannot_write_message, write_text_atomic
from perfsuite.report.verdict_table import RowKind, VerdictRow, overall_verdict, verdict_table

if TYPE_CHECKING:
    from perfsuite.judge.results import Results
    from perfsuite.judge.tally import Tally

SUMMARY_FILE = "summary.md"
STEP_SUMMARY_VARIABLE = "GITHUB_STEP_SUMMARY"
SUMMARY_HEADERS = ("test", "metric", "change (ratio CI)", "verdict", "why not judged")


@dataclass(frozen=True, slots=True)
class SummaryFiles:
    """Where the summary went: ``summary.md`` always, the job summary when ``$GITHUB_STEP_SUMMARY`` was set."""

    summary: Path
    step_summary: Path | None


def markdown_cell(text: str) -> str:
    """Text that stays in its table cell: a pipe escaped, line breaks as ``<br>``, no leading or trailing blanks."""
    escaped = text.replace("\\", "\\\\").replace("|", "\\|")
    return "<br>".join(line.strip() for line in escaped.replace("\r\n", "\n").replace("\r", "\n").split("\n"))


def summary_markdown(results: Results, tally: Tally) -> str:
    """A heading with the overall verdict, the judged line, the verdict rows as a table, then what ran where."""
    table = verdict_table(results.tests, paired=results.against is not None)
    lines = [f"### perfsuite: {overall_verdict(table.rows)}", "", tally.line(), ""]
    if table.rows:
        lines += [_table_line(SUMMARY_HEADERS), _table_line(("---",) * len(SUMMARY_HEADERS))]
        lines += [_table_line(_summary_cells(row)) for row in table.rows]
        lines.append("")
    lines += [f"- {markdown_cell(fact)}" for fact in _session_facts(results)]
    return "\n".join(lines) + "\n"


def write_summary_files(markdown: str, report_dir: Path, environ: Mapping[str, str] = os.environ) -> SummaryFiles:
    """``report_dir/summary.md``, replaced atomically, and the job summary appended to when the variable is set.

    Raises OutputError, one line naming the file and the fix, when either cannot be written.
    """
    path = Path(report_dir) / SUMMARY_FILE
    write_text_atomic(path, markdown)
    step_summary = environ.get(STEP_SUMMARY_VARIABLE) or None
    if step_summary is None:
        return SummaryFiles(path, None)
    step_path = Path(step_summary)
    try:
        with step_path.open("a", encoding="utf-8") as f:
            f.write(markdown if markdown.endswith("\n") else markdown + "\n")
    except OSError as error:
        instead = f"point ${STEP_SUMMARY_VARIABLE} at a writable file, or unset it ({path} has the summary)"
        raise OutputError(cannot_write_message(step_path, error, instead)) from None
    return SummaryFiles(path, step_path)


def _summary_cells(row: VerdictRow) -> tuple[str, ...]:
    cells = row.cells
    change = f"{cells.change} {cells.ratio_ci}" if row.kind is RowKind.COMPARED else cells.change
    return (cells.test, cells.metric, change, cells.verdict, row.why_not_judged or "")


def _table_line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(markdown_cell(cell) for cell in cells) + " |"


def _session_facts(results: Results) -> list[str]:
    against = results.against
    if against is not None:
        side_a = f"REF {against.ref}" + (f" ({against.commit[:12]})" if against.commit else "")
        compared = f"A/B: A = {side_a}, B = the current tree, side by side"
    else:
        compared = "against the stored baselines of this environment"
    commit = results.commit[:12] if results.commit else "none (not a git checkout)"
    return [
        compared,
        f"profile {results.profile}, {results.repeats} repeats, commit {commit}",
        f"environment {results.fingerprint or 'unknown'}",
    ]
