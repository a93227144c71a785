"""Unique completions over N runs in results.json, the report, and a ``pytest --perf`` session (``perf.measure_determinism``)."""

from __future__ import annotations

import json

import pytest

from fake_backend import FAKE_BACKEND_CONFTEST
from perfsuite.judge.results import DeterminismResult, read_results, write_results
from perfsuite.measure.determinism import PromptCompletions, UniqueCompletions
from perfsuite.report.render import render_report
from perfsuite.plugin.session import DeterminismEntry
from report_fixtures import fake_session
from results_builders import make_result, make_results

pytest_plugins = ["pytester"]

MIXED = UniqueCompletions(5, 0, 0.02, tuple(PromptCompletions(f"r{i}", n) for i, n in enumerate((1, 2, 1, 3))))
STEADY = UniqueCompletions(4, 7, 0.0, (PromptCompletions("a", 1), PromptCompletions("b", 1)))
RECORDED = (
    DeterminismResult("tests/perf/test_det.py::test_unique[inflight]", "inflight", MIXED),
    DeterminismResult("tests/perf/test_det.py::test_unique[static]", "static", STEADY),
)


def test_results_json_carries_each_tests_unique_completions_and_their_summary_and_reads_them_back(tmp_path):
    path = tmp_path / "results.json"
    results = make_results(make_result("timed"), determinism=RECORDED)
    write_results(path, results)
    written = json.loads(path.read_text())["determinism"]
    assert [d["test_id"] for d in written] == [r.test_id for r in RECORDED]
    assert written[0]["summary"] == {"num_prompts": 4, "max_distinct": 3, "mean_distinct": 1.75,
                                     "num_deterministic": 2, "fraction_deterministic": 0.5}  # fmt: skip
    assert written[0]["completions"]["prompts"][1] == {"request_id": "r1", "num_distinct": 2}
    assert read_results(path) == results


def test_a_session_that_measured_no_unique_completions_writes_no_key_so_older_readers_read_it(tmp_path):
    path = tmp_path / "results.json"
    write_results(path, make_results(make_result("timed")))
    assert "determinism" not in json.loads(path.read_text())
    assert read_results(path).determinism is None


def test_the_report_has_a_row_per_test_with_trials_prompts_max_distinct_and_prompts_deterministic():
    page = render_report(make_results(make_result("timed"), determinism=RECORDED))
    assert '<section id="determinism">' in page and "Unique completions over N runs" in page
    table = page.split('<table id="determinism-table">')[1].split("</table>")[0]
    cells = [row.split("</tr>")[0] for row in table.split("<tbody>")[1].split("<tr")[1:]]
    assert ' class="changed"' in cells[0] and ' class="changed"' not in cells[1]  # more than 1 distinct stands out
    assert [_texts(row) for row in cells] == [
        ["tests/perf/test_det.py::test_unique[inflight]", "inflight", "5", "4", "3", "1.75", "2 of 4 (50%)"],
        ["tests/perf/test_det.py::test_unique[static]", "static", "4", "2", "1", "1.00", "2 of 2 (100%)"],
    ]


def test_a_report_without_unique_completions_has_no_such_section():
    assert 'id="determinism' not in render_report(make_results(make_result("timed")))


def test_a_test_that_only_measured_unique_completions_plans_no_comparison_and_travels_from_an_xdist_worker(tmp_path):
    worker = fake_session(tmp_path)
    worker.num_planned_tests = 2  # one timed test that recorded nothing, one that only measured unique completions
    worker.record(DeterminismEntry(RECORDED[0].test_id, "inflight", MIXED))
    assert worker.tally().num_planned == len(worker.compared_metrics)
    controller = fake_session(tmp_path)
    controller.add_worker_output(worker.worker_output())
    assert controller.determinism == [RECORDED[0]]
    assert controller.document().determinism == (RECORDED[0],)


def _texts(row: str) -> list[str]:
    return [cell.split(">", 1)[1].split("</td>")[0] for cell in row.split("<td")[1:]]


PERF_TEST = """
import pytest
from perfsuite.engine import EngineCounters, RunResult
from perfsuite.engine.types import FinishReason, RequestRecord


class OddBatches:
    '''Answers every request with one token, 1 in an odd-sized batch, else 0.'''

    name, greedy_equal, batch_size = "odd-batches", False, 8

    def run(self, requests, on_step=None, max_concurrency=None):
        batch = list(requests)
        records = tuple(RequestRecord(r.request_id, 1, (len(batch) % 2,), 0.0, 0.0, (0.5,), 1.0, FinishReason.LENGTH)
                        for r in batch)
        return RunResult(self.name, records, 0.0, 1.0, EngineCounters())


@pytest.mark.perf
def test_inflight_is_deterministic(perf, perf_inflight_engine, perf_workload):
    completions = perf.measure_determinism(perf_inflight_engine, perf_workload, trials=3, max_arrival_offset=0.0)
    assert completions.max_distinct == 1


@pytest.mark.perf
def test_odd_batches_are_not(perf, perf_workload):
    completions = perf.measure_determinism(OddBatches(), perf_workload, trials=4, seed=1, max_arrival_offset=0.0)
    assert completions.max_distinct == 2
"""


def test_a_perf_session_records_unique_completions_into_results_json_and_the_report(pytester):
    pytester.makeconftest(FAKE_BACKEND_CONFTEST)
    pytester.makepyfile(test_det=PERF_TEST)
    result = pytester.runpytest_subprocess("--perf", "--perf-profile", "smoke", "-p", "no:randomly", "-rs")
    result.assert_outcomes(passed=2)  # nothing timed, nothing to judge: neither is skipped for judging nothing
    result.stdout.fnmatch_lines([
        "*unique completions: test_det.py::test_inflight_is_deterministic (inflight): max 1 distinct completion *",
        "*unique completions: test_det.py::test_odd_batches_are_not (odd-batches): max 2 distinct completions over 4*",
    ])  # fmt: skip
    assert "Benchmark fixture was not used" not in result.stdout.str() and "judged 0 of" not in result.stdout.str()
    recorded = json.loads((pytester.path / "reports" / "results.json").read_text())
    assert recorded["tests"] == []
    by_test = {d["test_id"]: d for d in recorded["determinism"]}
    assert by_test["test_det.py::test_inflight_is_deterministic"]["summary"]["max_distinct"] == 1
    odd = by_test["test_det.py::test_odd_batches_are_not"]
    assert odd["engine_name"] == "odd-batches" and odd["completions"]["num_trials"] == 4
    assert odd["summary"]["max_distinct"] == 2
    page = (pytester.path / "reports" / "report.html").read_text()
    assert "test_det.py::test_odd_batches_are_not" in page.split('<table id="determinism-table">')[1]
