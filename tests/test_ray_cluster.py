"""``--perf-ray`` on a real Ray cluster: two nodes of one CPU on this machine (``ray.cluster_utils.Cluster``).

One module-scoped cluster serves every test here (starting one costs seconds
of a 2-core runner); its head has no CPU, so every measurement actor runs
on one of the two worker nodes. Each session is the shipped suite's
smallest (smoke profile, tiny-random, a few tests by ``-k``), run in this
process so a plugin can remove a node while a test measures. Marked
``cluster``: a cluster is a dozen processes, which in the parallel phase
would share one CPU with an xdist worker (conftest.py pins each to one), and
the module takes minutes of a 2-core runner, so ``make test-cluster`` runs it
alone, outside ``make test`` (test_ray_units.py covers the logic without one).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from xml.etree import ElementTree

import pytest

from perfsuite.judge.results import read_results
from perfsuite.plugin.stash import SESSION_KEY
from smoke_session import SMOKE_ARGS

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'perfsuite[ray]' (make test installs it)")
# pytester drops what an in-process session imported, and an extension module cannot load twice in one process:
# what the in-process session uses (Ray's core, the statistics, the report's figures) is loaded here. Under
# --perf-ray the controller loads no model, so torch stays out of this process.
import matplotlib.pyplot  # noqa: E402, F401
import numpy.fft  # noqa: E402, F401
import ray._private.state  # noqa: E402, F401
import ray.exceptions  # noqa: E402, F401
import ray.util.scheduling_strategies  # noqa: E402, F401
import scipy.stats  # noqa: E402, F401
from ray.cluster_utils import Cluster  # noqa: E402

pytest_plugins = ["pytester"]

pytestmark = pytest.mark.cluster

OBJECT_STORE_BYTES = 80 * 1024 * 1024  # Ray's minimum is 75 MiB; the messages are a few kB
TWO_TESTS = "test_throughput and fixed"  # static and inflight, batch 2, fixed lengths
FOUR_TESTS = "test_throughput"


@pytest.fixture(scope="module")
def cluster():
    # Ray keeps its sessions, sockets and the address of "the current cluster" under $RAY_TMPDIR/ray: a directory
    # of this module's, so no other job's `ray.init("auto")` finds this cluster, and short (a socket path is <108).
    temp_dir = Path(tempfile.mkdtemp(prefix="psray-"))
    head = {"num_cpus": 0, "include_dashboard": False, "object_store_memory": OBJECT_STORE_BYTES}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TMPDIR", str(temp_dir))
        started = Cluster(initialize_head=True, head_node_args=head)
        try:
            for _ in range(2):
                started.add_node(num_cpus=1, object_store_memory=OBJECT_STORE_BYTES)
            started.wait_for_nodes()
            yield started
        finally:
            started.shutdown()
            shutil.rmtree(temp_dir, ignore_errors=True)


def run_session(pytester, *args, plugins=()):
    """In this process when a plugin must reach into the session, else in a subprocess (which loads torch)."""
    args = ("--pyargs", "perfsuite.suites", *SMOKE_ARGS, "-p", "no:cacheprovider", "--perf-history", "none", *args)
    if plugins:
        return pytester.runpytest_inprocess(*args, plugins=list(plugins))
    return pytester.runpytest_subprocess(*args)


def by_test(pytester):
    return {test.test_id: test for test in read_results(pytester.path / "reports" / "results.json").tests}


def assert_nothing_left(cluster) -> None:
    """No actor alive or pending, no placement group: what a session started, it stopped."""
    ray.init(address=cluster.address, configure_logging=False, log_to_driver=False)
    try:
        states = {info["State"] for info in ray._private.state.actors().values()}
        groups = ray.util.placement_group_table()
    finally:
        ray.shutdown()
    assert states <= {"DEAD"}, f"actors left behind: {states}"
    assert all(group["state"] == "REMOVED" for group in groups.values()), groups


def with_worker_nodes(cluster, count: int) -> None:
    """At least ``count`` worker nodes of 1 CPU: the node-removal test removes both (the module's cluster is shared)."""
    for _ in range(count - len(cluster.worker_nodes)):
        cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE_BYTES)
    cluster.wait_for_nodes()


