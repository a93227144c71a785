"""Every mode's ``Measurer`` measures through the one repeat loop, so each reaches the same policy outcomes.

The same fake engine (perfsuite's in-flight engine over a fake runner, counting
its runs) goes through the local measurer, the Ray measurer (its actor run in
this process: the real ``MeasureActor.measure`` behind a fake pool) and the
client-shard measurer (fake shards that send its schedule). In each:

- a disturbed repeat (the CPU busy, or a client shard behind its schedule)
  is re-run once the machine is quiet again, and the re-run takes its place;
- a ``--perf-save-baseline`` test whose repeats stay noisy fails, its
  baseline not saved.

A/B pairs (``--perf-against``) are measured on a busy machine by design (both
sides see the same load): a busy pair is kept, with each side's busy share, and
``--perf-save-baseline`` cannot be combined with ``--perf-against``.
"""

from __future__ import annotations

import dataclasses

import pytest
from test_client_shards import NODE, OTHER_NODE, SERVED, shard_run
from test_ray_units import ENVIRONMENT
from test_ray_units import NODE as ACTOR_NODE
from test_server_identity import Benchmark, in_process_engine, requests, session

from perfsuite.adapters import Backend, EngineConfig
from perfsuite.cluster import wire
from perfsuite.cluster.actor import MeasureActor
from perfsuite.cluster.client_pool import ShardedRun, ShardRecord
from perfsuite.cluster.pool import Delivered
from perfsuite.cluster.shards import ClockOffset, merge_runs, on_controller_clock, split_schedule
from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.measure import repeats as repeat_loop
from perfsuite.measure.contention import CpuUse
from perfsuite.plugin.measurers import (
    Conditions,
    Job,
    LocalMeasurer,
    PairedMeasurer,
    PairedTimings,
    RayMeasurer,
    ShardMeasurer,
    Timings,
)
from perfsuite.plugin.recorder import PerfRecorder

pytest_plugins = ["pytester"]

NUM_REPEATS = 4
BUSY = CpuUse(wall_seconds=2.0, num_cpus=2, foreign_share=0.6, steal_share=0.0, own_share=0.4)
QUIET = CpuUse(wall_seconds=2.0, num_cpus=2, foreign_share=0.0, steal_share=0.0, own_share=1.0)


class CountingEngine:
    """The one fake engine every mode serves: it counts the runs it made."""

    def __init__(self) -> None:
        self._engine = in_process_engine()
        self.name = "inflight"
        self.runs_in_process = True
        self.resolves_follow_ups = True
        self.num_runs = 0

    @property
    def batch_size(self) -> int:
        return self._engine.batch_size

    def run(self, requests, on_step=None, max_concurrency=None):
        self.num_runs += 1
        return self._engine.run(requests, on_step=on_step, max_concurrency=max_concurrency)


class Disturbances:
    """Which of the timed repeats (1-based, in the order they ran) are disturbed, and whether the machine quiets."""

    def __init__(self, disturbed: set[int] | str, quiets: bool = True) -> None:
        self.disturbed = disturbed
        self.quiets = quiets
        self.num_timed = 0

    def next_is_disturbed(self) -> bool:
        self.num_timed += 1
        return self.disturbed == "all" or self.num_timed in self.disturbed


@pytest.fixture
def scripted_cpu(monkeypatch):
    """The CPU meter of the repeat loop reads BUSY for the disturbed repeats, else QUIET."""
    script = {"now": Disturbances(set())}

    class ScriptedMeter:
        def __enter__(self):
            self.use = BUSY if script["now"].next_is_disturbed() else QUIET
            return self

        def __exit__(self, *exc_info):
            return None

    monkeypatch.setattr(repeat_loop, "CpuMeter", ScriptedMeter)
    monkeypatch.setattr(repeat_loop, "wait_until_quiet", lambda threshold: script["now"].quiets)

    def set_script(disturbances: Disturbances) -> Disturbances:
        script["now"] = disturbances
        return disturbances

    return set_script


def backend() -> Backend:
    return Backend(runner=FakeRunner(vocab_size=97), tokenize=list, eos_token_id=None, max_context=64, device="cpu",
                   probe=lambda device: 0.01)  # fmt: skip


