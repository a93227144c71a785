"""What a test's repeats add up to: typed samples, vLLM's summary and the timeline of one run."""

from __future__ import annotations

import math

from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.engine.types import EngineCounters
from perfsuite.measure.metrics import SLO
from perfsuite.measure.summaries import (
    BUSY_SHARE,
    GOODPUT,
    PROBE,
    Repeats,
    RunSummary,
    RunTimeline,
    summarise,
)
from perfsuite.workload import OutputLengths, Workload
from own_engines import own_engine

METRICS = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "median_e2el_ms")


def runs(engine_kind="static", max_new_tokens=(2, 9), repeats=3):
    requests = Workload(6, OutputLengths("uniform", *max_new_tokens), seed=3).requests(lambda t: [3, 4, 5])
    engine = own_engine(engine_kind, FakeRunner(), batch_size=4, max_seq_len=64, eos_token_id=None)
    return tuple(engine.run(requests) for _ in range(repeats))


def test_one_sample_per_repeat_with_the_probes_and_busy_shares():
    measured = summarise(Repeats(runs(), probes=(0.1, 0.2, 0.3), busy_shares=(0.0, 0.1, 0.0)), METRICS)
    assert set(measured.samples) == {*METRICS, PROBE, BUSY_SHARE}
    assert all(len(values) == 3 for values in measured.samples.values())
    assert measured.samples[PROBE] == (0.1, 0.2, 0.3)
    assert isinstance(measured.counters, EngineCounters) and measured.counters.num_forward_passes > 0
    assert measured.summary.completed == 18 and measured.summary.request_goodput is None


def test_a_metric_undefined_in_some_repeat_is_dropped_not_stored_as_nan():
    measured = summarise(Repeats(runs(max_new_tokens=(1, 1))), METRICS)  # one token each: TPOT is undefined
    assert "median_tpot_ms" not in measured.samples and "output_throughput" in measured.samples


def test_goodput_is_sampled_and_summarised_with_an_slo():
    measured = summarise(Repeats(runs()), (*METRICS, GOODPUT), SLO.parse("ttft=10s"))
    assert len(measured.samples[GOODPUT]) == 3
    assert math.isclose(measured.summary.request_goodput, measured.summary.request_throughput)


def test_the_summary_round_trips_through_vllms_flat_keys():
    summary = summarise(Repeats(runs()), METRICS, SLO.parse("ttft=10s")).summary
    keys = summary.vllm_keys()
    assert {"median_ttft_ms", "p99_itl_ms", "std_e2el_ms", "completed", GOODPUT} <= set(keys)
    assert keys["p99_ttft_ms"] == summary.ttft.p99_ms
    assert all(isinstance(value, (int, float)) for value in keys.values())  # vLLM's keys stay numbers
    assert RunSummary.from_vllm_keys({**keys, **summary.interval_keys()}) == summary


def test_the_timeline_names_each_chunk_and_request():
    timeline = summarise(Repeats(runs()), METRICS).timeline
    assert isinstance(timeline, RunTimeline) and timeline.num_slots == 4 and timeline.steps
    assert all(step.end >= step.start >= 0 for step in timeline.steps)
    padding = [c for step in timeline.steps for c in step.chunks if c.is_padding]
    assert padding, "a static batch pads rows of finished requests"
    assert {r.request_id for r in timeline.requests} == {c.request_id for s in timeline.steps for c in s.chunks}


def test_the_timeline_keeps_the_kv_pool_each_steps_use_and_its_preemptions():
    import dataclasses

    from perfsuite.engine.types import StepTrace

    run = runs("inflight", repeats=1)[0]
    timeline = summarise(Repeats((run,)), METRICS).timeline
    assert (timeline.num_kv_blocks, timeline.kv_block_size) == (run.num_kv_blocks, run.kv_block_size) == (4, 64)
    assert [s.num_kv_blocks_used for s in timeline.steps] == [s.num_kv_blocks_used for s in run.steps]
    assert max(s.num_kv_blocks_used for s in timeline.steps) == run.counters.peak_kv_blocks_used > 0
    preempting = StepTrace(run.start_time + 1.0, run.start_time + 2.0, 1, (), 3, 40, ("r4", "r5"))
    timeline = summarise(Repeats((dataclasses.replace(run, steps=(preempting,)),)), METRICS).timeline
    [step] = timeline.steps
    assert (step.start, step.num_kv_blocks_used, step.num_kv_tokens_used) == (1.0, 3, 40)
    assert step.preempted_request_ids == ("r4", "r5")
