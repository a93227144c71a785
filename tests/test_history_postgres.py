"""The run history store on a real PostgreSQL server: sessions in and out, its migration, a kill and two writers.

``tests/test_history_store.py`` runs the store on SQLite files; these run the
same store on a PostgreSQL server this module starts itself (``postgres_server``:
initdb and pg_ctl in a temporary directory, as ``nobody`` when run as root), one
server for the module, a new database for each test. Skipped, saying why,
where the server binaries or the pg8000 driver are missing.
"""

from __future__ import annotations

import itertools
import os
import signal

import pytest
import sqlalchemy as sa

import postgres_server
from perfsuite.history.rows import configuration_key, session_key
from perfsuite.history.schema import SCHEMA_VERSION
from perfsuite.history.store import HistoryError, HistoryStore
from results_builders import ENVIRONMENT
from test_history_store import CONFIGURATION, OTHER_MACHINE, session, start_writer, wait_for

pytestmark = pytest.mark.skipif(postgres_server.why_not() is not None, reason=str(postgres_server.why_not()))

_database_numbers = itertools.count()


@pytest.fixture(scope="module")
def server():
    started = postgres_server.start_server()
    yield started
    started.stop()


@pytest.fixture
def url(server) -> str:
    """A new, empty database on the module's server."""
    return server.create_database(f"history_{os.getpid()}_{next(_database_numbers)}")


def query(url: str, sql: str, **parameters) -> list[tuple]:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            result = connection.execute(sa.text(sql), parameters)
            return [tuple(row) for row in result] if result.returns_rows else []
    finally:
        engine.dispose()


def test_sessions_are_read_back_equal_oldest_first_and_filtered(url):
    here = [session(f"2026-03-0{day}T10:00:00+00:00", f"c{day}") for day in (3, 1, 2)]
    elsewhere = session("2026-03-04T10:00:00+00:00", "c4", environment=OTHER_MACHINE)
    with HistoryStore.open(url) as store:
        ids = [store.append(results) for results in (*here, elsewhere)]
        assert store.location == url, "the URL as given (it holds no password)"
    assert len(set(ids)) == 4
    oldest_first = sorted(here, key=lambda results: results.created_at)
    with HistoryStore.open(url) as store:  # another connection, after the first is closed
        assert store.sessions() == [*oldest_first, elsewhere]
        assert store.sessions(fingerprint=ENVIRONMENT.fingerprint()) == oldest_first
        assert store.sessions(newest=2) == [oldest_first[2], elsewhere]
        assert store.sessions(fingerprint=ENVIRONMENT.fingerprint(), newest=2) == oldest_first[1:]


def test_each_test_row_holds_its_series_columns_as_postgresql_types(url):
    results = session("2026-03-01T10:00:00+00:00", "c1", throughput=90.0)
    with HistoryStore.open(url) as store:
        session_id = store.append(results)
        assert store.append(results) == session_id, "the same session is stored once"
    rows = query(url, 'SELECT test_id, "commit", configuration_key, configuration, samples FROM perfsuite_tests '
                      "ORDER BY position")  # fmt: skip
    (test_a, commit, key_a, configuration, samples), test_b = rows
    assert (test_a, commit) == ("tests/perf/t.py::test_a[static]", "c1")
    assert key_a == configuration_key(CONFIGURATION.to_json()) != test_b[2]
    assert configuration == CONFIGURATION.to_json(), "a json column: the driver hands back the document"
    assert samples == {"output_throughput": [90.0, 91.0, 89.0]}
    types = dict(query(url, "SELECT column_name, data_type FROM information_schema.columns "
                            "WHERE table_name = 'perfsuite_tests'"))  # fmt: skip
    assert types["result"] == types["samples"] == "json" and types["configuration_key"] == "character varying"
    indexes = {name for (name,) in query(url, "SELECT indexname FROM pg_indexes WHERE tablename = 'perfsuite_tests'")}
    assert "ix_perfsuite_tests_series" in indexes


