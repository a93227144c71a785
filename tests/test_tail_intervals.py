"""Tail honesty: every reported percentile carries its distribution-free interval (``measure.quantiles``) into
results.json, and one the sample cannot support is shown as such in the terminal table and the HTML report."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from perfsuite.judge.results import TestResult, read_results, write_results
from perfsuite.measure.quantiles import PercentileInterval
from perfsuite.measure.summaries import LatencySummary, RunSummary
from results_builders import make_result, make_results, version_4_document


def latencies(num: int, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [rng.expovariate(10.0) for _ in range(num)]  # seconds


def summary_of(num: int) -> RunSummary:
    latency = LatencySummary.of(latencies(num))
    return RunSummary(request_throughput=1.0, output_throughput=10.0, completed=num, total_output_tokens=10 * num,
                      ttft=latency, tpot=latency, itl=latency, e2el=latency)  # fmt: skip


def test_every_percentile_gets_an_interval_around_its_figure_in_ms():
    seconds = latencies(1000)
    latency = LatencySummary.of(seconds)
    for statistic in ("median", "p90", "p99"):
        interval = latency.interval(statistic)
        assert interval.supported and interval.num_values == 1000
        assert interval.low <= getattr(latency, f"{statistic}_ms") <= interval.high
    assert latency.p99_ci.high <= 1e3 * max(seconds)


def test_p99_of_100_requests_is_unsupported_with_an_open_upper_end():
    latency = LatencySummary.of(latencies(100))
    assert latency.p90_ci.supported and latency.median_ci.supported
    assert not latency.p99_ci.supported and latency.p99_ci.high is None and latency.p99_ci.low is not None
    assert latency.p99_ci.unsupported_text() == f"≥ {latency.p99_ci.low:.4g} (p99 needs 368 requests, has 100)"
    assert latency.p90_ci.unsupported_text() is None


def test_no_values_support_nothing():
    latency = LatencySummary.of([])  # TPOT of one-token requests
    assert all(not latency.interval(s).supported and latency.interval(s).num_values == 0 for s in ("median", "p99"))
    assert latency.median_ci.unsupported_text() == "unsupported (p50 needs 6 requests, has 0)"


def test_results_json_carries_each_percentiles_interval_and_support_beside_it(tmp_path):
    path = tmp_path / "results.json"
    write_results(path, make_results(make_result("t", summary=summary_of(100))))
    test = json.loads(path.read_text())["tests"][0]
    low = test["p99_ttft_ms_ci"][0]
    assert isinstance(low, float) and test["p99_ttft_ms_ci"][1] is None  # an open end is null
    assert test["p99_ttft_ms_supported"] is False and test["p90_ttft_ms_supported"] is True
    assert test["median_e2el_ms_ci"] == pytest.approx(summary_of(100).e2el.median_ci.as_list())
    assert test["ttft_num_values"] == 100
    assert isinstance(test["p99_ttft_ms"], float)  # vLLM's key itself stays a number
    assert read_results(path).tests[0].measurement.summary == summary_of(100)


def test_a_results_file_without_intervals_still_loads_as_not_recorded(tmp_path):
    path = tmp_path / "results.json"
    data = version_4_document(make_results(make_result("t", summary=summary_of(100))))  # older than the intervals
    data["tests"] = [{k: v for k, v in t.items() if not k.endswith(("_ci", "_supported", "_num_values"))}
                     for t in data["tests"]]  # fmt: skip
    path.write_text(json.dumps(data))
    summary = read_results(path).tests[0].measurement.summary
    assert summary.ttft.p99_ci is None and summary.itl.median_ci is None
    assert summary.ttft.p99_ms == summary_of(100).ttft.p99_ms
    write_results(path, read_results(path))  # read and written again: still not recorded
    written = json.loads(path.read_text())["tests"][0]
    assert "p99_ttft_ms_ci" not in written and "p99_ci" not in written["measurement"]["summary"]["ttft"]


def test_the_html_report_shows_an_unsupported_p99_as_what_the_sample_says():
    from perfsuite.report.render import render_report

    page = render_report(make_results(make_result("small", summary=summary_of(100))))
    low = summary_of(100).ttft.p99_ci.low
    assert f"≥ {low:.4g} (p99 needs 368 requests, has 100)" in page
    assert f"{summary_of(100).ttft.p99_ms:.4g}" not in page  # not the precise-looking figure
    big = render_report(make_results(make_result("big", summary=summary_of(400))))
    assert "needs 368" not in big and f"{summary_of(400).ttft.p99_ms:.4g}" in big


def test_the_html_report_of_an_older_file_shows_the_figure():
    from perfsuite.report.render import render_report

    summary = summary_of(100)
    old = dataclasses.replace(summary, ttft=dataclasses.replace(summary.ttft, p99_ci=None))
    page = render_report(make_results(make_result("old", summary=old)))
    assert f"{summary.ttft.p99_ms:.4g}" in page


def test_the_run_commands_table_marks_an_unsupported_p99():
    from perfsuite.cli import shown_percentile

    values = latencies(50)
    shown = shown_percentile(123.0, values, 99, scale=1e3)
    assert isinstance(shown, str) and shown.startswith("≥ ") and "p99 needs 368 requests, has 50" in shown
    assert shown_percentile(45.0, values, 50, scale=1e3) == 45.0
    assert shown_percentile(1.0, [], 50) == "unsupported (p50 needs 6 requests, has 0)"


def test_an_interval_with_only_an_upper_end_says_so():
    interval = PercentileInterval(1.0, None, 0.5, 0.95, 20)
    assert interval.unsupported_text(scale=1e3) == "≤ 500 (p1 needs 368 requests, has 20)"
    assert isinstance(TestResult, type)
