"""One scenario, served by an engine or by perfsuite's schedulers over a runner, against the unbatched reference.

``check_engine`` needs only ``BatchingEngine.run`` (any registered engine, a
server through ``openai-http`` included): the scenario's arrivals become
arrival times. ``check_runner`` puts a model runner (``new_kv_cache``,
``new_paged_kv_cache``, ``execute``) under perfsuite's static, in-flight and
paged schedulers and drives them step by step. Both report every divergence
with the reference's top-1/top-2 margin (``perfsuite.correctness``), so a
near-tie flip reads apart from a bug; neither asserts, the caller decides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perfsuite.adapters.protocol import BatchingEngine, EngineConfig
from perfsuite.correctness import (
    Divergence,
    GreedyCheck,
    GreedyReference,
    check_greedy_equal,
    check_server_greedy,
    find_divergences,
)
from perfsuite.engine import EngineCounters
from perfsuite.testing.drive import drive
from perfsuite.testing.reference import CachedReference
from perfsuite.testing.scenarios import Scenario

if TYPE_CHECKING:
    from perfsuite.engine.engine import Runner

EngineBuilder = Callable[[EngineConfig], BatchingEngine]


def check_engine(
    engine: BatchingEngine | EngineBuilder,
    scenario: Scenario,
    reference: GreedyReference,
    *,
    max_seq_len: int | None = None,
    seconds_per_step: float = 0.0,
    near_tie_tolerance: float = 0.0,
) -> GreedyCheck:
    """Serve ``scenario`` with ``engine.run`` and compare every output with ``reference``'s.

    ``engine`` is a ``BatchingEngine``, or a function that builds one from
    the scenario's knobs (``Scenario.engine_config(max_seq_len)``), such as
    ``functools.partial(perfsuite.adapters.build_engine, "my-engine", backend)``.
    ``max_seq_len`` defaults to the scenario's longest request. A request
    arrives ``seconds_per_step`` x its arrival step after the run starts (0:
    all at once). An engine with a ``base_url`` (``openai-http``) is named by
    its server and checked as ``check_server_greedy`` checks one.
    """
    if not isinstance(engine, BatchingEngine):
        engine = engine(scenario.engine_config(max_seq_len or scenario.max_total_tokens))
    requests = scenario.timed_requests(seconds_per_step)
    if getattr(engine, "base_url", None):
        return check_server_greedy(engine, requests, reference, near_tie_tolerance)
    return check_greedy_equal(engine, requests, reference, near_tie_tolerance)


@dataclass(frozen=True, slots=True)
class ScheduledRun:
    """One of perfsuite's engines over the runner under test: its outputs against the reference, its work."""

    check: GreedyCheck
    counters: EngineCounters


@dataclass(frozen=True, slots=True)
class RunnerCheck:
    """A runner under each of perfsuite's schedulers, on one scenario."""

    runs: tuple[ScheduledRun, ...]

    @property
    def passed(self) -> bool:
        return all(run.check.passed for run in self.runs)

    @property
    def near_ties(self) -> tuple[Divergence, ...]:
        return tuple(tie for run in self.runs for tie in run.check.near_ties)

    def counters(self, engine_name: str) -> EngineCounters:
        """The work counters of the engine named ``engine_name`` (``static``, ``inflight``, ``paged``)."""
        for run in self.runs:
            if run.check.engine_name == engine_name:
                return run.counters
        raise KeyError(f"no {engine_name!r} run; ran {', '.join(run.check.engine_name for run in self.runs)}")

    def describe(self) -> str:
        return "\n".join(run.check.describe() for run in self.runs)

    def assert_passed(self, max_near_ties: int | None = None) -> None:
        """Fail on any divergence that is not a near-tie, or on more near-ties (all engines together) than that."""
        if not self.passed:
            raise AssertionError("outputs differ from the unbatched reference:\n" + self.describe())
        if max_near_ties is not None and len(self.near_ties) > max_near_ties:
            raise AssertionError(f"too many near-ties to be chance (at most {max_near_ties}):\n{self.describe()}")


def check_runner(
    runner: Runner,
    scenario: Scenario,
    reference: CachedReference,
    *,
    eos_token_id: int | None,
    max_seq_len: int | None = None,
    near_tie_tolerance: float = 0.0,
) -> RunnerCheck:
    """Serve ``scenario`` step by step with perfsuite's static, in-flight and paged engines over ``runner``.

    ``max_seq_len`` (each slot's length, default the scenario's longest
    request) must fit every request; ``eos_token_id`` is the model's.
    """
    expected, margins = reference.outputs(scenario.requests)
    runs = []
    for engine in scenario.engines(runner, eos_token_id, max_seq_len or scenario.max_total_tokens):
        divergences = find_divergences(engine.name, expected, drive(engine, scenario), margins)
        check = GreedyCheck(engine.name, len(scenario.requests), tuple(divergences), near_tie_tolerance)
        runs.append(ScheduledRun(check, engine.result(0.0, 1.0).counters))
    return RunnerCheck(tuple(runs))
