"""Servers of the peers tier: started on 127.0.0.1, waited for, and always taken down.

Each server runs in its own process group with its output in a log file; a
server that exits or never answers its health check fails the test with the
log's tail. Nothing here reaches beyond loopback: the servers get
``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE`` and the health check uses no
proxy.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEERS_VENV = Path(os.environ.get("PERFSUITE_PEERS_VENV", ROOT / ".venv-peers"))
MAIN_VENV = Path(os.environ.get("PERFSUITE_MAIN_VENV", ROOT / ".venv"))
LOG_TAIL_CHARS = 6000
STOP_TIMEOUT_S = 30.0

OFFLINE_ENVIRONMENT = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}

_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True, slots=True)
class ServerCommand:
    """How to start one server and how to tell that it is ready."""

    name: str
    argv: tuple[str, ...]
    port: int
    startup_timeout_s: float
    health_path: str = "/health"
    extra_environment: tuple[tuple[str, str], ...] = ()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def environment(self) -> dict[str, str]:
        return {**os.environ, **OFFLINE_ENVIRONMENT, **dict(self.extra_environment)}


class ServerFailed(RuntimeError):
    """The server exited or never became healthy; the message carries its log's tail."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log_tail(log_path: Path, num_chars: int = LOG_TAIL_CHARS) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except OSError as error:
        return f"(no log: {error})"
    return text[-num_chars:]


def is_healthy(url: str) -> bool:
    try:
        with _no_proxy.open(url, timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_until_healthy(command: ServerCommand, process: subprocess.Popen, log_path: Path) -> float:
    """Seconds until ``command``'s health check answered 200; raises ``ServerFailed`` otherwise."""
    started = time.monotonic()
    while time.monotonic() - started < command.startup_timeout_s:
        if process.poll() is not None:
            raise ServerFailed(
                f"{command.name} exited with status {process.returncode} before it was healthy; "
                f"its log ({log_path}) ends:\n{log_tail(log_path)}"
            )
        if is_healthy(command.url + command.health_path):
            return time.monotonic() - started
        time.sleep(1.0)
    raise ServerFailed(
        f"{command.name} did not answer {command.health_path} within {command.startup_timeout_s:.0f} s; "
        f"its log ({log_path}) ends:\n{log_tail(log_path)}"
    )


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server's whole process group, SIGKILL after ``STOP_TIMEOUT_S``."""
    for sig, timeout in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, STOP_TIMEOUT_S)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=timeout)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # children the server left behind in its group


@contextlib.contextmanager
def running_server(command: ServerCommand, log_path: Path) -> Iterator[str]:
    """The base URL of ``command``'s server once healthy; the server is stopped on exit, whatever happened."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command.argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=command.environment(),
            cwd=ROOT,
            start_new_session=True,
        )
    try:
        seconds = wait_until_healthy(command, process, log_path)
        print(f"{command.name} healthy at {command.url} after {seconds:.0f} s (log: {log_path})")
        yield command.url
    finally:
        stop(process)


def python_of(venv: Path) -> Path | None:
    python = venv / "bin" / "python"
    return python if python.exists() else None


def can_import(python: Path, module: str) -> bool:
    """Whether ``python`` finds ``module`` (without importing it: vLLM takes seconds to import)."""
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0


def run_logged(
    argv: Sequence[str],
    log_path: Path,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    unset: Sequence[str] = (),
) -> subprocess.CompletedProcess:
    """Run ``argv`` to completion with its output in ``log_path`` (and returned), under ``timeout_s``.

    ``env`` adds to the offline environment and ``unset`` removes variables from it. It runs in
    its own process group, so that workers it spawned go with it when it times out.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    environment = {**os.environ, **OFFLINE_ENVIRONMENT, **(env or {})}
    for name in unset:
        environment.pop(name, None)
    argv = [str(arg) for arg in argv]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=environment, cwd=ROOT,
            start_new_session=True,
        )
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ServerFailed(
            f"{' '.join(argv[:4])} ... did not finish within {timeout_s:.0f} s; its log ({log_path}) ends:\n"
            f"{log_tail(log_path)}"
        ) from None
    finally:
        stop(process)
    return subprocess.CompletedProcess(argv, process.returncode, log_path.read_text(errors="replace"))


def incomplete_tests(results: dict, num_requests: int) -> list[str]:
    """The tests of a results.json whose runs lost a request or returned fewer tokens than were asked for.

    ``completed`` and ``total_output_tokens`` add up over the repeats that ran (fewer than planned
    when the busy-machine check stopped a test early: one sample per repeat);
    ``parameters.output_length`` is the mean number of new tokens asked for, so asked = mean x requests x repeats.
    """
    problems = []
    for test in results["tests"]:
        repeats = repeats_run(test)
        asked = round(test["measurement"]["parameters"]["output_length"] * num_requests * repeats)
        if repeats == 0 or test["completed"] != num_requests * repeats or test["total_output_tokens"] != asked:
            problems.append(
                f"{test['test_id']}: {test['completed']} of {num_requests * repeats} requests completed "
                f"over {repeats} repeats, {test['total_output_tokens']} of {asked} tokens"
            )
    return problems


def repeats_run(test: dict) -> int:
    """How many timed repeats a results.json test holds: one sample per repeat of each metric."""
    return len(test["measurement"]["samples"]["output_throughput"])

