"""The run history: every ``pytest --perf`` session's results, kept in a database that outlives the runner.

``HistoryStore.open(location)`` takes a file path (a SQLite file, created
with its directory) or a SQLAlchemy database URL (``sqlite:///...``,
``postgresql+psycopg://...``); ``append`` adds one session's ``Results``,
``sessions`` reads them back as ``Results``, oldest first, and
``import_files`` brings in results.json files (written before the store
existed, or on another machine). ``read_sessions`` is the reader for a store
that must exist already (``perfsuite report --history``, ``perfsuite history
show``). The store is perfsuite's one run history: no other copy of a
session is kept.

Each append is one transaction: a session killed while appending leaves no
row of its own and every earlier row as it was. SQLite writers take the
write lock when their transaction begins (``BEGIN IMMEDIATE``) and wait up to
``BUSY_TIMEOUT_SECONDS`` for it, so two writers (two CI jobs sharing a file)
queue rather than fail; the file is in WAL mode where its filesystem allows,
so readers never wait for a writer. On a database server, the unique session
key settles two jobs appending the same session at once.

The tables' layout is versioned (``schema.SCHEMA_VERSION``): a store of an
older layout is migrated in one transaction when it is opened; one of a newer
layout is refused, naming both versions.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

import sqlalchemy as sa

from perfsuite.history import rows, schema
from perfsuite.history.location import ELSEWHERE, URL_FORM, HistoryError, Location, prepare_sqlite_file, resolve
from perfsuite.judge.results import Results, ResultsFileError, read_results, results_from_json

__all__ = ["BUSY_TIMEOUT_SECONDS", "HistoryError", "HistoryStore", "ImportReport", "read_sessions"]

BUSY_TIMEOUT_SECONDS = 30.0
_WRITE = "perfsuite_write"  # the execution option that makes a SQLite transaction begin IMMEDIATE


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What ``import_files`` did: sessions added, sessions the store held already, and each file it could not use."""

    num_imported: int
    num_duplicates: int
    problems: tuple[str, ...]  # one line per file: its path, why, and the fix


