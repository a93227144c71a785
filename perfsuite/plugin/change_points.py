"""The session's change-point verdict (``perfsuite.history.head``): where its run history comes from.

The history is the report directory's ``history/``: one results.json per
earlier session, kept there by ``perfsuite.report.render.write_report``.
``history_sessions`` is the one place that reads it for the verdict, so a
history store can take its place without the session noticing.
"""

from __future__ import annotations

from pathlib import Path

from perfsuite.history.changes import ChangePointPolicy
from perfsuite.history.head import HeadCheck, check_head
from perfsuite.judge.results import Results, read_history

POLICY = ChangePointPolicy()


def history_sessions(report_dir: Path) -> list[Results]:
    """Earlier sessions, oldest first: as many as one search window holds (older ones cannot move the head)."""
    sessions, _ = read_history(Path(report_dir) / "history", newest=POLICY.window_len)
    return sessions  # an unreadable file is named among the report's warnings (write_report)


def check_session(document: Results, report_dir: Path) -> HeadCheck:
    """The head change points of the session that ``document`` (its results.json) describes."""
    return check_head(history_sessions(report_dir), document, POLICY)
