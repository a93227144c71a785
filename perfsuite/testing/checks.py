"""One scenario, served by an engine or by perfsuite's schedulers over a runner, against the unbatched reference.

``check_engine`` needs only ``BatchingEngine.run`` (any registered engine, a
server through ``openai-http`` included): the scenario's arrivals become
arrival times. ``check_runner`` puts a model runner (``new_kv_cache``,
``new_paged_kv_cache``, ``execute``) under perfsuite's static, in-flight and
paged schedulers and drives them step by step. Both report every divergence
with the reference's top-1/top-2 margin (``perfsuite.testing.greedy``), so a
near-tie flip reads apart from a bug; neither asserts, the caller decides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perfsuite.adapters.protocol import BatchingEngine, EngineConfig
from perfsuite.engine import EngineCounters
from perfsuite.testing.drive import drive
from perfsuite.testing.greedy import (
    Divergence,
    GreedyCheck,
    GreedyReference,
    InvalidRunResult,
    check_greedy_equal,
    check_server_greedy,
    find_divergences,
    server_name,
    validate_run_result,
)
from perfsuite.testing.reference import CachedReference
from perfsuite.testing.scenarios import Scenario
from perfsuite.testing.verdict import LogitTolerance, TokenCheck, check_tokens

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
    tolerance: LogitTolerance | None = None,
) -> GreedyCheck | TokenCheck:
    """Serve ``scenario`` with ``engine.run`` and compare every output with ``reference``'s.

    ``engine`` is a ``BatchingEngine``, or a function that builds one from
    the scenario's knobs (``Scenario.engine_config(max_seq_len)``), such as
    ``functools.partial(perfsuite.adapters.build_engine, "my-engine", backend)``.
    ``max_seq_len`` defaults to the scenario's longest request. A request
    arrives ``seconds_per_step`` x its arrival step after the run starts (0:
    all at once). An engine with a ``base_url`` (``openai-http``) is named by
    its server and checked as ``check_server_greedy`` checks one.

    With a ``tolerance`` (``LogitTolerance``; ``reference`` a ``CachedReference``
    with a scorer) the verdict is per token: every output token against the
    reference given the engine's own prefix (``perfsuite.testing.verdict``),
    a ``TokenCheck``. Without one, the two free-running greedy sequences are
    compared up to their first difference, with near-ties below
    ``near_tie_tolerance`` reported apart (a ``GreedyCheck``).
    """
    if not isinstance(engine, BatchingEngine):
        engine = engine(scenario.engine_config(max_seq_len or scenario.max_total_tokens))
    requests = scenario.timed_requests(seconds_per_step)
    if tolerance is not None:
        if not isinstance(reference, CachedReference):
            raise TypeError(
                "a per-token verdict (tolerance=...) needs a CachedReference with a scorer (cached_reference)"
            )
        return _check_engine_tokens(engine, requests, reference, tolerance)
    if getattr(engine, "base_url", None):
        return check_server_greedy(engine, requests, reference, near_tie_tolerance)
    return check_greedy_equal(engine, requests, reference, near_tie_tolerance)


def _check_engine_tokens(
    engine: BatchingEngine, requests: tuple, reference: CachedReference, tolerance: LogitTolerance
) -> TokenCheck:
    name = server_name(engine) if getattr(engine, "base_url", None) else engine.name
    result = engine.run(requests)
    problems = validate_run_result(requests, result)
    if problems:
        raise InvalidRunResult(name, problems)
    return check_tokens(name, requests, result.outputs(), reference.score, tolerance, reference.eos_token_id)


@dataclass(frozen=True, slots=True)
class ScheduledRun:
    """One of perfsuite's engines over the runner under test: its outputs against the reference, its work."""

    check: GreedyCheck | TokenCheck
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
    tolerance: LogitTolerance | None = None,
) -> RunnerCheck:
    """Serve ``scenario`` step by step with perfsuite's static, in-flight and paged engines over ``runner``.

    ``max_seq_len`` (each slot's length, default the scenario's longest
    request) must fit every request; ``eos_token_id`` is the model's. With a
    ``tolerance``, each engine's verdict is per token, as in ``check_engine``.
    """
    if tolerance is None:
        expected, margins = reference.outputs(scenario.requests)
    runs = []
    check: GreedyCheck | TokenCheck
    for engine in scenario.engines(runner, eos_token_id, max_seq_len or scenario.max_total_tokens):
        outputs = drive(engine, scenario)
        if tolerance is not None:
            served = {r.request_id: tuple(outputs.get(r.request_id, ())) for r in scenario.requests}
            check = check_tokens(engine.name, scenario.requests, served, reference.score, tolerance, eos_token_id)
        else:
            divergences = find_divergences(engine.name, expected, outputs, margins)
            check = GreedyCheck(engine.name, len(scenario.requests), tuple(divergences), near_tie_tolerance)
        runs.append(ScheduledRun(check, engine.result(0.0, 1.0).counters))
    return RunnerCheck(tuple(runs))
