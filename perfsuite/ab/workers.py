"""The controller's end of the A/B workers: start one, talk to it, notice it dying or hanging, stop it.

A worker (``worker_main.py``) is a child process with the same Python; it
answers one message at a time. Every request here waits for its answer with
a time limit: a worker that exits is reported with its exit code and the
tail of its stderr, one that does not answer in time is killed and reported
as hung, and one that raised answers ``Failed`` and stays usable. Each of
these is a ``WorkerError`` that names the side, so a perf test can fail with
it while the session goes on (``WorkerPair`` starts a dead side again at its
next use).
"""

from __future__ import annotations

import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsuite.ab import wire
from perfsuite.adapters.registry import EngineSpec

WORKER_SCRIPT = Path(__file__).with_name("worker_main.py")
STDERR_TAIL_CHARS = 3000
SHUTDOWN_SECONDS = 5.0
START_SECONDS = 120.0  # importing torch and transformers on a cold 2-core VM takes tens of seconds


class WorkerError(RuntimeError):
    """A worker died, hung, or failed to do what it was asked."""


@dataclass(frozen=True, slots=True)
class Side:
    """One side of an A/B comparison."""

    label: str  # "A" (the reference) or "B" (the current tree)
    description: str  # "REF origin/main (3f2a9c1)", "the current tree"
    tree: Path
    number: int | None = None  # which of the side's workers, when it has several
    perfsuite_from: Path | None = None  # where its perfsuite must come from; None: its tree

    @property
    def perfsuite_home(self) -> Path:
        return (self.perfsuite_from or self.tree).resolve()

    def __str__(self) -> str:
        number = "" if self.number is None else f"#{self.number}"
        return f"{self.label}{number}, {self.description}"


class Worker:
    """One running worker process."""

    def __init__(self, side: Side, python: str = sys.executable, env: dict[str, str] | None = None) -> None:
        self.side = side
        self._stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")  # noqa: SIM115 (closed by close())
        self._process = subprocess.Popen(
            [python, str(WORKER_SCRIPT), "--tree", str(side.tree)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=side.tree,
            env=env,
            text=True,
            encoding="utf-8",
        )
        assert self._process.stdin is not None and self._process.stdout is not None  # both are pipes
        self._stdin, self._stdout = self._process.stdin, self._process.stdout
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_lines, name=f"perfsuite-worker-{side.label}", daemon=True).start()
        try:
            self.hello: wire.Hello = self._expect(wire.Hello, START_SECONDS, "start")
            self._check_tree()
        except BaseException:  # Ctrl-C and SIGTERM too: nobody else holds this worker yet
            self.close()  # one that failed to start (its tree did not import, or not from the tree) is reaped too
            raise

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def request(self, message: Any, answer: type, timeout: float, what: str) -> Any:
        """Send ``message`` and wait up to ``timeout`` seconds for its ``answer``."""
        if not self.alive:
            raise self._died(what)
        try:
            wire.write_message(self._stdin, message)
        except (BrokenPipeError, OSError):
            raise self._died(what) from None
        return self._expect(answer, timeout, what)

    def close(self) -> None:
        """Ask the worker to stop; kill it if it does not within a few seconds. Never leaves it running."""
        if self.alive:
            try:
                wire.write_message(self._stdin, wire.Shutdown())
                self._stdin.close()
            except (BrokenPipeError, OSError, ValueError):
                pass
            try:
                self._process.wait(SHUTDOWN_SECONDS)
            except subprocess.TimeoutExpired:
                self.kill()
        self._process.wait()
        self._stderr.close()

    def kill(self) -> None:
        self._process.kill()
        self._process.wait()

    def stderr_tail(self) -> str:
        try:
            self._stderr.flush()
            self._stderr.seek(0)
            text = self._stderr.read()
        except (OSError, ValueError):
            return ""
        return text[-STDERR_TAIL_CHARS:].strip()

    def _read_lines(self) -> None:
        for line in self._stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _expect(self, answer: type, timeout: float, what: str) -> Any:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise WorkerError(
                f"worker {self.side} did not answer {what} within {timeout:g} s and was killed; "
                f"raise --perf-worker-timeout if a run can take longer{self._tail()}"
            ) from None
        if line is None:
            raise self._died(what)
        try:
            message = wire.loads_message(line)
        except wire.WireError as error:
            raise WorkerError(f"worker {self.side} answered {what} with what perfsuite cannot read: {error}") from None
        if isinstance(message, wire.Failed):
            traceback = f"\n{message.traceback}" if message.traceback else ""
            failed = f"{message.error_type}: {message.message}{traceback}"
            raise WorkerError(f"worker {self.side} failed to {what}: {failed}")
        if not isinstance(message, answer):
            raise WorkerError(
                f"worker {self.side} answered {what} with {type(message).__name__}, not {answer.__name__}"
            )
        return message

    def _died(self, what: str) -> WorkerError:
        try:
            code = self._process.wait(SHUTDOWN_SECONDS)
        except subprocess.TimeoutExpired:
            code = None
        return WorkerError(f"worker {self.side} died (exit code {code}) during {what}{self._tail()}")

    def _tail(self) -> str:
        tail = self.stderr_tail()
        return f"; its stderr ends:\n{tail}" if tail else ""

    def _check_tree(self) -> None:
        imported = Path(self.hello.perfsuite_file)
        if self.side.perfsuite_home in imported.parents:
            return
        if self.side.perfsuite_from is not None:
            raise WorkerError(
                f"worker {self.side} imported perfsuite from {imported}, not the installed one the session runs "
                f"({self.side.perfsuite_from}): its tree holds a perfsuite/ of its own; remove it or run from it"
            )
        raise WorkerError(
            f"worker {self.side} imported perfsuite from {imported}, not from its tree {self.side.tree}: "
            "something ahead of sys.path (a .pth file, PYTHONPATH) shadows the tree"
        )


