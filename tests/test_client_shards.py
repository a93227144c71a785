"""``--perf-client-shards``' parts without a cluster: the schedule's split, the clock offsets (fake clocks), the
merge onto the controller's clock, the send-lag check per shard, the wiring into the recorder, the faults and the
usage errors. The real two-shard run is at the end of tests/test_ray_cluster.py."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfsuite.adapters.http_options import HttpClientOptions
from perfsuite.adapters.server_info import ServedModel
from perfsuite.cluster import wire
from perfsuite.cluster.client_pool import START_MARGIN_S, ShardedRun, ShardRecord
from perfsuite.cluster.shards import (
    ClockOffset,
    RoundTrip,
    estimate_offset,
    measure_offset,
    merge_runs,
    on_controller_clock,
    split_schedule,
)
from perfsuite.engine.types import EngineCounters, FinishReason, Request, RequestRecord, RunResult, SamplingParams
from perfsuite.measure.send_lag import shards_client_bound_reason

pytest_plugins = ["pytester"]

NODE = wire.NodeInfo("a" * 56, "client-1", "10.0.0.1")
OTHER_NODE = wire.NodeInfo("b" * 56, "client-2", "10.0.0.2")
SERVED = ServedModel("tiny-random", 64, None, "perfsuite")
GAP_S = 0.1  # the schedule: one request every 100 ms


def schedule(num: int) -> list[Request]:
    return [Request(f"r{i}", (3, 4, 5), SamplingParams(2, ignore_eos=True), arrival_time=GAP_S * i) for i in range(num)]


# -- splitting ------------------------------------------------------------------------------------------------------


def test_the_schedule_is_dealt_round_robin_in_arrival_order_and_keeps_its_timebase():
    requests = list(reversed(schedule(7)))  # given in any order: dealt in arrival order
    shares = split_schedule(requests, 3)
    assert [[r.request_id for r in share] for share in shares] == [["r0", "r3", "r6"], ["r1", "r4"], ["r2", "r5"]]
    assert [r.arrival_time for r in shares[1]] == [GAP_S * 1, GAP_S * 4], "offsets unchanged: one timebase"
    assert sorted(r.request_id for share in shares for r in share) == sorted(r.request_id for r in requests)


def test_more_shards_than_requests_leaves_some_idle_and_none_is_refused():
    assert [len(share) for share in split_schedule(schedule(2), 3)] == [1, 1, 0]
    with pytest.raises(ValueError, match="num_shards must be >= 1"):
        split_schedule(schedule(2), 0)


# -- clock offsets --------------------------------------------------------------------------------------------------


class FakeClocks:
    """A controller's clock and a shard's, ``offset_s`` apart; each round trip takes the given delays (out, back)."""

    def __init__(self, offset_s: float, delays: list[tuple[float, float]]) -> None:
        self.now = 1000.0  # the controller's true time
        self.offset_s = offset_s
        self.delays = list(delays)

    def controller(self) -> float:
        return self.now

    def read_shard(self) -> float:
        out, back = self.delays.pop(0)
        self.now += out
        reading = self.now + self.offset_s
        self.now += back
        return reading


def test_the_offset_comes_from_the_shortest_round_trip_and_is_within_half_of_it():
    # the shortest round trip (2 ms, asymmetric) is kept; the slow ones (up to 80 ms) would be off by up to 40 ms
    clocks = FakeClocks(offset_s=-250.0, delays=[(0.070, 0.010), (0.0015, 0.0005), (0.040, 0.040)])
    offset = measure_offset(clocks.read_shard, clocks.controller, num_round_trips=3)
    assert offset.num_round_trips == 3
    assert offset.error_bound_s == pytest.approx(0.001)
    assert offset.offset_s == pytest.approx(-250.0 + 0.0005)  # out 1.5 ms, back 0.5 ms: off by half the difference
    assert abs(offset.offset_s - clocks.offset_s) <= offset.error_bound_s
    assert offset.to_controller(offset.to_shard(12.5)) == pytest.approx(12.5)


@given(
    offset_s=st.floats(-1e4, 1e4),
    delays=st.lists(st.tuples(st.floats(0, 0.5), st.floats(0, 0.5)), min_size=1, max_size=8),
)
def test_the_true_offset_is_always_within_the_stated_bound(offset_s, delays):
    clocks = FakeClocks(offset_s, delays)
    offset = measure_offset(clocks.read_shard, clocks.controller, num_round_trips=len(delays))
    assert abs(offset.offset_s - offset_s) <= offset.error_bound_s + 1e-9
    assert offset.error_bound_s == pytest.approx(min(out + back for out, back in delays) / 2, abs=1e-9)


def test_no_round_trip_or_a_clock_that_went_backwards_is_refused():
    with pytest.raises(ValueError, match="no round trip"):
        estimate_offset([])
    with pytest.raises(ValueError, match="went backwards"):
        estimate_offset([RoundTrip(sent=5.0, remote=1.0, received=4.0)])


# -- merging onto the controller's clock ------------------------------------------------------------------------------


def record(request: Request, start: float, lag_s: float = 0.001) -> RequestRecord:
    """An open-loop request's record on a clock on which the run started at ``start``."""
    scheduled = start + request.arrival_time
    sent = scheduled + lag_s
    return RequestRecord(request.request_id, 3, (7, 8), scheduled, None, (sent + 0.02, sent + 0.03), sent + 0.03,
                         FinishReason.LENGTH, scheduled_time=scheduled, send_ready_time=scheduled,
                         sent_time=sent)  # fmt: skip


