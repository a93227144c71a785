"""The capacity search (perfsuite.measure.capacity): it finds a known capacity within its tolerance, says why
it cannot, and judges steady state; on fakes, no model and no sleeping."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capacity_fakes import ConcurrencyLatencyEngine, LoadLatencyEngine, known_capacity
from perfsuite.engine.types import EngineCounters, FinishReason, RequestRecord, RunResult
from perfsuite.judge.results import CapacityRecord
from perfsuite.measure.capacity import (
    Capacity,
    CapacityError,
    CapacitySearch,
    ProbeOutcome,
    SteadyState,
    closed_loop_outcome,
    probe_outcome,
    search_capacity,
)
from perfsuite.measure.metrics import SLO
from perfsuite.measure.capacity_runs import start_rate
from perfsuite.workload import Arrivals, OutputLengths, Workload


def outcome(rate: float, share: float = 1.0, steady: bool = True, kept_up: bool = True) -> ProbeOutcome:
    return ProbeOutcome(rate, share, 20, 10.0, 20.0, 1.0, 2.0, steady, kept_up)


def threshold(capacity: float):
    """A probe that passes exactly at rates up to ``capacity``."""
    return lambda rate: outcome(rate, 1.0 if rate <= capacity else 0.5)


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.floats(0.05, 5000),
    start=st.floats(0.1, 1000),
    tolerance=st.sampled_from([0.05, 0.10, 0.25]),
)
def test_the_search_brackets_the_capacity_within_its_tolerance(capacity, start, tolerance):
    search = CapacitySearch(start_rate=start, tolerance=tolerance, min_rate=0.01, max_rate=10_000, max_probes=40)
    found = search_capacity(threshold(capacity), search)
    low, high = found.bracket
    assert low <= capacity < high
    assert high / low <= 1 + tolerance + 1e-9 and found.within_tolerance
    assert found.requests_per_second == low == found.requests_per_second_per_device
    assert "within" in found.stopped and len(found.probes) <= 40


def test_a_search_from_a_power_of_two_stays_on_one_grid():
    """Two searches from different powers of two probe rates of one grid, so their answers are comparable."""
    a = search_capacity(threshold(3.3), CapacitySearch(start_rate=1.0))
    b = search_capacity(threshold(3.3), CapacitySearch(start_rate=4.0))
    assert a.requests_per_second == pytest.approx(b.requests_per_second)
    for probe in a.probes + b.probes:
        assert (8 * math.log2(probe.rate)) == pytest.approx(round(8 * math.log2(probe.rate)))


def test_start_rate_is_the_power_of_two_at_or_below_the_offline_throughput():
    assert start_rate(10.0) == 8.0 and start_rate(8.0) == 8.0 and start_rate(0.3) == 0.25
    assert start_rate(float("nan")) == 1.0


def test_per_device_divides_by_the_devices_one_instance_spans():
    found = search_capacity(threshold(8.0), CapacitySearch(start_rate=1.0), num_devices=2)
    assert found.requests_per_second_per_device == found.requests_per_second / 2


@pytest.mark.parametrize("failing", [dict(steady=False), dict(kept_up=False)])
def test_a_probe_that_is_not_steady_or_whose_client_fell_behind_fails_whatever_its_share(failing):
    def probe(rate):
        return outcome(rate, 1.0, **(failing if rate > 2.0 else {}))

    found = search_capacity(probe, CapacitySearch(start_rate=1.0))
    assert found.bracket[0] <= 2.0 < found.bracket[1]


def test_even_the_floor_failing_is_an_error_never_a_capacity_of_zero():
    with pytest.raises(CapacityError, match=r"capacity below the search floor of 0.25 req/s.*loosen the SLO"):
        search_capacity(lambda r: outcome(r, 0.5), CapacitySearch(start_rate=4.0, min_rate=0.25))


def test_an_slo_missed_one_request_at_a_time_stops_the_search_at_once():
    probed = []

    def probe(rate):
        probed.append(rate)
        return outcome(rate, 0.3)

    with pytest.raises(CapacityError, match=r"served one request at a time, only 30% of requests met the SLO"):
        search_capacity(probe, CapacitySearch(start_rate=4.0, min_rate=0.01), unloaded=lambda: outcome(0.0, 0.3))
    assert probed == [4.0], "no lower rate is probed once no load is seen to be enough"


def test_passing_at_the_ceiling_is_an_error():
    with pytest.raises(CapacityError, match=r"even at the search's ceiling of 64 req/s"):
        search_capacity(threshold(1e9), CapacitySearch(start_rate=1.0, max_rate=64.0))


def test_running_out_of_probes_before_a_bracket_is_an_error():
    with pytest.raises(CapacityError, match=r"no bracket after 4 probes \(1 req/s: 100% good, 2 req/s"):
        search_capacity(threshold(1000.0), CapacitySearch(start_rate=1.0, max_probes=4))


def test_running_out_of_probes_while_bisecting_returns_the_wider_bracket_and_says_so():
    found = search_capacity(threshold(3.3), CapacitySearch(start_rate=1.0, max_probes=4))
    assert not found.within_tolerance
    assert found.bracket[0] <= 3.3 < found.bracket[1]
    assert found.stopped.startswith("probe limit (4) reached with the bracket")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (dict(target_share=0.0), "target_share"),
        (dict(growth=1.0), "growth"),
        (dict(tolerance=0.0), "tolerance"),
        (dict(start_rate=0.001), "min_rate <= start_rate"),
        (dict(max_probes=1), "max_probes"),
    ],
)
def test_bad_search_settings_are_refused(arguments, message):
    with pytest.raises(ValueError, match=message):
        CapacitySearch(**arguments)


# -- steady state and probes from runs ---------------------------------------------------------------------------


def run_with_queueing(delays: list[float], gap: float = 0.1, ttft_after_scheduling: float = 0.01) -> RunResult:
    records = []
    for index, delay in enumerate(delays):
        arrival = 10.0 + index * gap
        first = arrival + delay + ttft_after_scheduling
        records.append(RequestRecord(f"r{index}", 4, (1, 2), arrival, arrival + delay, (first, first + 0.005),
                                     first + 0.005, FinishReason.LENGTH))  # fmt: skip
    return RunResult("fake", tuple(records), 10.0, records[-1].finished_time, EngineCounters())


def test_a_flat_queue_is_steady_and_a_growing_one_is_not():
    slo = SLO(ttft=10.0)
    flat = probe_outcome(run_with_queueing([0.02, 0.0, 0.03, 0.01] * 5), 10.0, slo)
    assert flat.steady and flat.note == "" and flat.good_share == 1.0 and flat.num_requests == 16
    growing = probe_outcome(run_with_queueing([0.05 * i for i in range(20)]), 10.0, slo)
    assert not growing.steady and growing.note.startswith("the queue grew: mean queueing delay")
    assert not growing.passes(0.9)


def test_the_ramp_is_left_out_of_the_share_and_the_steady_state():
    delays = [5.0] * 4 + [0.0] * 16  # the first fifth queued behind a cold start
    outcome_ = probe_outcome(run_with_queueing(delays), 10.0, SLO(ttft=1.0))
    assert outcome_.steady and outcome_.good_share == 1.0 and outcome_.num_requests == 16


def test_too_few_requests_cannot_show_a_steady_state():
    outcome_ = probe_outcome(run_with_queueing([0.0] * 5), 10.0, SLO(ttft=1.0))
    assert not outcome_.steady and "needs at least 8" in outcome_.note


def test_the_share_counts_requests_that_missed_the_slo_and_the_latencies_are_reported():
    run = run_with_queueing([0.0] * 12 + [0.5] * 8, gap=1.0)  # half the 16 after the ramp wait 0.5 s
    outcome_ = probe_outcome(run, 1.0, SLO(ttft=0.1), SteadyState(queue_slack_gaps=10))
    assert outcome_.good_share == pytest.approx(8 / 16)
    assert outcome_.p50_ttft_ms == pytest.approx(260) and outcome_.p90_ttft_ms == pytest.approx(510)
    assert outcome_.p50_tpot_ms == pytest.approx(5.0)


# -- a fake engine whose latency grows with load ------------------------------------------------------------------


def requests_at(rate: float, num_requests: int = 40):
    workload = Workload(num_requests, OutputLengths("fixed", 4, 4), Arrivals(rate), seed=3)
    return workload.requests(lambda text: [3 + b % 90 for b in text.encode()][:12])


def search_fake(engine: LoadLatencyEngine, slo: SLO):
    return search_capacity(
        lambda rate: probe_outcome(engine.run(requests_at(rate)), rate, slo), CapacitySearch(start_rate=1.0)
    )


@pytest.mark.parametrize(("service_rate", "base_ttft", "slo_ttft"),
                         [(50.0, 0.010, 0.050), (8.0, 0.050, 0.100), (300.0, 0.002, 0.020), (1.5, 0.100, 0.400)])  # fmt: skip
def test_the_search_finds_a_fake_engines_known_capacity_within_its_tolerance(service_rate, base_ttft, slo_ttft):
    known = known_capacity(service_rate, base_ttft, slo_ttft, requests_at(1.0))
    found = search_fake(LoadLatencyEngine(service_rate, base_ttft), SLO(ttft=slo_ttft))
    low, high = found.bracket
    assert low <= known < high and high / low <= 1.10 + 1e-9


def test_under_a_loose_slo_the_growing_queue_bounds_the_capacity():
    """Past saturation every request would meet a 5 s TTFT in a 40-request probe: only the queue says no.

    A finite probe cannot see an overload of a few percent grow the queue
    (here 4.6% passed), so the answer is within the tolerance of the true one
    rather than below it.
    """
    known = known_capacity(20.0, 0.001, 5.0, requests_at(1.0))
    found = search_fake(LoadLatencyEngine(20.0, 0.001), SLO(ttft=5.0))
    assert known < found.bracket[1] and found.requests_per_second <= known * 1.10
    assert any(not p.steady and p.note.startswith("the queue grew") for p in found.probes)


def test_an_engine_that_misses_the_slo_unloaded_has_no_capacity():
    engine, slo = LoadLatencyEngine(50.0, base_ttft=0.2), SLO(ttft=0.1)

    def unloaded():
        return probe_outcome(engine.run(requests_at(1.0), max_concurrency=1), 1.0, slo)

    with pytest.raises(CapacityError, match="one request at a time, only 0% of requests met the SLO"):
        search_capacity(lambda rate: probe_outcome(engine.run(requests_at(rate)), rate, slo),
                        CapacitySearch(start_rate=8.0), unloaded=unloaded)  # fmt: skip


def test_a_capacity_record_round_trips_through_json_with_nan_latencies():
    found = search_capacity(
        lambda rate: dataclasses.replace(outcome(rate, 1.0 if rate <= 3 else 0.0), p50_tpot_ms=math.nan),
        CapacitySearch(start_rate=1.0),
    )
    record = CapacityRecord.of([found, found], SLO(ttft=0.5, tpot=0.05), ["a note"])
    data = record.to_json()
    assert data["searches"][0]["probes"][0]["p50_tpot_ms"] is None
    back = CapacityRecord.from_json(data)
    assert back.requests_per_second == found.requests_per_second and back.slo_tpot_ms == pytest.approx(50)
    assert math.isnan(back.searches[0].probes[0].p50_tpot_ms) and back.notes == ("a note",)


def test_a_probe_whose_client_fell_behind_fails_and_says_how_far():
    run = run_with_queueing([0.0] * 20)
    late = probe_outcome(run, 10.0, SLO(ttft=1.0), client_kept_up=False, client_note="p90 send lag 80.0 ms")
    assert late.steady and late.good_share == 1.0 and not late.passes(0.9)
    assert late.note == "the client fell behind its schedule: latencies not trusted; p90 send lag 80.0 ms"


# -- a search by concurrency (closed loop) ------------------------------------------------------------------------


PROBE_SIZE = 40


def offline_requests():
    return [dataclasses.replace(r, arrival_time=0.0) for r in requests_at(1.0, PROBE_SIZE)]


def search_by_concurrency(engine: ConcurrencyLatencyEngine, slo: SLO, **settings_) -> Capacity:
    search = CapacitySearch(by="concurrency", max_concurrency=PROBE_SIZE, max_probes=20, **settings_)
    requests = offline_requests()
    return search_capacity(lambda c: closed_loop_outcome(engine.run(requests, max_concurrency=c), c, slo), search)


@settings(max_examples=40, deadline=None)
@given(
    base_ttft=st.floats(0.001, 0.5),
    ttft_per_request=st.floats(0.0005, 0.2),
    known=st.integers(1, PROBE_SIZE - 1),
    start=st.sampled_from([1, 2, 4, 8, 16, 32]),
    tolerance=st.sampled_from([0.01, 0.10, 0.25]),
)
def test_the_concurrency_search_finds_a_fake_engines_known_highest_passing_concurrency(
    base_ttft, ttft_per_request, known, start, tolerance
):
    engine = ConcurrencyLatencyEngine(50.0, base_ttft, ttft_per_request=ttft_per_request)
    slo_ttft = engine.ttft_at(known) + ttft_per_request / 2  # halfway to the next concurrency's TTFT
    assert engine.known_concurrency(slo_ttft, PROBE_SIZE) == known
    found = search_by_concurrency(engine, SLO(ttft=slo_ttft), start_concurrency=start, tolerance=tolerance)
    low, high = found.bracket
    assert low <= known < high and found.within_tolerance and found.concurrency == low
    assert high - low == 1 or high / low <= 1 + tolerance
    if tolerance == 0.01:  # narrower than any step between two concurrencies below 100: exact
        assert found.concurrency == known
    at_capacity = next(p for p in found.probes if p.concurrency == low)
    assert found.requests_per_second == at_capacity.rate > 0 and found.by == "concurrency"
    assert all(p.steady and p.note.startswith("closed loop") for p in found.probes)
    probed = [p.concurrency for p in found.probes]
    assert len(set(probed)) == len(probed) and found.stopped.startswith("bracket within")  # no probe wasted


def test_searches_by_concurrency_from_two_powers_of_two_agree():
    engine = ConcurrencyLatencyEngine(50.0, 0.010, ttft_per_request=0.004)
    slo = SLO(ttft=engine.ttft_at(11) + 0.001)
    a, b = (search_by_concurrency(engine, slo, start_concurrency=s) for s in (1, 16))
    assert a.concurrency == b.concurrency == 11 and a.bracket == b.bracket == (11, 12)
    assert "bracket within" in a.stopped and "concurrency 11..12" in a.stopped


def test_no_concurrency_passing_even_at_one_is_an_error_that_says_to_loosen_the_slo():
    engine = ConcurrencyLatencyEngine(50.0, base_ttft=0.2)
    with pytest.raises(CapacityError, match=r"no concurrency passes: even one request at a time.*loosen the SLO"):
        search_by_concurrency(engine, SLO(ttft=0.1), start_concurrency=4)


def test_the_slo_holding_with_every_request_in_flight_is_an_error_that_says_to_use_more_requests():
    engine = ConcurrencyLatencyEngine(50.0, 0.010, ttft_per_request=0.001)
    with pytest.raises(CapacityError, match=r"even at the search's ceiling of 40 requests in flight.*more requests"):
        search_by_concurrency(engine, SLO(ttft=10.0), start_concurrency=8)


def test_a_concurrency_search_out_of_probes_before_a_bracket_names_its_probes_and_the_fix():
    engine = ConcurrencyLatencyEngine(50.0, 0.010, ttft_per_request=0.001)
    search = CapacitySearch(by="concurrency", max_concurrency=PROBE_SIZE, max_probes=2)
    requests, slo = offline_requests(), SLO(ttft=10.0)
    with pytest.raises(CapacityError, match=r"no bracket after 2 probes \(concurrency 1 \(.* req/s\): 100% good.*"
                                            r"start_concurrency"):  # fmt: skip
        search_capacity(lambda c: closed_loop_outcome(engine.run(requests, max_concurrency=c), c, slo), search)


def test_the_search_kind_is_in_the_label_but_a_rate_searchs_label_is_unchanged():
    assert CapacitySearch().label == "share>=0.9,tolerance=0.1"  # what shipped baselines carry
    assert CapacitySearch(by="concurrency").label == "by=concurrency,share>=0.9,tolerance=0.1"
    with pytest.raises(ValueError, match="a capacity search is by rate or concurrency, got 'load'"):
        CapacitySearch(by="load")
    with pytest.raises(ValueError, match="start_concurrency <= max_concurrency"):
        CapacitySearch(by="concurrency", start_concurrency=8, max_concurrency=4)


def test_a_closed_loop_probe_leaves_out_its_ramp_and_does_not_judge_a_queue():
    delays = [5.0] * 4 + [0.05 * i for i in range(16)]  # a growing "queue" that an open loop would fail
    run = run_with_queueing(delays)
    outcome_ = closed_loop_outcome(run, 4, SLO(ttft=10.0))
    assert outcome_.steady and outcome_.passes(0.9) and outcome_.num_requests == 16 and outcome_.concurrency == 4
    assert outcome_.note.startswith("closed loop: at most 4 requests in flight")
    assert outcome_.rate == pytest.approx(20 / run.duration)  # the throughput it achieved
    assert not probe_outcome(run, outcome_.rate, SLO(ttft=10.0)).steady  # as an open loop it would fail


def test_a_concurrency_record_round_trips_through_json_with_its_concurrency():
    engine = ConcurrencyLatencyEngine(50.0, 0.010, ttft_per_request=0.004)
    found = search_by_concurrency(engine, SLO(ttft=engine.ttft_at(6) + 0.001))
    data = CapacityRecord.of([found, found], SLO(ttft=0.5)).to_json()
    assert data["by"] == "concurrency" and data["concurrency"] == 6 and data["searches"][0]["concurrency"] == 6
    assert data["searches"][0]["probes"][0]["concurrency"] == found.probes[0].concurrency
    back = CapacityRecord.from_json(data)
    assert back.concurrency == 6 and back.by == "concurrency" and back.searches[0].probes == found.probes
    assert back.requests_per_second == found.requests_per_second and back.searches[0].bracket == (6, 7)


def test_a_rate_records_json_has_no_concurrency_and_older_json_without_it_still_reads():
    found = search_capacity(threshold(3.3), CapacitySearch(start_rate=1.0))
    data = CapacityRecord.of([found], SLO(ttft=0.5)).to_json()
    assert "by" not in data and "concurrency" not in data
    assert "concurrency" not in data["searches"][0] and "concurrency" not in data["searches"][0]["probes"][0]
    back = CapacityRecord.from_json(data)  # as a results.json written before concurrency searches
    assert back.concurrency is None and back.by == "rate" and back.searches[0].concurrency is None
    assert back.searches[0].probes[0].concurrency is None and back.requests_per_second == found.requests_per_second
