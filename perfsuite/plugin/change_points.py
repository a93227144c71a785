"""The session's change-point verdict (``perfsuite.history.head``): where its run history comes from.

The history is ``--perf-history``'s store (``perfsuite.history.store``): the
sessions before this one, read before this one is appended. With the store
off (``--perf-history none``) there is no history, and so no change point.
``history_sessions`` is the one place the plugin reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from perfsuite.history.changes import ChangePointPolicy
from perfsuite.history.head import HeadCheck, check_head
from perfsuite.judge.results import Results
from perfsuite.plugin.options import PerfOptions

POLICY = ChangePointPolicy()


@dataclass(frozen=True, slots=True)
class History:
    """The sessions before this one, oldest first; or why the store holding them could not be read."""

    sessions: list[Results]
    unreadable: str | None = None  # the store's error: no change point can be searched
    kept: bool = True  # False: --perf-history none, so there is no history to search


def history_sessions(options: PerfOptions, fingerprint: str | None) -> History:
    """Earlier sessions of this machine, oldest first: as many as one search window holds (older ones cannot move
    the head).

    A store that cannot be read gives no sessions and its error, which the
    change-point line shows (appending this session to it fails too, and
    says so on its own line).
    """
    if options.history_store is None:
        return History([], kept=False)
    location = options.history_store
    if isinstance(location, Path) and not location.exists():
        return History([])  # the first session: appending creates the store
    from perfsuite.history.store import HistoryError, HistoryStore

    try:
        with HistoryStore.open(location) as store:
            return History(store.sessions(fingerprint=fingerprint, newest=POLICY.window_len))
    except HistoryError as error:
        return History([], str(error))


def check_session(document: Results, history: History) -> HeadCheck:
    """The head change points of the session that ``document`` (its results.json) describes."""
    if not history.kept:
        return HeadCheck(not_checked="no run history is kept (--perf-history none)")
    if history.unreadable is not None:
        return HeadCheck(unavailable=f"the run history could not be read: {history.unreadable}")
    return check_head(history.sessions, document, POLICY)