class HistoryStore:
    """A history store, open; ``HistoryStore.open(location)`` makes one. Close it, or use it as a context manager."""

    def __init__(self, engine: sa.Engine, location: Location) -> None:
        self._engine = engine
        self._location = location

    @classmethod
    def open(cls, location: str | os.PathLike) -> HistoryStore:
        """Open (creating or migrating) the store at ``location``; ``HistoryError`` says why it cannot be used.

        ``location``: a filesystem path, or a database URL (a string holding ``://``).
        """
        where = resolve(location)
        if where.sqlite_file is not None:
            prepare_sqlite_file(where.sqlite_file)
        store = cls(_engine(where), where)
        try:
            with store._database_errors("open"), store._transaction(write=True) as connection:
                _prepare(connection, where.shown)
        except BaseException:
            store.close()
            raise
        return store

    @property
    def location(self) -> str:
        """The path, or the URL without its password."""
        return self._location.shown

    def append(self, results: Results) -> int:
        """Add one session in one transaction; its id.

        A session is stored once: appended again (or imported from its
        results.json), it is found by its key, a digest of its ``created_at``,
        commit and fingerprint and each test's id and samples
        (``rows.session_key``), and its id is returned with nothing added.
        """
        session_id, _ = self._append(results)
        return session_id

    def sessions(self, *, fingerprint: str | None = None, newest: int | None = None) -> list[Results]:
        """The stored sessions, oldest first (by ``created_at``, then by when they were appended).

        ``fingerprint``: only sessions on that environment (``Results.fingerprint``);
        ``newest``: only the last so many of them.
        """
        if newest is not None and newest < 0:
            raise ValueError(f"newest must be 0 or more, got {newest}")
        chosen = sa.select(schema.sessions.c.id)
        if fingerprint is not None:
            chosen = chosen.where(schema.sessions.c.fingerprint == fingerprint)
        if newest is not None:
            chosen = chosen.order_by(schema.sessions.c.created_at.desc(), schema.sessions.c.id.desc()).limit(newest)
        chosen_ids = chosen.subquery()
        with self._database_errors("read"), self._transaction(write=False) as connection:
            sessions = connection.execute(
                sa.select(schema.sessions.c.id, schema.sessions.c.document)
                .where(schema.sessions.c.id.in_(sa.select(chosen_ids.c.id)))
                .order_by(schema.sessions.c.created_at, schema.sessions.c.id)
            ).all()
            test_rows = connection.execute(
                sa.select(schema.tests.c.session_id, schema.tests.c.result)
                .where(schema.tests.c.session_id.in_(sa.select(chosen_ids.c.id)))
                .order_by(schema.tests.c.session_id, schema.tests.c.position)
            ).all()
        tests_of: dict[int, list[dict[str, Any]]] = {}
        for session_id, result in test_rows:
            tests_of.setdefault(session_id, []).append(result)
        return [self._rebuilt(session_id, document, tests_of.get(session_id, [])) for session_id, document in sessions]

    def import_files(self, paths: Iterable[Path]) -> ImportReport:
        """Append the results files at ``paths`` (a directory: its ``*.json``), each on its own, of any schema version.

        A file that cannot be read is a problem of the report, and the others
        are imported; a session stored already is counted, not added.
        """
        num_imported = num_duplicates = 0
        problems: list[str] = []
        for path in _results_files(paths, problems):
            try:
                results = read_results(path)
            except ResultsFileError as error:
                problems.append(f"{error} (not imported)")
                continue
            problem = rows.created_at_problem(results.created_at)
            if problem is not None:
                problems.append(f"{path}: {problem} (not imported)")
                continue
            _, added = self._append(results)
            num_imported += added
            num_duplicates += not added
        return ImportReport(num_imported, num_duplicates, tuple(problems))

    def close(self) -> None:
        """Release the connections (SQLite folds its write-ahead log back into the file when the last one closes)."""
        self._engine.dispose()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None):
        self.close()

    def __repr__(self) -> str:
        return f"HistoryStore({self.location!r})"

    def _append(self, results: Results) -> tuple[int, bool]:
        """The session's id, and whether this call added it."""
        problem = rows.created_at_problem(results.created_at)
        if problem is not None:
            raise HistoryError(f"cannot append the session of commit {results.commit} to {self.location}: {problem}")
        try:
            session = rows.session_row(results)
        except ValueError as error:  # a NaN or infinity, which JSON (and so the store) cannot hold
            message = f"cannot append to {self.location}: {error}; please report this with its results"
            raise HistoryError(message) from None
        with self._database_errors("write to"):
            try:
                return self._insert(results, session)
            except sa.exc.IntegrityError:  # another writer stored the same session since we looked
                with self._transaction(write=False) as connection:
                    stored = _session_id(connection, session["session_key"])
                if stored is None:
                    raise
                return stored, False

    def _insert(self, results: Results, session: dict[str, Any]) -> tuple[int, bool]:
        with self._transaction(write=True) as connection:
            stored = _session_id(connection, session["session_key"])
            if stored is not None:
                return stored, False
            inserted = connection.execute(sa.insert(schema.sessions).values(session)).inserted_primary_key
            if inserted is None:  # SQLite and PostgreSQL always say; a dialect that does not cannot be a store
                raise HistoryError(f"{self.location}: the database did not return the new session's id")
            session_id = inserted[0]
            _insert_tests(connection, results, session_id)
            return session_id, True

    def _rebuilt(self, session_id: int, document: dict[str, Any], tests: list[dict[str, Any]]) -> Results:
        try:
            return results_from_json(rows.results_document(document, tests), f"{self.location} session {session_id}")
        except ResultsFileError as error:
            raise HistoryError(f"{error} (a stored session perfsuite cannot read: please report it)") from None

    def _transaction(self, write: bool) -> AbstractContextManager[sa.Connection]:
        return _transaction(self._engine, write)

    def _database_errors(self, doing: str) -> _DatabaseErrors:
        return _DatabaseErrors(self._location, doing)


