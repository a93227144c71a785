"""The Markdown summary for a pull request (perfsuite.report.summary): the verdict table's rows, the files it goes
to (``reports/summary.md`` always, ``$GITHUB_STEP_SUMMARY`` appended to when set), and ``perfsuite summary``."""

from __future__ import annotations

import os

import pytest

from fake_backend import FAKE_BACKEND_CONFTEST
from perfsuite.cli import main
from perfsuite.judge.baselines import OutputError
from perfsuite.judge.compare import judged_tally
from perfsuite.judge.results import write_results
from perfsuite.judge.stats import Comparison, CounterChange, Direction, Verdict
from perfsuite.report.summary import SUMMARY_HEADERS, markdown_cell, summary_markdown, write_summary_files
from report_fixtures import AGAINST
from results_builders import make_result, make_results

pytest_plugins = ["pytester"]


def comparison(verdict: Verdict, metric: str = "output_throughput") -> Comparison:
    return Comparison(
        metric=metric, direction=Direction.HIGHER_IS_BETTER, n_baseline=7, n_current=7,
        baseline_median=100.0, current_median=73.0, change=-0.27, ci_low=0.7, ci_high=0.76, p_worse=0.001,
        p_better=0.999, p_adjusted=0.00087, verdict=verdict, min_detectable_effect=0.12,
    )  # fmt: skip


def table_rows(markdown: str) -> list[list[str]]:
    """The Markdown table's rows split on the pipes that are not escaped, header and rule included."""
    rows = []
    for line in markdown.splitlines():
        if line.startswith("| "):
            cells = line.replace("\\\\", "\0").replace("\\|", "\1")[2:-2].split(" | ")
            rows.append([cell.replace("\1", "|").replace("\0", "\\") for cell in cells])
    return rows


def test_each_row_has_test_metric_change_with_ci_verdict_and_why_not_judged():
    results = make_results(
        make_result("t.py::test_a", comparisons=(comparison(Verdict.REGRESSED), comparison(Verdict.NOISY, "ttft"))),
        make_result("t.py::test_b", baseline_status="no baseline"),
        make_result("t.py::test_c", comparisons=(comparison(Verdict.UNCHANGED),),
                    counter_changes=(CounterChange("num_forward_passes", 10, 12),)),  # fmt: skip
    )
    markdown = summary_markdown(results, judged_tally(results))
    assert markdown.startswith("### perfsuite: regressed\n")
    assert judged_tally(results).line() in markdown.splitlines()
    header, rule, *rows = table_rows(markdown)
    assert tuple(header) == SUMMARY_HEADERS and rule == ["---"] * len(SUMMARY_HEADERS)
    assert rows == [
        ["test_a", "output_throughput", "-27.0% [0.700, 0.760]", "regressed", ""],
        ["test_a", "ttft", "-27.0% [0.700, 0.760]", "noisy: inconclusive", "noisy (the machine was busy)"],
        ["test_b", "output_throughput", "-", "no baseline", "without a baseline for this environment"],
        ["test_c", "output_throughput", "-27.0% [0.700, 0.760]", "unchanged", ""],
        ["test_c", "num_forward_passes", "exact", "counter changed", "an exact counter: shown, never judged"],
    ]
    assert "- against the stored baselines of this environment" in markdown


def test_pipes_and_line_breaks_stay_inside_their_cell():
    assert markdown_cell("a|b\nc\r\nd \\ e") == "a\\|b<br>c<br>d \\\\ e"
    test = make_result("t.py::test_x[prompt=a|b\nsecond line]", baseline_status="not compared: a|b")
    markdown = summary_markdown(make_results(test), judged_tally(make_results(test)))
    _, _, row = table_rows(markdown)
    assert len(row) == len(SUMMARY_HEADERS)
    assert row[0] == "test_x[prompt=a|b<br>second line]" and row[3] == "not compared: a|b"


def test_an_ab_session_names_its_reference():
    results = make_results(make_result("t.py::test_a", comparisons=(comparison(Verdict.IMPROVED),)), against=AGAINST)
    assert "- A/B: A = REF origin/main (3f2a9c1d0e4b), B = the current tree, side by side" in summary_markdown(
        results, judged_tally(results)
    )


def test_summary_md_is_replaced_whole_and_the_step_summary_appended_to_when_set(tmp_path):
    step_summary = tmp_path / "step_summary"
    step_summary.write_text("an earlier step's\n")
    written = write_summary_files("### first\n", tmp_path / "reports", {"GITHUB_STEP_SUMMARY": str(step_summary)})
    written = write_summary_files("### second", tmp_path / "reports", {"GITHUB_STEP_SUMMARY": str(step_summary)})
    assert written.summary.read_text() == "### second" and written.step_summary == step_summary
    assert step_summary.read_text() == "an earlier step's\n### first\n### second\n"
    assert os.listdir(tmp_path / "reports") == ["summary.md"], "no temporary file left beside it"
    unset = write_summary_files("### third\n", tmp_path / "reports", {})
    assert unset.step_summary is None and "third" not in step_summary.read_text()


def test_a_step_summary_that_cannot_be_written_is_an_error_naming_the_variable(tmp_path):
    with pytest.raises(OutputError, match=r"cannot write .*missing/x.*GITHUB_STEP_SUMMARY at a writable file"):
        write_summary_files("x\n", tmp_path, {"GITHUB_STEP_SUMMARY": str(tmp_path / "missing" / "x")})
    assert (tmp_path / "summary.md").read_text() == "x\n", "summary.md is written first"


def test_perfsuite_summary_prints_a_results_file_as_markdown(tmp_path, capsys):
    results = make_results(make_result("t.py::test_a", comparisons=(comparison(Verdict.REGRESSED),)))
    write_results(tmp_path / "results.json", results)
    assert main(["summary", str(tmp_path / "results.json")]) == 0
    assert capsys.readouterr().out == summary_markdown(results, judged_tally(results))
    assert main(["summary", str(tmp_path / "nothing.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_perf_session_writes_summary_md_and_fills_the_step_summary(pytester, monkeypatch):
    pytester.makeconftest(FAKE_BACKEND_CONFTEST)
    pytester.makepyfile(
        test_speed="""
        import pytest

        @pytest.mark.perf
        def test_speed(perf, perf_inflight_engine, perf_workload):
            perf.measure(perf_inflight_engine, perf_workload)
        """
    )
    step_summary = pytester.path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    result = pytester.runpytest_subprocess("--perf", "--perf-profile", "smoke", "-p", "no:randomly")
    summary = pytester.path / "reports" / "summary.md"
    result.stdout.fnmatch_lines([f"summary: {summary}"])
    markdown = summary.read_text()
    assert step_summary.read_text() == markdown
    assert markdown.startswith("### perfsuite: no baseline\n")
    assert "perfsuite: judged 0 of 4 planned comparisons (4 without a baseline for this environment)" in markdown
    assert "| test_speed | output_throughput | - | no baseline | without a baseline for this environment |" in markdown
