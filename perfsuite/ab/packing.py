"""The two trees of an A/B comparison as tarballs, so they can travel to a cluster node that has neither.

``--perf-against REF --perf-ray ADDRESS`` runs both sides on a node of the
cluster, which holds no checkout of the project. The controller lays the
trees out as it does for a local comparison (``trees.prepare_trees``: REF's
snapshot through ``git archive``, or another checkout), packs each into a
gzipped tar in memory, and the node unpacks both into a temporary folder of
its own. What a tree holds:

- a folder inside a git work tree (the current tree, another checkout): the
  files git would see, tracked and untracked alike, but not those
  ``.gitignore`` ignores (a virtual environment, build outputs, ``reports/``)
  nor a tracked file deleted from the working tree: ``git ls-files -co
  --exclude-standard``;
- any other folder (REF's snapshot, which ``git archive`` filled): every file
  but the snapshot's owner record.

Neither travels with Python's byte-code caches (``__pycache__``): the node's
Python writes its own.

A symbolic link travels as a link when it points inside the tree; one that
points outside it (an absolute path of this machine, ``../``) would point
at nothing on the node, and tar's ``data`` filter refuses it there: it is left
out, and ``PackedTree.left_out`` names it so the session can say so.

Only the standard library: the node unpacks with the perfsuite it has installed.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from perfsuite.ab.snapshots import OWNER_FILE

SKIPPED_FOLDERS = frozenset({".git", "__pycache__"})


class PackingError(ValueError):
    """A tree that cannot be packed or unpacked; the message names the folder and what to do."""


@dataclass(frozen=True, slots=True)
class PackedTree:
    """One tree as a gzipped tar, with what it holds."""

    archive: bytes
    num_files: int
    left_out: tuple[str, ...] = ()  # links that point outside the tree (module docstring)


def tree_files(folder: Path) -> list[str]:
    """The files of ``folder`` that travel, as paths relative to it, sorted (module docstring)."""
    folder = folder.resolve()
    if not folder.is_dir():
        raise PackingError(f"{folder} is not a folder: give a git ref or a checkout's path")
    listed = _git_listed(folder)
    if listed is None:
        return sorted(_walked(folder))
    return sorted(
        path
        for path in listed
        if ((folder / path).is_file() or (folder / path).is_symlink()) and "__pycache__" not in path.split("/")
    )


def pack_tree(folder: Path) -> PackedTree:
    """``folder``'s files (``tree_files``) as a gzipped tar, in memory."""
    folder = folder.resolve()
    files: list[str] = []
    left_out: list[str] = []
    for path in tree_files(folder):
        (left_out if _links_outside(folder, path) else files).append(path)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in files:
            tar.add(folder / path, arcname=path, recursive=False)
    return PackedTree(buffer.getvalue(), len(files), tuple(left_out))


def _links_outside(folder: Path, path: str) -> bool:
    link = folder / path
    if not link.is_symlink():
        return False
    target = os.readlink(link)
    return os.path.isabs(target) or not (link.parent / target).resolve().is_relative_to(folder)


def unpack_tree(archive: bytes, into: Path) -> Path:
    """``archive`` (from ``pack_tree``) written into the folder ``into`` (made if missing); ``into``.

    Tar's ``data`` filter refuses what a tree of files never holds (an absolute
    path, a link out of the folder, a device), so a corrupt archive cannot write
    outside ``into``.
    """
    into.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            tar.extractall(into, filter="data")
    except (tarfile.TarError, OSError, EOFError) as error:
        message = f"cannot unpack a tree into {into}: {error}; the controller sends what pack_tree made"
        raise PackingError(message) from None
    return into


def _git_listed(folder: Path) -> list[str] | None:
    """What git sees of ``folder`` (tracked and untracked, not ignored); None when it is in no git work tree."""
    try:
        inside = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--is-inside-work-tree"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        return None
    listed = subprocess.run(
        ["git", "-C", str(folder), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        timeout=300,
    )
    if listed.returncode != 0:
        stderr = listed.stderr.decode(errors="replace").strip()
        raise PackingError(f"git ls-files in {folder} failed: {stderr}")
    return sorted({name for name in listed.stdout.decode().split("\0") if name})


def _walked(folder: Path) -> list[str]:
    found = []
    for directory, folders, files in os.walk(folder):
        folders[:] = [name for name in folders if name not in SKIPPED_FOLDERS]
        here = Path(directory).relative_to(folder)
        found += [(here / name).as_posix() for name in files if not (here == Path(".") and name == OWNER_FILE)]
    return found
