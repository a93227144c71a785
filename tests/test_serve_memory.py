"""A server under a load that never lets its engine go idle keeps a bounded history.

The engine's step traces and records, and the worker's archive, must not grow
with the number of steps served; each test drives thousands of steps with a
request always waiting, so the engine is never idle, and asserts sizes (no
timing). The clock is a counter, so the step and arrival times are exact.
"""

from __future__ import annotations

import itertools

from perfsuite.engine import FinishReason, Request, SamplingParams, inflight_engine
from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.serve.worker import EngineWorker

NUM_STEPS = 3000
BATCH_SIZE = 4
IN_FLIGHT = 6  # more than the batch: one or two requests are always waiting
MAX_NEW_TOKENS = 12


def busy_engine():
    clock = itertools.count()
    runner = FakeRunner(vocab_size=97)
    return inflight_engine(
        runner, decode_batch_size=BATCH_SIZE, max_seq_len=32, eos_token_id=None, clock=lambda: float(next(clock))
    )


def new_request(number: int) -> Request:
    length = 1 + number * 7 % MAX_NEW_TOKENS  # 1..12 tokens, so requests finish at different steps
    return Request(f"r{number}", (5 + number % 50, 6, 7), SamplingParams(length, ignore_eos=True))


def in_flight(engine) -> int:
    return engine.scheduler.num_running + engine.scheduler.num_waiting


def test_the_engines_step_traces_stay_bounded_under_continuous_arrivals():
    engine = busy_engine()
    numbers = itertools.count()
    largest_history = 0
    num_finished = 0
    for _ in range(NUM_STEPS):
        while in_flight(engine) < IN_FLIGHT:
            engine.add_request(new_request(next(numbers)))
        engine.step()
        num_finished += len(engine.forget_finished())
        assert engine.has_unfinished_requests(), "the engine must never go idle here"
        retained = engine.result(0.0, 0.0)
        largest_history = max(largest_history, len(retained.steps))
        assert len(retained.records) <= IN_FLIGHT
    assert num_finished > NUM_STEPS // MAX_NEW_TOKENS, "requests kept finishing"
    # A request waits for at most the ones ahead of it, then runs at most MAX_NEW_TOKENS steps.
    assert largest_history <= 4 * MAX_NEW_TOKENS, f"{largest_history} step traces kept after {NUM_STEPS} steps"


def test_the_kept_steps_cover_every_request_in_flight():
    engine = busy_engine()
    for number in range(IN_FLIGHT):
        engine.add_request(new_request(number))
    for _ in range(5):
        engine.step()
        engine.forget_finished()
    retained = engine.result(0.0, 0.0)
    oldest_arrival = min(r.arrival_time for r in retained.records)
    assert retained.steps and retained.steps[0].end_time >= oldest_arrival
    scheduled = {chunk.request_id for step in retained.steps for chunk in step.chunks}
    assert {r.request_id for r in retained.records if r.first_scheduled_time is not None} <= scheduled


def test_the_worker_archives_records_while_the_engine_stays_busy():
    engine = busy_engine()
    worker = EngineWorker(engine, num_recent_records=50)
    numbers = itertools.count()
    for _ in range(NUM_STEPS // 3):
        while in_flight(engine) < IN_FLIGHT:
            number = next(numbers)
            worker._add_all([new_request(number)], [f"client-{number}"])  # the engine thread's calls, in order
        worker._step()
        assert len(engine.result(0.0, 0.0).records) <= IN_FLIGHT
        assert len(engine.result(0.0, 0.0).steps) <= 4 * MAX_NEW_TOKENS
    assert engine.has_unfinished_requests()
    recent = worker.recent_records()
    assert len(recent) == 50, "finished records were archived although the engine never went idle"
    assert all(r.request_id.startswith("client-") and r.finish_reason is FinishReason.LENGTH for r in recent)
    assert len(worker._client_ids) <= IN_FLIGHT
