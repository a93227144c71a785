"""Baselines on disk: one JSON file per test, under an environment fingerprint.

    baselines/<fingerprint>/<test file path>/<test name>.json

The test id is a pytest nodeid, already relative to the rootdir (the shipped
suite's tests are known by their path inside the package instead:
``perfsuite.plugin.ids``), so ``tests/perf/test_x.py::test_y[a-b]`` is stored as
``baselines/<fingerprint>/tests/perf/test_x.py/test_y[a-b].json``: two test
files with the same name in different folders never share a baseline. Each
part of the name is percent-encoded (``urllib.parse.quote``) except letters,
digits and ``_.-~[]=+,``, so a ``/`` or ``::`` inside a parameter id (or
the ``::`` after a test class) stays inside one file name and every test id
has its own path. A name longer than ``MAX_NAME_LENGTH`` is cut and ends in
a hash of the whole name. Ids without ``::`` are one encoded file name.
Ids whose file part would leave the fingerprint directory (``..``, ``.``,
empty parts, absolute paths) raise ValueError.

A baseline is compared only with a run from the same fingerprint (device,
torch and transformers versions, dtype, model, CPU model and thread count):
numbers from another machine say nothing about this one. A test of a server
in another process (``openai-http``) is stored under the server's fingerprint
instead (``ServerEnvironment``: the served model, its maximum length, who
serves it and the user's ``--perf-server-label``), whatever client drove it. Every sample in a
baseline must be a finite number that its metric can measure (``perfsuite.judge.samples``: never
negative, and above 0 for throughput and the machine probe), every counter an integer >= 0, and the
environment an object of the fields above: ``read_baseline`` raises BaselineError naming the file and
the field otherwise, and ``BaselineStore.save`` refuses to write such a baseline.

Writes are atomic (a temporary file ``.<name>.pid<pid>.<random>.tmp`` in the
same directory, flushed, then ``os.replace`` and a flush of the directory), so
a crash never leaves a half-written file. The file gets the mode a plain
``open(path, "w")`` would give, so a CI uploader running as another user can
read it. A temporary file that a killed writer left is removed by the first
write into the same directory once it is a minute old (ten minutes for one
that names no writer): a writer in another pid namespace (a container sharing
the directory) looks dead from here, and removing its file mid-write would fail
its rename. A directory that cannot be written raises
OutputError with a one-line message naming the file and the fix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import math
import os
import re
import tempfile
import time
import urllib.parse
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from perfsuite.engine.types import EngineCounters
from perfsuite.judge.run_config import RunConfiguration
from perfsuite.judge.samples import measurement_problem
from perfsuite.measure.environment import Environment, ServerEnvironment, environment_from_json, environment_problem
from perfsuite.measure.summaries import SizingParameters

SCHEMA_VERSION = 2  # 2: the run configuration is part of a baseline's identity
MAX_NAME_LENGTH = 200  # below the 255 bytes most filesystems allow, with room for ".json"

_SAFE_CHARACTERS = "[]=+,"  # quote() never encodes letters, digits and "_.-~" either
_TEMPORARY_PATTERN = ".*.tmp"
_WRITER_PID = re.compile(r"\.pid(\d{1,10})\.[^.]+\.tmp$")
# A writer in another pid namespace (a container sharing the directory) looks dead
# from here; its temporary file lives for milliseconds, so waiting a minute is safe.
_DEAD_WRITER_GRACE_SECONDS = 60
# Old-format leftovers name no writer; none takes ten minutes to write a JSON file.
_UNKNOWN_WRITER_STALE_SECONDS = 600
_FULL_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_ELSEWHERE = "choose another directory (--perf-report-dir / --perf-baseline-dir)"


class BaselineError(RuntimeError):
    """A baseline file that cannot be used; the message names the file and the fix."""


class OutputError(RuntimeError):
    """A file that cannot be written; the one-line message names the file and the fix."""


@dataclass(frozen=True, slots=True)
class Baseline:
    test_id: str
    environment: Environment | ServerEnvironment
    configuration: RunConfiguration  # what was measured: compared only with a run of the same
    commit: str | None
    created_at: str
    samples: dict[str, tuple[float, ...]]  # metric -> one value per repeat
    counters: EngineCounters = EngineCounters()
    parameters: SizingParameters | None = None  # the six sizing parameters
    slo: str | None = None  # the SLO its goodput counts (--perf-slo); stored among the parameters
    request_samples: dict[str, tuple[float, ...]] = field(default_factory=dict)  # per request, for plots
    schema_version: int = SCHEMA_VERSION
    unrecorded_counters: tuple[str, ...] = ()  # counters newer than the file: defaults, never compared

    def to_json(self) -> dict[str, Any]:
        parameters = dataclasses.asdict(self.parameters) if self.parameters else {}
        return {
            "test_id": self.test_id,
            "environment": dataclasses.asdict(self.environment),
            "configuration": self.configuration.to_json(),
            "commit": self.commit,
            "created_at": self.created_at,
            "samples": {k: list(v) for k, v in self.samples.items()},
            "counters": recorded_counters(self.counters, self.unrecorded_counters),
            "parameters": {**parameters, "slo": self.slo},
            "request_samples": {k: list(v) for k, v in self.request_samples.items()},
            "schema_version": self.schema_version,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Baseline:
        parameters = dict(data.get("parameters", {}))
        slo = parameters.pop("slo", None)
        counters, unrecorded = counters_from_json(data.get("counters", {}))
        return cls(
            test_id=data["test_id"],
            environment=environment_from_json(data["environment"]),
            configuration=RunConfiguration.from_json(data["configuration"]),
            commit=data.get("commit"),
            created_at=data["created_at"],
            samples={k: tuple(float(x) for x in v) for k, v in data["samples"].items()},
            counters=counters,
            parameters=SizingParameters(**parameters) if parameters else None,
            slo=slo,
            request_samples={k: tuple(float(x) for x in v) for k, v in data.get("request_samples", {}).items()},
            schema_version=data["schema_version"],
            unrecorded_counters=unrecorded,
        )


def counters_from_json(stored: Mapping[str, Any]) -> tuple[EngineCounters, tuple[str, ...]]:
    """Stored counters, and the names of those the file does not hold.

    A file written before a counter existed lacks it; the dataclass fills in
    its default (0), which is not a measurement: comparing it with a run that
    counts, say, preemptions would report a change no code made. So the names
    travel with the counters, and ``catalogue.exact_counter_changes`` leaves
    them out. A counter this perfsuite does not know (a newer file) is a
    TypeError, which the readers report as a malformed field.
    """
    counters = EngineCounters(**{name: int(value) for name, value in stored.items()})
    return counters, tuple(f.name for f in dataclasses.fields(EngineCounters) if f.name not in stored)


def recorded_counters(counters: EngineCounters, unrecorded: Collection[str] = ()) -> dict[str, int]:
    """The counters as stored: without the ``unrecorded`` ones, so a file read and written again still lacks them."""
    return {name: value for name, value in dataclasses.asdict(counters).items() if name not in unrecorded}


class BaselineStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path_for(self, test_id: str, environment: Environment | ServerEnvironment) -> Path:
        return self.root / environment.fingerprint() / baseline_relative_path(test_id)

    def load(self, test_id: str, environment: Environment | ServerEnvironment) -> Baseline | None:
        """This environment's baseline for ``test_id``, or None when there is none."""
        path = self.path_for(test_id, environment)
        if not path.exists():
            return None
        return read_baseline(path)

    def other_fingerprints(self, test_id: str, environment: Environment | ServerEnvironment) -> list[str]:
        """Fingerprints that have a baseline for ``test_id`` but are not this one."""
        if not self.root.is_dir():
            return []
        relative = baseline_relative_path(test_id)
        mine = environment.fingerprint()
        return sorted(d.name for d in self.root.iterdir() if d.is_dir() and d.name != mine and (d / relative).exists())

    def holds_fingerprint(self, fingerprint: str) -> bool:
        """Whether any baseline is stored under ``fingerprint`` (a test's own may still be missing)."""
        folder = self.root / fingerprint
        return folder.is_dir() and any(folder.rglob("*.json"))

    def save(self, baseline: Baseline) -> Path:
        """Write ``baseline``; BaselineError if it holds a value ``load`` would refuse."""
        path = self.path_for(baseline.test_id, baseline.environment)
        data = baseline.to_json()
        problem = measurement_problem(data)
        if problem is not None:
            raise BaselineError(
                f"cannot save baseline {path}: {problem}; a baseline must hold finite numbers "
                "that later runs can be compared with"
            )
        write_json_atomic(path, data)
        return path


