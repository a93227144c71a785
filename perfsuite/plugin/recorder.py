"""The ``perf`` fixture's object: measure an engine, then assert no regression.

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
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

import pytest

from perfsuite.adapters.protocol import Backend, BatchingEngine, EngineConfig, check_serves_follow_ups
from perfsuite.engine import Request, RunResult
from perfsuite.judge.baselines import BaselineError, OutputError
from perfsuite.judge.results import TestResult
from perfsuite.judge.run_config import RunConfiguration, knobs, workload_digest
from perfsuite.measure.contention import CpuMeter, CpuUse, contention_reason
from perfsuite.measure.determinism import (
    DEFAULT_MAX_ARRIVAL_OFFSET,
    DEFAULT_TRIALS,
    UniqueCompletions,
    unique_completions,
)
from perfsuite.measure.environment import ServerEnvironment, server_environment
from perfsuite.measure.send_lag import shards_client_bound_reason
from perfsuite.measure.summaries import Repeats, SizingParameters, sizing_parameters, summarise
from perfsuite.plugin.options import AUTO_THREADS
from perfsuite.plugin.session import SERVER_DECODE_MODE, SERVER_PRECISION, PerfSession

if TYPE_CHECKING:
    from perfsuite.cluster.wire import PairResult

QUIET_CHECK_SECONDS = 0.5
QUIET_WAIT_SECONDS = 5.0


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

    def measure(
        self,
        engine: BatchingEngine,
        requests: Sequence[Request],
        *,
        max_concurrency: int | None = None,
        arrival_rate: float | None = None,
        repeats: int | None = None,
    ) -> TestResult:
        """Warm up (discarded), then time ``repeats`` (default: the profile's) through pytest-benchmark."""
        options = self.session.options
        repeats = repeats or self.session.repeats
        try:
            check_serves_follow_ups(engine, requests)
        except ValueError as error:
            pytest.fail(f"{self.test_id}: {error}", pytrace=False)
        if self.session.against is not None:
            return self._measure_paired(engine, requests, max_concurrency, arrival_rate, repeats)
        if self.session.cluster is not None:
            return self._measure_on_cluster(engine, requests, max_concurrency, arrival_rate, repeats)
        for _ in range(options.profile.warmup_runs):
            engine.run(requests, max_concurrency=max_concurrency)
        measured = self._timed_repeats(engine, requests, max_concurrency, repeats)
        server = None if runs_in_process(engine) else server_environment(engine, options.server_label)
        parameters = self._sizing(engine, requests, max_concurrency, server)
        configuration = self._configuration(engine, requests, max_concurrency, arrival_rate, repeats)
        try:
            self.result = self.session.record(
                self.test_id, measured, parameters, configuration, arrival_rate, environment=server
            )
        except (OutputError, BaselineError) as error:
            self.fail_unrecorded(error)
        if options.save_baseline and measured.noisy:
            pytest.fail(
                f"{self.test_id}: baseline not saved: {measured.noisy}; record it on a quiet machine", pytrace=False
            )
        recorded = self.result.measurement
        self.benchmark.extra_info.update(
            {
                "engine": recorded.engine_name,
                "parameters": dataclasses.asdict(recorded.parameters),
                **recorded.summary.vllm_keys(),
                **recorded.summary.interval_keys(),  # each percentile's interval and support
                "counters": dataclasses.asdict(recorded.counters),
                "memory": dataclasses.asdict(memory) if (memory := self.result.memory) else None,
                "baseline": self.result.judgement.baseline_status,
            }
        )
        return self.result

    def fail_unrecorded(self, error: Exception) -> NoReturn:
        """Fail the test, its result not judged or stored (a corrupt baseline), and have results.json say so.

        The error's one line, without the exceptions it was raised from: pytest
        would show those first (a corrupt baseline's bare JSON error) and then
        the message again.
        """
        self.session.note_unrecorded(self.test_id, str(error))
        raise pytest.fail.Exception(str(error), pytrace=False) from None

    def measure_capacity(
        self, engine: BatchingEngine, requests_at: Callable[[float], Sequence[Request]], **search
    ) -> TestResult:
        """R searches for the highest rate at which ``--perf-slo`` holds (``perfsuite.plugin.capacity``).

        ``requests_at(rate)``: the probe's requests, Poisson arrivals at ``rate``
        req/s; ``search``: ``target_share``, ``tolerance``, ``steady_state``, ``repeats``.
        Under ``--perf-ray`` an actor runs every search of the test on its node.
        """
        from perfsuite.plugin.capacity import measure_capacity

        in_process = runs_in_process(engine)  # a server's machine is not this one: not probed
        probes = _BracketingProbe(self.backend.probe if in_process else None, self.backend.device)
        return measure_capacity(self, engine, requests_at, probes, in_process, **search)

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
        if self.session.against is not None or self.session.cluster is not None:
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
        self.session.record_determinism(self.test_id, engine.name, completions)
        return completions

    def _measure_paired(
        self,
        engine: BatchingEngine,
        requests: Sequence[Request],
        max_concurrency: int | None,
        arrival_rate: float | None,
        repeats: int,
    ) -> TestResult:
        """``--perf-against``: the warm-ups, then ``repeats`` pairs, each side in its worker (``perfsuite.ab``)."""
        from perfsuite.ab.pair import different_output_lengths
        from perfsuite.ab.workers import WorkerError
        from perfsuite.plugin.against import WorkerEngine

        session, options = self.session, self.session.options
        self._require_factory_engine(
            engine, WorkerEngine, "--perf-against", "the workers build it by name in each tree"
        )
        threads = None if options.against_threads == AUTO_THREADS else options.against_threads
        node = environment = None
        if session.cluster is not None:  # --perf-ray: both sides on one node of the cluster
            from perfsuite.ab.on_ray import paired_runs

            on_node = self._pairs_on_cluster(engine, requests, max_concurrency, repeats, threads)
            paired, in_process = paired_runs(on_node), on_node.runs_in_process
            node, environment = str(on_node.node), on_node.environment
        else:
            runner = session.against.runner
            try:
                built = runner.build(engine.spec)
                paired = runner.run_pairs(
                    engine.spec, requests, max_concurrency, options.profile.warmup_runs, repeats, threads
                )
            except WorkerError as error:
                pytest.fail(f"{self.test_id}: --perf-against {options.against}: {error}", pytrace=False)
            in_process = all(side.runs_in_process for side in built)
        if not in_process:
            pytest.fail(
                f"{self.test_id}: {engine.name} runs in another process, the same for both sides: "
                "--perf-against measures in-process engines",
                pytrace=False,
            )
        unequal = different_output_lengths(paired)
        if unequal:
            pytest.fail(
                f"{self.test_id}: the runs made different numbers of tokens, so their speeds cannot be compared "
                f"(a side that does less looks faster): {'; '.join(unequal[:5])}",
                pytrace=False,
            )
        metrics, slo = session.compared_metrics, options.slo
        current = summarise(Repeats(paired.current, busy_shares=paired.current_busy), metrics, slo)
        reference = summarise(Repeats(paired.reference, busy_shares=paired.reference_busy), metrics, slo)
        configuration = self._configuration(engine, requests, max_concurrency, arrival_rate, repeats)
        parameters = self._sizing(engine, requests, max_concurrency, None)
        self.result = session.record_paired(
            self.test_id,
            current,
            reference,
            paired.order,
            parameters,
            configuration,
            arrival_rate,
            num_threads=paired.num_threads,
            environment=environment,
            node=node,
        )
        return self.result

    def _pairs_on_cluster(
        self,
        engine: BatchingEngine,
        requests: Sequence[Request],
        max_concurrency: int | None,
        repeats: int,
        threads: int | None,
    ) -> PairResult:
        """``--perf-against`` with ``--perf-ray``: the test's pairs from the node that ran both sides
        (``plugin.against_on_ray``); the test fails, unrecorded, naming the node when they cannot be had."""
        from perfsuite.cluster.pool import ClusterError
        from perfsuite.plugin.against_on_ray import measure_pairs

        session, options = self.session, self.session.options
        try:
            delivered = measure_pairs(
                session.cluster,
                self.test_id,
                engine,
                requests,
                max_concurrency,
                options.profile.warmup_runs,
                repeats,
                threads,
            )
        except ClusterError as error:
            self.fail_unrecorded(ClusterError(f"--perf-against {options.against}: {error}"))
        result = delivered.result
        if delivered.retried_after is not None:
            session.warnings.append(f"{self.test_id}: measured on node {result.node} after {delivered.retried_after}")
        return result

    def _measure_on_cluster(
        self,
        engine: BatchingEngine,
        requests: Sequence[Request],
        max_concurrency: int | None,
        arrival_rate: float | None,
        repeats: int,
    ) -> TestResult:
        """``--perf-ray``: one typed request to an actor, which warms up and times every repeat on its node."""
        from perfsuite.cluster.pool import ClusterError
        from perfsuite.cluster.wire import MeasureRequest
        from perfsuite.plugin.cluster import ClusterEngine

        session, options = self.session, self.session.options
        self._require_factory_engine(engine, ClusterEngine, "--perf-ray", "an actor builds it by name on its node")
        if session.client_shards is not None and not engine.runs_in_process:
            return self._measure_with_client_shards(engine, requests, max_concurrency, arrival_rate, repeats)
        request = MeasureRequest(
            self.test_id,
            engine.knobs,
            tuple(requests),
            max_concurrency,
            options.profile.warmup_runs,
            repeats,
            options.busy_threshold,
        )
        try:
            measured = session.cluster.measure(request)
        except ClusterError as error:
            self.fail_unrecorded(error)
        result = measured.result
        if not result.runs_in_process:  # a sweep case's openai-http: the server's fingerprint, not the node's
            pytest.fail(
                f"{self.test_id}: {engine.name} measures a server in another process; measure it without --perf-ray",
                pytrace=False,
            )
        if measured.retried_after is not None:
            session.warnings.append(f"{self.test_id}: measured on node {result.node} after {measured.retried_after}")
        runs = Repeats(result.runs, result.probes, result.busy_shares, result.noisy, device_memory=result.device_memory)
        parameters = self._sizing(engine, requests, max_concurrency, None)
        configuration = self._configuration(engine, requests, max_concurrency, arrival_rate, repeats)
        try:
            self.result = session.record(
                self.test_id,
                runs,
                parameters,
                configuration,
                arrival_rate,
                environment=result.environment,
                node=str(result.node),
            )
        except (OutputError, BaselineError) as error:
            self.fail_unrecorded(error)
        if options.save_baseline and runs.noisy:
            pytest.fail(
                f"{self.test_id}: baseline not saved: {runs.noisy}; record it on a quiet machine", pytrace=False
            )
        return self.result

    def _measure_with_client_shards(
        self,
        engine: BatchingEngine,
        requests: Sequence[Request],
        max_concurrency: int | None,
        arrival_rate: float | None,
        repeats: int,
    ) -> TestResult:
        """``--perf-client-shards N``: each run's schedule split over N client actors, merged on this clock (a closed
        loop: sent whole by one of them)."""
        from perfsuite.cluster.pool import ClusterError
        from perfsuite.measure.environment import served_model_environment

        session, options = self.session, self.session.options
        shards = session.client_shards
        try:
            for _ in range(options.profile.warmup_runs):
                shards.run(self.test_id, requests, engine.batch_size, max_concurrency)
            sharded = [shards.run(self.test_id, requests, engine.batch_size, max_concurrency) for _ in range(repeats)]
        except ClusterError as error:
            self.fail_unrecorded(error)
        runs = Repeats(tuple(run.merged for run in sharded), noisy=shards_client_bound_reason(per_shard_runs(sharded)))
        server = served_model_environment(sharded[-1].served_model, options.server_label)
        parameters = self._sizing(engine, requests, max_concurrency, server)
        configuration = self._configuration(engine, requests, max_concurrency, arrival_rate, repeats)
        # Sent by N clients on other hosts, not one: judged only against runs sent the same way
        sent_by = {"client_shards": len(sharded[-1].shards)}
        configuration = dataclasses.replace(
            configuration, engine_knobs=knobs({**dict(configuration.engine_knobs), **sent_by})
        )
        nodes = ", ".join(sorted({str(part.node) for part in sharded[-1].shards}))
        try:
            self.result = session.record(
                self.test_id,
                runs,
                parameters,
                configuration,
                arrival_rate,
                environment=server,
                node=f"client shards on {nodes}",
            )
        except (OutputError, BaselineError) as error:
            self.fail_unrecorded(error)
        return self.result

    def _require_factory_engine(self, engine: BatchingEngine, stand_in: type, option: str, why: str) -> None:
        """Under ``option`` an engine is a name and knobs built elsewhere: one the test built itself cannot travel."""
        if not isinstance(engine, stand_in):
            pytest.fail(
                f"{self.test_id}: under {option} the engine must come from perf_engine_factory ({why}); "
                f"this test built {engine.name!r} itself",
                pytrace=False,
            )

    def assert_no_regression(self) -> None:
        if self.result is None:
            raise RuntimeError("call perf.measure(engine, requests) before perf.assert_no_regression()")
        if self.result.regressions and not self.session.options.save_baseline:
            against = self.session.against
            sides = ("REF (A)", "current (B)") if against is not None else ("baseline", "current")
            lines = "\n".join(f"  {c.describe(sides)}" for c in self.result.regressions)
            where = f" (A/B against {against.label})" if against is not None else ""
            pytest.fail(f"performance regression in {self.test_id}{where}:\n{lines}", pytrace=False)

    def _timed_repeats(
        self, engine: BatchingEngine, requests: Sequence[Request], max_concurrency: int | None, repeats: int
    ) -> Repeats:
        """``repeats`` timed runs, each between two machine probes (in pytest-benchmark's untimed ``setup``).

        A run during which other work used the machine is re-run once the
        machine is quiet again (at most half of them); if it stays busy, the
        test stops and is reported noisy: more repeats would only measure the
        other work.
        """
        from perfsuite.measure.gpu_telemetry import RepeatTelemetry, disturbance_reason, open_gpu_telemetry
        from perfsuite.measure.timing import DevicePeakMemory, timed_run

        threshold = self.session.options.busy_threshold
        checks_machine = self.backend.probe is not None  # a fake that sleeps does not follow the machine
        in_process = runs_in_process(engine)
        runs: list[RunResult] = []
        uses: list[CpuUse | None] = []
        peaks: list[int | None] = []  # CUDA: the device's peak allocation during each run
        # A server in another process may run on another machine: this one's probe would only add its noise.
        probes = _BracketingProbe(self.backend.probe if in_process else None, self.backend.device)
        memory_device = self.backend.device if in_process else "cpu"  # a server's memory is not this device's
        gpu = open_gpu_telemetry(memory_device)  # NVML on CUDA with nvidia-ml-py; else None
        telemetry: list[RepeatTelemetry | None] = []  # a repeat throttled or shared on its GPU is disturbed too

        def one_run() -> None:
            probes.starting_run()
            before = gpu.sample() if gpu is not None else None
            with CpuMeter() as meter, DevicePeakMemory(memory_device) as memory:
                runs.append(timed_run(engine, requests, self.backend.device, max_concurrency=max_concurrency))
            telemetry.append(RepeatTelemetry(before, gpu.sample()) if gpu is not None else None)
            peaks.append(memory.peak_bytes)
            uses.append(_counted(meter.use, in_process) if checks_machine else None)
            if uses[-1] is not None and uses[-1].is_busy(threshold) and not _wait_until_quiet(threshold):
                raise _BusyForGood

        try:
            self.benchmark.pedantic(one_run, setup=probes.take, rounds=repeats, iterations=1, warmup_rounds=0)
            while len(runs) < repeats:  # --benchmark-disable runs the target only once
                probes.take()
                one_run()
            probes.take()  # after the last run
            disturbed = [
                i
                for i, use in enumerate(uses)
                if (use is not None and use.is_busy(threshold))
                or (telemetry[i] is not None and telemetry[i].disturbed())
            ]
            for index in disturbed[: repeats // 2]:
                probes.take()
                one_run()  # the machine is quiet again: this repeat takes the disturbed one's place
                probes.take()
                runs[index], uses[index], peaks[index] = runs.pop(), uses.pop(), peaks.pop()
                telemetry[index] = telemetry.pop()
                probes.move_last_to(index)
        except _BusyForGood:
            reason = contention_reason(uses, threshold)
            return Repeats(
                tuple(runs),
                probes.per_run(),
                _shares(uses),
                f"{reason}; the other repeats were not run",
                device_memory=_peaks(peaks),
                energy_per_token=_energy(runs, telemetry),
            )
        noisy = "; ".join(filter(None, (contention_reason(uses, threshold), disturbance_reason(telemetry)))) or None
        return Repeats(
            tuple(runs),
            probes.per_run(),
            _shares(uses),
            noisy,
            device_memory=_peaks(peaks),
            energy_per_token=_energy(runs, telemetry),
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
        if built is not None:
            name, engine_knobs = built.name, built.config.identity()
        else:  # built by the test itself: all we know is what the protocol shows
            name, engine_knobs = engine.name, {"batch_size": engine.batch_size}
        max_seq_len = engine_knobs.pop("max_seq_len", None)
        attention = getattr(engine, "attention", None)  # a paged engine's: in place or gathered, not the same speed
        if attention is not None:
            engine_knobs["attention"] = attention
        fallback = getattr(engine, "attention_fallback", None)
        if fallback is not None:
            warning = (
                f"paged decode gathered the KV blocks instead of attending in place (slower; recorded as "
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


class _BracketingProbe:
    """The machine probe around each run: the geometric mean of the readings just before and just after it.

    bench/probe_drift.py: the machine's speed drifts during a run, and the
    reading after it as well as before cut the drift left in a decode step's
    time by a fifth. A reading serves as the "after" of one run and the
    "before" of the next. Without a probe, there are no readings.
    """

    def __init__(self, probe: Callable[[str], float] | None, device: str) -> None:
        self._probe = probe
        self._device = device
        self._latest: float | None = None
        self._before: list[float] = []  # per run, in run order
        self._around: list[float] = []  # per run whose "after" reading is in

    def take(self) -> None:
        if self._probe is None:
            return
        self._latest = self._probe(self._device)
        if len(self._around) < len(self._before):  # the last run's "after"
            self._around.append(math.sqrt(self._before[len(self._around)] * self._latest))

    def starting_run(self) -> None:
        if self._latest is not None:
            self._before.append(self._latest)

    def move_last_to(self, index: int) -> None:
        """A re-run took the place of the disturbed run ``index``."""
        if self._around:
            self._before[index] = self._before.pop()
            self._around[index] = self._around.pop()

    def per_run(self) -> tuple[float, ...]:
        """One reading per run; a run cut short by a busy machine has only its "before"."""
        return tuple(self._around) + tuple(self._before[len(self._around) :])


class _BusyForGood(Exception):
    """The machine stayed busy after a disturbed repeat: more repeats would measure the other work."""


def per_shard_runs(sharded: Sequence) -> list[tuple[str, list[RunResult]]]:
    """Each client shard's own runs (one per repeat, on its own clock), by the shard's name, for its send-lag check."""
    by_shard: dict[str, list[RunResult]] = {}
    for run in sharded:
        for part in run.shards:
            by_shard.setdefault(part.name, []).append(part.run)
    return list(by_shard.items())


def runs_in_process(engine: BatchingEngine) -> bool:
    """False for an engine whose work a server in another process does (``openai-http``)."""
    return getattr(engine, "runs_in_process", True)


def _shares(uses: Sequence[CpuUse | None]) -> tuple[float, ...]:
    return tuple(use.busy_share for use in uses if use is not None)


def _energy(runs, telemetry) -> tuple[float, ...]:
    """Joules per output token of each repeat, from NVML's energy counter; none unless every repeat has one."""
    energies = [
        None if t is None else t.energy_per_token(sum(r.num_output_tokens for r in run.records))
        for run, t in zip(runs, telemetry)
    ]
    return tuple(energies) if energies and all(e is not None for e in energies) else ()


def _peaks(peaks: Sequence[int | None]) -> tuple[int, ...]:
    """One peak per run, or none at all (off CUDA)."""
    return tuple(peaks) if peaks and all(peak is not None for peak in peaks) else ()


def _counted(use: CpuUse | None, in_process: bool) -> CpuUse | None:
    """An engine served from another process (an HTTP server here) shows up as other work: count only steal."""
    if use is None or in_process:
        return use
    return dataclasses.replace(use, foreign_share=0.0)


def _wait_until_quiet(threshold: float) -> bool:
    deadline = time.monotonic() + QUIET_WAIT_SECONDS
    while time.monotonic() < deadline:
        with CpuMeter() as meter:
            time.sleep(QUIET_CHECK_SECONDS)
        if meter.use is None or not meter.use.is_busy(threshold):
            return True
    return False
