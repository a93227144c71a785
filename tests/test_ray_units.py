"""``--perf-ray``'s pure parts, without a cluster: the typed wire, the probes around each repeat, what an actor
reserves, the plugin's usage errors, and a missing Ray named with what to install."""

from __future__ import annotations

import dataclasses
import json
import math
import socket
import sys
import time
from types import SimpleNamespace

import pytest

from perfsuite.adapters import EngineConfig
from perfsuite.adapters.registry import EngineSpec
from perfsuite.cluster import wire
from perfsuite.cluster.actor import MeasureActor
from perfsuite.cluster.pool import Requirement
from perfsuite.engine.types import EngineCounters, FinishReason, Request, RequestRecord, RunResult, SamplingParams
from perfsuite.measure.capacity import CapacityError, CapacitySearch, SteadyState
from perfsuite.measure.capacity_runs import CapacityRuns, SearchChoices, rate_scaling_mismatch, scaled_to
from perfsuite.measure.environment import Environment
from perfsuite.measure.metrics import SLO
from perfsuite.workload import Arrivals, MultiTurn, OutputLengths, Workload
from perfsuite.workload.prompts import Vocab
from capacity_fakes import LoadLatencyEngine

pytest_plugins = ["pytester"]

NODE = wire.NodeInfo("a" * 56, "gpu-7", "10.0.0.7")
ENVIRONMENT = Environment("cpu", "2.13.0", "4.57", "float32", "tiny-random", "Some CPU", 2)
REQUEST = wire.MeasureRequest(
    "suites/test_x.py::test_x[static]", EngineSpec("static", EngineConfig(2, 64, num_kv_blocks=9)),
    (Request("r0", (1, 2, 3), SamplingParams(3, ignore_eos=True)),), max_concurrency=None, warmup_runs=1, repeats=3,
    busy_threshold=0.05,
)  # fmt: skip
RUN = RunResult("static", (RequestRecord("r0", 3, (5, 6), 0.0, 0.01, (0.1, 0.2), 0.2, FinishReason.LENGTH),),
                0.0, 0.25, EngineCounters(num_forward_passes=3))  # fmt: skip


def test_a_request_and_a_result_travel_as_typed_json_and_come_back_equal():
    result = wire.MeasureResult(REQUEST.test_id, NODE, ENVIRONMENT, (RUN, RUN), probes=(0.01, math.inf),
                                busy_shares=(0.0, 0.3), noisy="busy")  # fmt: skip
    for message in (REQUEST, result):
        text = wire.dumps(message)
        assert json.loads(text)["v"] == wire.PROTOCOL_VERSION
        assert wire.loads(type(message), text) == message


def test_another_protocol_version_or_message_is_refused_naming_it():
    data = json.loads(wire.dumps(REQUEST))
    other = wire.PROTOCOL_VERSION + 1
    with pytest.raises(wire.ClusterWireError,
                       match=f"version {other}, this side speaks {wire.PROTOCOL_VERSION}: install the same perfsuite"):
        wire.loads(wire.MeasureRequest, json.dumps({**data, "v": other}))
    with pytest.raises(wire.ClusterWireError, match="expected a MeasureResult message, got 'MeasureRequest'"):
        wire.loads(wire.MeasureResult, wire.dumps(REQUEST))
    with pytest.raises(wire.ClusterWireError, match="has no field surprise"):
        wire.loads(wire.MeasureRequest, json.dumps({**data, "surprise": 1}))
    with pytest.raises(wire.ClusterWireError, match="not a message of the cluster protocol"):
        wire.dumps(RUN)  # a record travels inside a message, never alone


def test_each_repeat_gets_the_geometric_mean_of_the_probes_before_and_after_it():
    from perfsuite.measure.repeats import BracketingProbe

    readings = iter([1.0, 4.0, 9.0])
    probes = BracketingProbe(lambda device: next(readings), "cpu")
    for _ in range(2):
        probes.take()
        probes.starting_run()
    probes.take()
    assert probes.per_run() == (2.0, 6.0)
    assert BracketingProbe(None, "cpu").per_run() == ()


@pytest.mark.parametrize(
    ("device", "shown", "fits", "does_not_fit"),
    [("cpu", "1 CPU", {"CPU": 1.0}, {"CPU": 0.0, "GPU": 4.0}), ("cuda", "1 GPU", {"GPU": 1.0}, {"CPU": 64.0})],
)
def test_an_actor_reserves_a_cpu_or_a_whole_gpu(device, shown, fits, does_not_fit):
    requirement = Requirement.for_device(device)
    assert requirement.describe() == shown
    assert requirement.fits(fits) and not requirement.fits(does_not_fit)