LOCAL_SESSION = """
import sys
from pathlib import Path
import ray
from perfsuite.cluster.pool import LOCAL, RayPool
from perfsuite.cluster.wire import ActorModel

pool = RayPool(LOCAL, ActorModel("tiny-random", "cpu", "float32", "packed"), timeout=60)
pool.connect()
temp_dir = Path(pool._temp_dir)
print("started", ray.is_initialized(), temp_dir.is_dir() and any(temp_dir.iterdir()),
      len([node for node in ray.nodes() if node["Alive"]]))
pool.close()
print("closed", ray.is_initialized(), temp_dir.exists())
"""


def test_a_local_cluster_is_started_in_a_temporary_directory_and_gone_after_the_session():
    # In a process of its own: a local ray.init() leaves Ray's auth mode set in the process that ran it.
    done = subprocess.run([sys.executable, "-c", LOCAL_SESSION], capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith(("started", "closed"))]
    assert lines == ["started True True 1", "closed False False"], done.stdout + done.stderr[-2000:]


def test_a_session_over_two_nodes_judges_and_counts_as_one_without_ray(pytester, cluster):
    assert run_session(pytester, "-k", TWO_TESTS, "--perf-save-baseline").ret == pytest.ExitCode.OK
    local = run_session(pytester, "-k", TWO_TESTS)
    local_results = by_test(pytester)

    on_ray = run_session(pytester, "-k", TWO_TESTS, "--perf-ray", cluster.address, "--junitxml", "junit.xml")

    assert on_ray.ret == local.ret
    ray_results = by_test(pytester)
    assert sorted(ray_results) == sorted(local_results) and len(ray_results) == 2
    for test_id, result in ray_results.items():
        expected = local_results[test_id]
        assert result.judgement.baseline_status == expected.judgement.baseline_status == "compared"
        assert [c.verdict for c in result.judgement.comparisons] == [c.verdict for c in expected.judgement.comparisons]
        assert result.measurement.counters == expected.measurement.counters
        assert result.fingerprint == expected.fingerprint  # the nodes run this machine's libraries: one fingerprint
        assert expected.node is None
    nodes = {result.node for result in ray_results.values()}
    assert len(nodes) == 2, f"the two tests went to the two nodes in turn: {nodes}"
    on_ray.stdout.fnmatch_lines(["measured on Ray nodes (tests each; results.json names each test's): *: 1, *: 1"])
    junit = ElementTree.parse(pytester.path / "junit.xml")
    reported = {p.get("value") for p in junit.iter("property") if p.get("name") == "perf_node"}
    assert reported == nodes, "each test's report names the node that measured it"
    assert_nothing_left(cluster)


def test_a_hung_actor_is_killed_at_the_timeout_and_a_missing_resource_fails_at_once(pytester, cluster):
    one_test = ("-k", "test_throughput and static and fixed", "--perf-ray", cluster.address)
    # 10 ms: no measurement (warm-up, probes, three repeats) answers within it; loading the model has its own limit
    hung = run_session(pytester, *one_test, "--perf-worker-timeout", "0.01")
    hung.assert_outcomes(failed=1)
    hung.stdout.fnmatch_lines([
        "the actor on node * did not answer `measure *static-B2-fixed?` within 0.01 s and was killed; "
        "raise --perf-worker-timeout if a measurement can take longer",
    ])  # fmt: skip
    assert_nothing_left(cluster)

    no_gpu = run_session(pytester, *one_test, "--perf-device", "cuda")
    no_gpu.assert_outcomes(errors=1)  # in the backend fixture, before the test asks for anything
    no_gpu.stdout.fnmatch_lines([
        f"--perf-ray {cluster.address}: no live node of the cluster has 1 GPU free for a measurement actor; its "
        "live nodes (all resources): *. Add one with `ray start --address=HEAD:6379 --num-gpus 1`",
    ])  # fmt: skip
    listed = next(line for line in no_gpu.outlines if "live nodes (all resources)" in line)
    assert "0 CPU, 0 GPU" in listed and "1 CPU, 0 GPU" in listed, "the head and a worker node, in Ray's order"