def baseline_relative_path(test_id: str) -> Path:
    """Where ``test_id``'s baseline lies inside its fingerprint directory (see the module docstring)."""
    if not test_id:
        raise ValueError("a baseline needs a non-empty test id")
    file_part, separator, name = test_id.partition("::")
    if not separator:
        return Path(_file_name(test_id))
    _refuse_escaping_file_part(test_id, file_part)
    if not name:
        raise ValueError(f"test id {test_id!r} has no test name after '::'")
    return Path(*(_encode(part) for part in file_part.split("/")), _file_name(name))


def _refuse_escaping_file_part(test_id: str, file_part: str) -> None:
    """A nodeid is relative to the rootdir; anything else could write outside the baselines."""
    parts = file_part.split("/")
    if PurePosixPath(file_part).is_absolute() or PureWindowsPath(file_part).drive:
        raise ValueError(f"test id {test_id!r} has an absolute path; baselines need a rootdir-relative nodeid")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"test id {test_id!r} has an empty, '.' or '..' path part; it would leave the baseline dir")


def _file_name(name: str) -> str:
    encoded = _encode(name)
    if len(encoded) > MAX_NAME_LENGTH:
        digest = hashlib.sha256(encoded.encode()).hexdigest()[:16]
        encoded = f"{encoded[: MAX_NAME_LENGTH - len(digest) - 1]}~{digest}"
    return f"{encoded}.json"


