"""What travels between the controller and a measurement actor: typed messages through the structural codec.

Every message is a frozen dataclass encoded by ``perfsuite.codec`` into a
JSON string with its type and the protocol version; the receiver rebuilds
it from its own classes and refuses another version or an unknown shape
with a ``ClusterWireError`` naming it. Ray carries only these strings, so
nothing pickled (no model, no engine, no tensor) crosses the wire, and a
node running another perfsuite cannot silently measure another workload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfsuite.adapters.http_options import HttpClientOptions
from perfsuite.adapters.registry import EngineSpec
from perfsuite.adapters.server_info import ServedModel
from perfsuite.codec import CodecError, Protocol
from perfsuite.engine import Request, RunResult
from perfsuite.measure.capacity import Capacity, CapacitySearch, SteadyState
from perfsuite.measure.capacity_runs import SearchChoices
from perfsuite.measure.environment import Environment
from perfsuite.measure.metrics import SLO

PROTOCOL_VERSION = 3  # 2: capacity searches, A/B pairs and client shards; 3: an engine as its name and EngineConfig


class ClusterWireError(CodecError):
    """A message this side cannot read: malformed, of another protocol version, or of another type than expected."""


@dataclass(frozen=True, slots=True)
class ActorModel:
    """The model an actor loads once and keeps: actors are reused by it (one per node and model).

    Not ``perfsuite.models.ModelSpec`` (which model a name resolves to): this
    is the model's name as given, with the device, dtype and decode mode to
    load it in, as the A/B worker's ``Load`` message carries them.
    """

    model: str
    device: str
    dtype: str
    decode_mode: str


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """The Ray node an actor runs on, as the messages name it."""

    node_id: str
    hostname: str
    ip: str

    def __str__(self) -> str:
        return f"{self.hostname} ({self.ip}, node {self.node_id[:12]})"


@dataclass(frozen=True, slots=True)
class Described:
    """The actor's loaded model and its node: what the controller's fixtures need instead of a local model."""

    node: NodeInfo
    environment: Environment  # captured on the node: the fingerprint its measurements are stored under
    device: str
    max_context: int
    eos_token_id: int | None
    vocab_size: int | None
    special_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Tokenize:
    text: str


@dataclass(frozen=True, slots=True)
class Tokens:
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MeasureRequest:
    """One perf test's measurement: warm-ups (discarded), then ``repeats`` timed runs, each between two probes."""

    test_id: str
    engine: EngineSpec
    requests: tuple[Request, ...]
    max_concurrency: int | None
    warmup_runs: int
    repeats: int
    busy_threshold: float


@dataclass(frozen=True, slots=True)
class MeasureResult:
    """The repeats of one ``MeasureRequest``, every one of them from ``node``, with what was read around each."""

    test_id: str
    node: NodeInfo
    environment: Environment
    runs: tuple[RunResult, ...]
    probes: tuple[float, ...] = ()  # the machine probe around each repeat, on the node
    busy_shares: tuple[float, ...] = ()  # other work's share of the node's CPU during each repeat
    noisy: str | None = None
    device_memory: tuple[int, ...] = ()
    runs_in_process: bool = True


@dataclass(frozen=True, slots=True)
class CapacityRequest:
    """One capacity test: warm-ups, the offline run that sets the start, then ``repeats`` searches, all on one node.

    ``requests``: the probe's requests at 1 req/s; each probe at rate r sends
    them with their arrival offsets divided by r (``measure.capacity_runs.scaled_to``).
    """

    test_id: str
    engine: EngineSpec
    requests: tuple[Request, ...]
    slo: SLO
    steady_state: SteadyState
    choices: SearchChoices
    warmup_runs: int
    repeats: int
    busy_threshold: float

    @property
    def max_runs(self) -> int:
        """The most runs it can take (warm-ups, the start, the unloaded probe, every search's probes)."""
        return self.warmup_runs + 2 + self.repeats * CapacitySearch().max_probes


@dataclass(frozen=True, slots=True)
class CapacityResult:
    """The searches of one ``CapacityRequest``, every probe of every one of them from ``node``.

    ``at_capacity``: each search's run at the capacity it found; ``probes`` and
    ``busy_shares``: the machine probe around each search and other work's
    share of the node's CPU during it. ``no_capacity``: why a search found
    none (the searches before it are dropped: the test fails).
    """

    test_id: str
    node: NodeInfo
    environment: Environment
    search: CapacitySearch
    searches: tuple[Capacity, ...] = ()
    at_capacity: tuple[RunResult, ...] = ()
    probes: tuple[float, ...] = ()
    busy_shares: tuple[float, ...] = ()
    noisy: str | None = None
    no_capacity: str | None = None
    runs_in_process: bool = True


