"""The controller's end of ``--perf-ray``: connect to the cluster, keep one actor per node, measure, survive faults.

Actors are created on demand, one per node that has the resources a
measurement needs (``NodeAffinitySchedulingStrategy``, hard), each loading
the session's model once and kept for every later test. Tests go to the
usable nodes in turn, so a session spreads over the cluster and each test's
repeats all come from one node.

Faults (docs/ray.md):

- an actor that dies (its process, or its whole node) fails the attempt; the
  test is run again, all its repeats, on another node, once. The node whose
  actor died takes no more tests this session. A second death, or no other
  node to retry on, is a ``ClusterError`` naming both nodes;
- an actor that does not answer within ``timeout`` seconds is killed and
  its test fails (not retried: a hang would likely hang again);
- a cluster in which no live node has the resources fails the test at once,
  before anything is scheduled (Ray would otherwise wait forever for a node);
- an error raised by the measurement itself (an unknown engine, a request
  the model cannot hold) fails the test with that error, and the actor lives on.

Joining a cluster is bounded: before ``ray.init`` the address it would dial
is probed (``PROBE_SECONDS``), since Ray itself retries an address where
nothing listens for minutes, printing only its own "Failed to connect to GCS".

Ray is imported only here, inside the methods, and only under ``--perf-ray``.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from perfsuite.cluster import wire

LOCAL = "local"
AUTO = "auto"
START_SECONDS = 300.0  # a fresh node imports torch and loads the model before its actor answers
# Tokenizing is not a measurement: --perf-worker-timeout bounds a run, and a tight one (a hang test's 10 ms) must not
# fail the round trip that builds the workload before any run starts.
TOKENIZE_SECONDS = 60.0
ERROR_CHARS = 600
PROBE_SECONDS = 3.0  # a head on another machine answers a TCP connect in milliseconds; a firewall's drop never does


class ClusterError(RuntimeError):
    """A measurement the cluster could not deliver; the message names the node(s) and what to do."""


class _ActorDied(Exception):
    def __init__(self, node: wire.NodeInfo, message: str) -> None:
        super().__init__(message)
        self.node = node


@dataclass(frozen=True, slots=True)
class Requirement:
    """What one measurement actor reserves on its node."""

    num_cpus: float
    num_gpus: float

    @classmethod
    def for_device(cls, device: str) -> Requirement:
        return cls(num_cpus=0, num_gpus=1) if device.startswith("cuda") else cls(num_cpus=1, num_gpus=0)

    def fits(self, resources: dict[str, float]) -> bool:
        return resources.get("CPU", 0) >= self.num_cpus and resources.get("GPU", 0) >= self.num_gpus

    def describe(self) -> str:
        return f"{self.num_gpus:g} GPU" if self.num_gpus else f"{self.num_cpus:g} CPU"

    def bundle(self) -> dict[str, float]:
        """As a placement group's bundle: the resources it reserves, none of them zero (Ray refuses those)."""
        return {name: amount for name, amount in (("CPU", self.num_cpus), ("GPU", self.num_gpus)) if amount}


@dataclass(frozen=True, slots=True)
class Delivered:
    """A measurement's result, and the first attempt's failure when it was retried on another node."""

    result: wire.MeasureResult | wire.CapacityResult | wire.PairResult  # the last from ``cluster.pairs``
    retried_after: str | None = None


Measurement = wire.MeasureRequest | wire.CapacityRequest

# Each request: the actor's method that answers it, and the answer's message.
_ANSWERS: dict[type, tuple[str, type]] = {
    wire.MeasureRequest: ("measure", wire.MeasureResult),
    wire.CapacityRequest: ("measure_capacity", wire.CapacityResult),
}


