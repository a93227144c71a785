"""The run history store: sessions in and out, its schema versions, and what a kill or a second writer cannot break.

Everything here runs on SQLite files in tmp_path; the URL path is taken with a
``sqlite:///`` URL. tests/test_history_postgres.py runs the store on a real PostgreSQL server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from perfsuite.history.rows import configuration_key, session_key
from perfsuite.history.schema import SCHEMA_VERSION
from perfsuite.history.store import HistoryError, HistoryStore, ImportReport
from perfsuite.judge.results import Results, read_results, write_results
from perfsuite.judge.run_config import RunConfiguration
from perfsuite.judge.stats import Direction, Policy, compare
from results_builders import ENVIRONMENT, make_result, make_results, version_4_document, with_counters_unrecorded
from test_results import version_1

CONFIGURATION = RunConfiguration(
    profile="ci", workload_digest="0123abcd", num_requests=8, engine="static", engine_knobs=(("batch_size", 4),),
    decode_mode="packed", max_seq_len=64, repeats=3,
)  # fmt: skip
OTHER_MACHINE = dataclasses.replace(ENVIRONMENT, cpu_model="Another CPU @ 3GHz")


def session(created_at: str, commit: str = "abc123", throughput: float = 100.0, environment=ENVIRONMENT) -> Results:
    """A session of two tests: one judged against a baseline, one with another configuration and none."""
    comparison = compare("output_throughput", [100.0, 101, 102], [throughput] * 3, Direction.HIGHER_IS_BETTER, Policy())
    judged = make_result(
        "tests/perf/t.py::test_a[static]", CONFIGURATION, [throughput, throughput + 1, throughput - 1],
        comparisons=(comparison,), baseline_status="compared", environment=environment,
    )  # fmt: skip
    other = make_result(
        "tests/perf/t.py::test_b[inflight]", dataclasses.replace(CONFIGURATION, engine="inflight"),
        environment=environment,
    )  # fmt: skip
    return make_results(judged, other, created_at=created_at, commit=commit, environment=environment)


@pytest.fixture
def location(tmp_path) -> Path:
    return tmp_path / "not yet" / "history.sqlite"  # its directory is created with it


def rows_of(path: Path, sql: str) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(path)) as connection:
        return connection.execute(sql).fetchall()


def execute(path: Path, sql: str, *parameters) -> None:
    with contextlib.closing(sqlite3.connect(path)) as connection, connection:
        connection.execute(sql, parameters)


# -- round trip ---------------------------------------------------------------------------------------------------


def test_sessions_are_read_back_equal_and_oldest_first(location):
    later, earlier = session("2026-03-02T10:00:00+00:00", "c2"), session("2026-03-01T10:00:00+00:00", "c1")
    with HistoryStore.open(location) as store:
        first_id, second_id = store.append(later), store.append(earlier)
        assert store.sessions() == [earlier, later]
    assert first_id != second_id
    with HistoryStore.open(location) as store:  # and from another connection, after the first is closed
        assert store.sessions() == [earlier, later]


def test_sessions_filter_by_fingerprint_and_keep_the_newest(location):
    here = [session(f"2026-03-0{day}T10:00:00+00:00", f"c{day}") for day in (1, 2, 3)]
    elsewhere = session("2026-03-04T10:00:00+00:00", "c4", environment=OTHER_MACHINE)
    with HistoryStore.open(location) as store:
        for results in (*here, elsewhere):
            store.append(results)
        assert store.sessions(fingerprint=ENVIRONMENT.fingerprint()) == here
        assert store.sessions(fingerprint=OTHER_MACHINE.fingerprint()) == [elsewhere]
        assert store.sessions(fingerprint="no-such-machine") == []
        assert store.sessions(newest=2) == [here[2], elsewhere]
        assert store.sessions(fingerprint=ENVIRONMENT.fingerprint(), newest=2) == here[1:]
        assert store.sessions(newest=0) == []


def test_sessions_of_one_second_keep_the_order_they_were_appended_in(location):
    same_time = "2026-03-01T10:00:00+00:00"
    first, second = session(same_time, throughput=90.0), session(same_time, throughput=95.0)
    with HistoryStore.open(location) as store:
        store.append(first)
        store.append(second)
        assert store.sessions() == [first, second]


def test_each_test_row_holds_what_a_series_is_selected_and_compared_by(location):
    results = session("2026-03-01T10:00:00+00:00", "c1", throughput=90.0)
    with HistoryStore.open(location) as store:
        store.append(results)
    rows = rows_of(
        location,
        'SELECT test_id, "commit", created_at, fingerprint, configuration_key, configuration, samples, verdicts '
        "FROM perfsuite_tests ORDER BY position",
    )
    (test_a, commit, created_at, fingerprint, key_a, configuration, samples, verdicts), test_b = rows
    assert (test_a, commit, created_at) == ("tests/perf/t.py::test_a[static]", "c1", "2026-03-01T10:00:00+00:00")
    assert fingerprint == ENVIRONMENT.fingerprint()
    assert RunConfiguration.from_json(json.loads(configuration)) == CONFIGURATION
    assert key_a == configuration_key(CONFIGURATION.to_json()) != test_b[4]
    assert json.loads(samples) == {"output_throughput": [90.0, 91.0, 89.0]}
    regressed = {"output_throughput": "regressed"}
    assert json.loads(verdicts) == {"baseline": "compared", "noisy": None, "metrics": regressed}


def test_the_same_configuration_has_the_same_key_and_another_one_another():
    stored = json.loads(json.dumps(CONFIGURATION.to_json()))  # as a JSON column gives it back
    assert configuration_key(CONFIGURATION.to_json()) == configuration_key(stored)
    assert configuration_key(CONFIGURATION.to_json()) != configuration_key(
        dataclasses.replace(CONFIGURATION, repeats=4).to_json()
    )
    assert configuration_key(None) is None


def test_appending_the_same_session_twice_stores_it_once(location):
    results = session("2026-03-01T10:00:00+00:00")
    with HistoryStore.open(location) as store:
        session_id = store.append(results)
        assert store.append(results) == session_id
        assert store.append(read_back(results, location.parent)) == session_id  # its results.json: the same session
        assert store.sessions() == [results]
    assert rows_of(location, "SELECT count(*) FROM perfsuite_tests") == [(2,)]


def test_two_sessions_alike_but_for_their_samples_are_two_sessions():
    created_at = "2026-03-01T10:00:00+00:00"
    assert session_key(session(created_at, throughput=90.0)) != session_key(session(created_at, throughput=91.0))
    assert session_key(session(created_at)) == session_key(session(created_at))


def read_back(results: Results, directory: Path) -> Results:
    path = directory / "results.json"
    write_results(path, results)
    return read_results(path)


def test_the_store_opens_as_a_path_and_as_a_sqlite_url(location):
    first, second = session("2026-03-01T10:00:00+00:00", "c1"), session("2026-03-02T10:00:00+00:00", "c2")
    with HistoryStore.open(f"sqlite:///{location}") as store:
        store.append(first)
        assert store.location == f"sqlite:///{location}"
    with HistoryStore.open(location) as store:
        store.append(second)
        assert store.location == str(location)
    with HistoryStore.open(f"sqlite:///{location}") as store:
        assert store.sessions() == [first, second]


def test_a_sqlite_file_is_left_in_wal_mode_with_its_log_folded_back_on_close(location):
    with HistoryStore.open(location) as store:
        store.append(session("2026-03-01T10:00:00+00:00"))
    assert sorted(path.name for path in location.parent.iterdir()) == ["history.sqlite"]
    assert rows_of(location, "PRAGMA journal_mode") == [("wal",)]


# -- what cannot be opened ------------------------------------------------------------------------------------------


def test_a_file_that_is_not_sqlite_is_refused_and_left_as_it_was(tmp_path):
    garbage = tmp_path / "history.sqlite"
    garbage.write_text("these are notes, not a database\n")
    with pytest.raises(HistoryError) as error:
        HistoryStore.open(garbage)
    assert f"{garbage} is not a SQLite database" in str(error.value) and "choose another location" in str(error.value)
    assert garbage.read_text() == "these are notes, not a database\n"


def test_another_applications_sqlite_file_is_refused_naming_its_tables(tmp_path):
    other = tmp_path / "app.sqlite"
    execute(other, "CREATE TABLE users (name TEXT)")
    with pytest.raises(HistoryError, match=r"is not a perfsuite history store \(it holds the tables users"):
        HistoryStore.open(other)
    assert rows_of(other, "SELECT name FROM sqlite_master WHERE type = 'table'") == [("users",)]


def test_a_directory_is_refused_with_a_file_path_to_use_instead(tmp_path):
    with pytest.raises(HistoryError, match=f"{tmp_path} is a directory; give the store's file path, e.g. "):
        HistoryStore.open(tmp_path)


def test_a_path_under_a_file_is_refused_naming_the_file_in_the_way(tmp_path):
    (tmp_path / "blocker").write_text("")
    with pytest.raises(HistoryError, match=f"cannot write .*: {tmp_path / 'blocker'} is not a directory"):
        HistoryStore.open(tmp_path / "blocker" / "history.sqlite")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("no such url://", "is not a database URL .*dialect\\+driver://user:password@host/database"),
        ("nosuchdb://host/db", "SQLAlchemy knows no database 'nosuchdb'"),
        ("postgresql+nosuchdriver://ci@db/perf", "SQLAlchemy knows no database 'postgresql\\+nosuchdriver'"),
    ],
)
def test_a_url_sqlalchemy_cannot_use_is_refused_saying_how_to_write_one(url, message):
    with pytest.raises(HistoryError, match=message):
        HistoryStore.open(url)


def test_a_database_that_cannot_be_reached_is_named_with_what_to_check(tmp_path):
    # A URL SQLite must open read-only, where nothing exists: it cannot connect, as an unreachable server cannot.
    url = f"sqlite:///file:{tmp_path / 'absent' / 'history.sqlite'}?mode=ro&uri=true"
    with pytest.raises(HistoryError) as error:
        HistoryStore.open(url)
    message = str(error.value)
    assert message.startswith("cannot open the history store sqlite:///file")
    assert "unable to open database file" in message
    assert message.endswith("check the URL, that the database server is up and reachable, and the credentials")


@pytest.mark.parametrize(
    "url",
    ["sqlite://", "sqlite:///:memory:", "sqlite:///file::memory:?cache=shared&uri=true",
     "sqlite:///file:history?mode=memory&uri=true"],
)  # fmt: skip
def test_an_in_memory_sqlite_url_is_refused_saying_to_give_a_file(url):
    with pytest.raises(HistoryError) as error:
        HistoryStore.open(url)
    message = str(error.value)
    assert message.startswith(f"{url} is an in-memory SQLite database, gone when perfsuite exits")
    assert message.endswith("give a file path (reports/history.sqlite) or a URL naming a file "
                            "(sqlite:///reports/history.sqlite)")  # fmt: skip


@pytest.mark.skipif(importlib.util.find_spec("psycopg") is not None, reason="psycopg is installed here")
def test_a_missing_database_driver_is_named_with_how_to_install_it():
    with pytest.raises(HistoryError) as error:
        HistoryStore.open("postgresql+psycopg://ci:secret@db.example/perf")
    message = str(error.value)
    assert "the driver for postgresql+psycopg, psycopg, is not installed (pip install 'psycopg[binary]')" in message
    assert "secret" not in message and "ci:***@db.example" in message


@pytest.mark.skipif(importlib.util.find_spec("MySQLdb") is not None, reason="mysqlclient is installed here")
def test_a_missing_driver_of_another_scheme_names_its_own_package_and_the_supported_schemes():
    with pytest.raises(HistoryError) as error:
        HistoryStore.open("mysql://ci@db.example/perf")
    message = str(error.value)
    assert message.startswith("mysql://ci@db.example/perf: the driver for mysql, MySQLdb, is not installed "
                              "(pip install mysqlclient); perfsuite's history store supports sqlite:///PATH")  # fmt: skip
    assert message.endswith("postgresql+pg8000://USER@HOST/DB (pip install pg8000)")
    assert message.count("pg8000") == 2, "pg8000 only as the postgresql scheme's driver, not as mysql's fix"


# -- schema versions -----------------------------------------------------------------------------------------------

# The layout perfsuite wrote as schema version 1, as SQLAlchemy created it on SQLite.
VERSION_1_TABLES = """
CREATE TABLE perfsuite_schema (version INTEGER NOT NULL);
CREATE TABLE perfsuite_sessions (
    id INTEGER NOT NULL, session_key VARCHAR(64) NOT NULL, created_at TEXT NOT NULL, "commit" TEXT,
    fingerprint TEXT, document JSON NOT NULL, PRIMARY KEY (id), UNIQUE (session_key)
);
CREATE TABLE perfsuite_tests (
    id INTEGER NOT NULL, session_id INTEGER NOT NULL, position INTEGER NOT NULL, test_id TEXT NOT NULL,
    "commit" TEXT, created_at TEXT NOT NULL, fingerprint TEXT, configuration JSON, samples JSON NOT NULL,
    verdicts JSON NOT NULL, result JSON NOT NULL, PRIMARY KEY (id), UNIQUE (session_id, position),
    FOREIGN KEY(session_id) REFERENCES perfsuite_sessions (id)
);
CREATE INDEX ix_perfsuite_tests_session_id ON perfsuite_tests (session_id);
INSERT INTO perfsuite_schema (version) VALUES (1);
"""


def version_1_store(path: Path, *stored: Results) -> None:
    """A store of schema version 1, its rows holding ``stored`` as results.json version 4 (of that time) did."""
    with contextlib.closing(sqlite3.connect(path)) as connection, connection:
        connection.executescript(VERSION_1_TABLES)
        for session_id, results in enumerate(stored, start=1):
            document = version_4_document(results)
            tests = document.pop("tests")
            connection.execute(
                "INSERT INTO perfsuite_sessions VALUES (?, ?, ?, ?, ?, ?)",
                (session_id, f"key{session_id}", results.created_at, results.commit, results.fingerprint,
                 json.dumps(document)),
            )  # fmt: skip
            for position, test in enumerate(tests):
                connection.execute(
                    "INSERT INTO perfsuite_tests (session_id, position, test_id, \"commit\", created_at, fingerprint, "
                    "configuration, samples, verdicts, result) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (session_id, position, test["test_id"], results.commit, results.created_at, test["fingerprint"],
                     json.dumps(test["configuration"]), json.dumps(test["samples"]), json.dumps({}), json.dumps(test)),
                )  # fmt: skip


def test_a_version_1_store_is_migrated_when_opened_and_keeps_its_rows(tmp_path):
    path = tmp_path / "old.sqlite"
    stored = [session("2026-03-01T10:00:00+00:00", "c1"), session("2026-03-02T10:00:00+00:00", "c2")]
    version_1_store(path, *stored)
    with HistoryStore.open(path) as store:
        converted = [with_counters_unrecorded(s) for s in stored]  # version 4 predates the prefix cache counters
        assert store.sessions() == converted, "rows of results.json version 4 are converted on reading"
        newer = session("2026-03-03T10:00:00+00:00", "c3")
        store.append(newer)
        assert store.sessions() == [*converted, newer]
    [(document,)] = rows_of(path, "SELECT document FROM perfsuite_sessions WHERE \"commit\" = 'c3'")
    [(result,)] = rows_of(path, "SELECT result FROM perfsuite_tests ORDER BY id DESC LIMIT 1")
    assert json.loads(document)["schema_version"] == 5 and "measurement" in json.loads(result)
    assert rows_of(path, "SELECT version FROM perfsuite_schema") == [(SCHEMA_VERSION,)] == [(2,)]
    keys = rows_of(path, "SELECT configuration_key FROM perfsuite_tests ORDER BY id")
    expected = configuration_key(CONFIGURATION.to_json())
    assert [key for (key,) in keys[::2]] == [expected] * 3, "the migration computes the keys of the old rows"
    assert len({key for (key,) in keys}) == 2 and None not in {key for (key,) in keys}
    indexes = rows_of(path, "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'perfsuite_tests'")
    assert ("ix_perfsuite_tests_series",) in indexes


def test_a_failed_migration_leaves_the_old_store_as_it_was(tmp_path, monkeypatch):
    from perfsuite.history import schema

    path = tmp_path / "old.sqlite"
    version_1_store(path, session("2026-03-01T10:00:00+00:00"))

    def half_done(connection):
        schema._add_configuration_keys(connection)
        raise RuntimeError("the migration died half way")

    monkeypatch.setattr(schema, "MIGRATIONS", (half_done,))
    with pytest.raises(RuntimeError, match="half way"):
        HistoryStore.open(path)
    assert rows_of(path, "SELECT version FROM perfsuite_schema") == [(1,)]
    columns = [name for _, name, *_ in rows_of(path, "PRAGMA table_info(perfsuite_tests)")]
    assert "configuration_key" not in columns, "the migration's DDL was rolled back with it"


def test_a_store_of_a_newer_schema_is_refused_naming_both_versions(location):
    with HistoryStore.open(location):
        pass
    execute(location, "UPDATE perfsuite_schema SET version = ?", SCHEMA_VERSION + 1)
    with pytest.raises(HistoryError) as error:
        HistoryStore.open(location)
    message = str(error.value)
    assert f"schema version {SCHEMA_VERSION + 1}, newer than the version {SCHEMA_VERSION}" in message
    assert "a newer perfsuite wrote it; upgrade this perfsuite from its source" in message
    assert "pip install -U perfsuite" not in message, "perfsuite comes from its source, not a package index"
    assert rows_of(location, "SELECT version FROM perfsuite_schema") == [(SCHEMA_VERSION + 1,)]


def test_a_store_whose_version_table_is_damaged_is_refused(location):
    with HistoryStore.open(location):
        pass
    execute(location, "DELETE FROM perfsuite_schema")
    with pytest.raises(HistoryError, match="its perfsuite_schema table holds \\[\\], not one version number"):
        HistoryStore.open(location)


def test_the_schema_compiles_for_postgresql_without_a_server():
    """No PostgreSQL here: at least the DDL the store would send one is valid for its dialect."""
    import sqlalchemy as sa

    from perfsuite.history import schema

    statements = []
    def record(sql, *args, **kwargs):
        statements.append(str(sql.compile(dialect=engine.dialect)))

    engine = sa.create_mock_engine("postgresql+psycopg://", record)
    schema.metadata.create_all(engine, checkfirst=False)
    heads = sorted(statement.split("(")[0].strip() for statement in statements)
    assert heads == [
        "CREATE INDEX ix_perfsuite_tests_series ON perfsuite_tests",
        "CREATE INDEX ix_perfsuite_tests_session_id ON perfsuite_tests",
        "CREATE TABLE perfsuite_schema", "CREATE TABLE perfsuite_sessions", "CREATE TABLE perfsuite_tests",
    ]  # fmt: skip
    assert any("id SERIAL NOT NULL" in statement and "result JSON NOT NULL" in statement for statement in statements)


# -- a kill, and two writers ----------------------------------------------------------------------------------------

# Appends each results file given, in order; a session whose commit is "killed" stops inside its transaction,
# after its rows are written, and says so in the flag file; GO (if given) is waited for before anything.
WRITER = """
import sys, time
from pathlib import Path