# -- A/B on a cluster (``--perf-against`` with ``--perf-ray``): both sides on one node (docs/ray.md) ----------------


@dataclass(frozen=True, slots=True)
class PairSetup:
    """What a node's A/B actor sets up once, beside the two trees' tarballs: the sides' workers and their model."""

    ref: str  # --perf-against as the user gave it
    reference_commit: str | None  # None: a checkout that is not a git repository
    current_commit: str | None
    perfsuite_in_trees: bool  # False: a project that installs perfsuite; both sides import the node's
    model: ActorModel
    workers_per_side: int
    timeout: float  # --perf-worker-timeout: one run of one side


@dataclass(frozen=True, slots=True)
class PairRequest:
    """One perf test's A/B measurement: warm-ups on every worker, then ``num_pairs`` pairs in ABBA order."""

    test_id: str
    engine: EngineSpec
    requests: tuple[Request, ...]
    max_concurrency: int | None
    warmup_runs: int
    num_pairs: int
    threads: int | None = None  # every worker's intra-op threads; None: chosen on the node from its free cores


@dataclass(frozen=True, slots=True)
class PairResult:
    """A ``PairRequest``'s pairs, both sides run on ``node`` (``perfsuite.ab.pair.PairedRuns``, field by field)."""

    test_id: str
    node: NodeInfo
    environment: Environment  # the node's: the fingerprint the test is recorded under
    reference: tuple[RunResult, ...]  # side A
    current: tuple[RunResult, ...]  # side B
    order: tuple[str, ...]  # "AB" or "BA", per pair
    workers: tuple[int, ...] = ()
    reference_busy: tuple[float, ...] = ()
    current_busy: tuple[float, ...] = ()
    num_threads: int | None = None
    runs_in_process: bool = True  # False: the engine is a server in another process, on both sides


@dataclass(frozen=True, slots=True)
class PairFailed:
    """A side's worker died, hung or raised on ``node``: the test fails with ``message``, the actor lives on."""

    test_id: str
    node: NodeInfo
    message: str


MESSAGES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        ActorModel,
        NodeInfo,
        Described,
        Tokenize,
        Tokens,
        MeasureRequest,
        MeasureResult,
        CapacityRequest,
        CapacityResult,
        PairSetup,
        PairRequest,
        PairResult,
        PairFailed,
    )
}


# --------------------------------------------------------------------------- client shards (--perf-client-shards)


@dataclass(frozen=True, slots=True)
class HttpClientSpec:
    """What a client shard sends to: the server's URL and the ``openai-http`` client's options (API key included)."""

    endpoint: str
    options: HttpClientOptions


@dataclass(frozen=True, slots=True)
class ClockReading:
    """A shard's ``time.perf_counter`` when it answered: one round trip of the clock-offset estimate."""

    seconds: float


@dataclass(frozen=True, slots=True)
class ShardPrepare:
    """Build (or reuse) the shard's client for ``batch_size`` connections and settle its prompt format, untimed."""

    batch_size: int
    probe_prompt_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ShardRun:
    """One shard's share of a schedule, its arrival offsets unchanged, from ``start_time`` on the shard's clock.

    ``max_concurrency``: a closed loop, which has no schedule to split: one shard sends every request.
    """

    test_id: str
    shard: int
    batch_size: int
    requests: tuple[Request, ...]
    start_time: float
    max_concurrency: int | None = None


@dataclass(frozen=True, slots=True)
class ShardResult:
    """A shard's run, its timestamps on the shard's own clock, and the server's model as it answered."""

    test_id: str
    shard: int
    node: NodeInfo
    run: RunResult
    served_model: ServedModel


MESSAGES.update({cls.__name__: cls for cls in (HttpClientSpec, ClockReading, ShardPrepare, ShardRun, ShardResult)})


PROTOCOL = Protocol(
    "the cluster protocol",
    PROTOCOL_VERSION,
    MESSAGES,
    ClusterWireError,
    on_other_version=": install the same perfsuite on every node and the controller",
)


def dumps(message: Any) -> str:
    """``message`` in the envelope (``perfsuite.codec.Protocol``): its fields, its type and the protocol version."""
    return PROTOCOL.dumps(message)


def loads(expected: type, text: str) -> Any:
    """``text`` (from ``dumps``) as this side's ``expected`` message; ``ClusterWireError`` naming what is wrong."""
    return PROTOCOL.loads(text, (expected,))


def loads_one_of(expected: tuple[type, ...], text: str) -> Any:
    """``text`` as whichever of the ``expected`` messages it is (an answer or its failure)."""
    return PROTOCOL.loads(text, expected)