def test_two_xdist_workers_are_two_controllers_measuring_at_once_each_on_a_node_of_its_own(pytester, cluster):
    result = run_session(pytester, "-k", TWO_TESTS, "-n", "2", "--perf-ray", cluster.address)

    result.assert_outcomes(skipped=2)  # measured and recorded; no baselines here, so judged nothing
    results = by_test(pytester)
    assert len(results) == 2
    assert len({r.node for r in results.values()}) == 2, "worker gwN starts at the Nth node; a taken node is skipped"
    assert_nothing_left(cluster)


class RemoveNodeWhileMeasuring:
    """Removes the node that is to measure each of ``test_ids`` (a substring of its id) once its actor has loaded
    the model and before the measurement is sent: a smoke measurement can finish before a removal that races it
    (its answer, a few kB, is then already in this process and the test would pass)."""

    def __init__(self, cluster, test_ids) -> None:
        self.cluster = cluster
        self.pending = list(test_ids)
        self.removed: list[str] = []

    @pytest.hookimpl(trylast=True)  # after perfsuite's own, which joins the cluster
    def pytest_collection_finish(self, session) -> None:
        pool = session.config.stash[SESSION_KEY].cluster
        get, measure_on = pool._get, pool._measure_on
        armed: list[str] = []  # the node to remove once its actor answers `load the model`

        def measure_on_arming(node, request):
            if self.pending and self.pending[0] in request.test_id:
                self.pending.pop(0)
                armed.append(node.node_id)
            return measure_on(node, request)

        def get_removing_the_node(ref, node, timeout, what):
            answer = get(ref, node, timeout, what)
            if armed and what == "load the model" and armed[-1] == node.node_id:
                self._remove(armed.pop())
            return answer

        pool._measure_on, pool._get = measure_on_arming, get_removing_the_node

    def _remove(self, node_id: str) -> None:
        (node,) = [n for n in self.cluster.worker_nodes if n.node_id == node_id]
        self.cluster.remove_node(node, allow_graceful=False)
        self.removed.append(node_id[:12])


def test_a_node_removed_mid_test_retries_elsewhere_then_fails_only_its_tests(pytester, cluster):
    removing = RemoveNodeWhileMeasuring(cluster, ["static-B2-uniform", "inflight-B2-uniform"])

    result = run_session(pytester, "-k", FOUR_TESTS, "--perf-ray", cluster.address, plugins=[removing])

    outcomes = result.parseoutcomes()
    assert (outcomes.get("failed"), outcomes.get("skipped")) == (1, 3), result.stdout.str()[-3000:]  # no baselines
    first, second = removing.removed
    result.stdout.fnmatch_lines([
        "*_ test_throughput?inflight-B2-uniform? _*",
        f"the actor on node * {second}) died during `measure *inflight-B2-uniform?`: *; "
        "no other node of the cluster has 1 CPU free to retry it on",
    ])  # fmt: skip
    results = by_test(pytester)
    assert sorted(results) == [
        "perfsuite/suites/test_throughput.py::test_throughput[inflight-B2-fixed]",
        "perfsuite/suites/test_throughput.py::test_throughput[static-B2-fixed]",
        "perfsuite/suites/test_throughput.py::test_throughput[static-B2-uniform]",
    ], "the tests measured before the removals, and the retried one, are kept"
    retried = results["perfsuite/suites/test_throughput.py::test_throughput[static-B2-uniform]"]
    assert first not in retried.node and second in retried.node, "retried on the other node, every repeat there"
    document = read_results(pytester.path / "reports" / "results.json")
    assert any(f"{first}) died during `measure" in w and "measured on node" in w for w in document.warnings)
    assert any("inflight-B2-uniform]: no result recorded" in w and second in w for w in document.warnings)
    assert_nothing_left(cluster)