class RayPool:
    """The session's actors on the cluster at ``address`` (``local``, ``auto`` or an address)."""

    def __init__(self, address: str, spec: wire.ActorModel, timeout: float, first_node: int = 0) -> None:
        self.address = address
        self.spec = spec
        self.timeout = timeout
        self.requirement = Requirement.for_device(spec.device)
        self._actors: dict[str, Any] = {}  # node id -> actor handle
        self._nodes: dict[str, wire.NodeInfo] = {}
        self._dead: set[str] = set()  # nodes whose actor died: no more tests go there
        self._first_node = first_node  # pytest-xdist worker N starts at the Nth node, so workers spread out
        self._next = first_node
        self._connected_here = False
        self._temp_dir: str | None = None
        self._described: wire.Described | None = None

    def connect(self) -> None:
        """Join (or, for ``local``, start) the cluster; a session already connected to Ray is reused as it is."""
        import ray

        if ray.is_initialized():
            return
        options: dict[str, Any] = {"configure_logging": False, "log_to_driver": False}
        if self.address == LOCAL:
            self._temp_dir = tempfile.mkdtemp(prefix="perfsuite-ray-")
            options.update(include_dashboard=False, _temp_dir=self._temp_dir)
            address = None
        else:
            address = self.address
            self._probe()
        try:
            ray.init(address=address, **options)
        except Exception as error:
            self._remove_temp_dir()
            raise ClusterError(
                f"--perf-ray {self.address}: cannot join the Ray cluster: {_short(error)}. Start one with "
                "`ray start --head` (docs/ray.md), or give --perf-ray local"
            ) from None
        self._connected_here = True

    def _probe(self) -> None:
        """A ``ClusterError`` when nothing accepts a connection where ``ray.init`` would dial, within seconds."""
        target = _dialled(self.address)
        if target is None:
            return  # Ray finds no address to dial (auto with no cluster here) and says so at once itself
        host, port = target
        try:
            socket.create_connection((host, port), timeout=PROBE_SECONDS).close()
        except OSError as error:
            timed_out = isinstance(error, TimeoutError)
            reason = f"no answer in {PROBE_SECONDS:g} s" if timed_out else (error.strerror or str(error)).lower()
            raise ClusterError(
                f"--perf-ray {self.address}: nothing accepts connections at {host}:{port} ({reason}); check that "
                "`ray start --head` runs on that machine and that this is its address and port (`ray status` there "
                "prints them), or give --perf-ray local"
            ) from None

    def describe(self) -> wire.Described:
        """The model as the first usable node loaded it: the fixtures' backend, the session's environment."""
        if self._described is None:
            nodes = self._usable_nodes()
            node = nodes[self._first_node % len(nodes)]
            try:
                self._described = self._load_on(node)
            except _ActorDied as died:
                raise ClusterError(str(died)) from None
        return self._described

    def tokenize(self, text: str) -> tuple[int, ...]:
        """On the node that described the model; should its actor die, on the next usable node (same model)."""
        try:
            return self._tokenize_on(self.describe().node, text)
        except _ActorDied:
            self._described = None
        try:
            return self._tokenize_on(self.describe().node, text)
        except _ActorDied as died:
            raise ClusterError(str(died)) from None

    def _tokenize_on(self, node: wire.NodeInfo, text: str) -> tuple[int, ...]:
        actor = self._actor_on(node)
        seconds = max(self.timeout, TOKENIZE_SECONDS)
        answer = self._get(actor.tokenize.remote(wire.dumps(wire.Tokenize(text))), node, seconds, "tokenize")
        return wire.loads(wire.Tokens, answer).token_ids

    def measure(self, request: Measurement) -> Delivered:
        """``request`` on the next usable node; once more, all of it, on another node should its actor die.

        A capacity test is one request: every search of it, and every probe of each, runs on one node.
        """
        return self._deliver(lambda node: self._measure_on(node, request))

    def _deliver(self, measure_on: Callable[[wire.NodeInfo], Any]) -> Delivered:
        nodes = self._usable_nodes()
        first = nodes[self._next % len(nodes)]
        self._next += 1
        try:
            return Delivered(measure_on(first))
        except _ActorDied as died:
            others = [node for node in self._usable_nodes(must_have_one=False) if node.node_id != first.node_id]
            if not others:
                raise ClusterError(
                    f"{died}; no other node of the cluster has {self.requirement.describe()} free to retry it on"
                ) from None
            try:
                return Delivered(measure_on(others[0]), retried_after=str(died))
            except _ActorDied as again:
                raise ClusterError(f"{died}; its retry died too: {again}") from None

    def close(self) -> None:
        """Kill every actor and, when this session started or joined Ray, disconnect (and remove a local temp dir)."""
        try:
            import ray
        except ImportError:
            return
        self._release_actors()
        if self._connected_here:
            ray.shutdown()
            self._connected_here = False
        self._remove_temp_dir()

    def _release_actors(self) -> None:
        import ray

        for actor in self._actors.values():
            try:
                ray.kill(actor)
            except Exception:
                pass
        self._actors.clear()

    @property
    def nodes_used(self) -> tuple[wire.NodeInfo, ...]:
        return tuple(self._nodes[node_id] for node_id in self._actors)

    def _measure_on(self, node: wire.NodeInfo, request: Measurement) -> wire.MeasureResult | wire.CapacityResult:
        method, answer = _ANSWERS[type(request)]
        actor = self._actor_on(node)
        self._load_on(node)  # a new actor loads first
        remote = getattr(actor, method).remote(wire.dumps(request))
        text = self._get(remote, node, self._timeout_of(request), f"{method} {request.test_id}")
        result = wire.loads(answer, text)
        if result.node.node_id != node.node_id:
            raise ClusterError(f"{request.test_id}: asked node {node}, answered by {result.node}")
        return result

    def _timeout_of(self, request: Measurement) -> float:
        """``timeout`` bounds one measurement's runs; a capacity test's many runs get it for each run they may make."""
        if isinstance(request, wire.CapacityRequest):
            return self.timeout * request.max_runs
        return self.timeout

    def _usable_nodes(self, must_have_one: bool = True) -> list[wire.NodeInfo]:
        """Live nodes whose actor has not died: ours, and those with the resources for one free (another
        controller, a pytest-xdist worker, may hold the rest; an actor placed there would wait forever)."""
        import ray

        alive = [n for n in ray.nodes() if n.get("Alive")]
        free = _free_resources()
        usable = [
            _node_info(n)
            for n in alive
            if n["NodeID"] not in self._dead
            and self.requirement.fits(n.get("Resources", {}))
            and (n["NodeID"] in self._actors or free is None or self.requirement.fits(free.get(n["NodeID"], {})))
        ]
        if not usable and must_have_one:
            raise ClusterError(self._no_resources_message(alive))
        for node in usable:
            self._nodes.setdefault(node.node_id, node)
        return sorted(usable, key=lambda node: node.node_id)

    def _no_resources_message(self, alive: list[dict]) -> str:
        shown = "; ".join(f"{_node_info(n)}: {_resources(n)}" for n in alive) or "none"
        lost = f" (nodes whose actor died this session: {len(self._dead)})" if self._dead else ""
        flag = "--num-gpus 1" if self.requirement.num_gpus else "--num-cpus 1"
        return (
            f"--perf-ray {self.address}: no live node of the cluster has {self.requirement.describe()} free for a "
            f"measurement actor{lost}; its live nodes (all resources): {shown}. Add one with "
            f"`ray start --address=HEAD:6379 {flag}`"
        )

    def _load_on(self, node: wire.NodeInfo) -> wire.Described:
        """The model as ``node``'s actor loaded it (a new actor loads it now)."""
        text = self._get(self._actor_on(node).describe.remote(), node, START_SECONDS, "load the model")
        return wire.loads(wire.Described, text)

    def _actor_on(self, node: wire.NodeInfo):
        if node.node_id not in self._actors:
            self._actors[node.node_id] = self._new_actor(node)
        return self._actors[node.node_id]

    def _new_actor(self, node: wire.NodeInfo):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from perfsuite.cluster.actor import MeasureActor

        remote = ray.remote(MeasureActor).options(
            num_cpus=self.requirement.num_cpus,
            num_gpus=self.requirement.num_gpus,
            max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
        )
        return remote.remote(wire.dumps(self.spec))

    def _get(self, ref, node: wire.NodeInfo, timeout: float, what: str) -> str:
        import ray
        from ray.exceptions import ActorUnschedulableError, GetTimeoutError, RayActorError, RayTaskError

        try:
            return ray.get(ref, timeout=timeout)
        except GetTimeoutError:
            self._drop(node, kill=True)
            raise ClusterError(
                f"the actor on node {node} did not answer `{what}` within {timeout:g} s and was killed; raise "
                "--perf-worker-timeout if a measurement can take longer"
            ) from None
        except (RayActorError, ActorUnschedulableError) as error:
            self._drop(node, kill=True)
            self._dead.add(node.node_id)
            raise _ActorDied(node, f"the actor on node {node} died during `{what}`: {_short(error)}") from None
        except RayTaskError as error:
            raise ClusterError(f"`{what}` failed on node {node}: {_short(error)}") from None
        except BaseException:  # Ctrl-C: the measurement in flight is abandoned with its actor
            self._drop(node, kill=True)
            raise

    def _drop(self, node: wire.NodeInfo, kill: bool) -> None:
        import ray

        actor = self._actors.pop(node.node_id, None)
        if actor is not None and kill:
            try:
                ray.kill(actor)
            except Exception:
                pass

    def _remove_temp_dir(self) -> None:
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None


