"""One verdict table (perfsuite.report.verdict_table): its rows, its cells, and the same cells in all three places.

The terminal summary, ``perfsuite compare`` and the HTML report each show it;
the last test gives the three one set of results and reads the same headers
and cells back from each.
"""

from __future__ import annotations

import dataclasses
import html as markup
import re

import pytest

from perfsuite.cli import main
from perfsuite.engine.types import EngineCounters
from perfsuite.judge.compare import policy_of, rejudge
from perfsuite.judge.results import CapacityRecord, read_results, write_results
from perfsuite.judge.stats import Comparison, CounterChange, Direction, Verdict
from perfsuite.measure.capacity import Capacity
from perfsuite.plugin.terminal import WrittenFiles, write_summary
from perfsuite.report.render import render_report
from perfsuite.report.table import format_table
from perfsuite.report.verdict_table import (
    PAIRED_HEADERS,
    STORED_HEADERS,
    RowKind,
    format_figure,
    overall_verdict,
    verdict_table,
)
from report_fixtures import AGAINST, fake_session
from results_builders import make_result, make_results

CAPACITY = CapacityRecord(
    searches=(Capacity(12.5, (12.5, 14.0), (), "bracket narrower than the tolerance", 0.9, 0.05),),
    slo_ttft_ms=500.0,
    slo_tpot_ms=None,
)


def comparison(verdict: Verdict, min_detectable_effect: float | None = 0.12) -> Comparison:
    return Comparison(
        metric="output_throughput", direction=Direction.HIGHER_IS_BETTER, n_baseline=7, n_current=7,
        baseline_median=100.0, current_median=73.0, change=-0.27, ci_low=0.7, ci_high=0.76, p_worse=0.001,
        p_better=0.999, p_adjusted=0.00087, verdict=verdict, min_detectable_effect=min_detectable_effect,
    )  # fmt: skip


def cells_of(results, paired: bool = False) -> list[tuple[str, ...]]:
    return [dataclasses.astuple(row.cells) for row in verdict_table(results, paired).rows]


# -- rows and cells --------------------------------------------------------------------------------------------------


def test_a_compared_metric_shows_medians_change_ratio_ci_p_mde_and_verdict():
    test = make_result("t.py::test_a[x]", comparisons=(comparison(Verdict.REGRESSED),), baseline_status="compared")
    assert cells_of([test]) == [
        ("test_a[x]", "output_throughput", "100", "73", "-27.0%", "[0.700, 0.760]", "0.00087", "12%", "regressed")
    ]


def test_a_comparison_that_could_flag_no_slowdown_says_mde_none_and_noisy_says_inconclusive():
    test = make_result("t.py::test_a", comparisons=(comparison(Verdict.NOISY, min_detectable_effect=None),))
    [cells] = cells_of([test])
    assert cells[-2:] == ("none", "noisy: inconclusive")
    assert verdict_table([test], paired=False).rows[0].category == "noisy"


def test_a_capacity_test_with_nothing_compared_shows_its_capacity():
    test = make_result("t.py::test_capacity[paged]", capacity=CAPACITY, baseline_status="saved to baselines/x.json")
    [row] = verdict_table([test], paired=False).rows
    assert row.kind is RowKind.CAPACITY and row.category == "none"
    assert dataclasses.astuple(row.cells) == (
        "test_capacity[paged]", "capacity_under_slo", "-", "12.5", "-", "-", "-", "-", "saved to baselines/x.json"
    )  # fmt: skip


def test_a_test_with_nothing_compared_shows_its_output_throughput_and_why():
    test = make_result("t.py::test_b", output_throughput=[12000.0, 12345.0, 12500.0])
    assert cells_of([test]) == [("test_b", "output_throughput", "-", "12,282", "-", "-", "-", "-", "no baseline")]


def test_each_changed_counter_follows_the_tests_comparisons_as_an_exact_row():
    changes = (CounterChange("num_forward_passes", 10, 12), CounterChange("num_padding_tokens", 0, 8))
    test = make_result("t.py::test_a", comparisons=(comparison(Verdict.UNCHANGED),), counter_changes=changes)
    rows = verdict_table([test], paired=False).rows
    assert [row.kind for row in rows] == [RowKind.COMPARED, RowKind.COUNTER_CHANGED, RowKind.COUNTER_CHANGED]
    assert dataclasses.astuple(rows[1].cells) == (
        "test_a", "num_forward_passes", "10", "12", "exact", "-", "-", "-", "counter changed"
    )  # fmt: skip
    assert rows[1].category == "changed"


