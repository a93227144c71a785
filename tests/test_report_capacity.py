"""The report's capacity figure and facts (perfsuite.report.capacity), from a search over the virtual-time fake."""

from __future__ import annotations

import dataclasses

from capacity_fakes import LoadLatencyEngine
from perfsuite.judge.results import CapacityRecord, Measurement, TestResult
from perfsuite.judge.run_config import RunConfiguration
from perfsuite.measure.capacity import CapacitySearch, probe_outcome, search_capacity
from perfsuite.measure.metrics import SLO
from perfsuite.measure.summaries import Repeats, sizing_parameters, summarise
from perfsuite.report.capacity import capacity_facts, capacity_svg
from perfsuite.workload import Arrivals, OutputLengths, Workload
from results_builders import changed

SLO_ = SLO(ttft=0.050, tpot=0.005)


def requests_at(rate: float):
    return Workload(40, OutputLengths("fixed", 4, 4), Arrivals(rate), seed=3).requests(lambda t: [5, 6, 7])


def capacity_test(capacity: CapacityRecord | None) -> TestResult:
    engine = LoadLatencyEngine(40.0)
    run = engine.run(requests_at(8.0))
    configuration = RunConfiguration("smoke", "d", 40, "load-latency", (), "packed", 64, 2)
    measurement = Measurement.of(summarise(Repeats((run,)), (), SLO_),
                                 sizing_parameters(requests_at(1.0), "fake", "float32", 4), configuration, 8.0,
                                 None)  # fmt: skip
    return TestResult("test_capacity[load-latency]", measurement, capacity=capacity)


def search(service_rate: float):
    engine = LoadLatencyEngine(service_rate)
    return search_capacity(lambda r: probe_outcome(engine.run(requests_at(r)), r, SLO_), CapacitySearch(start_rate=8.0))


def test_a_capacity_test_gets_its_figure_and_facts():
    record = CapacityRecord.of([search(40.0), search(36.0)], SLO_, ["search 2: a note"])
    test = capacity_test(record)
    svg = capacity_svg(test)
    assert svg.startswith("<svg") and "arrival rate (req/s)" in svg and "TTFT ms" in svg and "goodput share" in svg
    facts = dict(capacity_facts(test))
    assert facts["capacity under SLO"].endswith("per device") and facts["searches"].startswith("2: ")
    assert facts["not converged"] == "search 2: a note"


def test_other_tests_get_neither():
    test = capacity_test(None)
    assert capacity_svg(test) is None and capacity_facts(test) == []


def test_the_html_report_shows_a_capacity_tests_figure(tmp_path):
    from report_fixtures import fake_results
    from perfsuite.report.render import render_report

    results = fake_results(tmp_path)
    record = CapacityRecord.of([search(40.0)], SLO_)
    tests = (*results.tests, changed(capacity_test(record), environment=results.tests[0].measurement.environment))
    html = render_report(dataclasses.replace(results, tests=tests))
    assert html.count('class="plot capacity"') == 1 and "capacity under SLO" in html


def test_perfsuite_compare_judges_capacities_higher_is_better(tmp_path):
    from report_fixtures import fake_results
    from perfsuite.judge.catalogue import CAPACITY
    from perfsuite.judge.compare import rejudge
    from perfsuite.judge.stats import Policy, Verdict

    results = fake_results(tmp_path)
    environment = results.tests[0].measurement.environment
    record = CapacityRecord.of([search(40.0)], SLO_)

    def run_with(capacities):
        test = changed(capacity_test(record), environment=environment, samples={CAPACITY: capacities})
        return dataclasses.replace(results, tests=(test,), slo=SLO_.label)

    old, new = run_with((30.0, 31.0, 29.5, 30.5, 30.2)), run_with((25.0, 25.5, 24.8, 25.2, 25.1))
    (judged,) = rejudge(old, new, Policy()).tests
    (comparison,) = judged.judgement.comparisons
    assert comparison.metric == CAPACITY and comparison.verdict is Verdict.REGRESSED


def test_a_search_by_concurrency_is_drawn_against_concurrency_and_its_concurrency_shown():
    from capacity_fakes import ConcurrencyLatencyEngine
    from perfsuite.measure.capacity import closed_loop_outcome

    engine = ConcurrencyLatencyEngine(40.0, 0.010, ttft_per_request=0.004)
    offline = [dataclasses.replace(r, arrival_time=0.0) for r in requests_at(1.0)]
    search = CapacitySearch(by="concurrency", max_concurrency=len(offline), start_concurrency=8)
    found = search_capacity(lambda c: closed_loop_outcome(engine.run(offline, max_concurrency=c), c, SLO_), search)
    test = capacity_test(CapacityRecord.of([found, found], SLO_))
    svg = capacity_svg(test)
    assert "concurrency (requests in flight)" in svg and "arrival rate (req/s)" not in svg
    facts = dict(capacity_facts(test))
    assert facts["capacity under SLO"].endswith(f"per device, at concurrency {found.concurrency}")
    assert facts["searches"].endswith(f"req/s at concurrency {found.concurrency}, {found.concurrency}")
    assert facts["search rule"].startswith("by concurrency (closed loop)")
