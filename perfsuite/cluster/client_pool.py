"""The controller's end of ``--perf-client-shards N``: N client actors send one open-loop schedule between them.

For each run (a warm-up or a repeat) the controller

1. has every shard build its client for the test's batch size and ask the
   server once (``prepare``: the prompt-format probe, untimed);
2. estimates each shard's clock offset (``perfsuite.cluster.shards``);
3. picks a start on its own clock, ``START_MARGIN_S`` ahead (more where a
   round trip was slow), and sends each shard its share of the schedule
   with that start on the shard's clock;
4. waits for every share, moves each shard's timestamps onto its own clock
   and merges them into one ``RunResult`` in schedule order.

A closed loop (a fixed number of requests in flight) has no schedule to
split: one shard runs it whole, its records moved onto the controller's clock.

The shards are placed round robin over the live nodes that have a CPU (an
actor per node and shard number, pinned to its node) and reserve none: a
client shard waits on sockets most of the time, and a node's CPU is the
measurement actor's. A shard that dies, times out or fails its run fails
the whole run with a ``ClusterError`` naming the shard and its node; no
shard's records are kept then (nothing half-merged is ever returned). Its
actor is replaced, on a live node, at the next run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from perfsuite.cluster import wire
from perfsuite.cluster.pool import ClusterError, _node_info, _short
from perfsuite.cluster.shards import ClockOffset, measure_offset, merge_runs, on_controller_clock, split_schedule
from perfsuite.engine.types import Request, RunResult

START_MARGIN_S = 0.5  # from picking the start to the first send: a Ray call is milliseconds; a loaded node, more
START_SECONDS = 120.0  # a fresh shard imports perfsuite's client (no torch) and reads the server's /v1/models


@dataclass(frozen=True, slots=True)
class ShardRecord:
    """What one shard did in a run: its run on its own clock, and its offset to the controller's."""

    shard: int
    node: wire.NodeInfo
    run: RunResult
    offset: ClockOffset

    @property
    def name(self) -> str:
        return f"shard {self.shard} on node {self.node}"


@dataclass(frozen=True, slots=True)
class ShardedRun:
    """One run of a schedule over the shards: merged on the controller's clock, and each shard's part."""

    merged: RunResult
    shards: tuple[ShardRecord, ...]
    served_model: Any  # perfsuite.adapters.server_info.ServedModel, as every shard's server answered