def shard_run(share, start: float, lag_s: float = 0.001) -> RunResult:
    records = tuple(record(r, start, lag_s) for r in share)
    return RunResult("openai-http", records, start, start + 1.0, EngineCounters())


def test_shards_on_other_clocks_merge_into_one_run_in_schedule_order_on_the_controllers_clock():
    start = 50.0  # the controller's
    offsets = [ClockOffset(+100.0, 0.001, 8), ClockOffset(-7.5, 0.002, 8)]
    shares = split_schedule(schedule(6), 2)
    runs = [shard_run(share, offset.to_shard(start)) for share, offset in zip(shares, offsets)]

    merged = merge_runs([on_controller_clock(run, offset) for run, offset in zip(runs, offsets)], start)

    assert [r.request_id for r in merged.records] == [f"r{i}" for i in range(6)], "schedule order, shards interleaved"
    assert [r.scheduled_time for r in merged.records] == pytest.approx([start + GAP_S * i for i in range(6)])
    assert [r.sent_time for r in merged.records] == pytest.approx([start + GAP_S * i + 0.001 for i in range(6)])
    assert merged.records[1].token_times == pytest.approx((start + GAP_S + 0.021, start + GAP_S + 0.031))
    assert merged.start_time == start and merged.end_time == pytest.approx(start + 1.0)


def test_a_request_two_shards_sent_is_refused_rather_than_counted_twice():
    share = schedule(2)
    with pytest.raises(ValueError, match="r0"):
        merge_runs([shard_run(share, 0.0), shard_run(share[:1], 0.0)], 0.0)


# -- the send-lag check per shard --------------------------------------------------------------------------------------


def test_a_shard_that_falls_behind_is_named_though_the_merged_run_keeps_the_schedule():
    from perfsuite.measure.send_lag import client_bound_reason

    shares = split_schedule(schedule(100), 20)
    keeping = [shard_run(share, 0.0) for share in shares[:19]]
    behind = shard_run(shares[19], 0.0, lag_s=0.080)  # 80 ms late, every request: past the 50 ms most a bound allows
    named = [(f"shard {i} on node client-{i}", [run]) for i, run in enumerate([*keeping, behind])]

    reason = shards_client_bound_reason(named)

    assert reason is not None and reason.startswith("client-bound: 1 of 20 load-generator shards fell behind")
    assert "shard 19 on node client-19 in 1 of 1 repeats (worst: p90 send lag 80.0 ms" in reason
    assert "shard 0 " not in reason and "Fix: give the load generator CPU" in reason
    merged = merge_runs([*keeping, behind], 0.0)
    assert client_bound_reason([merged]) is None, "in the merged run, one shard's lags in 20 hide above its p90"
    assert shards_client_bound_reason(named[:19]) is None


# -- the wire -------------------------------------------------------------------------------------------------------