class FakePool:
    """``RayPool.measure`` without Ray: the real actor's ``measure``, in this process, over the counting engine."""

    def __init__(self, engine: CountingEngine) -> None:
        self.actor = MeasureActor.__new__(MeasureActor)
        self.actor._backend, self.actor._environment, self.actor._node = backend(), ENVIRONMENT, ACTOR_NODE
        self.actor._engines = {}
        self.engine = engine

    def measure(self, request):
        self.actor._engines[request.engine] = self.engine
        return Delivered(wire.loads(wire.MeasureResult, self.actor.measure(wire.dumps(request))))


class FakeShards:
    """``ClientShards.run`` without Ray: the counting engine serves each run; shard 1 lags in disturbed ones."""

    def __init__(self, engine: CountingEngine, script: Disturbances) -> None:
        self.engine = engine
        self.script = script
        self.num_warmups_left = 0

    def run(self, test_id, requests, batch_size, max_concurrency=None) -> ShardedRun:
        self.engine.run(requests, max_concurrency=max_concurrency)
        warming_up = self.num_warmups_left > 0
        self.num_warmups_left -= 1
        lag_s = 0.080 if not warming_up and self.script.next_is_disturbed() else 0.001
        start = 10.0 * self.engine.num_runs
        offsets = (ClockOffset(0.0, 0.001, 8), ClockOffset(40.0, 0.001, 8))
        parts = tuple(
            ShardRecord(i, node, shard_run(share, offset.to_shard(start), lag_s if i else 0.001), offset)
            for i, (share, offset, node) in enumerate(zip(split_schedule(requests, 2), offsets, (NODE, OTHER_NODE)))
        )  # fmt: skip
        return ShardedRun(merge_runs([on_controller_clock(p.run, p.offset) for p in parts], start), parts, SERVED)


def schedule():
    """An open-loop schedule (client shards split one), served by every mode."""
    return tuple(dataclasses.replace(r, arrival_time=0.1 * i) for i, r in enumerate(requests()))


MODES = ("local", "ray", "client shards")


def measurer_for_mode(mode: str, engine: CountingEngine, script: Disturbances):
    """The mode's measurer and the engine a test hands it (a stand-in where the engine is built elsewhere)."""
    if mode == "local":
        return LocalMeasurer(), engine
    pool = FakePool(engine)
    ray = RayMeasurer(pool, [])  # type: ignore[arg-type]
    if mode == "ray":
        return ray, ray.engine("inflight", EngineConfig(2, 64), backend())
    shards = FakeShards(engine, script)
    shards.num_warmups_left = 1  # the smoke profile's warm-up: never disturbed
    measurer = ShardMeasurer(shards, ray)  # type: ignore[arg-type]
    return measurer, measurer.engine("openai-http", EngineConfig(2, 64), backend())


def job(engine, measurer) -> Job:
    return Job("t.py::test_x", engine, schedule(), None, NUM_REPEATS, Conditions(1, 0.05, backend()))


@pytest.mark.parametrize("mode", MODES)
def test_a_disturbed_repeat_is_re_run_and_the_re_run_takes_its_place(mode, scripted_cpu):
    engine = CountingEngine()
    script = scripted_cpu(Disturbances({2}))  # the second timed repeat is disturbed
    measurer, handed = measurer_for_mode(mode, engine, script)

    timings = measurer.measure(job(handed, measurer))

    assert isinstance(timings, Timings)
    assert engine.num_runs == 1 + NUM_REPEATS + 1, "one warm-up, the repeats, one re-run"
    assert len(timings.repeats.runs) == NUM_REPEATS
    assert timings.repeats.noisy is None, "the re-run replaced the disturbed repeat: nothing noisy is left"
    if mode != "client shards":  # a client's CPU is not read: its disturbance is its send lag
        assert timings.repeats.busy_shares == (0.0,) * NUM_REPEATS


@pytest.mark.parametrize("mode", MODES)
def test_a_noisy_save_baseline_fails_and_saves_nothing(mode, scripted_cpu, tmp_path):
    engine = CountingEngine()
    script = scripted_cpu(Disturbances("all", quiets=False))  # busy for good; every shard run late
    measurer, handed = measurer_for_mode(mode, engine, script)
    perf_session = session(tmp_path, save=True, busy_threshold=0.05)
    perf_session.measurer = measurer
    recorder = PerfRecorder(perf_session, "t.py::test_x", Benchmark(), backend())

    with pytest.raises(pytest.fail.Exception, match=r"baseline not saved: .*record it on a quiet machine"):
        recorder.measure(handed, schedule(), repeats=NUM_REPEATS)

    assert recorder.result is not None and recorder.result.judgement.baseline_status.startswith("not saved")
    assert not (tmp_path / "baselines").exists() or not any((tmp_path / "baselines").rglob("*.json"))


