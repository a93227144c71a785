"""``--perf-ray ADDRESS``: the session's Ray pool, and the fixtures' stand-ins for a model and engines on it.

The pytest process stays the controller: it collects, plans power, judges
and writes results, history and the report. No model is loaded here: the
first node's actor tokenizes the workloads and reports the model's limits
(as the current tree's worker does under ``--perf-against``), and an engine
``perf_engine_factory`` returns is a ``ClusterEngine``, a registered name
and knobs that an actor builds. ``perf.measure`` sends it, the requests and
the repeats as one typed ``MeasureRequest`` and waits for its result.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from typing import TypeVar

import pytest

from perfsuite.adapters.protocol import Backend, EngineConfig
from perfsuite.adapters.registry import EngineSpec
from perfsuite.cluster import wire
from perfsuite.cluster.client_pool import ClientShards, client_cpus
from perfsuite.cluster.pool import ClusterError, RayPool
from perfsuite.engine.names import SERVER_ENGINES
from perfsuite.plugin.options import PerfOptions

P = TypeVar("P", bound=RayPool)

INSTALL_HINT = "--perf-ray needs Ray: pip install 'perfsuite[ray]'"


def start_cluster(options: PerfOptions) -> RayPool:
    """Join (or start) the cluster; a usage error when Ray is missing or the cluster cannot be reached."""
    require_ray()
    assert options.ray is not None, "start the cluster only under --perf-ray"
    spec = wire.ActorModel(options.model, options.device, options.dtype, options.decode_mode)
    return connect(RayPool(options.ray, spec, options.worker_timeout, first_node=_xdist_worker_number()))


def connect(pool: P) -> P:
    """``pool`` joined to its cluster, closed at exit; a usage error when Ray is missing or the cluster unreachable."""
    require_ray()
    try:
        pool.connect()
    except ClusterError as error:
        raise pytest.UsageError(str(error)) from None
    atexit.register(pool.close)  # an interrupt that skips pytest_unconfigure still leaves no actor behind
    return pool


def start_client_shards(options: PerfOptions) -> ClientShards:
    """``--perf-client-shards N``: the client actors that split openai-http's schedules (started on first use)."""
    cpus = client_cpus()
    if options.client_shards > cpus:
        raise pytest.UsageError(
            f"--perf-client-shards {options.client_shards}: the cluster's live nodes have {cpus} CPU(s), one for each "
            f"shard's client; give at most {cpus}, or add a node (`ray start --address=HEAD:6379`)"
        )
    assert options.endpoint is not None, "client shards send to --perf-endpoint (read_options requires it)"
    spec = wire.HttpClientSpec(options.endpoint, options.http_client)
    shards = ClientShards(options.client_shards, spec, options.worker_timeout)
    atexit.register(shards.close)
    return shards


def require_ray() -> None:
    try:
        import ray  # noqa: F401 - only to say what to install
    except ImportError:
        raise pytest.UsageError(INSTALL_HINT) from None


def _xdist_worker_number() -> int:
    """N for pytest-xdist's worker gwN (each worker is a controller of its own), else 0."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


def cluster_backend(pool: RayPool) -> Backend:
    """The model as the fixtures see it, with no runner: the actors hold the models."""
    try:
        described = pool.describe()
    except ClusterError as error:
        pytest.fail(str(error), pytrace=False)
    return Backend.held_elsewhere(pool.tokenize, described)


@dataclass(frozen=True, slots=True)
class ClusterEngine:
    """An engine an actor builds by name on its node; ``perf.measure`` runs it there."""

    name: str
    config: EngineConfig
    greedy_equal = False  # checked by the correctness tests, not here
    # The actor builds the real engine on its node and checks there that it resolves a multi-turn workload's
    # follow-ups (perfsuite's own engines do, in Engine.run); one that does not fails the test naming it.
    resolves_follow_ups = True

    @property
    def runs_in_process(self) -> bool:
        """False for a server's client (``openai-http``): client shards send its load (``start_client_shards``)."""
        return self.name not in SERVER_ENGINES

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @property
    def knobs(self) -> EngineSpec:
        return EngineSpec(self.name, self.config)

    def run(self, requests, on_step=None, max_concurrency=None):
        raise RuntimeError(
            f"{self.name}: under --perf-ray an engine runs on a Ray actor, not in the pytest process; "
            "pass it to perf.measure(engine, requests)"
        )