def test_a_version_1_store_on_postgresql_is_migrated_when_opened(url):
    stored = [session("2026-03-01T10:00:00+00:00", "c1"), session("2026-03-02T10:00:00+00:00", "c2")]
    with HistoryStore.open(url) as store:
        for results in stored:
            store.append(results)
    query(url, "DROP INDEX ix_perfsuite_tests_series")  # the layout of version 1
    query(url, "ALTER TABLE perfsuite_tests DROP COLUMN configuration_key")
    query(url, "UPDATE perfsuite_schema SET version = 1")
    with HistoryStore.open(url) as store:
        assert store.sessions() == stored
    assert query(url, "SELECT version FROM perfsuite_schema") == [(SCHEMA_VERSION,)]
    keys = [key for (key,) in query(url, "SELECT configuration_key FROM perfsuite_tests ORDER BY id")]
    assert keys[::2] == [configuration_key(CONFIGURATION.to_json())] * 2 and None not in keys


def test_a_newer_schema_and_a_damaged_version_table_are_refused(url):
    HistoryStore.open(url).close()
    query(url, "UPDATE perfsuite_schema SET version = :version", version=SCHEMA_VERSION + 1)
    with pytest.raises(HistoryError, match=f"schema version {SCHEMA_VERSION + 1}, newer than the version"):
        HistoryStore.open(url)
    query(url, "DELETE FROM perfsuite_schema")
    with pytest.raises(HistoryError, match="its perfsuite_schema table holds \\[\\], not one version number"):
        HistoryStore.open(url)


def test_another_applications_tables_in_the_database_are_left_alone(url):
    query(url, "CREATE TABLE their_table (x integer)")
    with HistoryStore.open(url) as store:
        store.append(session("2026-03-01T10:00:00+00:00"))
    assert query(url, "SELECT count(*) FROM their_table") == [(0,)]


def test_a_writer_killed_inside_its_transaction_leaves_the_whole_session_or_nothing(tmp_path, url):
    committed = [session(f"2026-03-0{day}T10:00:00+00:00", f"c{day}") for day in (1, 2)]
    killed = session("2026-03-03T10:00:00+00:00", "killed")
    writer, inside = start_writer(tmp_path, url, [*committed, killed], "writer")
    wait_for(inside, writer)  # the killed session's test rows are written, not committed
    os.kill(writer.pid, signal.SIGKILL)
    assert writer.wait(timeout=60) == -signal.SIGKILL
    with HistoryStore.open(url) as store:
        assert store.sessions() == committed
        store.append(killed)  # its rows were rolled back with the connection: nothing holds its key
        assert store.sessions() == [*committed, killed]
    assert query(url, "SELECT count(*) FROM perfsuite_tests") == [(6,)]


def test_two_writers_opening_a_new_database_and_appending_at_once_lose_no_session(tmp_path, url):
    go = tmp_path / "go"
    first = [session(f"2026-03-01T10:00:{second:02d}+00:00", "first") for second in range(6)]
    second = [session(f"2026-03-01T10:00:{second:02d}+00:00", "second") for second in range(6)]
    both = first[:3]  # the same sessions, appended by both at once: the unique key keeps one of each
    writers = [start_writer(tmp_path, url, [*both, *first[3:]], "first", go)[0],
               start_writer(tmp_path, url, [*both, *second], "second", go)[0]]  # fmt: skip
    go.write_text("both started: open the empty database and append")
    for writer in writers:
        assert writer.wait(timeout=120) == 0, writer.stdout.read()
    with HistoryStore.open(url) as store:
        stored = store.sessions()
    assert sorted(stored, key=session_key) == sorted([*first, *second], key=session_key)
    assert query(url, "SELECT count(*) FROM perfsuite_tests") == [(2 * len(stored),)]


def test_an_unreachable_server_is_named_with_what_to_check(server):
    url = server.url("no_such_database")
    with pytest.raises(HistoryError) as error:
        HistoryStore.open(url)
    message = str(error.value)
    assert message.startswith(f"cannot open the history store {url}: ") and "no_such_database" in message
    assert "check the URL, that the database server is up and reachable, and the credentials" in message

