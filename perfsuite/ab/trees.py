"""The two trees of ``--perf-against REF``: the current one, and a snapshot of REF.

REF is a git ref of the repository the pytest rootdir lies in (``HEAD``,
``origin/main``, a tag, a commit), or a path to another checkout of the
project. A ref is checked out with ``git archive`` into a temporary
directory, not with ``git worktree add``: the snapshot leaves nothing
behind in the repository (no ``.git/worktrees`` entry for a killed session
to leave stale) and works in a shallow clone. Either way the tree a worker
imports from is the matching folder of the snapshot: a project in a
sub-folder of its repository finds its sub-folder there.

Two kinds of project use it. In perfsuite's own repository both trees hold
``perfsuite/`` and each worker imports perfsuite from its tree. In a project
that only installs perfsuite (an engine of its own, registered by entry
point), neither tree holds it: both workers import the installed perfsuite,
and the trees differ only in the project's own code, which each worker
imports from its tree. A REF without ``perfsuite/`` in perfsuite's own
repository is neither, and is refused. So is one older than ``--perf-against``
itself: the current tree's worker drives REF's engines through the modules
they have had since ``OLDEST_SUPPORTED``, and a tree without the worker's
module (``WORKER_MODULE``) predates them.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from perfsuite.ab.snapshots import new_snapshot

WORKER_MODULE = Path("ab", "worker_main.py")  # under perfsuite/: a tree has it from OLDEST_SUPPORTED on
OLDEST_SUPPORTED = "14782f4"  # the commit that added --perf-against (and WORKER_MODULE); a test checks both


class ReferenceError(ValueError):
    """REF names no commit or checkout, or its tree cannot be made."""


@dataclass(frozen=True, slots=True)
class Trees:
    """The current tree (side B) and the reference's (side A), and what REF resolved to."""

    ref: str  # as the user gave it
    commit: str | None  # the reference's commit; None for a checkout that is not a git repository
    current: Path
    reference: Path
    current_commit: str | None
    snapshot: Path | None  # the temporary directory to remove at the end; None for a user's checkout
    perfsuite_in_trees: bool = True  # False: a project that installs perfsuite; both sides import that one

    @property
    def reference_label(self) -> str:
        return f"{self.ref} ({self.commit[:12]})" if self.commit else self.ref

    def remove(self) -> None:
        if self.snapshot is not None:
            shutil.rmtree(self.snapshot, ignore_errors=True)


def prepare_trees(ref: str, rootdir: Path, invocation_dir: Path) -> Trees:
    """Resolve REF against the repository around ``rootdir`` and lay out its tree.

    The current tree is the rootdir; the reference's is the same folder of REF.
    """
    rootdir = rootdir.resolve()
    toplevel = _git(rootdir, "rev-parse", "--show-toplevel")
    current_commit = _git(rootdir, "rev-parse", "HEAD") if toplevel else None
    as_path = (invocation_dir / ref).expanduser().resolve()
    if _looks_like_path(ref) or (as_path.is_dir() and not _commit_of(rootdir, ref)):
        return _checkout_tree(ref, as_path, rootdir, current_commit)
    if not toplevel:
        raise ReferenceError(
            f"--perf-against {ref}: {rootdir} is not in a git repository, so {ref!r} names no commit; "
            "pass a path to another checkout instead"
        )
    commit = _commit_of(rootdir, ref)
    if commit is None:
        raise ReferenceError(
            f"--perf-against {ref}: not a commit of the repository at {toplevel}; check the name "
            f"(git log {ref}), fetch it first (git fetch origin main), or pass a path to a checkout"
        )
    snapshot = new_snapshot(commit)
    try:
        extract_commit(Path(toplevel), commit, snapshot)
    except BaseException:  # Ctrl-C and SIGTERM too: the session never learns of this snapshot
        shutil.rmtree(snapshot, ignore_errors=True)
        raise
    in_trees = holds_perfsuite(rootdir)
    try:
        folder = snapshot / rootdir.relative_to(Path(toplevel).resolve())
        reference = _reference_folder(ref, commit, snapshot, folder, in_trees)
    except ReferenceError:
        shutil.rmtree(snapshot, ignore_errors=True)
        raise
    return Trees(ref, commit, rootdir, reference, current_commit, snapshot, perfsuite_in_trees=in_trees)


