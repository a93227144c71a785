"""Where a history store lives: a SQLite file's path or a database URL, checked before anything connects."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from perfsuite.judge.baselines import cannot_write_message

SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
ELSEWHERE = "choose another location (a writable file path, or a database URL)"
URL_FORM = "write it as dialect+driver://user:password@host/database, e.g. postgresql+psycopg://ci@db.example/perf"


class HistoryError(RuntimeError):
    """A history store that cannot be opened, read or written; the one-line message names it and the fix."""


@dataclass(frozen=True, slots=True)
class Location:
    url: sa.URL
    shown: str  # as the user gave it: the path, or the URL without its password
    sqlite_file: Path | None  # the database file, when the store is one (None: a server, or SQLite in memory)


def resolve(location: str | os.PathLike) -> Location:
    """A filesystem path is a SQLite file; a string holding ``://`` is a database URL (SQLAlchemy's form)."""
    if isinstance(location, str) and "://" in location:
        return _from_url(location)
    path = Path(os.fspath(location)).expanduser()
    return Location(sa.URL.create("sqlite", database=str(path)), str(path), path)


def _from_url(text: str) -> Location:
    try:
        url = sa.make_url(text)
    except sa.exc.ArgumentError as error:
        raise HistoryError(f"{text!r} is not a database URL ({error}); {URL_FORM}, or give a file path") from None
    shown = url.render_as_string(hide_password=True)
    database = url.database or ""
    is_sqlite = url.get_backend_name() == "sqlite"
    if is_sqlite and _in_memory(url):
        raise HistoryError(
            f"{text} is an in-memory SQLite database, gone when perfsuite exits, so it would keep no history; give "
            "a file path (reports/history.sqlite) or a URL naming a file (sqlite:///reports/history.sqlite)"
        )
    in_file = is_sqlite and not database.startswith("file:")
    return Location(url, shown, Path(database) if in_file else None)


def _in_memory(url: sa.URL) -> bool:
    """``sqlite://``, ``sqlite:///:memory:``, or a ``file:`` URI of ``mode=memory`` or ``:memory:``."""
    database = url.database or ""
    if database in ("", ":memory:"):
        return True
    mode = url.query.get("mode")
    return database.startswith("file:") and (":memory:" in database or mode == "memory")


def prepare_sqlite_file(path: Path) -> None:
    """Create the file's directory; refuse a directory, or a file that is not a SQLite database, at ``path``."""
    if path.is_dir():
        raise HistoryError(f"{path} is a directory; give the store's file path, e.g. {path / 'history.sqlite'}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        header = _first_bytes(path, len(SQLITE_HEADER))
    except OSError as error:
        raise HistoryError(cannot_write_message(path, error, ELSEWHERE)) from None
    if header and header != SQLITE_HEADER:
        raise HistoryError(
            f"{path} is not a SQLite database, so not a perfsuite history store; move it away, or {ELSEWHERE}"
        )


def _first_bytes(path: Path, count: int) -> bytes:
    """Empty when there is no file yet (SQLite creates it) or it is empty (SQLite takes an empty file as new)."""
    if not path.exists():
        return b""
    with path.open("rb") as file:
        return file.read(count)
