"""``Engine.forget_finished``: how a long-lived caller keeps the engine's records bounded."""

from __future__ import annotations

from perfsuite.engine import EngineCounters, FinishReason, Request, SamplingParams, inflight_engine
from perfsuite.engine.fake_runner import FakeRunner

MAX_SEQ_LEN = 32


def make_engine():
    return inflight_engine(FakeRunner(), decode_batch_size=2, max_seq_len=MAX_SEQ_LEN, eos_token_id=None)


def make_request(request_id: str, max_new_tokens: int) -> Request:
    return Request(request_id, (11, 12, 13), SamplingParams(max_new_tokens, ignore_eos=True))


def step_until_finished(engine, request_id: str) -> None:
    for _ in range(100):
        if any(o.request_id == request_id and o.finished for o in engine.step()):
            return
    raise AssertionError(f"{request_id} did not finish")


def test_it_returns_and_drops_only_finished_and_aborted_requests():
    engine = make_engine()
    for request in (make_request("short", 1), make_request("long", 10), make_request("aborted", 10)):
        engine.add_request(request)
    step_until_finished(engine, "short")
    engine.abort_request("aborted")

    forgotten = engine.forget_finished()

    assert [(r.request_id, r.finish_reason) for r in forgotten] == [
        ("short", FinishReason.LENGTH),
        ("aborted", FinishReason.ABORT),
    ]
    assert forgotten[0].num_output_tokens == 1
    assert [r.request_id for r in engine.result(0.0, 0.0).records] == ["long"]
    assert engine.forget_finished() == [], "each record is handed out once"


def test_the_request_still_in_flight_keeps_its_record_and_the_steps():
    engine = make_engine()
    engine.add_request(make_request("short", 1))
    engine.add_request(make_request("long", 3))
    step_until_finished(engine, "short")
    engine.forget_finished()

    step_until_finished(engine, "long")
    [record] = engine.forget_finished()

    assert record.request_id == "long"
    assert record.num_output_tokens == 3
    assert len(record.token_times) == 3


def test_once_idle_the_counters_and_step_traces_start_over():
    engine = make_engine()
    engine.run([make_request("warm-up", 4)])
    assert engine.result(0.0, 0.0).steps

    [record] = engine.forget_finished()

    result = engine.result(0.0, 0.0)
    assert record.request_id == "warm-up"
    assert (result.records, result.steps, result.counters) == ((), (), EngineCounters())


def test_a_forgotten_request_id_can_be_used_again():
    engine = make_engine()
    engine.add_request(make_request("r", 2))
    step_until_finished(engine, "r")
    engine.forget_finished()

    engine.add_request(make_request("r", 2))
    step_until_finished(engine, "r")

    assert [r.request_id for r in engine.forget_finished()] == ["r"]