def read_sessions(
    location: str | os.PathLike, *, fingerprint: str | None = None, newest: int | None = None
) -> list[Results]:
    """The sessions of an existing store, oldest first, as ``HistoryStore.sessions`` filters them.

    A file path where no store is yet is a ``HistoryError`` rather than a new
    store: a reader that created one would only ever read nothing.
    """
    if not (isinstance(location, str) and "://" in location) and not Path(location).exists():
        raise HistoryError(
            f"{location}: no history store there; `pytest --perf` creates it (--perf-history), "
            "`perfsuite history import RESULTS.json...` fills it from results files, or pass --store"
        )
    with HistoryStore.open(location) as store:
        return store.sessions(fingerprint=fingerprint, newest=newest)


def _insert_tests(connection: sa.Connection, results: Results, session_id: int) -> None:
    test_rows = rows.test_rows(results, session_id)
    if test_rows:
        connection.execute(sa.insert(schema.tests), test_rows)


def _session_id(connection: sa.Connection, key: str) -> int | None:
    return connection.execute(sa.select(schema.sessions.c.id).where(schema.sessions.c.session_key == key)).scalar()


def _results_files(paths: Iterable[Path], problems: list[str]) -> Iterator[Path]:
    for path in map(Path, paths):
        if not path.is_dir():
            yield path
            continue
        found = sorted(path.glob("*.json"))
        if not found:
            problems.append(f"{path}: no *.json files in it; pass results files, or a folder of them")
        yield from found


# -- opening: the tables, their version and migrations --------------------------------------------------------------


def _prepare(connection: sa.Connection, shown: str) -> None:
    """Create the tables in an empty database, migrate an older layout, refuse anything else."""
    if connection.dialect.name == "postgresql":  # two jobs opening a new database at once: one creates, one waits
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _POSTGRESQL_LOCK_KEY})
    present = set(sa.inspect(connection).get_table_names())
    if schema.schema_version.name not in present:
        _create(connection, shown, present)
        return
    version = _stored_version(connection, shown)
    if version > schema.SCHEMA_VERSION:
        raise HistoryError(
            f"{shown} is a history store of schema version {version}, newer than the version "
            f"{schema.SCHEMA_VERSION} this perfsuite knows: a newer perfsuite wrote it; upgrade this perfsuite from "
            "its source (a git pull in its checkout, or pip install -U the git URL or path you installed it from)"
        )
    for migrate in schema.MIGRATIONS[version - 1 :]:
        migrate(connection)
    if version < schema.SCHEMA_VERSION:
        connection.execute(sa.update(schema.schema_version).values(version=schema.SCHEMA_VERSION))


# Any fixed number: the lock is held until the opening transaction ends (SQLite's BEGIN IMMEDIATE does this there).
_POSTGRESQL_LOCK_KEY = 0x7065726673756974  # "perfsuit"


def _create(connection: sa.Connection, shown: str, present: set[str]) -> None:
    ours = sorted(present & set(schema.TABLE_NAMES))
    foreign = connection.dialect.name == "sqlite" and present  # a file of its own: any table makes it another's
    if ours or foreign:
        raise HistoryError(
            f"{shown} is not a perfsuite history store (it holds the tables {', '.join(sorted(present))} but no "
            f"{schema.schema_version.name}); {ELSEWHERE}"
        )
    schema.metadata.create_all(connection)
    connection.execute(sa.insert(schema.schema_version).values(version=schema.SCHEMA_VERSION))


def _stored_version(connection: sa.Connection, shown: str) -> int:
    versions = connection.execute(sa.select(schema.schema_version.c.version)).scalars().all()
    if len(versions) != 1 or not isinstance(versions[0], int) or versions[0] < 1:
        raise HistoryError(
            f"{shown}: its {schema.schema_version.name} table holds {versions!r}, not one version number, so it "
            f"is damaged or not perfsuite's; {ELSEWHERE}"
        )
    return versions[0]


# -- the engine and its transactions --------------------------------------------------------------------------------


