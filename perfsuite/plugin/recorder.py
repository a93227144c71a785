"""The ``perf`` fixture's object: measure an engine, then assert no regression.

The session's measurer (``plugin.measurers``, one per mode) measures; this
checks what a test may ask, makes the run's identity (its configuration and
sizing parameters) and has the session record it, once, whatever the mode
and kind of result; a noisy ``--perf-save-baseline`` fails here, in every mode.

An engine that runs in this process is measured against this machine: each
repeat between two machine probes, its baseline under this machine's
fingerprint. An engine served by another process (``runs_in_process =
False``: ``openai-http``) is measured against its server: no probe (the
server may run elsewhere, and this machine's speed says nothing about it),
its baseline under the server's fingerprint (``environment.server_environment``),
and the server's model in the sizing parameters rather than ``--perf-model``.
A session that measures both keeps each under its own fingerprint.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn, TypeVar

import pytest

from perfsuite.adapters.protocol import Backend, BatchingEngine, EngineConfig, check_serves_follow_ups
from perfsuite.engine import Request
from perfsuite.judge.baselines import BaselineError, OutputError
from perfsuite.judge.instructions import InstructionResult
from perfsuite.judge.results import TestResult
from perfsuite.judge.run_config import RunConfiguration, knobs, workload_digest
from perfsuite.measure.capacity import SteadyState
from perfsuite.measure.capacity_runs import SearchChoices
from perfsuite.measure.determinism import (
    DEFAULT_MAX_ARRIVAL_OFFSET,
    DEFAULT_TRIALS,
    UniqueCompletions,
    unique_completions,
)
from perfsuite.measure.environment import ServerEnvironment
from perfsuite.measure.instruction_workload import InstructionWorkload
from perfsuite.measure.instructions import (
    DEFAULT_RUNS,
    InstructionCountError,
    count_instructions,
    valgrind_unavailable,
)
from perfsuite.measure.repeats import Rounds, noisy_save_failure, plain_rounds, runs_in_process
from perfsuite.measure.summaries import SizingParameters, sizing_parameters, summarise
from perfsuite.plugin.capacity import NO_SLO, capacity_configuration, capacity_entry, capacity_extra_info
from perfsuite.plugin.measurers import (
    CapacityJob,
    Conditions,
    Job,
    MeasureFailed,
    NotMeasured,
    PairedTimings,
)
from perfsuite.plugin.session import (
    SERVER_DECODE_MODE,
    SERVER_PRECISION,
    CapacityEntry,
    DeterminismEntry,
    PairedEntry,
    PerfSession,
    TimedEntry,
)

J = TypeVar("J")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BuiltEngine:
    """An engine the ``engine_factory`` fixture built, with the name and knobs it was built from."""

    engine: BatchingEngine
    name: str
    config: EngineConfig


class BenchmarkWhenUsed:
    """pytest-benchmark's ``benchmark`` fixture, requested the first time a test times something.

    A test that only measures unique completions times nothing; requested up
    front, the fixture would warn that it "was not used at all in this test".
    """

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request

    def __getattr__(self, name: str):
        return getattr(self._request.getfixturevalue("benchmark"), name)


class PerfRecorder:
    """A test's ``perf``: the session's measurer measures, the session records, and this checks what it may."""

    def __init__(
        self,
        session: PerfSession,
        test_id: str,
        benchmark,
        backend: Backend,
        built_engines: Sequence[BuiltEngine] = (),
    ) -> None:
        self.session = session
        self.test_id = test_id
        self.benchmark = benchmark
        self.backend = backend
        self.built_engines = built_engines
        self.result: TestResult | None = None
        self.instruction_result: InstructionResult | None = None

    def measure(
        self,
        engine: BatchingEngine,
        requests: Sequence[Request],
        *,
        max_concurrency: int | None = None,
        arrival_rate: float | None = None,
        repeats: int | None = None,
    ) -> TestResult:
        """Warm up (discarded), then time ``repeats`` (default: the profile's) by the session's measurer."""
        repeats = repeats or self.session.repeats
        try:
            check_serves_follow_ups(engine, requests)
        except ValueError as error:
            pytest.fail(f"{self.test_id}: {error}", pytrace=False)
        job = Job(self.test_id, engine, tuple(requests), max_concurrency, repeats, self._conditions())
        timings = self._measured(self.session.measurer.measure, job)
        configuration = self._configuration(engine, requests, max_concurrency, arrival_rate, repeats)
        if isinstance(timings, PairedTimings):
            paired = self._paired_entry(timings, engine, requests, max_concurrency, arrival_rate, configuration)
            self.result = self._record(paired)
            return self.result
        if timings.sent_by:
            sent_by = knobs({**dict(configuration.engine_knobs), **dict(timings.sent_by)})
            configuration = dataclasses.replace(configuration, engine_knobs=sent_by)
        parameters = self._sizing(engine, requests, max_concurrency, timings.server)
        entry = TimedEntry(
            self.test_id, timings.repeats, parameters, configuration, arrival_rate, timings.environment, timings.node
        )
        self.result = self._record(entry)
        self._fail_noisy_save(timings.repeats.noisy)
        if self.benchmark is not None:
            self.benchmark.extra_info.update(extra_info(self.result))
        return self.result

    def measure_capacity(
        self,
        engine: BatchingEngine,
        requests_at: Callable[[float], Sequence[Request]],
        *,
        by: str | None = None,
        target_share: float | None = None,
        tolerance: float | None = None,
        steady_state: SteadyState = SteadyState(),
        repeats: int | None = None,
    ) -> TestResult:
        """R searches for the highest rate at which ``--perf-slo`` holds (``perfsuite.plugin.capacity``).

        ``requests_at(rate)``: the probe's requests, Poisson arrivals at ``rate``
        req/s; ``by``: "rate" or "concurrency" (None: ``--perf-capacity-by``);
        ``target_share``, ``tolerance``, ``steady_state``, ``repeats``: the search's.
        Under ``--perf-ray`` an actor runs every search of the test on its node.
        """
        options = self.session.options
        slo = options.slo
        if slo is None:
            pytest.skip(NO_SLO)
        repeats = repeats or self.session.repeats
        choices = SearchChoices(by or options.capacity_by, target_share, tolerance)
        job = CapacityJob(self.test_id, engine, requests_at, slo, steady_state, choices, repeats, self._conditions())
        timings = self._measured(self.session.measurer.measure_capacity, job)
        base = self._configuration(engine, timings.requests, None, None, repeats)
        configuration = capacity_configuration(base, timings.search, slo.label, steady_state)
        parameters = self._sizing(engine, timings.requests, None, None)
        self.result = self._record(capacity_entry(self.test_id, timings, slo, parameters, configuration))
        self._fail_noisy_save(timings.at_capacity.noisy)
        if self.benchmark is not None:
            self.benchmark.extra_info.update(capacity_extra_info(self.result, slo.label))
        return self.result

    def measure_determinism(
        self,
        engine: BatchingEngine,
        requests: Sequence[Request],
        *,
        trials: int = DEFAULT_TRIALS,
        seed: int = 0,
        max_arrival_offset: float = DEFAULT_MAX_ARRIVAL_OFFSET,
    ) -> UniqueCompletions:
        """Unique completions over ``trials`` runs (``perfsuite.measure.determinism``): each prompt served once a
        trial in a seeded shuffled batch composition, its distinct completions counted.

        Recorded in results.json and the report, never judged: assert on what
        it returns (``.max_distinct == 1``) to require determinism. Nothing is
        timed, and a test that only measures this plans no comparison.
        """
        if not self.session.measurer.runs_here:
            pytest.fail(
                f"{self.test_id}: perf.measure_determinism runs the engine in this process; under "
                "--perf-against or --perf-ray engines are built elsewhere: measure it in a session "
                "without them",
                pytrace=False,
            )
        try:
            completions = unique_completions(engine, requests, trials, seed=seed, max_arrival_offset=max_arrival_offset)
        except ValueError as error:
            pytest.fail(f"{self.test_id}: {error}", pytrace=False)
        self.session.record(DeterminismEntry(self.test_id, engine.name, completions))
        return completions

    def measure_instructions(self, workload: InstructionWorkload, *, runs: int = DEFAULT_RUNS) -> InstructionResult:
        """Host instructions per engine step of ``workload`` under Valgrind (``perfsuite.measure.instructions``),
        judged against the stored figure by ``--perf-instructions-threshold``; saved under ``--perf-save-baseline``.

        Skipped, with the reason, unless ``--perf-instructions`` is given and
        ``valgrind`` is installed. The engine runs in two processes of its own
        here, whatever the session's mode: a count does not depend on the machine.
        """
        if not self.session.options.instructions:
            pytest.skip("the instruction lane is off: pass --perf-instructions to count instructions under Valgrind")
        missing = valgrind_unavailable()
        if missing is not None:
            pytest.skip(missing)
        try:
            count = count_instructions(workload, runs=runs, cwd=self.session.rootdir)
        except InstructionCountError as error:
            pytest.fail(f"{self.test_id}: {error}", pytrace=False)
        try:
            self.instruction_result = self.session.record_instructions(self.test_id, count)
        except (OutputError, BaselineError) as error:
            self.fail_unrecorded(error)
        return self.instruction_result

    def fail_unrecorded(self, error: Exception) -> NoReturn:
        """Fail the test, its result not judged or stored (a corrupt baseline), and have results.json say so.

        The error's one line, without the exceptions it was raised from: pytest
        would show those first (a corrupt baseline's bare JSON error) and then
        the message again.
        """
        self.session.note_unrecorded(self.test_id, str(error))
        raise pytest.fail.Exception(str(error), pytrace=False) from None

    def assert_no_regression(self) -> None:
        if self.result is None and self.instruction_result is None:
            raise RuntimeError(
                "call perf.measure(engine, requests) or perf.measure_instructions(workload) before "
                "perf.assert_no_regression()"
            )
        counted = self.instruction_result
        if counted is not None and counted.regressed and not self.session.options.save_baseline:
            pytest.fail(f"instruction count regression in {counted.describe()}", pytrace=False)
        if self.result is not None and self.result.regressions and not self.session.options.save_baseline:
            against = self.session.against
            sides = ("REF (A)", "current (B)") if against is not None else ("baseline", "current")
            lines = "\n".join(f"  {c.describe(sides)}" for c in self.result.regressions)
            where = f" (A/B against {against.label})" if against is not None else ""
            pytest.fail(f"performance regression in {self.test_id}{where}:\n{lines}", pytrace=False)

    def _conditions(self) -> Conditions:
        """The session's warm-ups and busy threshold, this test's backend, pytest-benchmark's rounds where this process
        times the repeats, and the server label."""
        options = self.session.options
        rounds = plain_rounds if self.benchmark is None else pedantic_rounds(self.benchmark)
        return Conditions(
            options.profile.warmup_runs, options.busy_threshold, self.backend, rounds, options.server_label
        )

    def _measured(self, measure: Callable[[J], T], job: J) -> T:
        """``measure(job)``; a ``MeasureFailed`` fails the test (unrecorded: results.json names it too)."""
        try:
            return measure(job)
        except NotMeasured as skipped:
            pytest.skip(str(skipped))
        except MeasureFailed as error:
            if error.unrecorded:
                self.fail_unrecorded(error)
            pytest.fail(str(error), pytrace=False)

    def _record(self, entry: TimedEntry | CapacityEntry | PairedEntry) -> TestResult:
        try:
            return self.session.record(entry)
        except (OutputError, BaselineError) as error:
            self.fail_unrecorded(error)

    def _fail_noisy_save(self, noisy: str | None) -> None:
        failure = noisy_save_failure(self.test_id, noisy, self.session.options.save_baseline)
        if failure is not None:
            pytest.fail(failure, pytrace=False)

    def _paired_entry(
        self,
        timings: PairedTimings,
        engine: BatchingEngine,
        requests: Sequence[Request],
        max_concurrency: int | None,
        arrival_rate: float | None,
        configuration: RunConfiguration,
    ) -> PairedEntry:
        metrics, slo = self.session.compared_metrics, self.session.options.slo
        return PairedEntry(
            self.test_id,
            summarise(timings.current, metrics, slo),
            summarise(timings.reference, metrics, slo),
            timings.order,
            self._sizing(engine, requests, max_concurrency, None),
            configuration,
            arrival_rate,
            timings.num_threads,
            timings.environment,
            timings.node,
        )

    def _sizing(
        self,
        engine: BatchingEngine,
        requests: Sequence[Request],
        max_concurrency: int | None,
        server: ServerEnvironment | None,
    ) -> SizingParameters:
        """The model and precision measured: the server's when it serves them, not ``--perf-model``/``--perf-dtype``."""
        options = self.session.options
        model, precision = (options.model, options.dtype) if server is None else (server.served_model, SERVER_PRECISION)
        return sizing_parameters(requests, model, precision, max_concurrency or engine.batch_size)

    def _configuration(
        self,
        engine: BatchingEngine,
        requests: Sequence[Request],
        max_concurrency: int | None,
        arrival_rate: float | None,
        repeats: int,
    ) -> RunConfiguration:
        options = self.session.options
        built = next((b for b in self.built_engines if b.engine is engine), None)
        identity: dict[str, int | None]
        if built is not None:
            name, identity = built.name, built.config.identity()
        else:  # built by the test itself: all we know is what the protocol shows
            name, identity = engine.name, {"batch_size": engine.batch_size}
        max_seq_len = identity.pop("max_seq_len", None)
        engine_knobs: dict[str, int | str | None] = dict(identity)
        attention = getattr(engine, "attention", None)  # in place or gathered: not the same speed
        if attention is not None:
            engine_knobs["attention"] = attention
        fallback = getattr(engine, "attention_fallback", None)
        if fallback is not None:
            warning = (
                f"decode attention gathered the keys instead of reading them in place (slower; recorded as "
                f"attention=gather, compared only with runs that gathered too): {fallback}"
            )
            if warning not in self.session.warnings:  # one line a session, not one a test
                self.session.warnings.append(warning)
        return RunConfiguration(
            profile=options.profile.name,
            workload_digest=workload_digest(requests, max_concurrency, arrival_rate),
            num_requests=len(requests),
            engine=name,
            engine_knobs=knobs(engine_knobs),
            # --perf-decode-mode picks this process's runner path, not a server's
            decode_mode=options.decode_mode if runs_in_process(engine) else SERVER_DECODE_MODE,
            max_seq_len=max_seq_len,
            repeats=repeats,
        )


def pedantic_rounds(benchmark) -> Rounds:
    """pytest-benchmark's ``pedantic`` as the repeat loop's rounds: each round one call, its setup untimed."""

    def rounds(one: Callable[[], None], setup: Callable[[], None], num_rounds: int) -> None:
        benchmark.pedantic(one, setup=setup, rounds=num_rounds, iterations=1, warmup_rounds=0)

    return rounds


def extra_info(result: TestResult) -> dict[str, object]:
    """What pytest-benchmark's JSON carries of a timed test's result."""
    recorded = result.measurement
    return {
        "engine": recorded.engine_name,
        "parameters": dataclasses.asdict(recorded.parameters),
        **recorded.summary.vllm_keys(),
        **recorded.summary.interval_keys(),  # each percentile's interval and support
        "counters": dataclasses.asdict(recorded.counters),
        "memory": dataclasses.asdict(memory) if (memory := result.memory) else None,
        "baseline": result.judgement.baseline_status,
    }
