"""The report shows, per open-loop test, how late the load generator sent requests against its schedule."""

from __future__ import annotations

import json

import pytest

from perfsuite.judge.results import Measurement, TestResult, read_results, write_results
from perfsuite.measure.summaries import Repeats, summarise
from perfsuite.report.render import render_report
from results_builders import ENVIRONMENT, make_result, make_results
from test_send_lag import FakeTime, engine_run, schedule

METRICS = ("median_ttft_ms", "median_e2el_ms")


def measured_test(test_id: str, overshoot: float, max_concurrency: int | None = None, gap: float = 0.1) -> TestResult:
    runs = tuple(engine_run(FakeTime(overshoot=overshoot), schedule(20, gap), max_concurrency) for _ in range(3))
    measured = summarise(Repeats(runs), METRICS)
    parameters = make_result(test_id).measurement.parameters
    return TestResult(test_id, Measurement.of(measured, parameters, None, 10.0, ENVIRONMENT))


def test_a_client_bound_test_shows_its_lag_its_rate_and_a_figure_of_each_requests_lag():
    test = measured_test("slow", overshoot=0.040)
    measured = test.measurement
    assert measured.noisy.startswith("client-bound") and measured.timeline.requests[-1].send_lag == pytest.approx(0.040)
    page = render_report(make_results(test))
    assert "send lag p50 / p90 / max" in page and "40 / 40 / 40 ms (client-bound above 10 ms at p90" in page
    assert "offered rate" in page and "client-bound: its latencies judge nothing" in page
    assert 'id="send-lag-' in page and "send lag (ms)" in page


def test_a_test_that_kept_its_schedule_says_so():
    page = render_report(make_results(measured_test("kept", overshoot=0.0)))
    assert "kept its schedule" in page and 'id="send-lag-' in page and "client-bound:" not in page


def test_a_closed_loop_or_an_older_file_shows_no_send_lag(tmp_path):
    closed = measured_test("closed", overshoot=0.040, max_concurrency=2)
    assert closed.measurement.send_lag is None and closed.measurement.noisy is None
    path = tmp_path / "results.json"
    write_results(path, make_results(measured_test("open", overshoot=0.0)))
    data = json.loads(path.read_text())
    assert data["tests"][0]["measurement"]["send_lag"]["num_requests"] == 20
    assert read_results(path).tests[0].measurement.send_lag == measured_test("open", overshoot=0.0).measurement.send_lag
    for test in data["tests"]:  # as a file from before the self-check
        del test["measurement"]["send_lag"]
        for request in test["measurement"]["timeline"]["requests"]:
            request.pop("send_lag", None)
    path.write_text(json.dumps(data))
    old = read_results(path).tests[0]
    assert old.measurement.send_lag is None and all(r.send_lag is None for r in old.measurement.timeline.requests)
    for page in (render_report(make_results(closed)), render_report(read_results(path))):
        assert "send lag" not in page and 'id="send-lag-' not in page


def test_every_request_at_once_gets_facts_but_no_figure():
    test = measured_test("burst", overshoot=0.0, gap=0.0)
    assert test.measurement.send_lag is not None and test.measurement.send_lag.target_rate is None
    page = render_report(make_results(test))
    assert "send lag p50 / p90 / max" in page and "offered rate" not in page and 'id="send-lag-' not in page
