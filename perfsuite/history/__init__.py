"""The run history: every session's results, in a SQLite file or a database, for trends that outlive the runner."""

from perfsuite.history.location import HistoryError
from perfsuite.history.store import HistoryStore, ImportReport

__all__ = ["HistoryError", "HistoryStore", "ImportReport"]
