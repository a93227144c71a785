"""Baselines on disk: one JSON file per test, under an environment fingerprint.

    baselines/<fingerprint>/<test file>__<test name>.json

A baseline is compared only with a run from the same fingerprint (device,
torch and transformers versions, dtype, model, CPU model and thread count):
numbers from another machine say nothing about this one. Writes are atomic
(a temporary file in the same directory, then ``os.replace``), so a crash
never leaves a half-written baseline.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1


class BaselineError(RuntimeError):
    """A baseline file that cannot be used; the message names the file and the fix."""


@dataclass(frozen=True, slots=True)
class Environment:
    """What a measurement depends on besides the code."""

    device_name: str
    torch_version: str
    transformers_version: str
    dtype: str
    model: str
    cpu_model: str
    num_threads: int
    cuda_version: str | None = None
    driver_version: str | None = None

    def fingerprint(self) -> str:
        """A readable directory name, with a short hash of every field for uniqueness."""
        readable = "-".join(
            _slug(part)
            for part in (self.device_name, self.model, self.dtype, f"torch{self.torch_version}", f"t{self.num_threads}")
        )
        digest = hashlib.sha256(json.dumps(dataclasses.asdict(self), sort_keys=True).encode()).hexdigest()[:10]
        return f"{readable}-{digest}"


@dataclass(frozen=True, slots=True)
class Baseline:
    test_id: str
    environment: Environment
    commit: str | None
    created_at: str
    samples: dict[str, tuple[float, ...]]  # metric -> one value per repeat
    counters: dict[str, int] = field(default_factory=dict)
    parameters: dict[str, Any] = field(default_factory=dict)  # the six sizing parameters
    request_samples: dict[str, tuple[float, ...]] = field(default_factory=dict)  # per request, for plots
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["samples"] = {k: list(v) for k, v in self.samples.items()}
        data["request_samples"] = {k: list(v) for k, v in self.request_samples.items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Baseline:
        return cls(
            test_id=data["test_id"],
            environment=Environment(**data["environment"]),
            commit=data.get("commit"),
            created_at=data["created_at"],
            samples={k: tuple(float(x) for x in v) for k, v in data["samples"].items()},
            counters={k: int(v) for k, v in data.get("counters", {}).items()},
            parameters=dict(data.get("parameters", {})),
            request_samples={k: tuple(float(x) for x in v) for k, v in data.get("request_samples", {}).items()},
            schema_version=data["schema_version"],
        )


class BaselineStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path_for(self, test_id: str, environment: Environment) -> Path:
        return self.root / environment.fingerprint() / f"{_file_name(test_id)}.json"

    def load(self, test_id: str, environment: Environment) -> Baseline | None:
        """This environment's baseline for ``test_id``, or None when there is none."""
        path = self.path_for(test_id, environment)
        if not path.exists():
            return None
        return read_baseline(path)

    def other_fingerprints(self, test_id: str, environment: Environment) -> list[str]:
        """Fingerprints that have a baseline for ``test_id`` but are not this one."""
        if not self.root.is_dir():
            return []
        name = f"{_file_name(test_id)}.json"
        mine = environment.fingerprint()
        return sorted(d.name for d in self.root.iterdir() if d.is_dir() and d.name != mine and (d / name).exists())

    def save(self, baseline: Baseline) -> Path:
        path = self.path_for(baseline.test_id, baseline.environment)
        write_json_atomic(path, baseline.to_json())
        return path


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
    try:
        return Baseline.from_json(data)
    except (KeyError, TypeError, ValueError) as error:
        raise BaselineError(
            f"baseline {path} is missing or has a malformed field ({error!r}); "
            "delete it or re-create it with --perf-save-baseline"
        ) from error


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that readers see the old file or the new one, never a mix."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """A temporary file in the same directory, flushed to disk, then ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "unknown"


def _file_name(test_id: str) -> str:
    """``tests/perf/test_x.py::test_y[a-b]`` -> ``test_x.py__test_y[a-b]``, safe on every filesystem."""
    path, _, name = test_id.rpartition("::")
    base = Path(path).name if path else ""
    return re.sub(r"[^A-Za-z0-9._\[\]=+-]+", "_", f"{base}__{name}" if base else name)