from perfsuite.history import store as store_module
from perfsuite.history.store import HistoryStore
from perfsuite.judge.results import read_results

location, flag, go, *documents = sys.argv[1:]
insert_tests = store_module._insert_tests

def insert_then_stop_if_killed(connection, results, session_id):
    insert_tests(connection, results, session_id)
    if results.commit == "killed":
        Path(flag).write_text("inside the transaction, rows written")
        time.sleep(600)

store_module._insert_tests = insert_then_stop_if_killed
while go != "-" and not Path(go).exists():
    time.sleep(0.01)
with HistoryStore.open(location) as store:
    for document in documents:
        store.append(read_results(Path(document)))
"""


def start_writer(tmp_path: Path, location: Path, sessions: list[Results], name: str, go: Path | None = None):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    documents = []
    for index, results in enumerate(sessions):
        documents.append(tmp_path / f"{name}-{index}.json")
        write_results(documents[-1], results)
    flag = tmp_path / f"{name}.inside"
    args = [sys.executable, str(script), str(location), str(flag), str(go or "-"), *map(str, documents)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), flag


def wait_for(flag: Path, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not flag.exists():
        if process.poll() is not None:
            pytest.fail(f"the writer ended before its transaction: {process.stdout.read()}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail("the writer never reached its transaction")
        time.sleep(0.02)


def test_a_writer_killed_inside_its_transaction_loses_only_its_own_session(tmp_path, location):
    committed = [session(f"2026-03-0{day}T10:00:00+00:00", f"c{day}") for day in (1, 2)]
    killed = session("2026-03-03T10:00:00+00:00", "killed")
    writer, inside = start_writer(tmp_path, location, [*committed, killed], "writer")
    wait_for(inside, writer)
    os.kill(writer.pid, signal.SIGKILL)
    assert writer.wait(timeout=60) == -signal.SIGKILL
    with HistoryStore.open(location) as store:
        assert store.sessions() == committed
        assert store.append(killed) not in (None, 0), "its session was never stored, so it is appended now"
        assert store.sessions() == [*committed, killed]
    assert rows_of(location, "PRAGMA integrity_check") == [("ok",)]
    assert rows_of(location, "SELECT count(*) FROM perfsuite_tests") == [(6,)]


def test_two_writers_appending_at_once_lose_no_session(tmp_path, location):
    go = tmp_path / "go"
    first = [session(f"2026-03-01T10:00:{second:02d}+00:00", "first") for second in range(8)]
    second = [session(f"2026-03-01T10:00:{second:02d}+00:00", "second") for second in range(8)]
    writers = [start_writer(tmp_path, location, first, "first", go)[0],
               start_writer(tmp_path, location, second, "second", go)[0]]  # fmt: skip
    go.write_text("both started: append")  # the two open the new store and append at the same moment
    for writer in writers:
        assert writer.wait(timeout=120) == 0, writer.stdout.read()
    with HistoryStore.open(location) as store:
        stored = store.sessions()
    assert sorted(stored, key=session_key) == sorted([*first, *second], key=session_key)


def test_a_second_writer_waits_for_the_first_to_commit_and_then_appends(location, monkeypatch):
    """Deterministic: the second writer starts while the first holds its transaction, and must wait, not fail."""
    from perfsuite.history import store as store_module

    inside, release = threading.Event(), threading.Event()
    insert_tests = store_module._insert_tests

    def hold_the_lock(connection, results, session_id):
        insert_tests(connection, results, session_id)
        if results.commit == "holds the lock":
            inside.set()
            assert release.wait(timeout=60)

    monkeypatch.setattr(store_module, "_insert_tests", hold_the_lock)
    first = session("2026-03-01T10:00:00+00:00", "holds the lock")
    second = session("2026-03-01T10:00:01+00:00", "waits")
    HistoryStore.open(location).close()
    errors = []

    def append(results):
        try:
            with HistoryStore.open(location) as store:
                store.append(results)
        except Exception as error:  # noqa: BLE001 - handed to the test's thread
            errors.append(error)

    holder = threading.Thread(target=append, args=(first,))
    holder.start()
    assert inside.wait(timeout=60)
    waiter = threading.Thread(target=append, args=(second,))
    waiter.start()
    waiter.join(timeout=0.5)
    assert waiter.is_alive() or errors, "the second writer cannot finish while the first holds the write lock"
    release.set()
    holder.join(timeout=60)
    waiter.join(timeout=60)
    assert errors == []
    with HistoryStore.open(location) as store:
        assert store.sessions() == [first, second]


# -- importing results files ----------------------------------------------------------------------------------------


def test_import_reads_older_versions_skips_what_is_stored_and_names_a_corrupt_file(tmp_path, location):
    history = tmp_path / "reports" / "history"
    history.mkdir(parents=True)
    current, older = session("2026-03-02T10:00:00+00:00", "c2"), session("2026-03-01T10:00:00+00:00", "c1")
    write_results(history / "2026-03-02T10-00-00+00-00.json", current)
    (history / "2026-03-01T10-00-00+00-00.json").write_text(json.dumps(version_1(version_4_document(older))))
    (history / "2026-02-28T10-00-00+00-00.json").write_text('{"schema_version": 4, "tests": [')
    results_json = tmp_path / "reports" / "results.json"
    write_results(results_json, current)  # the same session as its history copy
    with HistoryStore.open(location) as store:
        report = store.import_files([history, results_json])
        assert report == ImportReport(num_imported=2, num_duplicates=1, problems=report.problems)
        [problem] = report.problems
        assert "2026-02-28T10-00-00+00-00.json is not a readable JSON file" in problem and "not imported" in problem
        assert store.sessions() == [read_results(history / "2026-03-01T10-00-00+00-00.json"), current]
        again = store.import_files([history])
        assert (again.num_imported, again.num_duplicates, len(again.problems)) == (0, 2, 1)


def test_a_session_whose_created_at_is_not_a_time_is_refused_naming_the_file_and_the_field(tmp_path, location):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    write_results(good, session("2026-03-01T10:00:00+00:00", "c1"))
    write_results(bad, session("not a date", "c2"))
    (tmp_path / "naive.json").write_text(json.dumps({**json.loads(good.read_text()), "created_at": "2026-03-01"}))
    with HistoryStore.open(location) as store:
        report = store.import_files([good, bad, tmp_path / "naive.json"])
        assert report.num_imported == 1 and [results.commit for results in store.sessions()] == ["c1"]
        with pytest.raises(HistoryError, match="cannot append the session of commit c2 to .*: its created_at 'not a"):
            store.append(session("not a date", "c2"))
    assert report.problems == (
        f"{bad}: its created_at 'not a date' is not an ISO 8601 date and time with a UTC offset, as perfsuite writes "
        "it (2026-03-01T10:00:00+00:00); correct the field (not imported)",
        f"{tmp_path / 'naive.json'}: its created_at '2026-03-01' is not an ISO 8601 date and time with a UTC offset, "
        "as perfsuite writes it (2026-03-01T10:00:00+00:00); correct the field (not imported)",
    )


def test_import_names_a_missing_file_and_an_empty_directory(tmp_path, location):
    (tmp_path / "empty").mkdir()
    with HistoryStore.open(location) as store:
        report = store.import_files([tmp_path / "missing.json", tmp_path / "empty"])
        assert store.sessions() == []
    assert report.num_imported == report.num_duplicates == 0
    assert any(f"{tmp_path / 'missing.json'}: no such file" in problem for problem in report.problems)
    assert any(f"{tmp_path / 'empty'}: no *.json files" in problem for problem in report.problems)
