"""REF's snapshots in the temporary directory: each records the process that owns it, and a session removes those
whose owner is gone (one killed with SIGKILL, which no handler sees)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from perfsuite.ab.snapshots import Owner, new_snapshot, remove_stale_snapshots


def a_finished_process_pid() -> int:
    """The pid of a process that has exited and been reaped: no process holds it (until the system reuses it)."""
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    return done.pid


def test_a_new_snapshot_records_this_process_as_its_owner(tmp_path):
    snapshot = new_snapshot("0123456789abcdef", tmp_path)
    assert snapshot.parent == tmp_path and snapshot.name.startswith("perfsuite-ab-0123456789ab-")
    assert Owner.of(snapshot) == Owner.of_this_process()
    assert Owner.of(snapshot).pid == os.getpid() and Owner.of(snapshot).is_alive()


def test_a_snapshot_whose_owner_is_gone_is_removed_and_the_others_are_kept(tmp_path):
    mine = new_snapshot("aaaaaaaaaaaa", tmp_path)
    orphaned = new_snapshot("bbbbbbbbbbbb", tmp_path)
    Owner(a_finished_process_pid(), started=None).record(orphaned)
    reused_pid = new_snapshot("cccccccccccc", tmp_path)  # its pid now names a later process: this one
    Owner(os.getpid(), started=Owner.of_this_process().started - 1).record(reused_pid)
    unowned = tmp_path / "perfsuite-ab-dddddddddddd-x"  # made by an older perfsuite: whose it is, nobody can tell
    unowned.mkdir()
    other = tmp_path / "unrelated"
    other.mkdir()
    removed = remove_stale_snapshots(tmp_path)
    assert sorted(removed) == sorted([orphaned, reused_pid])
    assert not orphaned.exists() and not reused_pid.exists()
    assert mine.is_dir() and unowned.is_dir() and other.is_dir()
