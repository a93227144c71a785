"""The load generator's self-check (``perfsuite.measure.send_lag``): a client that falls behind its schedule is
client-bound and its latencies judge nothing; queueing for a busy engine or a busy connection is not lag."""

from __future__ import annotations

import asyncio
import time

import pytest

from perfsuite.adapters.openai_http import _send_all
from perfsuite.adapters.openai_stream import Piece, Received, to_record
from perfsuite.engine import Request, SamplingParams, inflight_engine
from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.engine.types import EngineCounters, FinishReason, RequestRecord, RunResult
from perfsuite.judge.stats import Verdict
from perfsuite.measure.send_lag import (
    MAX_LAG_BOUND_S,
    MIN_LAG_BOUND_S,
    client_bound_reason,
    lag_bound_s,
    send_lag,
    worst_send_lag,
)
from perfsuite.measure.summaries import Repeats, summarise

pytestmark = pytest.mark.timing  # reads the machine's load or must see a slowdown: run alone (conftest.py)


class FakeTime:
    """A clock whose sleep oversleeps by ``overshoot`` and whose model steps take ``step_seconds``."""

    def __init__(self, overshoot: float = 0.0, step_seconds: float = 0.0) -> None:
        self.now = 50.0
        self.overshoot = overshoot
        self.step_seconds = step_seconds

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 1e-9) + self.overshoot  # a real sleep always lets time pass

    def step(self, _output) -> None:
        self.now += self.step_seconds


def schedule(num: int, gap: float, max_new_tokens: int = 2) -> list[Request]:
    return [Request(f"r{i}", (3, 4, 5), SamplingParams(max_new_tokens, ignore_eos=True), arrival_time=i * gap)
            for i in range(num)]  # fmt: skip


def engine_run(fake: FakeTime, requests, max_concurrency=None) -> RunResult:
    engine = inflight_engine(FakeRunner(on_execute=fake.step), decode_batch_size=4, max_seq_len=64,
                             eos_token_id=None, clock=fake.clock, sleep=fake.sleep)  # fmt: skip
    return engine.run(requests, max_concurrency=max_concurrency)


# -- the in-process engine's loop ----------------------------------------------------------------------------


def test_an_engine_loop_that_oversleeps_its_schedule_is_client_bound():
    run = engine_run(FakeTime(overshoot=0.040), schedule(20, gap=0.100))
    check = send_lag(run)
    assert check.p90_lag_ms == pytest.approx(40.0) and check.lag_bound_ms == pytest.approx(10.0)
    assert check.is_lagging and check.is_client_bound
    reason = client_bound_reason([run])
    assert "client-bound" in reason and "p90 send lag 40.0 ms (bound 10.0 ms)" in reason and "Fix:" in reason


def test_an_engine_loop_that_keeps_its_schedule_is_not_client_bound():
    run = engine_run(FakeTime(), schedule(20, gap=0.100))
    check = send_lag(run)
    assert check.num_requests == 20 and check.max_lag_ms == pytest.approx(0.0, abs=1e-3)
    assert check.target_rate == pytest.approx(10.0) and check.achieved_rate == pytest.approx(10.0)
    assert not check.is_client_bound and client_bound_reason([run]) is None


def test_a_request_due_while_the_engine_steps_waits_for_the_engine_not_for_the_generator():
    # Every step takes 0.3 s and a request is due every 0.1 s: each gets in up to 0.3 s late, but
    # at the first moment the engine could take it. That is queueing (its latency counts it), not lag.
    run = engine_run(FakeTime(step_seconds=0.300), schedule(20, gap=0.100, max_new_tokens=4))
    late = [r.sent_time - r.scheduled_time for r in run.records]
    assert max(late) > 0.2
    check = send_lag(run)
    assert check.max_lag_ms == pytest.approx(0.0, abs=1e-3) and not check.is_client_bound


def test_a_closed_loop_has_no_schedule_to_keep():
    run = engine_run(FakeTime(overshoot=0.040), schedule(6, gap=0.100), max_concurrency=2)
    assert all(r.scheduled_time is None and r.sent_time is None for r in run.records)
    assert send_lag(run) is None and worst_send_lag([run]) is None and client_bound_reason([run]) is None


def test_a_client_bound_run_makes_the_test_noisy_so_its_comparisons_judge_nothing():
    from perfsuite.judge.judge import FamilyPlan, Reference, judge
    from perfsuite.judge.results import Measurement, TestResult
    from perfsuite.judge.stats import Policy
    from results_builders import ENVIRONMENT, make_result

    slow = [engine_run(FakeTime(overshoot=0.040), schedule(20, gap=0.100)) for _ in range(5)]
    metrics = ("median_ttft_ms", "median_e2el_ms")
    measured = summarise(Repeats(tuple(slow), noisy="the machine was busy"), metrics)
    assert measured.noisy.startswith("the machine was busy; client-bound: ")  # both reasons kept
    assert measured.send_lag.is_client_bound
    measured = summarise(Repeats(tuple(slow)), metrics)
    assert measured.noisy.startswith("client-bound: the load generator fell behind its schedule in 5 of 5")
    result = TestResult("t", Measurement.of(measured, make_result("t").measurement.parameters, None, 10.0, ENVIRONMENT))
    baseline = {name: tuple(v * 0.5 for v in values) for name, values in measured.samples.items()}  # 2x slower now
    reference = Reference(baseline, EngineCounters(), {}, None)
    judged = judge(result, reference, status="compared", slo=None, policy=Policy(), plan=FamilyPlan(2)).result
    comparisons = judged.judgement.comparisons
    assert comparisons and all(c.verdict is Verdict.NOISY for c in comparisons)
    kept = summarise(Repeats(tuple(engine_run(FakeTime(), schedule(20, 0.1)) for _ in range(5))), metrics)
    assert kept.noisy is None and not kept.send_lag.is_client_bound