def test_without_ray_the_option_says_what_to_install(monkeypatch):
    from perfsuite.plugin.cluster import INSTALL_HINT, start_cluster

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(pytest.UsageError, match=r"pip install 'perfsuite\[ray\]'"):
        start_cluster(None)
    assert "perfsuite[ray]" in INSTALL_HINT


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--perf-ray", "auto", "--perf-engines", "openai-http", "--perf-endpoint", "http://localhost:1"),
         "*openai-http measures a server in another process*measure it without --perf-ray"),
        (("--perf-ray", " "), "*--perf-ray needs local, auto or a cluster's address*"),
        (("--perf-ray", "local", "-n", "2"), "*each xdist worker would start a cluster of its own*--perf-ray auto"),
    ],
)
def test_combinations_the_cluster_cannot_serve_are_usage_errors(pytester, args, message):
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest_inprocess("--perf", "-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


def closed_port() -> int:
    """A local port nothing listens on (the kernel's pick, released at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_address_where_nothing_listens_is_one_usage_error_line_in_seconds(pytester, monkeypatch):
    """Issue 37: Ray retried 127.0.0.1:1 for minutes, printing only "Failed to connect to GCS"."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'perfsuite[ray]'")

    def dials(**kwargs):
        raise AssertionError("ray.init dialled an address where nothing listens")

    monkeypatch.setattr(ray, "init", dials)
    address = f"127.0.0.1:{closed_port()}"
    pytester.makepyfile("import pytest\n\n@pytest.mark.perf\ndef test_measured(): pass")  # one to measure: join
    started = time.monotonic()
    result = pytester.runpytest_inprocess("--perf", "-p", "no:cacheprovider", "--perf-ray", address)
    assert time.monotonic() - started < 10
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    [line] = [line for line in result.stderr.lines if line.strip()]
    assert line.startswith(f"ERROR: --perf-ray {address}: nothing accepts connections at ")
    assert line.endswith("(connection refused); check that `ray start --head` runs on that machine and that this is "
                         "its address and port (`ray status` there prints them), or give --perf-ray local")  # fmt: skip


def test_the_probe_dials_where_ray_would(monkeypatch):
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'perfsuite[ray]'")
    from perfsuite.cluster.pool import _dialled

    assert _dialled("ray://10.0.0.7:10001") == ("10.0.0.7", 10001)  # a Ray client's server
    assert _dialled("10.0.0.7:6379") == ("10.0.0.7", 6379)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.8:6380")
    assert _dialled("auto") == ("10.0.0.8", 6380)


# -- the pool's fault handling, with Ray's own exceptions and no cluster -------------------------------------------

OTHER_NODE = wire.NodeInfo("b" * 56, "gpu-8", "10.0.0.8")


