"""The history store's tables, and the version of their layout that this perfsuite writes.

Three tables, each name prefixed ``perfsuite_`` so that a database shared
with other applications (a team's PostgreSQL) keeps them apart:

- ``perfsuite_schema``: one row, the layout's version (``SCHEMA_VERSION``);
- ``perfsuite_sessions``: one row per ``pytest --perf`` session, holding its
  results document without its tests (``Results.to_json`` less ``tests``);
- ``perfsuite_tests``: one row per test of a session, holding the test's full
  ``TestResult.to_json`` and, in columns of their own, what a reader of the
  series selects and compares by: the test id, commit, time, fingerprint,
  run configuration (its JSON, and ``configuration_key``, a digest that
  compares equal when the configurations do), per-repeat samples and verdicts.

Documents keep their own results ``schema_version`` (the session row's), so
a session stored by an older perfsuite is read through the same conversion
as an older results.json.

Versions: 2 adds ``perfsuite_tests.configuration_key`` and an index over a
test's series (test id, fingerprint, configuration key): a series is the runs
that may be compared, and JSON columns cannot be compared for equality on
every database (PostgreSQL's ``json`` has no ``=``). ``MIGRATIONS`` brings an
older store up to this version when it is opened.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa

from perfsuite.history.rows import configuration_key

SCHEMA_VERSION = 2

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
    sa.Column("configuration_key", sa.String(64)),  # rows.configuration_key of it (version 2)
    sa.Column("samples", sa.JSON, nullable=False),  # metric -> one value per repeat
    sa.Column("verdicts", sa.JSON, nullable=False),  # rows.verdicts: baseline status, noisy, metric -> verdict
    sa.Column("result", sa.JSON, nullable=False),  # TestResult.to_json()
    sa.UniqueConstraint("session_id", "position"),
)

# A test's runs that may be compared with each other: same test, same environment, same run configuration.
series_index = sa.Index("ix_perfsuite_tests_series", tests.c.test_id, tests.c.fingerprint, tests.c.configuration_key)

TABLE_NAMES = tuple(metadata.tables)


def _add_configuration_keys(connection: sa.Connection) -> None:
    """1 -> 2: every test row's configuration key, computed from its configuration; the series index."""
    connection.execute(sa.text(f"ALTER TABLE {tests.name} ADD COLUMN configuration_key VARCHAR(64)"))
    stored = connection.execute(sa.select(tests.c.id, tests.c.configuration).where(tests.c.configuration.is_not(None)))
    keys = [{"row_id": row_id, "key": configuration_key(configuration)} for row_id, configuration in stored]
    if keys:
        update = sa.update(tests).where(tests.c.id == sa.bindparam("row_id"))
        connection.execute(update.values(configuration_key=sa.bindparam("key")), keys)
    series_index.create(connection)


# MIGRATIONS[i] brings a store of version i + 1 to version i + 2, inside the transaction that opens it.
MIGRATIONS: tuple[Callable[[sa.Connection], None], ...] = (_add_configuration_keys,)
assert 1 + len(MIGRATIONS) == SCHEMA_VERSION, "each schema version after the first has its migration"