def test_a_busy_ab_pair_is_kept_with_each_sides_busy_share_and_a_save_is_refused_up_front(pytester):
    from perfsuite.ab.pair import PairedRuns
    from perfsuite.plugin.against import WorkerEngine

    engine = CountingEngine()
    runs = tuple(engine.run(requests()) for _ in range(NUM_REPEATS))
    busy = (0.0, 0.6, 0.0, 0.0)  # the second pair ran on a busy machine: both sides saw it

    def transport(the_job, stand_in, threads):
        return PairedRuns(runs, runs, ("AB", "BA", "BA", "AB"), (), busy, busy), True, None, None

    measurer = PairedMeasurer(transport, None)
    stand_in = measurer.engine("inflight", EngineConfig(2, 64), backend())
    assert isinstance(stand_in, WorkerEngine)
    timings = measurer.measure(job(stand_in, measurer))
    assert isinstance(timings, PairedTimings) and engine.num_runs == NUM_REPEATS, "no pair re-run"
    assert timings.current.busy_shares == timings.reference.busy_shares == busy

    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest_inprocess("--perf", "--perf-against", "HEAD", "--perf-save-baseline")
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_the_loop_stops_when_the_machine_stays_busy_and_says_so(scripted_cpu):
    engine = CountingEngine()
    scripted_cpu(Disturbances({1}, quiets=False))
    timings = LocalMeasurer().measure(job(engine, None))
    assert len(timings.repeats.runs) == 1 and engine.num_runs == 2, "the warm-up and the one busy repeat"
    assert timings.repeats.noisy.endswith("the other repeats were not run")


class LaggingEngine(CountingEngine):
    """The counting engine whose load generator falls 80 ms behind its 100 ms schedule in the scripted runs."""

    def __init__(self, script: Disturbances) -> None:
        super().__init__()
        self.script = script
        self.num_warmups_left = 1

    def run(self, requests, on_step=None, max_concurrency=None):
        result = super().run(requests, on_step=on_step, max_concurrency=max_concurrency)
        warming_up, self.num_warmups_left = self.num_warmups_left > 0, self.num_warmups_left - 1
        lag_s = 0.080 if not warming_up and self.script.next_is_disturbed() else 0.0
        sent = tuple(
            dataclasses.replace(r, scheduled_time=r.arrival_time, send_ready_time=r.arrival_time,
                                sent_time=r.arrival_time + lag_s)
            for r in result.records
        )  # fmt: skip
        return dataclasses.replace(result, records=sent)


@pytest.mark.parametrize("mode", ("local", "ray"))
def test_one_clients_lagging_repeat_is_re_run_and_a_lag_left_makes_the_test_noisy(mode, monkeypatch):
    """One load generator behind its schedule is a disturbed repeat, as a shard behind its schedule is."""
    monkeypatch.setattr(repeat_loop, "CpuMeter", lambda: _Quiet())
    once = Disturbances({2})
    engine = LaggingEngine(once)
    measurer, handed = measurer_for_mode(mode, engine, once)
    timings = measurer.measure(job(handed if mode == "ray" else engine, measurer))
    assert isinstance(timings, Timings)
    assert engine.num_runs == 1 + NUM_REPEATS + 1, "one warm-up, the repeats, one re-run of the lagging one"
    assert timings.repeats.noisy is None

    always = Disturbances("all")
    engine = LaggingEngine(always)
    measurer, handed = measurer_for_mode(mode, engine, always)
    timings = measurer.measure(job(handed if mode == "ray" else engine, measurer))
    assert isinstance(timings, Timings)
    assert timings.repeats.noisy is not None and timings.repeats.noisy.startswith("client-bound")
    assert repeat_loop.noisy_save_failure("t.py::test_x", timings.repeats.noisy, save_baseline=True) is not None


class _Quiet:
    def __enter__(self):
        self.use = QUIET
        return self

    def __exit__(self, *exc_info):
        return None
