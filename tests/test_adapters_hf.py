"""The Hugging Face peer adapters keep perfsuite's run semantics: records, arrivals, counters, errors."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from perfsuite.adapters import Backend, BatchingEngine, EngineConfig, build_engine
from perfsuite.engine import EngineCounters, FinishReason, Request, SamplingParams
from perfsuite.engine.reference import ReferenceDecoder
from perfsuite.models import load_model

PEERS = ("hf-static", "hf-cb")
MAX_SEQ_LEN = 64


@pytest.fixture(scope="module")
def tiny():
    loaded = load_model("tiny-random", dtype="float64")
    return Backend.from_loaded(loaded), ReferenceDecoder(loaded.model, loaded.eos_token_id)


def ignoring_eos(request_id: str, prompt_len: int, max_new_tokens: int, arrival_time: float = 0.0) -> Request:
    prompt = tuple((11 * len(request_id) + 7 * j) % 300 + 3 for j in range(prompt_len))
    return Request(request_id, prompt, SamplingParams(max_new_tokens, ignore_eos=True), arrival_time)


def build(name: str, backend: Backend, batch_size: int = 3) -> BatchingEngine:
    return build_engine(name, backend, EngineConfig(batch_size, MAX_SEQ_LEN))


@pytest.mark.parametrize("name", PEERS)
def test_peers_follow_the_protocol(tiny, name):
    engine = build(name, tiny[0], batch_size=3)
    assert isinstance(engine, BatchingEngine)
    assert engine.name == name and engine.batch_size == 3 and engine.greedy_equal


@pytest.mark.parametrize("name", PEERS)
def test_every_request_gets_a_record_with_one_time_per_token(tiny, name):
    requests = [ignoring_eos(f"r{i}", 4 + 3 * i, n) for i, n in enumerate((5, 1, 9, 3, 7))]
    steps = []
    result = build(name, tiny[0]).run(requests, on_step=steps.append)
    assert sorted(result.outputs()) == sorted(r.request_id for r in requests)
    for request, record in zip(requests, sorted(result.records, key=lambda r: int(r.request_id[1:]))):
        assert record.num_output_tokens == request.sampling_params.max_new_tokens == len(record.token_times)
        assert record.finish_reason is FinishReason.LENGTH
        assert result.start_time <= record.arrival_time <= record.first_scheduled_time <= record.token_times[0]
        assert list(record.token_times) == sorted(record.token_times)
        assert record.finished_time == record.token_times[-1] <= result.end_time
    assert sum(len(outputs) for outputs in steps) == sum(r.sampling_params.max_new_tokens for r in requests)
    assert sum(o.finished for outputs in steps for o in outputs) == len(requests)


@pytest.mark.parametrize("name", PEERS)
def test_a_request_gets_in_only_once_its_arrival_time_has_passed(tiny, name):
    requests = [ignoring_eos("early", 5, 3), ignoring_eos("late", 6, 3, arrival_time=0.3)]
    result = build(name, tiny[0]).run(requests)
    records = {r.request_id: r for r in result.records}
    assert records["early"].arrival_time == result.start_time
    assert records["late"].arrival_time == pytest.approx(result.start_time + 0.3, abs=1e-9)
    assert records["late"].first_scheduled_time >= records["late"].arrival_time
    assert records["late"].first_scheduled_time > records["early"].finished_time  # the engine was idle meanwhile


@pytest.mark.parametrize("name", PEERS)
def test_a_closed_loop_keeps_at_most_that_many_requests_unfinished(tiny, name):
    requests = [ignoring_eos(f"r{i}", 5 + i, n) for i, n in enumerate((6, 2, 4, 3, 5))]
    result = build(name, tiny[0], batch_size=4).run(requests, max_concurrency=2)
    records = sorted(result.records, key=lambda r: r.arrival_time)
    assert len(records) == 5
    for record in records:
        unfinished = [r for r in records if r.arrival_time <= record.arrival_time < r.finished_time]
        assert len(unfinished) <= 2
    # a client's next request gets in when its previous one finishes
    assert records[2].arrival_time >= min(r.finished_time for r in records[:2])


def test_hf_static_counters_match_a_hand_computed_run(tiny):
    requests = [ignoring_eos("a", 3, 2), ignoring_eos("b", 5, 4), ignoring_eos("c", 4, 3)]
    result = build("hf-static", tiny[0], batch_size=2).run(requests)
    # batch 1 (a, b): 4 steps; prefill 3 + 5; decode (2-1) + (4-1); padding: a is left-padded
    # by 2 and computed for 2 steps after it finished. batch 2 (c): 3 steps, prefill 4, decode 2.
    assert result.counters == EngineCounters(
        num_forward_passes=4 + 3,
        num_decode_steps=3 + 2,
        num_prefill_tokens=8 + 4,
        num_decode_tokens=4 + 2,
        num_padding_tokens=4 + 0,
    )


def test_hf_cb_counts_nothing_it_cannot_observe_exactly(tiny):
    result = build("hf-cb", tiny[0]).run([ignoring_eos("a", 3, 2)])
    assert result.counters == EngineCounters()


@pytest.mark.parametrize("name", PEERS)
def test_outputs_stop_at_their_own_length_eos_and_stop_tokens(tiny, name):
    backend, reference = tiny
    prompt = tuple(range(40, 52))
    free_run = reference.generate(Request("free", prompt, SamplingParams(20, ignore_eos=True))).token_ids
    eos, stop_token = free_run[5], free_run[2]  # pretend the sixth token is EOS, the third a stop token
    requests = [
        Request("stops-at-eos", prompt, SamplingParams(20)),
        Request("ignores-eos", prompt, SamplingParams(20, ignore_eos=True)),
        Request("short", prompt, SamplingParams(3)),
        Request("stop-token", prompt, SamplingParams(20, ignore_eos=True, stop_token_ids=(stop_token,))),
    ]
    engine = build_engine(name, dataclasses.replace(backend, eos_token_id=eos), EngineConfig(4, MAX_SEQ_LEN))
    records = {r.request_id: r for r in engine.run(requests).records}
    with_eos = {r.request_id: ReferenceDecoder(backend.model, eos).generate(r) for r in requests}
    expected = {request_id: (ref.token_ids, ref.finish_reason) for request_id, ref in with_eos.items()}
    assert {k: (r.output_token_ids, r.finish_reason) for k, r in records.items()} == expected
    assert len(records["stops-at-eos"].output_token_ids) < 20 and len(records["stop-token"].output_token_ids) < 20


@pytest.mark.parametrize("name", PEERS)
def test_bad_input_raises_before_running_and_leaves_the_engine_usable(tiny, name):
    engine = build(name, tiny[0])
    with pytest.raises(ValueError, match="appears twice"):
        engine.run([ignoring_eos("x", 3, 2), ignoring_eos("x", 4, 2)])
    with pytest.raises(ValueError, match="exceeds the engine's context of 64"):
        engine.run([ignoring_eos("long", 60, 5)])
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        engine.run([Request("oov", (5, 320), SamplingParams(2))])
    with pytest.raises(ValueError, match="max_concurrency"):
        engine.run([ignoring_eos("x", 3, 2)], max_concurrency=0)
    assert engine.run([]).records == ()
    assert engine.run([ignoring_eos("x", 3, 2)]).outputs()["x"] == tiny[1].generate(ignoring_eos("x", 3, 2)).token_ids


def test_hf_cb_leaves_no_thread_behind(tiny):
    before = threading.active_count()
    build("hf-cb", tiny[0]).run([ignoring_eos(f"r{i}", 4, 3) for i in range(4)])
    assert threading.active_count() == before


def test_a_failure_inside_hf_cb_raises_instead_of_hanging(tiny, monkeypatch):
    backend = tiny[0]
    engine = build("hf-cb", backend)
    before = threading.active_count()

    def broken_forward(*args, **kwargs):
        raise RuntimeError("simulated kernel failure")

    with monkeypatch.context() as patch:
        patch.setattr(backend.model, "forward", broken_forward)
        with pytest.raises(RuntimeError, match="simulated kernel failure"):
            engine.run([ignoring_eos(f"r{i}", 4, 3) for i in range(3)])
    assert threading.active_count() == before
    assert engine.run([ignoring_eos("after", 4, 3)]).outputs()["after"]  # still usable


def test_a_stuck_hf_cb_manager_times_out(tiny, monkeypatch):
    from perfsuite.adapters.hf_cb import HFContinuousBatchingEngine

    backend = tiny[0]
    engine = HFContinuousBatchingEngine(backend.model, backend.eos_token_id, EngineConfig(2, MAX_SEQ_LEN), 0.3)
    before = threading.active_count()

    def stuck_forward(*args, **kwargs):
        time.sleep(1.0)
        raise RuntimeError("gave up")

    with monkeypatch.context() as patch:
        patch.setattr(backend.model, "forward", stuck_forward)
        with pytest.raises(TimeoutError, match="no generation step for 0.3 s"):
            engine.run([ignoring_eos("r", 4, 3)])
    assert threading.active_count() == before