def _encode(part: str) -> str:
    """Reversible, so distinct parts stay distinct; '/', ':' and '%' are always encoded."""
    return urllib.parse.quote(part, safe=_SAFE_CHARACTERS)


def read_baseline(path: Path) -> Baseline:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BaselineError(
            f"baseline {path} is corrupt ({error}); delete it or re-create it with --perf-save-baseline"
        ) from error
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != SCHEMA_VERSION:
        raise BaselineError(
            f"baseline {path} has schema_version {version!r} but this perfsuite reads {SCHEMA_VERSION}; "
            "re-create it with --perf-save-baseline"
        )
    problem = measurement_problem(data) or (environment_problem(data["environment"]) if "environment" in data else None)
    if problem is not None:
        raise BaselineError(f"baseline {path}: {problem}; re-create it with --perf-save-baseline")
    try:
        return Baseline.from_json(data)
    except (KeyError, TypeError, ValueError) as error:
        raise BaselineError(
            f"baseline {path} is missing or has a malformed field ({error!r}); "
            "delete it or re-create it with --perf-save-baseline"
        ) from error


def write_json_atomic(path: Path, data: Any) -> None:
    """Write standard JSON so that readers see the old file or the new one, never a mix.

    Every JSON file perfsuite writes comes through here. JSON has no NaN or
    infinity (Python's ``json`` would write ``NaN``, which other readers
    refuse), so such a value raises OutputError naming where it lies and
    nothing is written: the code that made the document must leave the
    value out or write null.
    """
    try:
        text = json.dumps(data, indent=2, sort_keys=True, allow_nan=False)
    except ValueError:
        found = _first_non_finite(data)
        if found is None:
            raise
        where, value = found
        raise OutputError(
            f"cannot write {path}: {where} is {value!r}, which JSON cannot hold; perfsuite should have left it "
            "out or written null: please report this with the test that made it"
        ) from None
    write_text_atomic(path, text + "\n")


