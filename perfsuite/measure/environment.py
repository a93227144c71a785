"""What a measurement ran on: the fingerprint that baselines are stored under.

This machine's (``capture_environment``) for the engines that run in this
process; the server's (``server_environment``) for an engine served by
another process, whose speed owes nothing to this machine's libraries.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import reprlib
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, get_type_hints

from perfsuite.host import cpu_model

SERVER_KIND = "server"  # ServerEnvironment.kind


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
            slug(part)
            for part in (self.device_name, self.model, self.dtype, f"torch{self.torch_version}", f"t{self.num_threads}")
        )
        digest = hashlib.sha256(json.dumps(dataclasses.asdict(self), sort_keys=True).encode()).hexdigest()[:10]
        return f"{readable}-{digest}"


@dataclass(frozen=True, slots=True)
class ServerEnvironment:
    """What a measurement of a server in another process depends on: that server, not the client.

    The tokens a remote server computes owe nothing to the client's torch,
    dtype or CPU, so its results are stored under what the server says it
    serves (``GET /v1/models``: the model id and its ``max_model_len``, and
    who serves it) and under a label the user gives (``--perf-server-label``,
    e.g. ``vllm-0.32-cpu``): the server's software, version and machine,
    which no endpoint reports.
    """

    served_model: str
    max_model_len: int | None = None
    label: str | None = None
    owned_by: str | None = None
    kind: str = SERVER_KIND  # tells it from an ``Environment`` in stored JSON

    def fingerprint(self) -> str:
        length = f"len{self.max_model_len}" if self.max_model_len is not None else "len-unknown"
        readable = "-".join(slug(part) for part in ("server", self.label or "unlabelled", self.served_model, length))
        digest = hashlib.sha256(json.dumps(dataclasses.asdict(self), sort_keys=True).encode()).hexdigest()[:10]
        return f"{readable}-{digest}"


def environment_from_json(data: Any) -> Environment | ServerEnvironment:
    """The environment a baseline or result was stored under: this machine's, or a remote server's.

    ValueError saying what is wrong (``environment_problem``) when ``data`` is not one.
    """
    problem = environment_problem(data)
    if problem is not None:
        raise ValueError(problem)
    return _environment_class(data)(**data)


def environment_problem(data: Any) -> str | None:
    """What makes stored ``data`` no environment, described with its field and value; else None.

    The readers of baselines and results.json add the file and the fix.
    """
    if not isinstance(data, dict):
        return f"environment is {reprlib.repr(data)}, not an object naming the machine or the server"
    cls = _environment_class(data)
    types = get_type_hints(cls)
    unknown = sorted(set(data) - set(types))
    if unknown:
        return f"environment has {unknown[0]!r}, which this perfsuite does not know"
    for field in dataclasses.fields(cls):
        if field.name not in data:
            if field.default is dataclasses.MISSING:
                return f"environment lacks {field.name!r}"
            continue
        value, expected = data[field.name], types[field.name]
        if isinstance(value, bool) or not isinstance(value, expected):
            shown = getattr(expected, "__name__", str(expected))  # int, str, or "str | None"
            return f"environment[{field.name!r}] is {reprlib.repr(value)}, not {shown}"
    return None


def _environment_class(data: dict[str, Any]) -> type[Environment] | type[ServerEnvironment]:
    return ServerEnvironment if data.get("kind") == SERVER_KIND else Environment


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "unknown"


def capture_environment(model: str, dtype: str, device: str, num_threads: int | None = None) -> Environment:
    """This machine's environment for ``model`` in ``dtype`` on ``device``.

    ``num_threads``: the intra-op threads the measurement will run with, where it
    is known before torch is set up (default: torch's count now).
    """
    import torch
    import transformers

    is_cuda = device.startswith("cuda")
    return Environment(
        device_name=torch.cuda.get_device_name(device) if is_cuda else "cpu",
        torch_version=torch.__version__,
        transformers_version=transformers.__version__,
        dtype=dtype,
        model=model,
        cpu_model=cpu_model(),
        num_threads=num_threads if num_threads is not None else torch.get_num_threads(),
        cuda_version=torch.version.cuda if is_cuda else None,
        driver_version=_nvidia_driver() if is_cuda else None,
    )


def server_environment(engine: object, label: str | None) -> ServerEnvironment:
    """The identity of the server behind an engine that runs in another process.

    From the engine's ``served_model`` (``perfsuite.adapters.server_info.ServedModel``,
    what ``GET /v1/models`` said); an engine that does not say is known by its name.
    """
    served = getattr(engine, "served_model", None)
    if served is None:
        return ServerEnvironment(served_model=getattr(engine, "name", "unknown"), label=label)
    return served_model_environment(served, label)


class ServedModelInfo(Protocol):
    """What a server environment reads of ``perfsuite.adapters.server_info.ServedModel`` (measure sits below adapters)."""

    @property
    def model_id(self) -> str: ...
    @property
    def max_model_len(self) -> int | None: ...
    @property
    def owned_by(self) -> str | None: ...


def served_model_environment(served: ServedModelInfo, label: str | None) -> ServerEnvironment:
    """The identity of a server from what its ``/v1/models`` said (a ``ServedModel``): client shards report it."""
    return ServerEnvironment(
        served_model=served.model_id, max_model_len=served.max_model_len, label=label, owned_by=served.owned_by
    )


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def git_commit(cwd: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip() or None