def _engine(location: Location) -> sa.Engine:
    """An engine for the store; ``HistoryError`` when SQLAlchemy knows no such database, or its driver is missing."""
    serializer = partial(json.dumps, allow_nan=False)  # standard JSON: PostgreSQL refuses NaN
    is_sqlite = location.url.get_backend_name() == "sqlite"
    try:
        engine = sa.create_engine(
            location.url,
            json_serializer=serializer,
            connect_args={"timeout": BUSY_TIMEOUT_SECONDS} if is_sqlite else {},
        )
    except sa.exc.NoSuchModuleError:
        raise HistoryError(
            f"{location.shown}: SQLAlchemy knows no database {location.url.drivername!r}; {URL_FORM}"
        ) from None
    except ImportError as error:
        raise HistoryError(_missing_driver_message(location, error)) from None
    if is_sqlite:
        sa.event.listen(engine, "connect", _sqlite_connected)
        sa.event.listen(engine, "begin", _sqlite_begin)
    return engine


# The store is tested on these (tests/test_history_postgres.py on a real server); SQLAlchemy may open others, each
# with its own driver (postgresql+psycopg too).
SUPPORTED = "sqlite:///PATH (no driver to install) and postgresql+pg8000://USER@HOST/DB (pip install pg8000)"
# The pip package of each driver module SQLAlchemy's dialects import.
_DRIVER_PACKAGES = {
    "psycopg": "'psycopg[binary]'",
    "psycopg2": "psycopg2-binary",
    "asyncpg": "asyncpg",
    "pg8000": "pg8000",
    "MySQLdb": "mysqlclient",
    "pymysql": "PyMySQL",
    "mysql": "mysql-connector-python",
    "pyodbc": "pyodbc",
    "oracledb": "oracledb",
}


def _missing_driver_message(location: Location, error: ImportError) -> str:
    """Which driver the URL's scheme needs and how to install it, and the schemes perfsuite supports."""
    scheme, module = location.url.drivername, error.name or str(error)
    package = _DRIVER_PACKAGES.get(module.partition(".")[0])
    install = f"pip install {package}" if package else f"install the Python module {module}"
    return (
        f"{location.shown}: the driver for {scheme}, {module}, is not installed ({install}); perfsuite's history store "
        f"supports {SUPPORTED}"
    )


def _sqlite_connected(dbapi_connection, connection_record) -> None:
    # Python's sqlite3 would begin transactions itself, lazily and not for DDL; _sqlite_begin does it instead.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")  # persistent in the file; a filesystem without it keeps its mode
    finally:
        cursor.close()


def _sqlite_begin(connection: sa.Connection) -> None:
    # A writer takes the write lock now, waiting for it under the busy timeout; begun deferred, it could find
    # at its first write that another writer had committed since it read, and fail at once instead of waiting.
    write = connection.get_execution_options().get(_WRITE, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


@contextmanager
def _transaction(engine: sa.Engine, write: bool) -> Iterator[sa.Connection]:
    """One connection, one transaction: committed when the block ends, rolled back when it raises; closed either way."""
    with engine.connect().execution_options(**{_WRITE: write}) as connection, connection.begin():
        yield connection


class _DatabaseErrors:
    """Turns what the database or its driver raised into one ``HistoryError`` line naming the store and the fix."""

    def __init__(self, location: Location, doing: str) -> None:
        self._location = location
        self._doing = doing

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, trace) -> None:
        if error is None or not isinstance(error, sa.exc.SQLAlchemyError):
            return
        reason = _first_line(getattr(error, "orig", None) or error)
        where = self._location
        if where.sqlite_file is not None and "locked" in reason:
            fix = f"another process held its write lock for over {BUSY_TIMEOUT_SECONDS:g} s; try again once it is done"
        elif where.sqlite_file is not None:
            fix = f"check that {where.sqlite_file} is a perfsuite history store and writable, or {ELSEWHERE}"
        else:
            fix = "check the URL, that the database server is up and reachable, and the credentials"
        raise HistoryError(f"cannot {self._doing} the history store {where.shown}: {reason}; {fix}") from error


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]
