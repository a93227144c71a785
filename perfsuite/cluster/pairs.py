"""The controller's end of A/B on a cluster: one placement group and one A/B actor per node, both sides in it.

``--perf-against REF --perf-ray ADDRESS`` (docs/ray.md). A ``RayPool`` whose
actor on a node is the A/B actor the plugin names (``ab.on_ray.PairActor``:
this layer does not import ``ab``), placed in a placement group of one
bundle (``STRICT_PACK``, pinned to the node by its ``ray.io/node-id``
label) that holds what one measurement actor would: the node's GPU, or a
CPU. The actor's worker processes, both sides', are its children inside
that reservation; the sides alternate and never run at once, so they share
it. The two trees travel once, as tarballs put into Ray's object store and
handed to each node's actor when it starts.

Everything else is ``RayPool``'s: tests go to the usable nodes in turn, a
test whose actor (or node) dies is measured again, every pair, on another
node once, and the messages name the node. A side that fails on the node
(its worker died, hung past ``--perf-worker-timeout``, or raised) fails
its test with the worker's message (``PairFailed``), not retried: that is
the tree's doing, not the node's. At the end every actor is asked to stop its
workers and remove its trees, then killed, and every placement group is
removed.
"""

from __future__ import annotations

from typing import Any

from perfsuite.cluster import wire
from perfsuite.cluster.pool import START_SECONDS, ClusterError, Delivered, RayPool

NODE_ID_LABEL = "ray.io/node-id"  # every Ray node carries its id as this label
RESERVE_SECONDS = 60.0  # a usable node has the bundle's resources free: its group is placed at once
CLOSE_SECONDS = 30.0  # for every actor together to stop its workers and remove its trees


class PairPool(RayPool):
    """The session's A/B actors, one per node used, each in its node's placement group."""

    def __init__(
        self,
        address: str,
        setup: wire.PairSetup,
        reference_archive: bytes,
        current_archive: bytes,
        actor_class: type,
        first_node: int = 0,
    ) -> None:
        super().__init__(address, setup.model, setup.timeout, first_node)
        self.setup = setup
        self._archives = (reference_archive, current_archive)
        self._archive_refs: tuple[Any, ...] | None = None  # in the object store once, for every node's actor
        self._actor_class = actor_class
        self._groups: dict[str, Any] = {}  # node id -> its placement group

    def measure_pairs(self, request: wire.PairRequest) -> Delivered:
        """``request``'s pairs on the next usable node; once more, every pair, on another should its actor die."""
        return self._deliver(lambda node: self._pairs_on(node, request))

    @property
    def group_ids(self) -> tuple[str, ...]:
        """The placement groups this pool holds now (hex ids)."""
        return tuple(group.id.hex() for group in self._groups.values())

    def _pairs_on(self, node: wire.NodeInfo, request: wire.PairRequest) -> wire.PairResult:
        actor = self._actor_on(node)
        self._load_on(node)  # a new actor unpacks its trees and starts both sides first
        seconds = self._pairs_seconds(request)
        text = self._get(actor.run_pairs.remote(wire.dumps(request)), node, seconds, f"measure {request.test_id}")
        answer = wire.loads_one_of((wire.PairResult, wire.PairFailed), text)
        if isinstance(answer, wire.PairFailed):
            raise ClusterError(f"on node {answer.node}: {answer.message}")
        if answer.node.node_id != node.node_id:
            raise ClusterError(f"{request.test_id}: asked node {node}, answered by {answer.node}")
        return answer

    def _pairs_seconds(self, request: wire.PairRequest) -> float:
        """The whole test: each side's runs have --perf-worker-timeout each on the node, and a side that died
        since the last test starts again first."""
        workers = self.setup.workers_per_side
        runs = 2 * (request.num_pairs + workers * (request.warmup_runs + 1))  # + 1: building the engine
        return self.timeout * runs + START_SECONDS

    def _load_on(self, node: wire.NodeInfo) -> wire.Described:
        seconds = START_SECONDS * 2 * self.setup.workers_per_side  # each worker imports torch and loads the model
        what = "start both sides (unpack the trees, load the model in each worker)"
        text = self._get(self._actor_on(node).describe.remote(), node, seconds, what)
        answer = wire.loads_one_of((wire.Described, wire.PairFailed), text)
        if isinstance(answer, wire.PairFailed):
            raise ClusterError(f"on node {answer.node}: {answer.message}")
        return answer

    def _new_actor(self, node: wire.NodeInfo):
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = self._reserve(node)
        if self._archive_refs is None:
            self._archive_refs = tuple(ray.put(archive) for archive in self._archives)
        remote: Any = ray.remote(self._actor_class).options(
            num_cpus=self.requirement.num_cpus,
            num_gpus=self.requirement.num_gpus,
            max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
        )
        return remote.remote(wire.dumps(self.setup), *self._archive_refs)

    def _reserve(self, node: wire.NodeInfo):
        """``node``'s placement group: one bundle of what a measurement actor holds, placed there or nowhere."""
        import ray
        from ray.exceptions import GetTimeoutError
        from ray.util.placement_group import placement_group, placement_group_table

        group = placement_group(
            [self.requirement.bundle()], strategy="STRICT_PACK", bundle_label_selector=[{NODE_ID_LABEL: node.node_id}]
        )
        self._groups[node.node_id] = group
        try:
            ray.get(group.ready(), timeout=RESERVE_SECONDS)
        except GetTimeoutError:
            self._remove_group(node.node_id)
            raise ClusterError(
                f"--perf-ray {self.address}: node {node} could not reserve {self.requirement.describe()} for both "
                f"sides of an A/B test within {RESERVE_SECONDS:g} s (another job took it meanwhile?); run again, or "
                "add a node with `ray start --address=HEAD:6379`"
            ) from None
        placed = placement_group_table(group).get("bundles_to_node_id", {}).get(0)
        if placed != node.node_id:  # a Ray that ignores the label selector would place it anywhere
            self._remove_group(node.node_id)
            raise ClusterError(
                f"--perf-ray {self.address}: the placement group for node {node} landed on node "
                f"{placed}; this Ray cannot pin a group to a node: install ray>=2.50"
            )
        return group

    def _drop(self, node: wire.NodeInfo, kill: bool) -> None:
        super()._drop(node, kill)
        self._remove_group(node.node_id)

    def _release_actors(self) -> None:
        import ray

        closing = []
        for actor in self._actors.values():
            try:
                closing.append(actor.close.remote())
            except Exception:
                pass
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=CLOSE_SECONDS)  # a dead one is ready too (its error)
        super()._release_actors()
        for node_id in list(self._groups):
            self._remove_group(node_id)
        self._archive_refs = None

    def _remove_group(self, node_id: str) -> None:
        from ray.util.placement_group import remove_placement_group

        group = self._groups.pop(node_id, None)
        if group is not None:
            try:
                remove_placement_group(group)
            except Exception:
                pass