class ClientShards:
    """``num_shards`` client actors of the Ray cluster this process is connected to (``RayPool.connect``)."""

    def __init__(self, num_shards: int, spec: wire.HttpClientSpec, timeout: float) -> None:
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        self.num_shards = num_shards
        self.spec = spec
        self.timeout = timeout
        self._actors: dict[int, Any] = {}  # shard number -> actor handle
        self._nodes: dict[int, wire.NodeInfo] = {}

    def run(
        self, test_id: str, requests: Sequence[Request], batch_size: int, max_concurrency: int | None = None
    ) -> ShardedRun:
        """Every request of ``requests`` sent once, by the shards between them, on the schedule's times.

        A closed loop (``max_concurrency``) has no schedule to split: shard 0 sends it all, as one client would.
        """
        import time

        num_shards = self.num_shards if max_concurrency is None else 1
        shares = [(shard, share) for shard, share in enumerate(split_schedule(requests, num_shards)) if share]
        per_shard_batch = max(1, -(-batch_size // num_shards))  # the client's connections, split
        probe_ids = tuple(shares[0][1][0].prompt_token_ids[:8]) if shares else (0,)
        prepare = wire.dumps(wire.ShardPrepare(per_shard_batch, probe_ids))
        try:
            self._wait_all({s: self._actor(s).prepare.remote(prepare) for s, _ in shares}, START_SECONDS, "prepare")
            offsets = {shard: self._offset(shard) for shard, _ in shares}
            slowest = max((offset.error_bound_s for offset in offsets.values()), default=0.0)
            start = time.perf_counter() + START_MARGIN_S + 8 * slowest
            runs = {
                shard: self._actor(shard).run.remote(
                    wire.dumps(
                        wire.ShardRun(
                            test_id, shard, per_shard_batch, share, offsets[shard].to_shard(start), max_concurrency
                        )
                    )
                )
                for shard, share in shares
            }
            answers = self._wait_all(runs, start - time.perf_counter() + self.timeout, f"run its share of {test_id}")
        except BaseException:  # a failure, a hang, Ctrl-C: no shard of an abandoned run may go on sending
            for shard, _ in shares:
                self._drop(shard)
            raise
        results = [wire.loads(wire.ShardResult, answers[shard]) for shard, _ in shares]
        return self._merged(results, offsets, start)

    def close(self) -> None:
        try:
            import ray
        except ImportError:
            return
        for actor in self._actors.values():
            try:
                ray.kill(actor)
            except Exception:
                pass
        self._actors.clear()

    def _merged(self, results, offsets: dict[int, ClockOffset], start: float) -> ShardedRun:
        served = {result.served_model for result in results}
        if len(served) > 1:
            shown = sorted(map(str, served))
            raise ClusterError(f"the client shards were answered by different served models: {shown}")
        records = tuple(ShardRecord(r.shard, r.node, r.run, offsets[r.shard]) for r in results)
        try:
            merged = merge_runs([on_controller_clock(r.run, r.offset) for r in records], start)
        except ValueError as error:
            raise ClusterError(f"the client shards' runs do not merge: {error}") from None
        return ShardedRun(merged, records, served.pop())

    def _offset(self, shard: int) -> ClockOffset:
        actor = self._actor(shard)

        def read_remote() -> float:
            text = self._get(actor.clock.remote(), shard, self.timeout, "read its clock")
            return wire.loads(wire.ClockReading, text).seconds

        return measure_offset(read_remote)

    def _wait_all(self, refs: dict[int, Any], timeout: float, what: str) -> dict[int, str]:
        """Every shard's answer within ``timeout`` seconds in all, or a ``ClusterError`` for the first that failed."""
        import time

        deadline = time.monotonic() + timeout
        return {
            shard: self._get(ref, shard, max(0.0, deadline - time.monotonic()), what) for shard, ref in refs.items()
        }

    def _get(self, ref, shard: int, timeout: float, what: str) -> str:
        import ray
        from ray.exceptions import ActorUnschedulableError, GetTimeoutError, RayActorError, RayTaskError

        node = self._nodes[shard]
        try:
            return ray.get(ref, timeout=timeout)
        except GetTimeoutError:
            raise ClusterError(
                f"client shard {shard} on node {node} did not {what} within {timeout:.3g} s and was killed; the run's "
                "records are not kept. Raise --perf-worker-timeout if a run can take longer"
            ) from None
        except (RayActorError, ActorUnschedulableError) as error:
            raise ClusterError(
                f"client shard {shard} on node {node} died during `{what}`: {_short(error)}; the run's records "
                "are not kept (no other shard's either: a schedule is measured whole or not at all)"
            ) from None
        except RayTaskError as error:
            raise ClusterError(f"client shard {shard} on node {node} failed to {what}: {_short(error)}") from None

    def _actor(self, shard: int):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from perfsuite.cluster.client_actor import ClientShardActor

        if shard not in self._actors:
            nodes = _client_nodes()
            if not nodes:
                raise ClusterError(
                    "no live node of the cluster has a CPU to run a client shard on; add one with "
                    "`ray start --address=HEAD:6379 --num-cpus 1`"
                )
            node = nodes[shard % len(nodes)]
            remote = ray.remote(ClientShardActor).options(
                num_cpus=0, max_restarts=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)
            )
            self._actors[shard] = remote.remote(wire.dumps(self.spec))
            self._nodes[shard] = node
        return self._actors[shard]

    def _drop(self, shard: int) -> None:
        import ray

        actor = self._actors.pop(shard, None)
        if actor is not None:
            try:
                ray.kill(actor)
            except Exception:
                pass


def client_cpus() -> int:
    """The CPUs of the live nodes a client shard may run on: one shard a CPU, or shards wait on each other."""
    import ray

    return sum(int(n.get("Resources", {}).get("CPU", 0)) for n in ray.nodes() if n.get("Alive"))


def _client_nodes() -> list[wire.NodeInfo]:
    """Live nodes with a CPU (a head started with none is kept free of work), in a stable order."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= 1]
    return sorted((_node_info(n) for n in alive), key=lambda node: node.node_id)
