"""``perfsuite.engine.admission``: when a run's requests get in, and their records, for the engine and peers alike."""

from __future__ import annotations

import pytest

from perfsuite.engine import FinishReason, Request, SamplingParams, StepOutput
from perfsuite.engine.admission import ArrivalQueue, RecordBuilder


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def request(request_id: str, arrival_time: float = 0.0, max_new_tokens: int = 3, **params) -> Request:
    return Request(request_id, (1, 2, 3), SamplingParams(max_new_tokens, **params), arrival_time=arrival_time)


def test_an_open_loop_request_arrives_at_the_run_start_plus_its_offset():
    clock = Clock()
    queue = ArrivalQueue([request("late", 2.0), request("early", 0.5)], max_concurrency=None, clock=clock)
    start = queue.start()
    assert queue.admit(num_unfinished=0) == []
    assert queue.seconds_to_next_arrival() == pytest.approx(0.5)
    clock.now += 3.0
    admitted = queue.admit(num_unfinished=0)
    assert [a.request.request_id for a in admitted] == ["early", "late"]
    assert [a.arrival_time for a in admitted] == [pytest.approx(start + 0.5), pytest.approx(start + 2.0)]
    assert len(queue) == 0 and queue.seconds_to_next_arrival() == float("inf")


def test_a_closed_loop_request_arrives_when_a_client_is_free():
    clock = Clock()
    queue = ArrivalQueue([request(f"r{i}") for i in range(3)], max_concurrency=2, clock=clock)
    queue.start()
    assert [a.request.request_id for a in queue.admit(num_unfinished=0)] == ["r0", "r1"]
    assert queue.admit(num_unfinished=2) == []
    clock.now += 1.0
    [admission] = queue.admit(num_unfinished=1)
    assert admission.arrival_time == clock.now


@pytest.mark.parametrize(
    ("requests", "max_concurrency", "words"),
    [
        ([request("x"), request("x")], None, "appears twice"),
        ([request("x")], 0, "max_concurrency"),
    ],
)
def test_a_bad_run_is_refused_before_anything_gets_in(requests, max_concurrency, words):
    with pytest.raises(ValueError, match=words):
        ArrivalQueue(requests, max_concurrency)


def test_a_record_stopped_by_the_requests_own_rule_drops_what_came_after():
    record = RecordBuilder(request("r", max_new_tokens=5), arrival_time=1.0)
    record.scheduled_at(1.5)
    record.scheduled_at(1.7)
    outputs = record.add_tokens([7, 9, 4, 4], [2.0, 2.1, 2.2, 2.3], eos_token_id=9)
    assert [o.token_id for o in outputs] == [7, 9]
    assert outputs[-1].finish_reason is FinishReason.STOP
    built = record.build()
    assert built.output_token_ids == (7, 9)
    assert built.first_scheduled_time == 1.5
    assert built.finished_time == 2.1
    with pytest.raises(RuntimeError, match="after it finished"):
        record.add(StepOutput("r", 4, None), 2.4)


def test_a_record_keeps_the_engines_own_finish_and_an_abort():
    finished = RecordBuilder(request("r", max_new_tokens=5), arrival_time=0.0)
    finished.add(StepOutput("r", 7, None), 1.0)
    finished.add(StepOutput("r", 8, FinishReason.LENGTH), 2.0)
    assert (finished.build().finish_reason, finished.build().finished_time) == (FinishReason.LENGTH, 2.0)
    aborted = RecordBuilder(request("a"), arrival_time=0.0)
    aborted.finish(FinishReason.ABORT, 3.0)
    assert aborted.build().output_token_ids == ()
    assert (aborted.build().finish_reason, aborted.build().finished_time) == (FinishReason.ABORT, 3.0)
