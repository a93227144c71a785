"""A throw-away PostgreSQL server for the history store's tests: initdb and pg_ctl in a temporary directory.

``start_server`` makes a cluster there, starts it on a free port of
127.0.0.1 and hands back a ``PostgresServer``; ``stop`` stops it and removes
the directory. ``why_not`` says, in a line a skip can carry, why no server can
be started here (the binaries or the driver missing, root with no way to drop
to an unprivileged user), or None. initdb refuses to run as root: as root the
server runs as ``nobody`` through ``runuser``.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

DRIVER = "pg8000"  # pure Python: the `postgres` extra of pyproject.toml
UNPRIVILEGED_USER = "nobody"
SUPERUSER = "perfsuite"


def server_binaries() -> Path | None:
    """The folder that holds initdb, pg_ctl and postgres: on PATH, else Debian's /usr/lib/postgresql/<v>/bin."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(os.path.realpath(on_path)).parent
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if all((Path(folder) / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
            return Path(folder)
    return None


def why_not() -> str | None:
    if server_binaries() is None:
        return "no PostgreSQL server binaries (initdb, pg_ctl) here: apt-get install postgresql"
    if importlib.util.find_spec(DRIVER) is None:
        return f"the PostgreSQL driver {DRIVER} is not installed: make install (the postgres extra)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return f"running as root, and initdb refuses root: no runuser to run it as {UNPRIVILEGED_USER}"
    return None


@dataclass(frozen=True, slots=True)
class PostgresServer:
    port: int
    base: Path  # the temporary directory: the cluster, its socket and its log
    bin: Path

    def url(self, database: str) -> str:
        return f"postgresql+{DRIVER}://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new, empty database; its URL."""
        import pg8000.native

        connection = pg8000.native.Connection(SUPERUSER, host="127.0.0.1", port=self.port, database="postgres")
        try:
            connection.run(f'CREATE DATABASE "{name}"')
        finally:
            connection.close()
        return self.url(name)

    def stop(self) -> None:
        _as_server_user([str(self.bin / "pg_ctl"), "-D", str(self.base / "data"), "-m", "fast", "-w", "stop"])
        shutil.rmtree(self.base, ignore_errors=True)


def start_server() -> PostgresServer:
    """initdb, then pg_ctl start on a free port; RuntimeError with initdb's or the server's log if either fails."""
    binaries = server_binaries()
    assert binaries is not None, why_not()
    base = Path(tempfile.mkdtemp(prefix="perfsuite-postgres-"))
    data = base / "data"
    if os.geteuid() == 0:  # the server's user must reach its folder: it owns base, and so data and the socket
        import pwd

        user = pwd.getpwnam(UNPRIVILEGED_USER)
        os.chown(base, user.pw_uid, user.pw_gid)
    port = _free_port()
    initdb = [str(binaries / "initdb"), "-D", str(data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--no-sync"]
    _checked(_as_server_user(initdb), "initdb", base)
    options = f"-p {port} -h 127.0.0.1 -k {base} -c fsync=off -c max_connections=40"
    start = [str(binaries / "pg_ctl"), "-D", str(data), "-l", str(base / "server.log"), "-o", options, "-w", "start"]
    _checked(_as_server_user(start), "pg_ctl start", base)
    return PostgresServer(port, base, binaries)


def _as_server_user(args: list[str]) -> subprocess.CompletedProcess:
    if os.geteuid() == 0:
        args = ["runuser", "-u", UNPRIVILEGED_USER, "--", *args]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd="/")


def _checked(ran: subprocess.CompletedProcess, what: str, base: Path) -> None:
    if ran.returncode == 0:
        return
    log = base / "server.log"
    server_log = log.read_text(errors="replace") if log.exists() else ""
    shutil.rmtree(base, ignore_errors=True)
    raise RuntimeError(f"{what} failed ({ran.returncode}):\n{ran.stdout}\n{ran.stderr}\n{server_log}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
