"""``--perf-against REF`` with ``--perf-ray ADDRESS``: both trees packed here, both sides of each test on one node.

The controller lays the two trees out as a local A/B session does (REF's
snapshot, the current tree), packs each into a tarball (``ab.packing``) and
removes its snapshot: nothing of REF stays here. ``cluster.pairs.PairPool``
hands the tarballs to one ``ab.on_ray.PairActor`` per node it uses, inside a
placement group on that node, and the first node's actor starts both sides
before any test: a REF whose tree does not import is a usage error, as
without Ray. Each test's pairs then run on one node, its result carrying
that node (docs/ray.md, "A/B on a cluster").
"""

from __future__ import annotations

import atexit
from collections.abc import Sequence
from pathlib import Path

import pytest

from perfsuite.ab.on_ray import PairActor
from perfsuite.ab.packing import PackedTree, PackingError, pack_tree
from perfsuite.ab.snapshots import remove_stale_snapshots
from perfsuite.ab.trees import ReferenceError, Trees, prepare_trees
from perfsuite.adapters.registry import EngineSpec
from perfsuite.cluster import wire
from perfsuite.cluster.pairs import PairPool
from perfsuite.cluster.pool import ClusterError, Delivered
from perfsuite.engine import Request
from perfsuite.plugin.against import Against, WorkerEngine, interrupt_on_sigterm
from perfsuite.plugin.cluster import connect, require_ray
from perfsuite.plugin.options import PerfOptions


def package_trees(ref: str, rootdir: Path, invocation_dir: Path) -> tuple[Trees, PackedTree, PackedTree]:
    """REF's tree and the current one, laid out as for a local A/B and packed: (trees, REF's, the current one's).

    A REF that names no commit or checkout is a usage error naming it, before
    the cluster is joined. The snapshot of REF is removed once packed.
    """
    remove_stale_snapshots()
    try:
        trees = prepare_trees(ref, rootdir, invocation_dir)
    except ReferenceError as error:
        raise pytest.UsageError(str(error)) from None
    try:
        return trees, pack_tree(trees.reference), pack_tree(trees.current)
    except PackingError as error:
        raise pytest.UsageError(f"--perf-against {ref}: {error}") from None
    finally:
        trees.remove()


def start_against_on_cluster(
    options: PerfOptions, rootdir: Path, invocation_dir: Path, warnings: list[str]
) -> tuple[Against, PairPool]:
    """Pack both trees, join the cluster and start both sides on its first usable node (module docstring).

    ``warnings``: the session's, where links left out of a tree are named.
    """
    require_ray()
    assert options.against is not None and options.ray is not None, "A/B on a cluster needs both options"
    trees, reference, current = package_trees(options.against, rootdir, invocation_dir)
    left_out = [f"REF's {path}" for path in reference.left_out] + list(current.left_out)
    spec = wire.ActorModel(options.model, options.device, options.dtype, options.decode_mode)
    setup = wire.PairSetup(
        trees.ref,
        trees.commit,
        trees.current_commit,
        trees.perfsuite_in_trees,
        spec,
        options.against_workers,
        options.worker_timeout,
    )
    pool = connect(PairPool(options.ray, setup, reference.archive, current.archive, PairActor))
    against = Against(trees, None, interrupt_on_sigterm(), options.against_workers)
    if left_out:
        warnings.append(
            f"--perf-against {options.against} with --perf-ray: {len(left_out)} symbolic link(s) that "
            f"point outside their tree stayed on this machine: {', '.join(left_out[:5])}"
        )
    atexit.register(against.close)
    try:
        pool.describe()
    except ClusterError as error:
        against.close()
        pool.close()
        raise pytest.UsageError(f"--perf-against {options.against}: {error}") from None
    except BaseException:  # interrupted while the first node starts both sides: pytest holds neither yet
        against.close()
        pool.close()
        raise
    return against, pool


def measure_pairs(
    pool: PairPool,
    test_id: str,
    engine: WorkerEngine,
    requests: Sequence[Request],
    max_concurrency: int | None,
    warmup_runs: int,
    num_pairs: int,
    threads: int | None,
) -> Delivered:
    """One test's pairs on a node of the cluster; ``ClusterError`` naming the node when they cannot be had."""
    knobs = EngineSpec(engine.name, engine.config)
    request = wire.PairRequest(test_id, knobs, tuple(requests), max_concurrency, warmup_runs, num_pairs, threads)
    return pool.measure_pairs(request)