def _reference_folder(ref: str, commit: str, snapshot: Path, reference: Path, in_trees: bool) -> Path:
    """``reference`` (the rootdir's folder in the snapshot of ``commit``) if a worker can drive it.

    ``in_trees``: the current tree holds perfsuite, so the reference must hold one new enough for the worker.
    """
    folder = reference.relative_to(snapshot)
    if not reference.is_dir():
        raise ReferenceError(f"--perf-against {ref}: {commit[:12]} has no {folder}/ folder")
    if in_trees and not holds_perfsuite(reference):
        raise ReferenceError(
            f"--perf-against {ref}: {commit[:12]} has no perfsuite/ package in {folder}/ (nor in its src/); "
            "give a commit of perfsuite"
        )
    if in_trees and not supports_worker(reference):
        raise ReferenceError(f"--perf-against {ref}: {commit[:12]} {_PREDATES}; give {OLDEST_SUPPORTED} or newer")
    return reference


def holds_perfsuite(tree: Path) -> bool:
    """Whether a worker over ``tree`` would import perfsuite from it (it puts ``tree/src`` and ``tree`` first)."""
    return any((folder / "perfsuite" / "__init__.py").is_file() for folder in (tree, tree / "src"))


def supports_worker(tree: Path) -> bool:
    """Whether the perfsuite a worker over ``tree`` imports (``tree``'s, else ``tree/src``'s: ``tree`` is first on its
    path) is one the current worker can drive: a commit from ``OLDEST_SUPPORTED`` on."""
    package = tree / "perfsuite"
    if not (package / "__init__.py").is_file():
        package = tree / "src" / "perfsuite"
    return (package / WORKER_MODULE).is_file()


_PREDATES = (
    f"predates --perf-against (its perfsuite/ has no {WORKER_MODULE.as_posix()}), so this perfsuite's worker "
    f"cannot drive its engines; the oldest commit it can measure is {OLDEST_SUPPORTED}"
)


def _checkout_tree(ref: str, path: Path, current: Path, current_commit: str | None) -> Trees:
    if not path.is_dir():
        raise ReferenceError(f"--perf-against {ref}: no such directory ({path}); give a git ref or a checkout's path")
    if path == current:
        raise ReferenceError(f"--perf-against {ref}: that is the current tree itself; give another checkout or a ref")
    in_trees = holds_perfsuite(current)
    if in_trees and not holds_perfsuite(path):
        raise ReferenceError(
            f"--perf-against {ref}: {path} is not a perfsuite checkout (no perfsuite/ package in it or its src/); "
            "give a git ref or the path of another perfsuite checkout"
        )
    if in_trees and not supports_worker(path):
        raise ReferenceError(f"--perf-against {ref}: {path} {_PREDATES}; check out {OLDEST_SUPPORTED} or newer there")
    if not in_trees and not any(path.iterdir()):
        raise ReferenceError(f"--perf-against {ref}: {path} is empty; give a git ref or another checkout's path")
    toplevel = _git(path, "rev-parse", "--show-toplevel")
    commit = _git(path, "rev-parse", "HEAD") if toplevel else None
    return Trees(ref, commit, current, path, current_commit, None, perfsuite_in_trees=in_trees)


def names_a_reference(ref: str, rootdir: Path, invocation_dir: Path) -> bool:
    """Whether ``prepare_trees`` could resolve ``ref``: a checkout's folder, or a commit of the rootdir's repository."""
    as_path = (invocation_dir / ref).expanduser().resolve()
    if _looks_like_path(ref) or as_path.is_dir():
        return as_path.is_dir()
    return _commit_of(rootdir.resolve(), ref) is not None


def _looks_like_path(ref: str) -> bool:
    return ref.startswith((".", "/", "~"))


def _commit_of(repo: Path, ref: str) -> str | None:
    if ref.startswith("-"):
        return None  # never an option to git
    return _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")


def extract_commit(repo: Path, commit: str, into: Path) -> None:
    """The files of ``commit`` (any ref git understands) written into the existing folder ``into``."""
    archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit], capture_output=True)
    if archive.returncode != 0:
        stderr = archive.stderr.decode(errors="replace").strip()
        raise ReferenceError(f"git archive {commit[:12]} failed: {stderr}")
    with tempfile.TemporaryFile() as buffer:
        buffer.write(archive.stdout)
        buffer.seek(0)
        with tarfile.open(fileobj=buffer) as tar:
            tar.extractall(into, filter="data")


def _git(cwd: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None