# -- the rule ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mean_gap", "bound"),
    [(0.0, MIN_LAG_BOUND_S), (0.02, MIN_LAG_BOUND_S), (0.25, 0.025), (1.0, MAX_LAG_BOUND_S), (60.0, MAX_LAG_BOUND_S)],
)
def test_the_lag_bound_is_a_tenth_of_the_gap_within_5_and_50_ms(mean_gap, bound):
    assert lag_bound_s(mean_gap) == pytest.approx(bound)


def record(i: int, scheduled: float, lag: float, ready_delay: float = 0.0) -> RequestRecord:
    ready = scheduled + ready_delay
    return RequestRecord(f"r{i}", 3, (1, 2), scheduled, None, (ready + lag + 0.1,), ready + lag + 0.2,
                         FinishReason.LENGTH, scheduled_time=scheduled, send_ready_time=ready,
                         sent_time=ready + lag)  # fmt: skip


def run_of(records) -> RunResult:
    return RunResult("fake", tuple(records), 0.0, 20.0, EngineCounters())


def test_a_generator_whose_last_sends_drift_misses_the_rate_though_its_p90_lag_is_small():
    records = [record(i, 0.5 * i, 0.0) for i in range(19)] + [record(19, 9.5, 1.5)]
    check = send_lag(run_of(records))
    assert check.p90_lag_ms == 0.0 and not check.is_lagging
    assert check.target_rate == pytest.approx(2.0) and check.achieved_rate == pytest.approx(19 / 11.0)
    assert check.misses_rate and check.is_client_bound
    assert "offered 1.73 of the 2 req/s scheduled" in check.describe()


def test_waiting_for_a_free_connection_is_queueing_not_lag():
    records = [record(i, 0.1 * i, 0.001, ready_delay=0.05 * i) for i in range(20)]
    check = send_lag(run_of(records))
    assert check.max_lag_ms == pytest.approx(1.0) and not check.is_client_bound


def test_every_request_at_once_has_no_rate_to_miss():
    check = send_lag(run_of([record(i, 0.0, 0.002) for i in range(8)]))
    assert check.target_rate is None and check.achieved_rate is None and not check.misses_rate
    assert check.lag_bound_ms == pytest.approx(1e3 * MIN_LAG_BOUND_S) and not check.is_client_bound
    assert send_lag(run_of([record(0, 0.0, 0.060)])).is_client_bound  # one request, sent 60 ms late


def test_the_worst_repeat_is_the_client_bound_one():
    fine = run_of([record(i, 0.1 * i, 0.004) for i in range(20)])
    lagging = run_of([record(i, 0.1 * i, 0.030) for i in range(20)])
    assert worst_send_lag([fine, lagging, fine]).p90_lag_ms == pytest.approx(30.0)
    assert "in 1 of 3 repeats" in client_bound_reason([fine, lagging, fine])


# -- the HTTP client's send loop -----------------------------------------------------------------------------


class FakeClient:
    """Stands in for ``_Client``: answers after ``seconds``, blocking the event loop for them when ``blocking``
    (a client busy parsing streams), else awaiting them (a client that keeps up)."""

    def __init__(self, seconds: float, blocking: bool) -> None:
        self.seconds = seconds
        self.blocking = blocking

    async def complete(self, request: Request, payload: dict, arrival: float) -> Received:
        if self.blocking:
            time.sleep(self.seconds)
        else:
            await asyncio.sleep(self.seconds)
        now = time.perf_counter()
        pieces = (Piece(now, "x", (7,)), Piece(now, "y", (8,)))
        return Received(request, arrival, now, pieces, FinishReason.LENGTH, 2)


def http_run(client: FakeClient, num_clients: int, gap: float = 0.100, num: int = 8) -> RunResult:
    requests = schedule(num, gap)
    payloads = {r.request_id: {} for r in requests}

    async def send():
        start = time.perf_counter()
        return start, await _send_all(client, requests, payloads, start, num_clients, closed_loop=False)

    start, received = asyncio.run(send())
    records = tuple(to_record(r, lambda text: [1]) for r in received)
    return RunResult("openai-http", records, start, time.perf_counter(), EngineCounters())


def test_an_http_client_that_blocks_its_event_loop_is_client_bound():
    run = http_run(FakeClient(0.250, blocking=True), num_clients=8)  # each answer holds the loop 0.25 s
    check = send_lag(run)
    assert check.p90_lag_ms > 100 and check.is_client_bound
    assert all(r.scheduled_time is not None and r.sent_time >= r.scheduled_time for r in run.records)


def test_an_http_client_that_keeps_up_is_not_client_bound():
    check = send_lag(http_run(FakeClient(0.250, blocking=False), num_clients=8))
    assert check.p90_lag_ms < check.lag_bound_ms and not check.is_client_bound


def test_an_http_client_waiting_for_its_one_connection_is_queueing_not_client_bound():
    run = http_run(FakeClient(0.250, blocking=False), num_clients=1)
    assert max(r.sent_time - r.scheduled_time for r in run.records) > 1.0  # queued behind the one connection
    assert not send_lag(run).is_client_bound
