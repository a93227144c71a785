"""One ``Measurer`` per mode, behind one interface: a test's job in, its repeats (or paired repeats) out.

The session's measurer is chosen once, when the session starts its
transports (``start_transports``, ``measurer_for``, from
``pytest_collection_finish``): the fixtures (where the models live, who
builds an engine), the recorder and the capacity test never ask which mode
they are in.

- ``LocalMeasurer``: the engine runs in this process (or is a server this
  process sends to); repeats through ``measure.repeats.RepeatLoop``, timed
  by pytest-benchmark.
- ``RayMeasurer`` (``--perf-ray``): one typed request to an actor, which
  runs the same loop on its node (``cluster.actor``).
- ``ShardMeasurer`` (``--perf-client-shards N``): each repeat's schedule
  sent by N client actors, through the same loop here; a repeat whose
  load generator fell behind is the loop's disturbed repeat.
- ``PairedMeasurer`` (``--perf-against``, alone or on Ray): both sides'
  repeats in ABBA pairs, from the A/B workers or a node's pair actor.
  A/B is measured on a busy machine by design (both sides see the same
  load), so its pairs are not re-run, and a baseline is never saved from it.

A measurer raises ``MeasureFailed`` to fail the test; the recorder turns it
into pytest's failure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from perfsuite.adapters.protocol import Backend, BatchingEngine, EngineConfig
from perfsuite.cluster.client_pool import ShardedRun
from perfsuite.engine import Request, RunResult
from perfsuite.measure.capacity import Capacity, CapacityError, CapacitySearch, SteadyState
from perfsuite.measure.capacity_runs import CapacityRuns, SearchChoices, rate_scaling_mismatch
from perfsuite.measure.environment import Environment, ServerEnvironment
from perfsuite.measure.metrics import SLO
from perfsuite.measure.repeats import (
    BracketingProbe,
    EngineRepeats,
    MachineMeter,
    Repeat,
    RepeatLoop,
    Rounds,
    measure_engine,
    noisy_reason,
    plain_rounds,
    runs_in_process,
    search_capacity,
)
from perfsuite.measure.send_lag import shards_client_bound_reason
from perfsuite.measure.summaries import Repeats
from perfsuite.plugin.endpoint import EndpointCheck

if TYPE_CHECKING:
    from perfsuite.cluster.client_pool import ClientShards
    from perfsuite.cluster.pairs import PairPool
    from perfsuite.cluster.pool import RayPool
    from perfsuite.plugin.against import Against

RATE_CHECKED = 2.0  # under --perf-ray, requests_at(RATE_CHECKED) must be requests_at(1.0) scaled to it


class MeasureFailed(Exception):
    """The test fails with this message; ``unrecorded``: a transport failed, and results.json names the test."""

    def __init__(self, message: str, unrecorded: bool = False) -> None:
        super().__init__(message)
        self.unrecorded = unrecorded


class NotMeasured(Exception):
    """The mode cannot measure this kind of test: it is skipped, saying why."""


@dataclass(frozen=True, slots=True)
class Conditions:
    """What a test is measured under: the session's warm-ups and busy threshold, this process's backend and rounds."""

    warmup_runs: int
    busy_threshold: float
    backend: Backend
    rounds: Rounds = plain_rounds  # pytest-benchmark's pedantic where this process times the repeats
    server_label: str | None = None  # --perf-server-label: a server's fingerprint names it


@dataclass(frozen=True, slots=True)
class Job:
    """What a test asks to be measured: its engine, requests and repeats."""

    test_id: str
    engine: BatchingEngine
    requests: tuple[Request, ...]
    max_concurrency: int | None
    num_repeats: int
    conditions: Conditions


@dataclass(frozen=True, slots=True)
class CapacityJob:
    """A capacity test: ``num_repeats`` searches of ``engine`` under ``slo`` (``plugin.capacity``)."""

    test_id: str
    engine: BatchingEngine
    requests_at: Callable[[float], Sequence[Request]]
    slo: SLO
    steady_state: SteadyState
    choices: SearchChoices
    num_repeats: int
    conditions: Conditions


@dataclass(frozen=True, slots=True)
class Timings:
    """A test's repeats and where they were measured.

    ``environment``: the fingerprint its baseline lives under (None: this
    machine's); ``server``: the served model, for the sizing parameters;
    ``sent_by``: knobs the mode adds to the run's configuration.
    """

    repeats: Repeats
    environment: Environment | ServerEnvironment | None = None
    server: ServerEnvironment | None = None
    node: str | None = None
    sent_by: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class PairedTimings:
    """Both sides' repeats, pair by pair (``--perf-against``)."""

    current: Repeats
    reference: Repeats
    order: tuple[str, ...]
    num_threads: int | None = None
    environment: Environment | None = None
    node: str | None = None


@dataclass(frozen=True, slots=True)
class CapacityTimings:
    """A capacity test's searches, the run at each capacity as its repeats, and where they ran."""

    search: CapacitySearch
    searches: tuple[Capacity, ...]
    at_capacity: Repeats
    requests: tuple[Request, ...]  # the probe's requests at 1 req/s
    environment: Environment | None = None
    node: str | None = None


class Measurer(Protocol):
    """How a mode measures: the engines it builds, repeats (or paired repeats), and capacity searches."""

    runs_here: bool  # whether engines run in this process, their repeats timed through pytest-benchmark

    def backend(self, load_here: Callable[[], Backend]) -> Backend:
        """The model as the fixtures see it: ``load_here()``, or one with no runner where the models live elsewhere."""
        ...

    def environment(self) -> Environment | None:
        """The session's environment where its models live elsewhere (the first node's); None: this machine's."""
        ...

    def engine(self, name: str, config: EngineConfig, backend: Backend) -> BatchingEngine: ...

    def measure(self, job: Job) -> Timings | PairedTimings: ...

    def measure_capacity(self, job: CapacityJob) -> CapacityTimings: ...


class LocalMeasurer:
    """The engine runs in this process: each repeat between two machine probes, metered here."""

    runs_here = True

    def __init__(self, endpoint: str | None = None, api_key: str | None = None) -> None:
        """``endpoint``: ``--perf-endpoint``, asked once a session before the first ``openai-http`` is built."""
        self._endpoint, self._api_key = endpoint, api_key
        self._endpoint_check: EndpointCheck | None = None

    def backend(self, load_here: Callable[[], Backend]) -> Backend:
        return load_here()

    def environment(self) -> Environment | None:
        return None

    def engine(self, name: str, config: EngineConfig, backend: Backend) -> BatchingEngine:
        """Built here; a server's client first asks its ``--perf-endpoint`` (once a session, ``plugin.endpoint``)."""
        from perfsuite.adapters import build_engine
        from perfsuite.adapters.http_options import SERVER_ENGINE

        if name == SERVER_ENGINE and self._endpoint:  # one answer a session, not a failure a test
            if self._endpoint_check is None:  # the option's, not the backend's: a project's own perf_backend has none
                self._endpoint_check = EndpointCheck(self._endpoint, self._api_key)
            self._endpoint_check.require()
        return build_engine(name, backend, config)

    def measure(self, job: Job) -> Timings:
        from perfsuite.measure.environment import server_environment

        engine, conditions = job.engine, job.conditions
        repeats = EngineRepeats(engine, job.requests, job.max_concurrency, conditions.warmup_runs, job.num_repeats)
        backend = conditions.backend
        timed = measure_engine(repeats, backend.device, backend.probe, conditions.busy_threshold, conditions.rounds)
        server = None if runs_in_process(engine) else server_environment(engine, conditions.server_label)
        return Timings(timed.summarised(), environment=server, server=server)

    def measure_capacity(self, job: CapacityJob) -> CapacityTimings:
        from perfsuite.measure.timing import timed_run

        engine, conditions = job.engine, job.conditions
        backend, in_process = conditions.backend, runs_in_process(engine)  # a server's machine: not probed

        def run(requests: Sequence[Request], max_concurrency: int | None) -> RunResult:
            return timed_run(engine, requests, backend.device, max_concurrency=max_concurrency)

        runs = CapacityRuns(run, job.requests_at, job.slo, job.steady_state, job.choices)
        search = runs.prepare(conditions.warmup_runs)
        probes = BracketingProbe(backend.probe if in_process else None, backend.device)
        meter = MachineMeter("cpu", reads_cpu=in_process and backend.probe is not None, in_process=in_process)
        try:
            searches, timed = search_capacity(
                runs, job.num_repeats, probes, meter, conditions.busy_threshold, conditions.rounds
            )
        except CapacityError as error:
            raise MeasureFailed(f"{job.test_id}: no capacity under SLO {job.slo.label}: {error}") from None
        return CapacityTimings(search, searches, timed.summarised(), tuple(job.requests_at(1.0)))


class RayMeasurer:
    """``--perf-ray``: each test one typed request to an actor, which runs the repeat loop on its node."""

    runs_here = False

    def __init__(self, pool: RayPool, warnings: list[str]) -> None:
        self.pool = pool
        self.warnings = warnings

    def backend(self, load_here: Callable[[], Backend]) -> Backend:
        """No model here: the first node's actor tokenizes and reports the model's limits."""
        from perfsuite.plugin.cluster import cluster_backend

        return cluster_backend(self.pool)

    def environment(self) -> Environment | None:
        """The first node's, as its actor captured it; each test records its own node's."""
        return self.pool.describe().environment

    def engine(self, name: str, config: EngineConfig, backend: Backend) -> BatchingEngine:
        """A name and knobs an actor builds on its node."""
        from perfsuite.plugin.cluster import ClusterEngine

        return cast(BatchingEngine, ClusterEngine(name, config))  # a frozen stand-in: its name cannot be set

    def measure(self, job: Job) -> Timings:
        from perfsuite.cluster.wire import MeasureRequest

        engine = _factory_engine(job.test_id, job.engine)
        request = MeasureRequest(
            job.test_id,
            engine.knobs,
            job.requests,
            job.max_concurrency,
            job.conditions.warmup_runs,
            job.num_repeats,
            job.conditions.busy_threshold,
        )
        result = self._delivered(job.test_id, engine, request)
        runs = Repeats(result.runs, result.probes, result.busy_shares, result.noisy, device_memory=result.device_memory)
        return Timings(runs, environment=result.environment, node=str(result.node))

    def measure_capacity(self, job: CapacityJob) -> CapacityTimings:
        from perfsuite.cluster.wire import CapacityRequest

        engine = _factory_engine(job.test_id, job.engine)
        requests = _scaled_by_rate(job)
        request = CapacityRequest(
            job.test_id,
            engine.knobs,
            requests,
            job.slo,
            job.steady_state,
            job.choices,
            job.conditions.warmup_runs,
            job.num_repeats,
            job.conditions.busy_threshold,
        )
        result = self._delivered(job.test_id, engine, request)
        if result.no_capacity is not None:
            where = f"(on node {result.node})"
            raise MeasureFailed(f"{job.test_id}: no capacity under SLO {job.slo.label} {where}: {result.no_capacity}")
        at_capacity = Repeats(result.at_capacity, result.probes, result.busy_shares, result.noisy)
        return CapacityTimings(
            result.search, result.searches, at_capacity, requests, result.environment, str(result.node)
        )

    def _delivered(self, test_id: str, engine: BatchingEngine, request: Any) -> Any:
        """The actor's answer; a retry after its node died is warned of, a server's engine fails the test."""
        from perfsuite.cluster.pool import ClusterError

        try:
            delivered = self.pool.measure(request)
        except ClusterError as error:
            raise MeasureFailed(str(error), unrecorded=True) from None
        result = delivered.result
        if not result.runs_in_process:  # a sweep case's openai-http: the server's fingerprint, not the node's
            raise MeasureFailed(
                f"{test_id}: {engine.name} measures a server in another process; measure it without --perf-ray"
            )
        if delivered.retried_after is not None:
            self.warnings.append(f"{test_id}: measured on node {result.node} after {delivered.retried_after}")
        return result


def _scaled_by_rate(job: CapacityJob) -> tuple[Request, ...]:
    """``requests_at(1.0)``, checked to be what the actor's probes scale to each rate (``plugin.capacity``)."""
    requests = tuple(job.requests_at(1.0))
    mismatch = rate_scaling_mismatch(requests, job.requests_at(RATE_CHECKED), RATE_CHECKED)
    if mismatch is not None:
        raise MeasureFailed(
            f"{job.test_id}: under --perf-ray the actor makes each probe's requests from requests_at(1.0), their "
            f"arrival offsets divided by the rate, but requests_at({RATE_CHECKED:g}) is not that: {mismatch}; make "
            "requests_at(rate) with perf_workload_factory(..., rate=rate), or run this test without --perf-ray"
        )
    return requests


def _factory_engine(test_id: str, engine: BatchingEngine) -> Any:
    """Under ``--perf-ray`` an engine is a name and knobs an actor builds: one the test built cannot travel."""
    from perfsuite.plugin.cluster import ClusterEngine

    return _require(test_id, engine, ClusterEngine, "--perf-ray", "an actor builds it by name on its node")


def _require(test_id: str, engine: BatchingEngine, stand_in: type, option: str, why: str) -> Any:
    if not isinstance(engine, stand_in):
        raise MeasureFailed(
            f"{test_id}: under {option} the engine must come from perf_engine_factory ({why}); "
            f"this test built {engine.name!r} itself"
        )
    return engine


class ShardMeasurer:
    """``--perf-client-shards N``: a server's load sent by N client actors, each repeat through the one loop.

    A repeat in which a shard fell behind its schedule measured the client,
    not the server: the loop re-runs it as a disturbed repeat. An in-process
    engine has no client to split: ``on_cluster`` (the Ray measurer) runs it.
    """

    runs_here = False

    def __init__(self, shards: ClientShards, on_cluster: Measurer) -> None:
        self.shards = shards
        self.on_cluster = on_cluster

    def backend(self, load_here: Callable[[], Backend]) -> Backend:
        return self.on_cluster.backend(load_here)

    def environment(self) -> Environment | None:
        return self.on_cluster.environment()

    def engine(self, name: str, config: EngineConfig, backend: Backend) -> BatchingEngine:
        return self.on_cluster.engine(name, config, backend)

    def measure(self, job: Job) -> Timings | PairedTimings:
        if runs_in_process(job.engine):
            return self.on_cluster.measure(job)
        from perfsuite.measure.environment import served_model_environment

        _factory_engine(job.test_id, job.engine)
        for _ in range(job.conditions.warmup_runs):
            self._send(job)
        probes = BracketingProbe(None, "cpu")  # the server's machine is not this one: not probed
        loop = RepeatLoop(lambda: self._repeat(job), probes, job.conditions.busy_threshold, reason=_shards_reason)
        timed = loop.run(job.num_repeats)
        last = _sharded(timed.repeats[-1])
        nodes = ", ".join(sorted({str(part.node) for part in last.shards}))
        server = served_model_environment(last.served_model, job.conditions.server_label)
        # Sent by N clients on other hosts, not one: judged only against runs sent the same way
        sent_by = (("client_shards", len(last.shards)),)
        return Timings(timed.summarised(), server, server, f"client shards on {nodes}", sent_by)

    def measure_capacity(self, job: CapacityJob) -> CapacityTimings:
        return self.on_cluster.measure_capacity(job)

    def _send(self, job: Job) -> ShardedRun:
        from perfsuite.cluster.pool import ClusterError

        try:
            return self.shards.run(job.test_id, job.requests, job.engine.batch_size, job.max_concurrency)
        except ClusterError as error:
            raise MeasureFailed(str(error), unrecorded=True) from None

    def _repeat(self, job: Job) -> Repeat:
        sharded = self._send(job)
        lagging = shards_client_bound_reason(per_shard_runs([sharded]))
        return Repeat(sharded.merged, lagging=lagging, payload=sharded)


def _sharded(repeat: Repeat) -> ShardedRun:
    assert isinstance(repeat.payload, ShardedRun), "a client shards' repeat carries its sharded run"
    return repeat.payload


def _shards_reason(repeats: Sequence[Repeat], threshold: float) -> str | None:
    lagging = shards_client_bound_reason(per_shard_runs([_sharded(repeat) for repeat in repeats]))
    return "; ".join(filter(None, (noisy_reason(repeats, threshold), lagging))) or None


def per_shard_runs(sharded: Sequence[ShardedRun]) -> list[tuple[str, list[RunResult]]]:
    """Each client shard's own runs (one per repeat, on its own clock), by the shard's name, for its send-lag check."""
    by_shard: dict[str, list[RunResult]] = {}
    for run in sharded:
        for part in run.shards:
            by_shard.setdefault(part.name, []).append(part.run)
    return list(by_shard.items())


PairsTransport = Callable[[Job, Any, int | None], tuple[Any, bool, str | None, Environment | None]]
"""One test's pairs: (``ab.pair.PairedRuns``, both sides in process, the node, its environment)."""


class PairedMeasurer:
    """``--perf-against``: the warm-ups, then ``num_repeats`` pairs, each side in its worker, here or on a node."""

    runs_here = False

    def __init__(
        self,
        transport: PairsTransport,
        threads: int | None,
        models: Measurer | None = None,
        workers: Against | None = None,
    ) -> None:
        """``models``: where the models live on a cluster (a Ray pool's measurer); ``workers``: the local A/B
        workers, whose current tree tokenizes."""
        self.transport = transport
        self.threads = threads
        self.models = models
        self.workers = workers

    def backend(self, load_here: Callable[[], Backend]) -> Backend:
        """No model here: the current tree's first worker tokenizes, or on a cluster the first node's actor."""
        from perfsuite.plugin.against import worker_backend

        if self.models is not None:
            return self.models.backend(load_here)
        assert self.workers is not None, "local A/B tokenizes through its workers"
        return worker_backend(self.workers)

    def environment(self) -> Environment | None:
        return None if self.models is None else self.models.environment()

    def engine(self, name: str, config: EngineConfig, backend: Backend) -> BatchingEngine:
        """A name and knobs both sides' workers build."""
        from perfsuite.plugin.against import WorkerEngine

        return cast(BatchingEngine, WorkerEngine(name, config))  # a frozen stand-in: its name cannot be set

    def measure(self, job: Job) -> PairedTimings:
        from perfsuite.ab.pair import different_output_lengths
        from perfsuite.plugin.against import WorkerEngine

        engine = _require(job.test_id, job.engine, WorkerEngine, "--perf-against", "the workers build it by name")
        paired, in_process, node, environment = self.transport(job, engine, self.threads)
        if not in_process:
            raise MeasureFailed(
                f"{job.test_id}: {engine.name} runs in another process, the same for both sides: "
                "--perf-against measures in-process engines"
            )
        unequal = different_output_lengths(paired)
        if unequal:
            raise MeasureFailed(
                f"{job.test_id}: the runs made different numbers of tokens, so their speeds cannot be compared "
                f"(a side that does less looks faster): {'; '.join(unequal[:5])}"
            )
        current = Repeats(paired.current, busy_shares=paired.current_busy)
        reference = Repeats(paired.reference, busy_shares=paired.reference_busy)
        return PairedTimings(current, reference, paired.order, paired.num_threads, environment, node)

    def measure_capacity(self, job: CapacityJob) -> CapacityTimings:
        raise NotMeasured("capacity under --perf-against is not supported yet: its workers run fixed workloads")


def pairs_in_workers(against: Against, ref: str) -> PairsTransport:
    """The local A/B workers' pairs (``ab.pair.ABRunner``)."""

    def pairs(job: Job, engine: Any, threads: int | None) -> tuple[Any, bool, str | None, Environment | None]:
        from perfsuite.ab.workers import WorkerError

        runner = against.runner
        assert runner is not None, "the local A/B transport needs the workers"
        try:
            built = runner.build(engine.spec)
            paired = runner.run_pairs(
                engine.spec, job.requests, job.max_concurrency, job.conditions.warmup_runs, job.num_repeats, threads
            )
        except WorkerError as error:
            raise MeasureFailed(f"{job.test_id}: --perf-against {ref}: {error}") from None
        return paired, all(side.runs_in_process for side in built), None, None

    return pairs


def pairs_on_cluster(pool: PairPool, ref: str, warnings: list[str]) -> PairsTransport:
    """``--perf-against`` with ``--perf-ray``: the pairs from the node that ran both sides (``plugin.against_on_ray``)."""

    def pairs(job: Job, engine: Any, threads: int | None) -> tuple[Any, bool, str | None, Environment | None]:
        from perfsuite.ab.on_ray import paired_runs
        from perfsuite.cluster.pool import ClusterError
        from perfsuite.cluster.wire import PairResult
        from perfsuite.plugin.against_on_ray import measure_pairs

        try:
            delivered = measure_pairs(
                pool,
                job.test_id,
                engine,
                job.requests,
                job.max_concurrency,
                job.conditions.warmup_runs,
                job.num_repeats,
                threads,
            )
        except ClusterError as error:
            raise MeasureFailed(f"--perf-against {ref}: {error}", unrecorded=True) from None
        result = delivered.result
        assert isinstance(result, PairResult), "a pair pool answers pairs"
        if delivered.retried_after is not None:
            warnings.append(f"{job.test_id}: measured on node {result.node} after {delivered.retried_after}")
        return paired_runs(result), result.runs_in_process, str(result.node), result.environment

    return pairs


def start_transports(session: Any, invocation_dir: Path) -> None:
    """Start what the session's mode measures through (``PerfSession``): the A/B workers, here or on a cluster;
    the Ray pool; the client shards. Nothing for a local session."""
    options = session.options
    if options.against is not None and options.ray is not None:  # both sides on one node per test
        from perfsuite.plugin.against_on_ray import start_against_on_cluster

        session.against, session.cluster = start_against_on_cluster(
            options, session.rootdir, invocation_dir, session.warnings
        )
    elif options.against is not None:
        from perfsuite.plugin.against import load_message, start_against

        load = load_message(options.model, options.device, options.dtype, options.decode_mode, invocation_dir)
        session.against = start_against(
            options.against, session.rootdir, invocation_dir, load, options.worker_timeout, options.against_workers
        )
    elif options.ray is not None:
        from perfsuite.plugin.cluster import start_client_shards, start_cluster

        session.cluster = start_cluster(options)
        if options.client_shards > 1:
            session.client_shards = start_client_shards(options)


def measurer_for(session: Any) -> Measurer:
    """The session's measurer, from the transports it started (``PerfSession``): chosen once, at its start."""
    from perfsuite.plugin.options import AUTO_THREADS

    options = session.options
    if session.against is not None:
        threads = None if options.against_threads == AUTO_THREADS else options.against_threads
        if session.cluster is not None:
            transport = pairs_on_cluster(session.cluster, options.against, session.warnings)
            return PairedMeasurer(transport, threads, RayMeasurer(session.cluster, session.warnings))
        return PairedMeasurer(pairs_in_workers(session.against, options.against), threads, workers=session.against)
    if session.cluster is None:
        return LocalMeasurer(options.endpoint, options.http_client.api_key)
    on_cluster = RayMeasurer(session.cluster, session.warnings)
    if session.client_shards is not None:
        return ShardMeasurer(session.client_shards, on_cluster)
    return on_cluster