def test_the_shards_messages_travel_typed_and_versioned():
    run = shard_run(schedule(2), 3.0)
    messages = [
        wire.HttpClientSpec("http://127.0.0.1:8000", HttpClientOptions(server_model="m", api_key="k")),
        wire.ClockReading(12.25),
        wire.ShardPrepare(2, (3, 4)),
        wire.ShardRun("t::x", 1, 2, tuple(schedule(2)), 99.5),
        wire.ShardResult("t::x", 1, NODE, run, SERVED),
    ]
    for message in messages:
        assert wire.loads(type(message), wire.dumps(message)) == message
    data = json.loads(wire.dumps(messages[3]))
    with pytest.raises(wire.ClusterWireError, match="version 0, this side speaks"):
        wire.loads(wire.ShardRun, json.dumps({**data, "v": 0}))


# -- faults, with Ray's own exceptions and no cluster ------------------------------------------------------------------


def test_a_shard_that_dies_fails_the_run_naming_it_and_its_node_and_no_share_is_kept(shards_on_fake_actors,
                                                                                     monkeypatch):  # fmt: skip
    import ray

    from perfsuite.cluster.pool import ClusterError

    shards, actors = shards_on_fake_actors
    killed = []
    monkeypatch.setattr(ray, "kill", killed.append)

    def get(ref, timeout):
        if ref.startswith('{"type":"ShardResult"') and wire.loads(wire.ShardResult, ref).shard == 1:
            raise ray.exceptions.RayActorError()
        return ref

    monkeypatch.setattr(ray, "get", get)
    died = r"client shard 1 on node client-2 \(10.0.0.2, node bbbbbbbbbbbb\) died during `run its share of t::x`: "
    with pytest.raises(ClusterError, match=died + r".*the run's records are not kept"):
        shards.run("t::x", schedule(4), batch_size=2)
    assert killed == [actors[0], actors[1]], "the surviving shard is stopped too: nothing of the run goes on"
    assert not shards._actors, "both are replaced at the next run"


def test_a_shard_that_hangs_fails_the_run_naming_it_and_the_option(shards_on_fake_actors, monkeypatch):
    import ray

    from perfsuite.cluster.pool import ClusterError

    shards, actors = shards_on_fake_actors
    killed = []
    monkeypatch.setattr(ray, "kill", killed.append)

    def hangs(ref, timeout):
        if ref.startswith('{"type":"ShardResult"'):
            raise ray.exceptions.GetTimeoutError("timed out")
        return ref

    monkeypatch.setattr(ray, "get", hangs)
    with pytest.raises(ClusterError, match=r"client shard 0 on node client-1 .* did not run its share of t::x within "
                                           r"5.\d* s and was killed.*--perf-worker-timeout"):  # fmt: skip
        shards.run("t::x", schedule(4), batch_size=2)
    assert killed == [actors[0], actors[1]]


class Remote:
    """``actor.method.remote(...)`` of a fake actor: the call happens at once, its answer is the "ref"."""

    def __init__(self, method) -> None:
        self.remote = method


class FakeShardActor:
    """A client shard whose clock runs ``offset_s`` ahead of this process's; it "sends" each request on time."""

    def __init__(self, node: wire.NodeInfo, offset_s: float) -> None:
        import time

        self.node, self.offset_s, self._time = node, offset_s, time.perf_counter
        self.clock = Remote(lambda: wire.dumps(wire.ClockReading(self._time() + self.offset_s)))
        self.prepare = Remote(lambda text: self.clock.remote())
        self.run = Remote(self._run)
        self.runs: list[wire.ShardRun] = []

    def _run(self, text: str) -> str:
        message = wire.loads(wire.ShardRun, text)
        self.runs.append(message)
        start = message.start_time
        run = shard_run(message.requests, start) if message.max_concurrency is None else RunResult(
            "openai-http", tuple(dataclasses.replace(record(r, start), scheduled_time=None, send_ready_time=None,
                                                     sent_time=None) for r in message.requests),
            start, start + 1.0, EngineCounters())  # fmt: skip
        return wire.dumps(wire.ShardResult(message.test_id, message.shard, self.node, run, SERVED))


