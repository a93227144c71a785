"""The run history: every session's results, in a SQLite file or a database, for trends that outlive the runner.

``perfsuite.history.store`` holds the store (``HistoryStore``, ``HistoryError``,
``ImportReport``); this package's own import stays free of SQLAlchemy, so the
plugin can name the default location without paying for it.
"""

DEFAULT_LOCATION = "reports/history.sqlite"  # --perf-history's default and `perfsuite history import --store`'s