@pytest.fixture
def pool_without_cluster(monkeypatch):
    """A pool whose every call to Ray is stubbed: ``killed`` lists the actors it killed."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'perfsuite[ray]'")
    from perfsuite.cluster.pool import RayPool

    pool = RayPool("auto", wire.ActorModel("tiny-random", "cpu", "float32", "packed"), timeout=5)
    pool.killed = []
    monkeypatch.setattr(ray, "kill", pool.killed.append)
    return pool, ray


def test_ctrl_c_while_waiting_kills_the_measuring_actor_and_goes_on_interrupting(pool_without_cluster, monkeypatch):
    pool, ray = pool_without_cluster
    pool._actors[NODE.node_id] = "actor on gpu-7"

    def interrupted(ref, timeout):
        raise KeyboardInterrupt

    monkeypatch.setattr(ray, "get", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pool._get("ref", NODE, 5, "measure t")
    assert pool.killed == ["actor on gpu-7"] and not pool._actors


def test_a_hang_kills_the_actor_and_names_the_node_and_the_option(pool_without_cluster, monkeypatch):
    from perfsuite.cluster.pool import ClusterError

    pool, ray = pool_without_cluster
    pool._actors[NODE.node_id] = "actor on gpu-7"

    def hangs(ref, timeout):
        raise ray.exceptions.GetTimeoutError("timed out")

    monkeypatch.setattr(ray, "get", hangs)
    with pytest.raises(ClusterError, match=r"node gpu-7 \(10.0.0.7, node aaaaaaaaaaaa\) did not answer `measure t` "
                                           r"within 5 s and was killed; raise --perf-worker-timeout"):  # fmt: skip
        pool._get("ref", NODE, 5, "measure t")
    assert pool.killed == ["actor on gpu-7"]
    assert NODE.node_id not in pool._dead, "a hang is not a death: the node may take later tests"


def test_a_death_is_retried_once_on_another_node_and_a_second_names_both(pool_without_cluster, monkeypatch):
    from perfsuite.cluster.pool import ClusterError, _ActorDied

    pool, _ = pool_without_cluster
    monkeypatch.setattr(pool, "_usable_nodes", lambda must_have_one=True: [
        n for n in (NODE, OTHER_NODE) if n.node_id not in pool._dead])  # fmt: skip
    tried = []

    def measure_on(node, request):
        tried.append(node.hostname)
        pool._dead.add(node.node_id)
        raise _ActorDied(node, f"the actor on node {node} died")

    monkeypatch.setattr(pool, "_measure_on", measure_on)
    with pytest.raises(ClusterError, match=r"gpu-7 .* died; its retry died too: the actor on node gpu-8 .* died"):
        pool.measure(REQUEST)
    assert tried == ["gpu-7", "gpu-8"], "once elsewhere, never twice on the same node"

    result = wire.MeasureResult(REQUEST.test_id, OTHER_NODE, ENVIRONMENT, (RUN,))
    pool._dead.clear()
    tried.clear()
    monkeypatch.setattr(pool, "_measure_on", lambda node, request: (
        measure_on(node, request) if node is NODE else result))  # fmt: skip
    pool._next = 0
    measured = pool.measure(REQUEST)
    assert measured.result is result and "gpu-7" in measured.retried_after



def test_xdist_with_a_cluster_does_not_share_out_this_hosts_gpus(pytester, monkeypatch):
    from perfsuite.plugin import hooks

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")  # this host's: the actors' GPUs are on the nodes
    config = pytester.parseconfig("--perf", "--perf-device", "cuda", "--perf-ray", "auto")
    assert hooks.pytest_xdist_auto_num_workers(config) is None
    without_ray = pytester.parseconfig("--perf", "--perf-device", "cuda")
    assert hooks.pytest_xdist_auto_num_workers(without_ray) == 3


# -- multi-turn workloads: typed over the wire, resolved by the engine the actor builds -----------------------------

MULTI_TURN = tuple(MultiTurn(sessions=2, turns=3, prompt=4, message=2, output=3).requests(Vocab(97, first_id=3), 7,
                                                                                          [0.0, 0.0]))  # fmt: skip


def actor_over(backend) -> MeasureActor:
    """An actor over ``backend`` without Ray (its constructor loads a model and asks Ray for its node)."""
    actor = MeasureActor.__new__(MeasureActor)
    actor._backend, actor._environment, actor._node, actor._engines = backend, ENVIRONMENT, NODE, {}
    return actor


def fake_backend():
    from perfsuite.adapters import Backend
    from perfsuite.engine.fake_runner import FakeRunner

    return Backend(runner=FakeRunner(vocab_size=97), tokenize=lambda text: [3], eos_token_id=None, max_context=512,
                   device="cpu", probe=lambda device: 1.0)  # fmt: skip


def test_a_multi_turn_workload_travels_with_its_follow_ups():
    request = dataclasses.replace(REQUEST, requests=MULTI_TURN)
    assert sum(r.follows is not None for r in MULTI_TURN) == 4
    assert wire.loads(wire.MeasureRequest, wire.dumps(request)) == request


def test_the_controllers_stand_in_lets_follow_ups_through_and_the_actors_engine_resolves_them():
    from perfsuite.adapters.protocol import check_serves_follow_ups
    from perfsuite.plugin.cluster import ClusterEngine

    check_serves_follow_ups(ClusterEngine("inflight", EngineConfig(2, 64)), MULTI_TURN)
    request = wire.MeasureRequest("t", EngineSpec("inflight", EngineConfig(2, 64)), MULTI_TURN, None, 0, 2, 0.05)
    result = wire.loads(wire.MeasureResult, actor_over(fake_backend()).measure(wire.dumps(request)))
    assert len(result.runs) == 2
    records = {r.request_id: r for r in result.runs[-1].records}
    assert [records[f"s0-t{turn}"].num_prompt_tokens for turn in range(3)] == [4, 4 + 3 + 2, 4 + 3 + 2 + 3 + 2]
    assert records["s1-t1"].arrival_time >= records["s1-t0"].finished_time


def test_an_engine_that_cannot_resolve_follow_ups_fails_on_the_node_naming_it():
    actor = actor_over(fake_backend())
    knobs = EngineSpec("one-turn", EngineConfig(2, 64))
    actor._engines[knobs] = SimpleNamespace(name="one-turn", run=lambda *args, **kwargs: pytest.fail("ran"))
    request = wire.MeasureRequest("t", knobs, MULTI_TURN, None, 0, 1, 0.05)
    with pytest.raises(ValueError, match="engine 'one-turn' cannot serve multi-turn follow-ups"):
        actor.measure(wire.dumps(request))


# -- capacity searches: one typed request, every search on the actor's node -----------------------------------------

CAPACITY_SLO = SLO(ttft=0.050)


def capacity_workload(rate: float) -> list[Request]:
    return Workload(16, OutputLengths(), Arrivals(rate), seed=3).requests(lambda text: [5, 6, 7])


def capacity_request(engine: str, repeats: int = 2, slo: SLO = CAPACITY_SLO) -> wire.CapacityRequest:
    return wire.CapacityRequest("suites/test_capacity.py::test_capacity[x]", EngineSpec(engine, EngineConfig(4, 64)),
                                tuple(capacity_workload(1.0)), slo, SteadyState(), SearchChoices(), warmup_runs=1,
                                repeats=repeats, busy_threshold=0.99)  # fmt: skip


def capacity_actor(engine) -> MeasureActor:
    actor = actor_over(fake_backend())
    actor._engines[EngineSpec(engine.name, EngineConfig(4, 64))] = engine
    return actor


def test_a_capacity_test_runs_every_search_on_the_actor_and_finds_what_the_process_finds():
    engine = LoadLatencyEngine(service_rate=40.0)
    request = capacity_request(engine.name)
    result = wire.loads(wire.CapacityResult, capacity_actor(engine).measure_capacity(wire.dumps(request)))

    here = CapacityRuns(lambda requests, c: engine.run(requests, max_concurrency=c), capacity_workload, CAPACITY_SLO,
                        SteadyState(), SearchChoices())  # fmt: skip
    assert result.search == here.prepare(warmup_runs=1)
    expected = [here.one_search()[0] for _ in range(2)]
    assert [s.requests_per_second for s in result.searches] == pytest.approx([s.requests_per_second for s in expected])
    assert result.node == NODE and result.no_capacity is None
    assert len(result.at_capacity) == len(result.probes) == 2, "one run at each capacity, the probe around each search"
    assert wire.loads(wire.CapacityResult, wire.dumps(result)) == result


def test_a_capacity_search_that_finds_none_says_why_and_keeps_no_search():
    engine = LoadLatencyEngine(service_rate=40.0)  # its unloaded TTFT is 10 ms: an SLO of 1 ms never holds
    request = capacity_request(engine.name, slo=SLO(ttft=0.001))
    result = wire.loads(wire.CapacityResult, capacity_actor(engine).measure_capacity(wire.dumps(request)))
    assert "loosen the SLO" in result.no_capacity
    assert result.searches == () and result.at_capacity == ()


def test_a_later_search_that_finds_none_drops_the_earlier_ones_too(monkeypatch):
    one_search, calls = CapacityRuns.one_search, []

    def second_finds_none(runs):
        calls.append(1)
        if len(calls) == 2:
            raise CapacityError("the second search found none")
        return one_search(runs)

    monkeypatch.setattr(CapacityRuns, "one_search", second_finds_none)
    engine = LoadLatencyEngine(service_rate=40.0)
    request = capacity_request(engine.name, repeats=3)
    result = wire.loads(wire.CapacityResult, capacity_actor(engine).measure_capacity(wire.dumps(request)))
    assert result.no_capacity == "the second search found none" and len(calls) == 2
    assert result.searches == result.at_capacity == result.probes == result.busy_shares == ()


def test_requests_at_a_rate_must_be_the_requests_at_one_scaled_by_it():
    at_one = capacity_workload(1.0)
    assert rate_scaling_mismatch(at_one, capacity_workload(2.0), 2.0) is None
    assert scaled_to(at_one, 4.0)[-1].arrival_time == at_one[-1].arrival_time / 4
    shorter = rate_scaling_mismatch(at_one, capacity_workload(2.0)[:8], 2.0)
    assert shorter == "8 requests at 2 req/s, 16 at 1 req/s"
    other_seed = Workload(16, OutputLengths(), Arrivals(2.0), seed=4).requests(lambda text: [5, 6, 7])
    assert "arrives at" in rate_scaling_mismatch(at_one, other_seed, 2.0)
    longer = [dataclasses.replace(r, sampling_params=SamplingParams(9)) for r in scaled_to(at_one, 2.0)]
    assert rate_scaling_mismatch(at_one, longer, 2.0) == "request 'req-0' differs in more than its arrival time"


def test_a_capacity_test_may_take_the_timeout_for_each_run_it_may_make():
    from perfsuite.cluster.pool import RayPool

    pool = RayPool("auto", wire.ActorModel("tiny-random", "cpu", "float32", "packed"), timeout=5)
    request = capacity_request("static", repeats=3)
    assert pool._timeout_of(REQUEST) == 5
    assert pool._timeout_of(request) == 5 * (1 + 2 + 3 * CapacitySearch().max_probes)
