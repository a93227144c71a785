"""The node's end of A/B on a cluster: one actor per node runs both sides of every test it is sent, there.

``--perf-against REF --perf-ray ADDRESS`` (docs/ray.md). The controller's
``cluster.pairs.PairPool`` reserves one bundle on a node (a placement group,
``STRICT_PACK``) and starts this actor in it with the two trees as tarballs
(``ab.packing``). The actor unpacks them into a temporary folder of the node
and runs the same A/B machinery as a local session: an ``ABRunner`` whose
worker processes (``worker_main.py``, each over its tree) are this actor's
children, so both sides of every pair run on this node, alternating in ABBA
order and never at once, on the accelerator (or CPUs) the bundle holds.

The class is plain Python, like ``cluster.actor.MeasureActor``: the pool makes
it a Ray actor. Every method takes and returns a string of
``perfsuite.cluster.wire``; a side that dies, hangs or raises is answered
with ``PairFailed`` (its test fails, the actor and the other side live on),
and the trees are removed by ``close``. A node whose actor is killed outright
leaves its folder to the next A/B actor on that node, which removes folders
whose owner has exited (``ab.snapshots``), and its workers exit with their
parent (``worker_main.exit_with_parent``).
"""

from __future__ import annotations

import shutil

from perfsuite.ab import wire as ab_wire
from perfsuite.ab.packing import unpack_tree
from perfsuite.ab.pair import ABRunner, PairedRuns
from perfsuite.ab.snapshots import new_snapshot, remove_stale_snapshots
from perfsuite.ab.trees import Trees
from perfsuite.ab.workers import WorkerError
from perfsuite.cluster import wire

NODE_TREES = "on-ray"  # the trees' folder on a node: perfsuite-ab-on-ray-XXXX in its temporary directory


class PairActor:
    def __init__(self, setup_text: str, reference_archive: bytes, current_archive: bytes) -> None:
        from perfsuite.cluster.actor import this_node

        setup = wire.loads(wire.PairSetup, setup_text)
        self._setup = setup
        self._node = this_node()
        remove_stale_snapshots()
        folder = new_snapshot(NODE_TREES)
        try:
            reference = unpack_tree(reference_archive, folder / "reference")
            current = unpack_tree(current_archive, folder / "current")
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self._trees = Trees(
            setup.ref,
            setup.reference_commit,
            current,
            reference,
            setup.current_commit,
            folder,
            perfsuite_in_trees=setup.perfsuite_in_trees,
        )
        spec = setup.model
        load = ab_wire.Load(spec.model, spec.device, spec.dtype, spec.decode_mode)
        self._runner = ABRunner(self._trees, load, setup.timeout, workers_per_side=setup.workers_per_side)
        self._described: wire.Described | None = None

    def describe(self) -> str:
        """Start both sides' workers (once), each loading the model: what the current tree's first one loaded."""
        if self._described is None:
            try:
                self._runner.start()
                loaded = self._runner.loaded
            except WorkerError as error:
                return wire.dumps(wire.PairFailed("", self._node, str(error)))
            self._described = wire.Described(
                node=self._node,
                environment=self._environment(loaded.device),
                device=loaded.device,
                max_context=loaded.max_context,
                eos_token_id=loaded.eos_token_id,
                vocab_size=loaded.vocab_size,
                special_token_ids=tuple(loaded.special_token_ids),
            )
        return wire.dumps(self._described)

    def tokenize(self, text: str) -> str:
        message = wire.loads(wire.Tokenize, text)
        return wire.dumps(wire.Tokens(tuple(int(t) for t in self._runner.tokenize(message.text))))

    def run_pairs(self, text: str) -> str:
        request = wire.loads(wire.PairRequest, text)
        spec = request.engine
        try:
            built = self._runner.build(spec)
            paired = self._runner.run_pairs(
                spec, request.requests, request.max_concurrency, request.warmup_runs, request.num_pairs, request.threads
            )
        except WorkerError as error:
            return wire.dumps(wire.PairFailed(request.test_id, self._node, str(error)))
        return wire.dumps(self._result(request.test_id, paired, all(side.runs_in_process for side in built)))

    def close(self) -> None:
        """Stop both sides' workers and remove the trees."""
        try:
            self._runner.close()
        finally:
            self._trees.remove()

    def _result(self, test_id: str, paired: PairedRuns, runs_in_process: bool) -> wire.PairResult:
        assert self._described is not None, "describe() starts the workers before the first test"
        return wire.PairResult(
            test_id=test_id,
            node=self._node,
            environment=self._described.environment,
            reference=paired.reference,
            current=paired.current,
            order=paired.order,
            workers=paired.workers,
            reference_busy=paired.reference_busy,
            current_busy=paired.current_busy,
            num_threads=paired.num_threads,
            runs_in_process=runs_in_process,
        )

    def _environment(self, device: str):
        from perfsuite.measure.environment import capture_environment

        spec = self._setup.model
        return capture_environment(spec.model, spec.dtype, device)


def paired_runs(result: wire.PairResult) -> PairedRuns:
    """The controller's view of a node's pairs: what a local ``ABRunner.run_pairs`` returns."""
    return PairedRuns(
        result.reference,
        result.current,
        result.order,
        result.workers,
        result.reference_busy,
        result.current_busy,
        result.num_threads,
    )
