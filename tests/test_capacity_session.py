"""The shipped capacity test end to end through pytester, on a fake engine in virtual time (tests/capacity_fakes.py):
skipped without an SLO, a capacity per engine in results.json, a slower engine failing against its baseline, and
a search by concurrency alongside a sweep config's [capacity] case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capacity_fakes import ConcurrencyLatencyEngine, known_capacity
from perfsuite.judge.results import Results, read_results
from perfsuite.workload import Arrivals, OutputLengths, Workload

pytestmark = pytest.mark.timing  # reads the machine's load or must see a slowdown: run alone (conftest.py)

pytest_plugins = ["pytester"]

TESTS = Path(__file__).parent
SHIPPED_SUITE = TESTS.parent / "perfsuite" / "suites"

CONFTEST_ADDITION = """
import os
from perfsuite.adapters import Backend, register_engine
from perfsuite.engine.fake_runner import FakeRunner
from capacity_fakes import ConcurrencyLatencyEngine, LoadLatencyEngine

register_engine("load-latency", lambda backend, config: LoadLatencyEngine(
    float(os.environ["FAKE_SERVICE_RATE"]), base_ttft=0.010, batch_size=config.batch_size))
register_engine("concurrency-latency", lambda backend, config: ConcurrencyLatencyEngine(
    float(os.environ["FAKE_SERVICE_RATE"]), base_ttft=0.010, batch_size=config.batch_size, ttft_per_request=0.004))

@pytest.fixture(scope="session")
def perf_backend():
    tokenize = lambda text: [3 + b % 90 for b in text.encode()][:12]
    return Backend(runner=FakeRunner(vocab_size=97), tokenize=tokenize, eos_token_id=None, max_context=512,
                   device="cpu", probe=None)
"""

ARGS = ["--perf", "--perf-profile", "smoke", "--perf-engines", "load-latency", "--perf-repeats", "5",
        "-p", "no:randomly", "--perf-busy-threshold", "0.99"]  # fmt: skip
SLO = ["--perf-slo", "ttft=50ms"]


@pytest.fixture
def project(pytester, monkeypatch):
    conftest = (SHIPPED_SUITE / "conftest.py").read_text() + CONFTEST_ADDITION
    pytester.makeconftest(conftest)
    pytester.makepyfile(test_capacity=(SHIPPED_SUITE / "test_capacity.py").read_text(),
                        capacity_fakes=(TESTS / "capacity_fakes.py").read_text())  # fmt: skip
    monkeypatch.setenv("FAKE_SERVICE_RATE", "40")
    return pytester


def tokenize(text: str) -> list[int]:
    return [3 + b % 90 for b in text.encode()][:12]


def results(project) -> dict:
    return json.loads((project.path / "reports" / "results.json").read_text())


def typed_results(project) -> Results:
    return read_results(project.path / "reports" / "results.json")


def test_without_an_slo_the_capacity_test_says_how_to_run_it(project):
    result = project.runpytest_subprocess(*ARGS, "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*capacity is the highest rate at which an SLO holds: give one, e.g. --perf-slo*"])


def test_a_capacity_is_recorded_then_a_slower_engine_fails_against_it(project, monkeypatch):
    saved = project.runpytest_subprocess(*ARGS, *SLO, "--perf-save-baseline")
    saved.assert_outcomes(passed=1)
    saved.stdout.fnmatch_lines(["*test_capacity[[]load-latency[]]*capacity_under_slo*saved to baselines*"])
    test = typed_results(project).tests[0]
    capacity, measured = test.capacity, test.measurement
    # the fake at mu = 40/s, TTFT 10 ms / (1 - load) under a 50 ms SLO: 32/s offered, within the 10% tolerance
    known = known_capacity(40.0, 0.010, 0.050, Workload(16, OutputLengths(), Arrivals(1.0)).requests(tokenize))
    assert known / 1.1 <= capacity.requests_per_second <= known
    assert len(measured.samples["capacity_under_slo"]) == 5 and len(capacity.searches) == 5
    assert capacity.slo_ttft_ms == 50 and capacity.searches[0].probes
    assert measured.parameters.concurrency == 2 and measured.parameters.model == "smollm2-135m"  # --perf-model
    assert "capacity_slo" in dict(measured.configuration.engine_knobs)

    same = project.runpytest_subprocess(*ARGS, *SLO)
    same.assert_outcomes(passed=1)

    monkeypatch.setenv("FAKE_SERVICE_RATE", "32")  # 20% slower
    slower = project.runpytest_subprocess(*ARGS, *SLO)
    slower.assert_outcomes(failed=1)
    slower.stdout.fnmatch_lines(["*performance regression in test_capacity.py::test_capacity*", "*capacity_under_slo*"])

    # a baseline searched against another SLO is another configuration: not compared
    other = project.runpytest_subprocess(*ARGS, "--perf-slo", "ttft=80ms")
    other.assert_outcomes(skipped=1)  # judged nothing: skipped, saying so
    other.stdout.fnmatch_lines(["*baseline measured another configuration*capacity_slo=ttft=50ms*"])


SWEEP_WITH_CAPACITY = """
[sweep]
engines = ["concurrency-latency"]
batch_sizes = [2]
output_lengths = [4]
num_requests = 8

[capacity]
by = "rate"
"""


def test_a_search_by_concurrency_and_a_sweep_configs_capacity_case_run_in_one_session(project):
    """test_capacity by --perf-capacity-by concurrency finds the fake's known concurrency; the sweep's [capacity]
    case searches by rate (its own ``by`` over the option) and its arrivals-free id is one case."""
    project.makepyfile(test_sweep=(SHIPPED_SUITE / "test_sweep.py").read_text())
    project.makefile(".toml", sweep=SWEEP_WITH_CAPACITY)
    args = [arg if arg != "load-latency" else "concurrency-latency" for arg in ARGS]
    result = project.runpytest_subprocess(*args, *SLO, "--perf-repeats", "2", "--perf-capacity-by", "concurrency",
                                          "--perf-config", "sweep.toml", "-v")  # fmt: skip
    result.assert_outcomes(skipped=3)  # each measured, then skipped for judging nothing: no baselines here
    result.stdout.fnmatch_lines(["*test_sweep_capacity[[]concurrency-latency-B2-*-out4[]] SKIPPED*"])
    tests = {test.test_id.split("::")[-1].split("[")[0]: test for test in typed_results(project).tests}

    by_concurrency = tests["test_capacity"].capacity
    # 10 ms + 4 ms per other request in flight under a 50 ms TTFT SLO: 11 in flight, within a probe of 16
    known = ConcurrencyLatencyEngine(40.0, 0.010, ttft_per_request=0.004).known_concurrency(0.050, 16)
    assert by_concurrency.by == "concurrency" and by_concurrency.concurrency == known == 11
    assert [s.concurrency for s in by_concurrency.searches] == [11, 11]
    at_known = [p for p in by_concurrency.searches[0].probes if p.concurrency == known]
    assert by_concurrency.requests_per_second == at_known[0].rate > 0
    knobs = dict(tests["test_capacity"].measurement.configuration.engine_knobs)
    assert knobs["capacity_search"] == "by=concurrency,share>=0.9,tolerance=0.1"

    by_rate = tests["test_sweep_capacity"].capacity
    assert by_rate.by == "rate" and by_rate.searches[0].concurrency is None and by_rate.requests_per_second > 0
    assert dict(tests["test_sweep_capacity"].measurement.configuration.engine_knobs)["capacity_search"] == (
        "share>=0.9,tolerance=0.1")  # the rate label stored baselines carry
