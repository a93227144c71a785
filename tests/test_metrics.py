"""Metrics are pure functions of recorded timestamps."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfsuite.engine import EngineCounters, FinishReason, RequestRecord, RunResult
from perfsuite.measure.metrics import Distribution, percentile, request_metrics, run_metrics


def record(request_id, arrival, token_times, reason=FinishReason.LENGTH, first_scheduled=None):
    return RequestRecord(
        request_id=request_id,
        num_prompt_tokens=4,
        output_token_ids=tuple(range(len(token_times))),
        arrival_time=arrival,
        first_scheduled_time=arrival if first_scheduled is None else first_scheduled,
        token_times=tuple(token_times),
        finished_time=token_times[-1] if token_times else None,
        finish_reason=reason,
    )


def test_request_metrics_follow_the_vllm_definitions():
    metrics = request_metrics(record("a", 1.0, [1.5, 1.75, 2.25, 2.5], first_scheduled=1.2))
    assert metrics.ttft == pytest.approx(0.5)
    assert metrics.e2e == pytest.approx(1.5)
    assert metrics.tpot == pytest.approx((1.5 - 0.5) / 3)
    assert metrics.itls == pytest.approx((0.25, 0.5, 0.25))
    assert metrics.queue_time == pytest.approx(0.2)


def test_a_single_token_has_no_tpot():
    metrics = request_metrics(record("a", 0.0, [0.3]))
    assert metrics.tpot is None
    assert metrics.itls == ()
    assert metrics.ttft == metrics.e2e == pytest.approx(0.3)


def test_run_metrics_count_completed_requests_only():
    result = RunResult(
        engine_name="x",
        records=(
            record("a", 0.0, [1.0, 2.0]),
            record("b", 0.0, [1.0, 3.0, 4.0]),
            record("c", 0.0, [1.0], reason=FinishReason.ABORT),
        ),
        start_time=0.0,
        end_time=4.0,
        counters=EngineCounters(),
    )
    metrics = run_metrics(result)
    assert (metrics.num_requests, metrics.num_completed, metrics.num_aborted) == (3, 2, 1)
    assert metrics.num_output_tokens == 5
    assert metrics.output_throughput == pytest.approx(5 / 4)
    assert metrics.request_throughput == pytest.approx(2 / 4)
    assert metrics.itl.count == 3
    assert metrics.e2el.max == pytest.approx(4.0)
    assert metrics.tpot.median == pytest.approx((1.0 + 1.5) / 2)


def test_empty_distribution_is_nan_not_an_error():
    empty = Distribution.of([])
    assert empty.count == 0 and math.isnan(empty.median)


@given(
    values=st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=50),
    q=st.floats(0, 100),
)
def test_percentile_matches_numpy(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-6)


@given(st.lists(st.floats(0, 1e3, allow_nan=False), min_size=1, max_size=50))
def test_distribution_is_ordered(values):
    d = Distribution.of(values)
    assert d.min <= d.median <= d.p90 <= d.p99 <= d.max
    assert d.min <= d.mean <= d.max or math.isclose(d.mean, d.min) or math.isclose(d.mean, d.max)


def test_percentile_rejects_bad_input():
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)
    with pytest.raises(ValueError, match="0..100"):
        percentile([1.0], 101)


def _record(request_id, arrival, token_times):
    from perfsuite.engine.types import FinishReason, RequestRecord

    return RequestRecord(request_id, 4, tuple(range(len(token_times))), arrival, arrival, tuple(token_times),
                         token_times[-1], FinishReason.LENGTH)


def test_goodput_counts_requests_that_meet_every_slo():
    from perfsuite.engine.types import EngineCounters, RunResult
    from perfsuite.measure.metrics import SLO, goodput, run_metrics

    records = (
        _record("fast", 0.0, [0.1, 0.2, 0.3]),  # ttft 0.1, tpot 0.1
        _record("slow-first", 0.0, [0.9, 1.0]),  # ttft 0.9
        _record("slow-decode", 0.0, [0.1, 0.6, 1.1]),  # tpot 0.5
        _record("one-token", 0.0, [0.2]),  # no tpot: cannot miss a tpot SLO
    )
    metrics = run_metrics(RunResult("e", records, 0.0, 2.0, EngineCounters()))
    assert goodput(metrics, SLO.parse("ttft=500ms,tpot=200ms")) == pytest.approx(2 / 2.0)
    assert goodput(metrics, SLO.parse("ttft=1s")) == pytest.approx(4 / 2.0)
    assert goodput(metrics, SLO.parse("e2el=250ms")) == pytest.approx(1 / 2.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [("ttft=5", "unit"), ("speed=5ms", "one of ttft, tpot, e2el"), ("ttft=-1ms", "positive"),
     ("", "at least one"), ("ttft=1ms,ttft=2ms", "twice"), ("e2el=infs", "finite"), ("e2el=nanms", "unit"),
     ("e2el=1e400s", "e2el='1e400s': expected a finite time"), ("ttft=1e307s", "finite")],  # 1e307 s is inf ms
)
def test_bad_slos_name_the_problem(text, message):
    from perfsuite.measure.metrics import SLO

    with pytest.raises(ValueError, match=message):
        SLO.parse(text)