def _dialled(address: str) -> tuple[str, int] | None:
    """The host and port ``ray.init(address)`` connects to: a Ray client's (``ray://``) as given, a cluster's as Ray
    reads it (``auto`` from RAY_ADDRESS or the cluster ``ray start`` runs here; localhost as this node's IP)."""
    if address.startswith("ray://"):
        target = address.removeprefix("ray://")
    else:
        try:
            from ray._private.services import canonicalize_bootstrap_address  # private: else the address as given

            target = canonicalize_bootstrap_address(address) or ""
        except ImportError:
            target = "" if address == AUTO else address
        except Exception:
            return None
    host, _, port = target.rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


def _free_resources() -> dict[str, dict[str, float]] | None:
    """Each node's unreserved resources, by node id; None where this Ray cannot say (then every node counts)."""
    try:
        from ray._private.state import available_resources_per_node  # GCS only: no dashboard needed

        return available_resources_per_node()
    except Exception:
        return None


def _node_info(node: dict) -> wire.NodeInfo:
    return wire.NodeInfo(node["NodeID"], node.get("NodeManagerHostname", "?"), node.get("NodeManagerAddress", "?"))


def _resources(node: dict) -> str:
    resources = node.get("Resources", {})
    return ", ".join(f"{resources.get(name, 0):g} {name}" for name in ("CPU", "GPU"))


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."