@pytest.fixture
def shards_on_fake_actors(monkeypatch):
    """``ClientShards`` of 2 over fake actors on clocks 300 s ahead and 20 s behind this one; Ray's get is identity."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'perfsuite[ray]'")
    from perfsuite.cluster.client_pool import ClientShards

    actors = {0: FakeShardActor(NODE, 300.0), 1: FakeShardActor(OTHER_NODE, -20.0)}
    shards = ClientShards(2, wire.HttpClientSpec("http://127.0.0.1:9", HttpClientOptions()), timeout=5)
    shards._actors, shards._nodes = dict(actors), {0: NODE, 1: OTHER_NODE}
    monkeypatch.setattr(ray, "get", lambda ref, timeout: ref)
    return shards, actors


def test_the_controller_splits_agrees_a_start_on_each_clock_and_merges_onto_its_own(shards_on_fake_actors):
    import time

    shards, actors = shards_on_fake_actors
    before = time.perf_counter()
    sharded = shards.run("t::x", schedule(5), batch_size=4)

    assert [[r.request_id for r in actor.runs[0].requests] for actor in actors.values()] == [["r0", "r2", "r4"],
                                                                                            ["r1", "r3"]]  # fmt: skip
    assert [actor.runs[0].batch_size for actor in actors.values()] == [2, 2], "4 connections, split"
    start = sharded.merged.start_time
    assert before + START_MARGIN_S <= start <= time.perf_counter() + START_MARGIN_S + 0.1, "ahead, on this clock"
    for actor, part in zip(actors.values(), sharded.shards):
        assert abs(part.offset.offset_s - actor.offset_s) <= part.offset.error_bound_s
        assert actor.runs[0].start_time == pytest.approx(start + actor.offset_s, abs=part.offset.error_bound_s)
    assert [r.request_id for r in sharded.merged.records] == [f"r{i}" for i in range(5)]
    assert [r.scheduled_time for r in sharded.merged.records] == pytest.approx(
        [start + GAP_S * i for i in range(5)], abs=1e-6)  # fmt: skip
    assert sharded.served_model == SERVED


def test_a_closed_loop_is_sent_whole_by_one_shard(shards_on_fake_actors):
    shards, actors = shards_on_fake_actors
    sharded = shards.run("t::x", schedule(5), batch_size=4, max_concurrency=2)
    assert [len(actor.runs) for actor in actors.values()] == [1, 0]
    assert actors[0].runs[0].max_concurrency == 2 and actors[0].runs[0].batch_size == 4
    assert len(sharded.merged.records) == 5 and len(sharded.shards) == 1


# -- the recorder: merged runs judged as one client's ------------------------------------------------------------------


class FakeShards:
    """``ClientShards.run`` without Ray: shard 1 runs on a clock 40 s ahead and sends ``lag_s`` late."""

    def __init__(self, lag_s: float = 0.001) -> None:
        self.lag_s = lag_s
        self.calls: list[tuple[str, int, int]] = []

    def run(self, test_id, requests, batch_size, max_concurrency=None) -> ShardedRun:
        self.calls.append((test_id, len(requests), batch_size))
        start = 10.0 * len(self.calls)
        offsets = (ClockOffset(0.0, 0.001, 8), ClockOffset(40.0, 0.001, 8))
        parts = tuple(
            ShardRecord(i, node, shard_run(share, offset.to_shard(start), self.lag_s if i else 0.001), offset)
            for i, (share, offset, node) in enumerate(zip(split_schedule(requests, 2), offsets, (NODE, OTHER_NODE)))
        )  # fmt: skip
        merged = merge_runs([on_controller_clock(p.run, p.offset) for p in parts], start)
        return ShardedRun(merged, parts, SERVED)


def measure_sharded(tmp_path, shards: FakeShards):
    from test_server_identity import Benchmark, session

    from perfsuite.adapters import Backend, EngineConfig
    from perfsuite.plugin.cluster import ClusterEngine
    from perfsuite.plugin.measurers import measurer_for
    from perfsuite.plugin.recorder import PerfRecorder

    perf_session = session(tmp_path, ray="auto", client_shards=2)
    perf_session.cluster, perf_session.client_shards = object(), shards  # the pool is not asked: shards measure
    perf_session.measurer = measurer_for(perf_session)
    backend = Backend(runner=None, tokenize=list, eos_token_id=None, max_context=64, device="cpu")
    engine = ClusterEngine("openai-http", EngineConfig(4, 64))
    return PerfRecorder(perf_session, "t.py::test_served", Benchmark(), backend).measure(engine, schedule(8))


def test_the_merged_runs_are_recorded_as_one_clients_under_the_servers_identity(tmp_path):
    shards = FakeShards()
    result = measure_sharded(tmp_path, shards)

    assert shards.calls == [("t.py::test_served", 8, 4)] * 4, "the smoke profile's warm-up, then 3 repeats"
    measured = result.measurement
    assert measured.environment.served_model == "tiny-random" and measured.parameters.model == "tiny-random"
    assert measured.configuration.decode_mode == "server" and measured.configuration.num_requests == 8
    assert measured.noisy is None and measured.send_lag.num_requests == 8, "lags of all 8 requests, one run"
    # judged only against runs sent by as many shards, never against a one-client baseline
    assert dict(measured.configuration.engine_knobs)["client_shards"] == 2
    assert result.node == f"client shards on {NODE}, {OTHER_NODE}"


def test_a_closed_loop_reaches_the_shards_with_its_concurrency(tmp_path):
    from test_server_identity import Benchmark, session

    from perfsuite.adapters import Backend, EngineConfig
    from perfsuite.plugin.cluster import ClusterEngine
    from perfsuite.plugin.measurers import measurer_for
    from perfsuite.plugin.recorder import PerfRecorder

    asked = []

    class ClosedLoopShards(FakeShards):
        def run(self, test_id, requests, batch_size, max_concurrency=None):
            asked.append(max_concurrency)
            return super().run(test_id, requests, batch_size)

    perf_session = session(tmp_path, ray="auto", client_shards=2)
    perf_session.cluster, perf_session.client_shards = object(), ClosedLoopShards()
    perf_session.measurer = measurer_for(perf_session)
    backend = Backend(runner=None, tokenize=list, eos_token_id=None, max_context=64, device="cpu")
    recorder = PerfRecorder(perf_session, "t.py::test_closed", Benchmark(), backend)
    recorder.measure(ClusterEngine("openai-http", EngineConfig(4, 64)), schedule(8), max_concurrency=2)
    assert asked == [2] * 4


def test_a_shard_behind_its_schedule_makes_the_test_client_bound_naming_the_shard(tmp_path):
    result = measure_sharded(tmp_path, FakeShards(lag_s=0.080))
    assert "shard 1 on node client-2 (10.0.0.2, node bbbbbbbbbbbb) in 3 of 3 repeats" in result.measurement.noisy
    assert "shard 0" not in result.measurement.noisy


# -- usage errors ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--perf-client-shards", "0"), "*--perf-client-shards: *at least 1 client shard*"),
        (("--perf-client-shards", "2", "--perf-engines", "openai-http", "--perf-endpoint", "http://localhost:1"),
         "*--perf-client-shards 2 runs the load generator on Ray actors: give --perf-ray*"),
        (("--perf-client-shards", "2", "--perf-ray", "auto", "--perf-engines", "static,openai-http",
          "--perf-endpoint", "http://localhost:1"),
         "*static runs in-process with no client to split; give --perf-engines openai-http*"),
        (("--perf-client-shards", "2", "--perf-ray", "auto", "--perf-engines", "openai-http", "--perf-api", "chat",
          "--perf-endpoint", "http://localhost:1"), "*a client shard loads no tokenizer*"),
        (("--perf-ray", "auto", "--perf-engines", "openai-http", "--perf-endpoint", "http://localhost:1"),
         "*split its load over the cluster with --perf-client-shards N (N >= 2), or measure it without --perf-ray"),
    ],
)
def test_shards_the_session_cannot_use_are_usage_errors(pytester, args, message):
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest_inprocess("--perf", "-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}"])


def test_the_option_reaches_the_sessions_options(pytester):
    from perfsuite.plugin.options import read_options

    config = pytester.parseconfig("--perf-client-shards", "3", "--perf-ray", "auto", "--perf-engines", "openai-http",
                                  "--perf-endpoint", "http://localhost:1")  # fmt: skip
    assert read_options(config).client_shards == 3
    assert read_options(pytester.parseconfig()).client_shards == 1, "default: the client in this process"


@pytest.fixture
def fake_server_url():
    """A fake vLLM-like server (tests/test_openai_http.py's) over loopback: ``fake_server_url(behaviour)``."""
    from test_openai_http import FakeOpenAIServer

    from perfsuite.serve import ServerThread

    threads = []

    def start(behaviour) -> str:
        thread = ServerThread(FakeOpenAIServer(behaviour))
        thread.__enter__()
        threads.append(thread)
        return thread.url

    yield start
    for thread in threads:
        thread.__exit__(None, None, None)


# -- a shard's client against a fake server (loopback, no Ray) ---------------------------------------------------------


def test_a_shards_client_starts_its_schedule_at_the_agreed_time(fake_server_url):
    import time

    from test_openai_http import VLLM, engine_for

    engine = engine_for(fake_server_url(VLLM))
    engine.prompt_format  # noqa: B018 - the probe, before the clock starts (as a shard's prepare)
    start_at = time.perf_counter() + 0.3
    run = engine.run(schedule(2), start_at=start_at)
    assert run.start_time == start_at
    assert [r.scheduled_time for r in run.records] == [start_at, start_at + GAP_S]
    assert all(r.sent_time >= r.scheduled_time for r in run.records), "nothing went before the agreed start"


def test_a_shard_without_a_tokenizer_names_a_text_only_server_as_the_reason(fake_server_url):
    from dataclasses import replace

    from test_openai_http import VLLM

    from perfsuite.adapters.openai_http import OpenAIHttpEngine, OpenAIHttpError
    from perfsuite.cluster.client_actor import _no_tokenizer

    url = fake_server_url(replace(VLLM, sends_token_ids=False))
    engine = OpenAIHttpEngine(url, 2, _no_tokenizer, options=HttpClientOptions(), probe_prompt_ids=(3, 4))
    with pytest.raises(OpenAIHttpError, match=r"streamed text only; measure it with one client"):
        engine.run(schedule(1))


def test_a_session_with_shards_starts_them_beside_the_pool_and_stops_them_at_its_end(pytester, monkeypatch):
    from perfsuite.cluster.client_pool import ClientShards
    from perfsuite.plugin import cluster

    stopped = []
    monkeypatch.setattr(cluster, "start_cluster", lambda options: FakePool(stopped))  # no Ray: the pool's part
    monkeypatch.setattr(cluster, "client_cpus", lambda: 4)
    monkeypatch.setattr(ClientShards, "close", lambda self: stopped.append(f"{self.num_shards} shards"))
    pytester.makepyfile("""
        import pytest
        from perfsuite.plugin.stash import SESSION_KEY

        @pytest.mark.perf
        def test_shards(request):
            shards = request.config.stash[SESSION_KEY].client_shards
            assert (shards.num_shards, shards.spec.endpoint) == (3, "http://127.0.0.1:9")
            assert shards.spec.options.server_model == "m"
    """)  # fmt: skip
    result = pytester.runpytest_inprocess(
        "--perf", "-p", "no:cacheprovider", "--perf-history", "none", "--perf-ray", "auto", "--perf-engines",
        "openai-http", "--perf-endpoint", "http://127.0.0.1:9", "--perf-server-model", "m", "--perf-client-shards", "3",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    assert stopped == ["3 shards", "pool"], "the shards first, while the pool still holds Ray"


def test_more_shards_than_the_clusters_cpus_is_a_usage_error_naming_the_limit(pytester, monkeypatch):
    from perfsuite.plugin import cluster

    monkeypatch.setattr(cluster, "start_cluster", lambda options: FakePool([]))
    monkeypatch.setattr(cluster, "client_cpus", lambda: 2)
    pytester.makepyfile("import pytest\n\n@pytest.mark.perf\ndef test_shards(request):\n    pass\n")
    result = pytester.runpytest_inprocess(
        "--perf", "-p", "no:cacheprovider", "--perf-history", "none", "--perf-ray", "auto", "--perf-engines",
        "openai-http", "--perf-endpoint", "http://127.0.0.1:9", "--perf-server-model", "m", "--perf-client-shards", "3",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--perf-client-shards 3: the cluster's live nodes have 2 CPU(s), one for each "
                                 "shard's client; give at most 2, or add a node*"])  # fmt: skip


class FakePool:
    def __init__(self, stopped: list[str]) -> None:
        self.stopped = stopped

    def close(self) -> None:
        self.stopped.append("pool")
