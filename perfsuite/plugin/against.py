"""``--perf-against REF``: the session's reference tree and its workers, and the fixtures' stand-ins for them.

In this mode no model is loaded in the pytest process: the current tree's
first worker (B) tokenizes the workloads and reports the model's limits, so
the machine holds one copy of the model per worker process, and
``--perf-against-workers`` (default 2) of those per side. An engine the
``perf_engine_factory`` fixture returns is a ``WorkerEngine``: a name and
knobs that both workers build the engine from; ``perf.measure`` runs it.
"""

from __future__ import annotations

import atexit
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from perfsuite.ab import wire
from perfsuite.ab.pair import ABRunner
from perfsuite.ab.snapshots import remove_stale_snapshots
from perfsuite.ab.trees import ReferenceError, Trees, prepare_trees
from perfsuite.ab.workers import WorkerError
from perfsuite.adapters.protocol import Backend, EngineConfig
from perfsuite.adapters.registry import EngineSpec
from perfsuite.judge.results import AgainstDescription

ORDER = "ABBA: repeats in pairs, A (the reference) first in even pairs, B (the current tree) first in odd ones"


ON_ONE_NODE = "both sides of each test on one Ray node (each result names it)"


def describe_order(workers_per_side: int, on_cluster: bool = False) -> str:
    if workers_per_side == 1:
        order = f"{ORDER}; one worker process a side"
    else:
        order = f"{ORDER}; pairs rotate two at a time over {workers_per_side} worker processes a side"
    return f"{order}; {ON_ONE_NODE}" if on_cluster else order


@dataclass(frozen=True, slots=True)
class Against:
    """The reference tree and the workers measuring it and the current tree."""

    trees: Trees
    runner: ABRunner | None  # None under --perf-ray: each node's actor runs both sides there (plugin.against_on_ray)
    restore_sigterm: Callable[[], None]  # undoes ``interrupt_on_sigterm``
    workers_per_side: int

    @property
    def label(self) -> str:
        return self.trees.reference_label

    def describe(self) -> AgainstDescription:
        order = describe_order(self.workers_per_side, on_cluster=self.runner is None)
        return AgainstDescription(self.trees.ref, self.trees.commit, self.trees.current_commit, order)

    def close(self) -> None:
        atexit.unregister(self.close)
        try:
            if self.runner is not None:
                self.runner.close()
        finally:
            self.trees.remove()
            self.restore_sigterm()


def start_against(
    ref: str, rootdir: Path, invocation_dir: Path, load: wire.Load, timeout: float, workers_per_side: int = 2
) -> Against:
    """Lay out REF's tree and start both sides' workers, each loading the model; a failure is a usage error naming REF.

    Snapshots left by sessions that were killed outright (SIGKILL) are removed
    first. From here on SIGTERM unwinds like Ctrl-C, and the snapshot is
    removed at exit should an interrupt escape pytest's hooks (one while the
    report is written skips ``pytest_unconfigure``).
    """
    remove_stale_snapshots()
    try:
        trees = prepare_trees(ref, rootdir, invocation_dir)
    except ReferenceError as error:
        raise pytest.UsageError(str(error)) from None
    runner = ABRunner(trees, load, timeout, workers_per_side=workers_per_side)
    against = Against(trees, runner, interrupt_on_sigterm(), workers_per_side)
    atexit.register(against.close)
    try:
        runner.start()
    except WorkerError as error:
        against.close()
        raise pytest.UsageError(f"--perf-against {ref}: {error}") from None
    except BaseException:  # interrupted while the models load: pytest has no Against to close yet
        against.close()
        raise
    return against


def interrupt_on_sigterm() -> Callable[[], None]:
    """Make SIGTERM raise KeyboardInterrupt, as Ctrl-C does; returns what puts its default action back.

    Only the default action (die on the spot) is replaced: a handler someone
    else set, or SIGTERM ignored, stays; off the main thread Python sets none.
    """
    on_main_thread = threading.current_thread() is threading.main_thread()
    if not on_main_thread or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return _leave_sigterm
    signal.signal(signal.SIGTERM, _raise_interrupt)
    return _restore_default_sigterm


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _restore_default_sigterm() -> None:
    if signal.getsignal(signal.SIGTERM) is _raise_interrupt:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _leave_sigterm() -> None:
    pass


def load_message(model: str, device: str, dtype: str, decode_mode: str, invocation_dir: Path) -> wire.Load:
    """What both workers load; a model given as a relative path is made absolute (a worker runs in its tree)."""
    as_path = invocation_dir / model
    return wire.Load(str(as_path.resolve()) if as_path.exists() else model, device, dtype, decode_mode)


def worker_backend(against: Against) -> Backend:
    """The current tree's model as the fixtures see it, with no runner: the workers hold the models."""
    runner = against.runner
    assert runner is not None, "the local A/B workers tokenize (under --perf-ray a node's actor does)"
    return Backend.held_elsewhere(runner.tokenize, runner.loaded)


@dataclass(frozen=True, slots=True)
class WorkerEngine:
    """An engine both workers build by name; ``perf.measure`` runs it on each side."""

    name: str
    config: EngineConfig
    greedy_equal = False  # checked by the correctness tests, not here
    runs_in_process = True
    resolves_follow_ups = True  # the engine each worker builds decides: a peer there refuses multi-turn itself

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @property
    def spec(self) -> EngineSpec:
        return EngineSpec(self.name, self.config)

    def run(self, requests, on_step=None, max_concurrency=None):
        raise RuntimeError(
            f"{self.name}: under --perf-against an engine runs in the two workers, not in the pytest process; "
            "pass it to perf.measure(engine, requests)"
        )
