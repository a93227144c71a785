"""The history store's tables, and the version of their layout that this perfsuite writes.

Three tables, each name prefixed ``perfsuite_`` so that a database shared
with other applications (a team's PostgreSQL) keeps them apart:

- ``perfsuite_schema``: one row, the layout's version (``SCHEMA_VERSION``);
- ``perfsuite_sessions``: one row per ``pytest --perf`` session, holding its
  results document without its tests (``Results.to_json`` less ``tests``);
- ``perfsuite_tests``: one row per test of a session, holding the test's full
  ``TestResult.to_json`` and, in columns of their own, what a reader of the
  series selects and compares by: the test id, commit, time, fingerprint,
  run configuration, per-repeat samples and verdicts.

Documents keep their own results ``schema_version`` (the session row's), so
a session stored by an older perfsuite is read through the same conversion
as an older results.json.
"""

from __future__ import annotations

import sqlalchemy as sa

SCHEMA_VERSION = 1

metadata = sa.MetaData()

schema_version = sa.Table(
    "perfsuite_schema",
    metadata,
    sa.Column("version", sa.Integer, nullable=False),
)

sessions = sa.Table(
    "perfsuite_sessions",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("session_key", sa.String(64), nullable=False, unique=True),  # rows.session_key: no session twice
    sa.Column("created_at", sa.Text, nullable=False),
    sa.Column("commit", sa.Text),
    sa.Column("fingerprint", sa.Text),
    sa.Column("document", sa.JSON, nullable=False),  # Results.to_json() without "tests"
)

tests = sa.Table(
    "perfsuite_tests",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("session_id", sa.Integer, sa.ForeignKey("perfsuite_sessions.id"), nullable=False, index=True),
    sa.Column("position", sa.Integer, nullable=False),  # the test's place in its session's document
    sa.Column("test_id", sa.Text, nullable=False),
    sa.Column("commit", sa.Text),
    sa.Column("created_at", sa.Text, nullable=False),
    sa.Column("fingerprint", sa.Text),  # the test's own environment: a server's, for a server test
    sa.Column("configuration", sa.JSON(none_as_null=True)),  # RunConfiguration.to_json(); null: none recorded
    sa.Column("samples", sa.JSON, nullable=False),  # metric -> one value per repeat
    sa.Column("verdicts", sa.JSON, nullable=False),  # rows.verdicts: baseline status, noisy, metric -> verdict
    sa.Column("result", sa.JSON, nullable=False),  # TestResult.to_json()
    sa.UniqueConstraint("session_id", "position"),
)

TABLE_NAMES = tuple(metadata.tables)