def _first_non_finite(data: Any, where: str = "") -> tuple[str, float] | None:
    """Where in ``data`` the first NaN or infinity lies (``['tests'][0]['change']``), and the value."""
    if isinstance(data, float) and not math.isfinite(data):
        return where or "the document", data
    children: Iterable[tuple[Any, Any]]
    if isinstance(data, Mapping):
        children = data.items()
    elif isinstance(data, (list, tuple)):
        children = enumerate(data)
    else:
        return None
    for key, child in children:
        found = _first_non_finite(child, f"{where}[{key!r}]")
        if found is not None:
            return found
    return None


def write_text_atomic(path: Path, text: str) -> None:
    """A temporary file in the same directory, flushed to disk, then ``os.replace``.

    Raises OutputError when the directory cannot be created or the file written.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporary_files(path.parent)
        _write_and_replace(path, text)
    except OSError as error:
        raise OutputError(cannot_write_message(path, error, _ELSEWHERE)) from error
    _fsync_directory(path.parent)


def _write_and_replace(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.pid{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.chmod(tmp, _new_file_mode())  # mkstemp makes it 0600 whatever the umask
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cannot_write_message(path: Path, error: OSError, instead: str) -> str:
    """One line: the file, why it cannot be written (in words, not the OS's errno), and the fix.

    The OS names whichever file it failed on (a temporary file, a parent it
    tried to create); the message names ``path``, the one the user chose.
    """
    directory = path.parent
    if error.errno in (errno.ENOTDIR, errno.EEXIST):  # EEXIST: mkdir found a file where a directory goes
        return f"cannot write {path}: {_file_in_the_way(path)} is not a directory; {instead}"
    if error.errno == errno.EISDIR:
        return f"cannot write {path}: {path} is a directory; {instead}"
    if error.errno == errno.EROFS:
        return f"cannot write {path}: {directory} is on a read-only file system; {instead}"
    if error.errno in _FULL_DISK_ERRNOS:
        fix = f"free space on the disk of {directory}"
    else:
        fix = f"make {directory} writable"
    reason = error.strerror or " ".join(str(error).split())  # one line, whatever the OS said
    return f"cannot write {path}: {reason}; {fix} or {instead}"


def _file_in_the_way(path: Path) -> Path:
    """The nearest existing ancestor of ``path``: a file where a directory should be."""
    for parent in path.parents:
        if parent.exists():
            return parent
    return path.parent


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable; some platforms cannot open or fsync a directory."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _new_file_mode() -> int:
    """What ``open(path, "w")`` would give: 0o666 less the umask."""
    return 0o666 & ~_current_umask()


def _current_umask() -> int:
    umask = _umask_from_proc()
    if umask is not None:
        return umask
    # os.umask can only be read by setting it; another thread creating a file meanwhile gets 0o077
    umask = os.umask(0o077)
    os.umask(umask)
    return umask


def _umask_from_proc() -> int | None:
    """Linux 4.7+ shows the umask in /proc, so reading it changes nothing."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _remove_stale_temporary_files(directory: Path) -> None:
    """Remove the temporary files of writers that were killed before ``os.replace``."""
    now = time.time()
    try:
        leftovers = list(directory.glob(_TEMPORARY_PATTERN))
    except OSError:
        return
    for leftover in leftovers:
        with contextlib.suppress(OSError):  # another writer may remove it first
            if _is_stale(leftover.name, now - leftover.stat().st_mtime):
                leftover.unlink()


def _is_stale(name: str, age_seconds: float) -> bool:
    pid = _writer_pid(name)
    if pid is None:
        return age_seconds > _UNKNOWN_WRITER_STALE_SECONDS
    # pytest-xdist workers write into the same directory at once: a live writer's file is never stale
    return age_seconds > _DEAD_WRITER_GRACE_SECONDS and not _is_alive(pid)


def _writer_pid(name: str) -> int | None:
    match = _WRITER_PID.search(name)
    pid = int(match[1]) if match else 0
    return pid if 0 < pid < 2**31 else None  # os.kill(0, ...) would mean our own process group


def _is_alive(pid: int) -> bool:
    if os.name != "posix":
        return True  # on Windows os.kill(pid, 0) sends CTRL_C_EVENT rather than checking
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: it exists but belongs to another user
    return True
