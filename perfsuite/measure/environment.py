"""What a measurement ran on: the fingerprint that baselines are stored under.

This machine's (``capture_environment``) for the engines that run in this
process; the server's (``server_environment``) for an engine served by
another process, whose speed owes nothing to this machine's libraries.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

from perfsuite.judge.baselines import Environment, ServerEnvironment


def capture_environment(model: str, dtype: str, device: str) -> Environment:
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
        num_threads=torch.get_num_threads(),
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
    return ServerEnvironment(
        served_model=served.model_id, max_model_len=served.max_model_len, label=label, owned_by=served.owned_by
    )


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
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
