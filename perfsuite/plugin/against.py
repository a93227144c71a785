"""``--perf-against REF``: the session's reference tree and its workers, and the fixtures' stand-ins for them.

In this mode no model is loaded in the pytest process: the current tree's
first worker (B) tokenizes the workloads and reports the model's limits, so
the machine holds one copy of the model per worker process, and
``--perf-against-workers`` (default 2) of those per side. An engine the
``perf_engine_factory`` fixture returns is a ``WorkerEngine``: a name and
knobs that both workers build the engine from; ``perf.measure`` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from perfsuite.ab import wire
from perfsuite.ab.pair import ABRunner
from perfsuite.ab.snapshots import remove_stale_snapshots
from perfsuite.ab.trees import ReferenceError, Trees, prepare_trees
from perfsuite.ab.workers import EngineSpec, WorkerError
from perfsuite.adapters.protocol import Backend, EngineConfig
from perfsuite.judge.results import AgainstDescription

ORDER = "ABBA: repeats in pairs, A (the reference) first in even pairs, B (the current tree) first in odd ones"


def describe_order(workers_per_side: int) -> str:
    if workers_per_side == 1:
        return f"{ORDER}; one worker process a side"
    return f"{ORDER}; pairs rotate two at a time over {workers_per_side} worker processes a side"


@dataclass(frozen=True, slots=True)
class Against:
    """The reference tree and the workers measuring it and the current tree."""

    trees: Trees
    runner: ABRunner

    @property
    def label(self) -> str:
        return self.trees.reference_label

    def describe(self) -> AgainstDescription:
        order = describe_order(self.runner.workers_per_side)
        return AgainstDescription(self.trees.ref, self.trees.commit, self.trees.current_commit, order)

    def close(self) -> None:
        try:
            self.runner.close()
        finally:
            self.trees.remove()


def start_against(
    ref: str, rootdir: Path, invocation_dir: Path, load: wire.Load, timeout: float, workers_per_side: int = 2
) -> Against:
    """Lay out REF's tree and start both sides' workers, each loading the model; a failure is a usage error naming REF.

    Snapshots left by sessions that were killed outright (SIGKILL) are removed first.
    """
    remove_stale_snapshots()
    try:
        trees = prepare_trees(ref, rootdir, invocation_dir)
    except ReferenceError as error:
        raise pytest.UsageError(str(error)) from None
    runner = ABRunner(trees, load, timeout, workers_per_side=workers_per_side)
    try:
        runner.start()
    except WorkerError as error:
        runner.close()
        trees.remove()
        raise pytest.UsageError(f"--perf-against {ref}: {error}") from None
    return Against(trees, runner)


def load_message(model: str, device: str, dtype: str, decode_mode: str, invocation_dir: Path) -> wire.Load:
    """What both workers load; a model given as a relative path is made absolute (a worker runs in its tree)."""
    as_path = invocation_dir / model
    return wire.Load(str(as_path.resolve()) if as_path.exists() else model, device, dtype, decode_mode)


def worker_backend(against: Against) -> Backend:
    """The current tree's model as the fixtures see it, with no runner: the workers hold the models."""
    loaded = against.runner.loaded
    return Backend(
        runner=None,
        tokenize=against.runner.tokenize,
        eos_token_id=loaded.eos_token_id,
        max_context=loaded.max_context,
        device=loaded.device,
        vocab_size=loaded.vocab_size,
        special_token_ids=loaded.special_token_ids,
    )


@dataclass(frozen=True, slots=True)
class WorkerEngine:
    """An engine both workers build by name; ``perf.measure`` runs it on each side."""

    name: str
    config: EngineConfig
    greedy_equal = False  # checked by the correctness tests, not here
    runs_in_process = True

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @property
    def spec(self) -> EngineSpec:
        config = self.config
        return EngineSpec(self.name, config.batch_size, config.max_seq_len, config.prefill_batch_size,
                          config.max_num_batched_tokens, config.num_kv_blocks)  # fmt: skip

    def run(self, requests, on_step=None, max_concurrency=None):
        raise RuntimeError(
            f"{self.name}: under --perf-against an engine runs in the two workers, not in the pytest process; "
            "pass it to perf.measure(engine, requests)"
        )