def test_counters_never_decide_the_overall_verdict():
    changed = make_result("t.py::test_a", counter_changes=(CounterChange("num_forward_passes", 10, 12),))
    assert overall_verdict(verdict_table([changed], paired=False).rows) == "no baseline"
    regressed = make_result("t.py::test_b", comparisons=(comparison(Verdict.REGRESSED),))
    improved = make_result("t.py::test_c", comparisons=(comparison(Verdict.IMPROVED),))
    assert overall_verdict(verdict_table([improved, changed, regressed], paired=False).rows) == "regressed"


def test_an_ab_session_renames_the_sides_and_the_change_only():
    table = verdict_table([make_result("t.py::test_a")], paired=True)
    assert table.headers == PAIRED_HEADERS
    assert dataclasses.astuple(PAIRED_HEADERS) == (
        "test", "metric", "A: REF", "B: current", "pair ratio", "ratio CI", "p (BH)", "MDE", "verdict"
    )  # fmt: skip
    assert table.text().splitlines()[0].split() == ["test", "metric", "A:", "REF", "B:", "current", "pair", "ratio",
                                                    "ratio", "CI", "p", "(BH)", "MDE", "verdict"]  # fmt: skip


@pytest.mark.parametrize(("value", "text"), [(None, "-"), (0.01234, "0.01234"), (99.96, "99.96"), (12345.6, "12,346"),
                                             (12, "12")])  # fmt: skip
def test_figures_keep_four_significant_digits_and_no_exponent(value, text):
    assert format_figure(value) == text


# -- the same table in the terminal, perfsuite compare and the report ----------------------------------------------


def html_table(page: str) -> tuple[list[str], list[list[str]]]:
    """The verdict table's header and cells as a reader sees them (tags stripped, entities decoded)."""
    table = page.split('<table id="verdict-table">')[1].split("</table>")[0]

    def text(cell: str) -> str:
        return markup.unescape(re.sub(r"<[^>]+>", "", cell)).strip()

    head, body = table.split("</thead>")
    headers = [text(cell) for cell in re.findall(r"<th[^>]*>(.*?)</th>", head, flags=re.S)]
    rows = [[text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, flags=re.S)]  # fmt: skip
    return headers, rows


def test_the_terminal_compare_and_the_report_show_the_same_rows(tmp_path, capsys):
    """A regression, a changed counter, a capacity test and a test the old run lacks, through all three."""
    slower = {"output_throughput": (70.0, 71, 72, 73, 74, 75, 76)}
    steady = {"output_throughput": (100.0, 101, 102, 103, 104, 105, 106)}
    old = make_results(
        make_result("t.py::test_regressed", samples=steady),
        make_result("t.py::test_counter", samples=steady, counters=EngineCounters(num_forward_passes=10)),
    )
    new = make_results(
        make_result("t.py::test_regressed", samples=slower),
        make_result("t.py::test_counter", samples=steady, counters=EngineCounters(num_forward_passes=12)),
        make_result("t.py::test_capacity", capacity=CAPACITY),
        make_result("t.py::test_new"),
    )
    write_results(tmp_path / "old.json", old)
    write_results(tmp_path / "new.json", new)

    code = main(["compare", str(tmp_path / "old.json"), str(tmp_path / "new.json"), "-o", str(tmp_path / "r.html")])
    compare_out = capsys.readouterr().out
    assert code == 1, compare_out

    old_read, new_read = read_results(tmp_path / "old.json"), read_results(tmp_path / "new.json")
    judged = rejudge(old_read, new_read, policy_of(new_read), old_name=str(tmp_path / "old.json"))
    session = fake_session(tmp_path)
    session.results = list(judged.tests)
    written: list[str] = []
    write_summary(lambda text, **markup: written.append(text), session, WrittenFiles(None, None), None)
    terminal_table = written[0]

    assert compare_out.startswith(terminal_table + "\n"), compare_out
    headers, rows = html_table((tmp_path / "r.html").read_text())
    assert format_table(headers, rows) == terminal_table
    assert headers == list(dataclasses.astuple(STORED_HEADERS))
    shown = {(row[0], row[1]): row for row in rows}
    assert shown["test_regressed", "output_throughput"][-1] == "regressed"
    assert shown["test_counter", "num_forward_passes"][2:] == ["10", "12", "exact", "-", "-", "-", "counter changed"]
    assert shown["test_capacity", "capacity_under_slo"][3] == "12.5"
    assert shown["test_new", "output_throughput"][-1] == f"not in {tmp_path / 'old.json'}"
    assert "overall: regressed" in compare_out


def test_an_ab_reports_header_is_the_terminals():
    results = make_results(make_result("t.py::test_a"), against=AGAINST)
    headers, rows = html_table(render_report(results))
    assert headers == list(dataclasses.astuple(PAIRED_HEADERS))
    assert format_table(headers, rows) == verdict_table(results.tests, paired=True).text()
