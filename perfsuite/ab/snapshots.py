"""REF's snapshots in the temporary directory, and the sweep that removes those whose session is gone.

A session removes its own snapshot when it ends, on Ctrl-C and SIGTERM too
(``plugin.against``), but no handler runs on SIGKILL or a power cut. So each
snapshot records the process that made it, and a later session removes any
snapshot whose owner no longer runs. The owner is its pid and, where
``/proc`` says, when that process started: a pid the system has since given
to another process does not keep a stale snapshot alive.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

PREFIX = "perfsuite-ab-"
OWNER_FILE = ".perfsuite-ab-owner.json"


@dataclass(frozen=True, slots=True)
class Owner:
    """The process a snapshot belongs to."""

    pid: int
    started: int | None  # clock ticks after boot (/proc/PID/stat); None where unknown

    @classmethod
    def of_this_process(cls) -> Owner:
        return cls(os.getpid(), process_start(os.getpid()))

    @classmethod
    def of(cls, snapshot: Path) -> Owner | None:
        """Who made ``snapshot``; None if it records no owner (an older perfsuite's, or not a snapshot)."""
        try:
            data = json.loads((snapshot / OWNER_FILE).read_text())
            return cls(int(data["pid"]), None if data["started"] is None else int(data["started"]))
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def record(self, snapshot: Path) -> None:
        (snapshot / OWNER_FILE).write_text(json.dumps({"pid": self.pid, "started": self.started}))

    def is_alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # another user's process holds the pid
        started = process_start(self.pid)
        return self.started is None or started is None or started == self.started


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks after boot; None where ``/proc`` cannot say (not Linux, gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the command name before ")" may hold spaces
    return int(fields[19]) if len(fields) > 19 else None  # field 22 of proc(5); fields[0] is field 3


def new_snapshot(commit: str, directory: Path | None = None) -> Path:
    """An empty folder for ``commit``'s files in the temporary directory, owned by this process."""
    snapshot = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{commit[:12]}-", dir=directory))
    Owner.of_this_process().record(snapshot)
    return snapshot


def remove_stale_snapshots(directory: Path | None = None) -> list[Path]:
    """Remove the snapshots in ``directory`` (the temporary one) whose owner has exited; the ones removed.

    A snapshot that records no owner is left alone: whose it is, nobody can tell.
    """
    removed = []
    for snapshot in Path(directory or tempfile.gettempdir()).glob(f"{PREFIX}*"):
        owner = Owner.of(snapshot)
        if owner is not None and not owner.is_alive():
            shutil.rmtree(snapshot, ignore_errors=True)
            removed.append(snapshot)
    return removed