# -- client shards (--perf-client-shards): openai-http's load generator split over Ray actors -------------------------

SHARD_GAP_S = 0.2  # wide enough that a loaded 2-core runner's send lag does not reorder neighbours


@pytest.fixture
def served_tiny_random(tmp_path):
    """`perfsuite serve` on tiny-random in a process of its own (the shards' server); its URL."""
    import socket
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (tmp_path / "serve.log").open("w")
    command = [sys.executable, "-m", "perfsuite", "serve", "--model", "tiny-random", "--port", str(port),
               "--device", "cpu", "--threads", "1", "--batch-size", "4", "--max-seq-len", "64"]  # fmt: skip
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, "perfsuite serve did not answer /health within 120 s"
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_two_client_shards_deliver_the_schedule_merged_in_order_on_the_controllers_clock(cluster, served_tiny_random):
    from perfsuite.adapters.http_options import HttpClientOptions
    from perfsuite.cluster.client_pool import ClientShards
    from perfsuite.cluster.wire import HttpClientSpec
    from perfsuite.engine.types import Request, SamplingParams

    with_worker_nodes(cluster, 2)  # one shard on each: the node-removal test above removed both
    schedule = [Request(f"r{i}", (5 + i, 6, 7), SamplingParams(2, ignore_eos=True), arrival_time=SHARD_GAP_S * i)
                for i in range(8)]  # fmt: skip
    ray.init(address=cluster.address, configure_logging=False, log_to_driver=False)
    shards = ClientShards(2, HttpClientSpec(served_tiny_random, HttpClientOptions(prompt_format="token_ids")), 120)
    try:
        sharded = shards.run("shards::test", schedule, batch_size=4)
    finally:
        shards.close()
        ray.shutdown()

    records = sharded.merged.records
    assert [r.request_id for r in records] == [r.request_id for r in schedule], "every request, once, in order"
    assert all(r.num_output_tokens == 2 and r.finish_reason is not None for r in records), "none dropped or cut"
    assert len({part.node.node_id for part in sharded.shards}) == 2, "one shard on each of the two nodes"
    bound = {part.shard: part.offset.error_bound_s for part in sharded.shards}
    for part in sharded.shards:  # one machine, one monotonic clock: the true offset is 0
        assert abs(part.offset.offset_s) <= part.offset.error_bound_s, part.offset
    shard_of = {r.request_id: part.shard for part in sharded.shards for r in part.run.records}
    start = sharded.merged.start_time
    for request, got in zip(schedule, records):
        slack = bound[shard_of[got.request_id]]
        assert got.scheduled_time == pytest.approx(start + request.arrival_time)
        assert got.sent_time >= got.scheduled_time - slack, f"{got.request_id} sent before its time"
    for earlier, later in zip(records, records[1:]):
        slack = bound[shard_of[earlier.request_id]] + bound[shard_of[later.request_id]]
        assert later.sent_time >= earlier.sent_time - slack, f"{later.request_id} went before {earlier.request_id}"
    assert_nothing_left(cluster)


# -- ray-gaps: multi-turn workloads and capacity searches on the cluster ---------------------------------------------

MULTI_TURN_SWEEP = """
[sweep]
engines = ["inflight"]
batch_sizes = [2]
repeats = 2

[[workload]]
kind = "multi_turn"
sessions = 2
turns = 2
prompt = 8
message = 4
output = 3
"""