def engine_id(spec: EngineSpec) -> str:
    """The name a worker keeps ``spec``'s engine under: its name and knobs, the later ones only when set."""
    config = spec.config
    knobs: tuple[object, ...] = (
        config.batch_size,
        config.max_seq_len,
        config.prefill_batch_size,
        config.max_num_batched_tokens,
    )
    if config.num_kv_blocks is not None or config.kv_block_size is not None:
        knobs += (config.num_kv_blocks,)
    if config.kv_block_size is not None:
        knobs += (f"block={config.kv_block_size}",)
    return f"{spec.name}:" + ",".join(map(str, knobs))


def build_message(spec: EngineSpec) -> wire.Build:
    """The ``Build`` of ``spec``: its config without the knobs an older tree lacks while they are unset."""
    return wire.Build(engine_id(spec), spec.name, spec.config.identity())


class SideRunner:
    """One side: its worker, started again after a death, with the model loaded and engines built on demand."""

    def __init__(self, side: Side, load: wire.Load, timeout: float, start: Callable[[Side], Worker] = Worker) -> None:
        self.side = side
        self._load = load
        self._timeout = timeout
        self._start = start
        self._worker: Worker | None = None
        self._built: dict[str, wire.Built] = {}
        self._threads: int | None = None  # None: as the worker set itself up at Load
        self.loaded: wire.Loaded | None = None

    def worker(self) -> Worker:
        if self._worker is None or not self._worker.alive:
            return self._restart()
        return self._worker

    def tokenize(self, text: str) -> tuple[int, ...]:
        return self.worker().request(wire.Tokenize(text), wire.Tokens, self._timeout, "tokenize").token_ids

    def build(self, spec: EngineSpec) -> wire.Built:
        worker = self.worker()
        key = engine_id(spec)
        if key not in self._built:
            self._built[key] = worker.request(build_message(spec), wire.Built, self._timeout, f"build {spec.name}")
        return self._built[key]

    def loaded_model(self) -> wire.Loaded:
        """What its worker (started now if it is not running) loaded."""
        self.worker()
        assert self.loaded is not None, "a worker starts by loading the model"
        return self.loaded

    def set_threads(self, num_threads: int) -> int:
        """Its worker's intra-op threads from now on (a worker started again gets them again); what it reports."""
        self._threads = num_threads
        return self._send_threads(self.worker())

    @property
    def pid(self) -> int | None:
        """The running worker's process id; None before it starts (or for a stand-in without one)."""
        return None if self._worker is None else getattr(self._worker, "pid", None)

    def run(self, spec: EngineSpec, requests: tuple[Any, ...], max_concurrency: int | None) -> Any:
        self.build(spec)
        message = wire.Run(engine_id(spec), requests, max_concurrency)
        return self.worker().request(message, wire.RunDone, self._timeout, f"run {spec.name}").result

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def _restart(self) -> Worker:
        if self._worker is not None:
            self._worker.close()
        self._worker, self._built = None, {}
        worker = self._start(self.side)
        try:
            self.loaded = worker.request(self._load, wire.Loaded, max(self._timeout, START_SECONDS), "load the model")
            if self._threads is not None:
                self._send_threads(worker)
        except BaseException:  # Ctrl-C and SIGTERM too: nobody else holds this worker yet
            worker.close()
            raise
        self._worker = worker
        return worker

    def _send_threads(self, worker: Worker) -> int:
        threads = self._threads
        assert threads is not None, "set_threads chose them"
        message = wire.SetThreads(threads)
        return worker.request(message, wire.ThreadsSet, self._timeout, f"set {threads} threads").num_threads
