"""A change point at the head of a test's run history is a verdict of the session: shown always, failing under
``--perf-fail-on-change-point`` (or its ini key) when it is a regression.

The engine fabricates its timestamps (no model, no sleeping; as in tests/test_plugin_late_regression.py), so
the sessions' figures are exact: 25% slower than the eleven stored sessions before them (themselves within
2% of one another), a step Otava finds at the head whatever the machine does, once two sessions follow it, and
reports as new once.
"""

from __future__ import annotations

import dataclasses

import matplotlib.figure  # noqa: F401
import otava.analysis  # noqa: F401
import pytest
import sqlalchemy  # noqa: F401

from perfsuite.history.head import HEAD_WARNING_PREFIX
from perfsuite.history.store import HistoryStore
from perfsuite.judge.results import read_results
from results_builders import changed

# pytester drops what an in-process run imported, and numpy cannot load twice in one process: what the sessions
# use it through (Otava, the report's figures; SQLAlchemy for the store) is loaded here, before pytester's snapshot
# of the loaded modules, so that every session and every later test finds it loaded.
pytest_plugins = ["pytester"]

CONFTEST = """
import os

import pytest

from perfsuite.adapters import Backend
from perfsuite.engine.types import EngineCounters, FinishReason, RequestRecord, RunResult


class FabricatedEngine:
    name = "fabricated"
    greedy_equal = True
    batch_size = 2
    runs_in_process = False  # finishes in microseconds: no machine probe, and nothing for other work to disturb

    def run(self, requests, on_step=None, max_concurrency=None):
        factor = float(os.environ["SLOWNESS"])
        records = []
        for request in requests:
            times = tuple(request.arrival_time + factor * (0.02 + 0.005 * k) for k in range(4))
            records.append(RequestRecord(
                request_id=request.request_id, num_prompt_tokens=request.num_prompt_tokens,
                output_token_ids=(7,) * 4, arrival_time=request.arrival_time,
                first_scheduled_time=request.arrival_time, token_times=times, finished_time=times[-1],
                finish_reason=FinishReason.LENGTH,
            ))
        counters = EngineCounters(num_forward_passes=4, num_decode_steps=3, num_prefill_tokens=12,
                                  num_decode_tokens=12)
        return RunResult(self.name, tuple(records), 0.0, max(r.finished_time for r in records), counters)


@pytest.fixture(scope="session")
def _perf_environment(perf_session, perf_backend):
    # This machine's environment without importing torch for its version (an in-process run could not import it
    # twice), and the commit each session says it measured.
    from perfsuite.measure.environment import Environment

    perf_session.environment = Environment("cpu", "2.13.0", "5.0.0", "float32", "fabricated", "Test CPU", 2)
    perf_session.commit = os.environ["COMMIT"]
    return perf_session.environment


@pytest.fixture(scope="session")
def perf_backend():
    return Backend(runner=None, tokenize=lambda text: [3] * len(text), eos_token_id=None, max_context=512,
                   device="cpu", probe=None)
"""

PERF_TEST = """
import pytest

from perfsuite.engine.types import Request, SamplingParams
from conftest import FabricatedEngine

REQUESTS = [Request(f"r{i}", (1, 2, 3), SamplingParams(max_new_tokens=4)) for i in range(4)]


@pytest.mark.perf
def test_fabricated(perf):
    perf.measure(FabricatedEngine(), REQUESTS)
    perf.assert_no_regression()
"""

ARGS = ("--perf", "--perf-profile", "smoke", "--perf-repeats", "5", "--perf-server-label", "fabricated",
        "--perf-busy-threshold", "0.99", "-p", "no:randomly", "-p", "no:cacheprovider")  # fmt: skip
NOISE = (1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99, 1.015, 0.985)


def test_a_regression_at_the_head_is_shown_and_fails_the_session_under_the_option(pytester, monkeypatch):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_fabricated=PERF_TEST)
    pytester.syspathinsert()
    monkeypatch.setenv("SLOWNESS", "1.0")
    monkeypatch.setenv("COMMIT", "a" * 40)
    first = pytester.runpytest_inprocess(*ARGS)
    assert first.ret == pytest.ExitCode.OK
    first.stdout.fnmatch_lines(["change points: none at the head of 0 series searched; * with too few runs*"])
    reports = pytester.path / "reports"
    stored = read_results(reports / "results.json")
    with HistoryStore.open(reports / "history.sqlite") as store:  # where the first session was appended
        assert len(store.sessions()) == 1
        for index, factor in enumerate(NOISE):  # ten more stored sessions, earlier ones, within 2% of the first
            tests = tuple(changed(t, samples={k: tuple(v * factor for v in vs)
                                              for k, vs in t.measurement.samples.items()})
                          for t in stored.tests)  # fmt: skip
            earlier = f"2025-06-{index + 1:02d}T00:00:00+00:00"
            store.append(dataclasses.replace(stored, created_at=earlier, commit=f"{index:07d}", tests=tests))

    monkeypatch.setenv("SLOWNESS", "1.25")
    monkeypatch.setenv("COMMIT", "b" * 40)
    pytester.makeini("[pytest]\nperf_fail_on_change_point = true\n")
    outlier = pytester.runpytest_inprocess(*ARGS)
    assert outlier.ret == pytest.ExitCode.OK, "one slow session is an outlier, not a step: no change point yet"
    outlier.stdout.fnmatch_lines(["change points: none at the head of 4 series searched (11 earlier sessions*"])

    monkeypatch.setenv("COMMIT", "c" * 40)
    second = pytester.runpytest_inprocess(*ARGS)
    second.assert_outcomes(skipped=1)
    assert second.ret == pytest.ExitCode.TESTS_FAILED, "the test judged nothing (no baseline, so skipped): only the head change fails the session"
    second.stdout.fnmatch_lines([
        f"{HEAD_WARNING_PREFIX}test_fabricated.py::test_fabricated output_throughput *: -20.0% (regression) "
        "between aaaaaaa..bbbbbbb * (fails the session: --perf-fail-on-change-point)",
        "change points: 4 at the head of 4 series searched (12 earlier sessions in the history)",
    ])  # fmt: skip
    warnings = read_results(reports / "results.json").warnings
    assert sum(w.startswith(HEAD_WARNING_PREFIX) for w in warnings) == 4

    monkeypatch.setenv("COMMIT", "d" * 40)
    third = pytester.runpytest_inprocess(*ARGS)
    assert third.ret == pytest.ExitCode.OK, "the same step, reported by the session before: no verdict again"
    third.stdout.fnmatch_lines([
        f"{HEAD_WARNING_PREFIX}test_fabricated.py::test_fabricated output_throughput *: -20.0% (regression) "
        "between aaaaaaa..bbbbbbb *; still at the head, first reported at session ccccccc * (fails nothing again)",
        "change points: 4 at the head (0 new, 4 reported by an earlier session) of 4 series searched *",
    ])  # fmt: skip