def test_a_multi_turn_workload_and_a_capacity_search_are_measured_on_one_node_each(pytester, cluster):
    with_worker_nodes(cluster, 1)  # the node-removal test removed both
    pytester.makefile(".toml", sweep=MULTI_TURN_SWEEP)
    result = run_session(pytester, "-k", "test_sweep or test_capacity and static", "--perf-config", "sweep.toml",
                         "--perf-slo", "ttft=2s", "--perf-repeats", "2", "--perf-ray", cluster.address)  # fmt: skip

    result.assert_outcomes(skipped=2)  # measured and recorded; no baselines here, so judged nothing
    tests = {test_id.split("::")[-1].split("[")[0]: test for test_id, test in by_test(pytester).items()}
    multi_turn, capacity = tests["test_sweep"], tests["test_capacity"]
    # each second turn's prompt is 8 + 3 + 4 tokens, resolved by the actor's engine: the mean over 4 turns
    assert multi_turn.measurement.parameters.input_length == pytest.approx(11.5)
    assert multi_turn.node and capacity.node, "each names the node that measured it"
    assert len(capacity.capacity.searches) == 2 and all(s.probes for s in capacity.capacity.searches)
    assert capacity.fingerprint == multi_turn.fingerprint  # the node's environment, not this process's (no torch)
    assert_nothing_left(cluster)


# -- A/B on a cluster (--perf-against with --perf-ray; docs/ray.md "A/B on a cluster") ------------------------------

from test_ab_session import (  # noqa: E402 - the A/B sessions' throw-away repository and helpers
    ONE_TEST,
    git,
    repo,  # noqa: F401 - a fixture
    results_json,
    run_ab,
    snapshots_of,
    worker_processes,
)


def trees_on_nodes() -> set[Path]:
    """The folders A/B actors unpack the two trees into (every node of this cluster is this machine)."""
    return set(Path(tempfile.gettempdir()).glob("perfsuite-ab-on-ray-*"))


def test_an_ab_session_runs_both_sides_of_a_test_on_one_node_and_leaves_nothing_behind(
    pytester,
    cluster,
    repo,  # noqa: F811 - the fixture imported above
):
    with_worker_nodes(cluster, 1)
    head = git(repo, "rev-parse", "HEAD")
    trees_before = trees_on_nodes()

    # 4 pairs: p cannot go below 1/16, so unchanged code cannot fail here by chance; one worker a side, to be cheap
    result = run_ab(pytester, "HEAD", "-k", ONE_TEST, "--perf-repeats", "4", "--perf-against-workers", "1",
                    "--perf-ray", cluster.address)  # fmt: skip

    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"A/B: A = REF HEAD ({head[:12]}), *ABBA*; both sides of each test on one Ray node;*"])
    document = results_json(repo)
    assert "one Ray node" in document["against"]["order"]
    (test,) = document["tests"]
    assert test["reference"]["pair_order"] == ["AB", "BA", "AB", "BA"]
    reference, current = test["reference"]["samples"], test["measurement"]["samples"]
    assert len(reference["output_throughput"]) == len(current["output_throughput"]) == 4
    assert test["judgement"]["baseline_status"] == f"A/B against HEAD ({head[:12]})"
    comparisons = test["judgement"]["comparisons"]
    assert comparisons and all(c["verdict"] != "regressed" for c in comparisons)
    worker_ids = {node.node_id for node in cluster.worker_nodes}
    (node_id,) = [node_id for node_id in worker_ids if node_id[:12] in test["node"]]
    ray.init(address=cluster.address, configure_logging=False, log_to_driver=False)
    try:
        groups = [g for g in ray.util.placement_group_table().values() if g["bundles_to_node_id"].get(0) == node_id]
    finally:
        ray.shutdown()
    assert groups and all(g["strategy"] == "STRICT_PACK" for g in groups), "both sides' actor in one bundle there"
    assert_nothing_left(cluster)
    assert not worker_processes(repo) and trees_on_nodes() <= trees_before and not snapshots_of(head)
