"""The run history: every session's results in a SQLite file or a database, each test's series, its change points.

``perfsuite.history.store`` holds the store (``HistoryStore``, ``HistoryError``,
``ImportReport``); ``series``, ``changes`` and ``head`` read sessions into
series and find their change points (Apache Otava). This package's own
import stays free of SQLAlchemy, so the plugin can name the default location
without paying for it.
"""

DEFAULT_LOCATION = "reports/history.sqlite"  # --perf-history's default and `perfsuite history`'s --store
