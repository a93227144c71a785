"""The HTML report of an A/B session (``--perf-against REF``): side A is REF, side B the current tree, no baselines."""

from __future__ import annotations

import dataclasses
import html as markup
import re

import pytest

from perfsuite.cli import main
from perfsuite.judge.results import Results, write_results
from perfsuite.report.render import pair_ratios, render_report
from report_fixtures import AGAINST, PAIR_RATIOS, THROUGHPUT, as_ab_session, fake_results

SHOWN = (  # a static/in-flight pair (the timeline figure needs one) and a latency test
    THROUGHPUT.format(engine="static", batch=4, lengths="uniform"),
    THROUGHPUT.format(engine="inflight", batch=4, lengths="uniform"),
    "tests/perf/test_latency.py::test_latency_poisson[static-400rps]",
)
REFERENCE_TITLE = "A: REF origin/main (3f2a9c1d0e4b)"
CURRENT_TITLE = "B: current tree at 4f1de97c0ffe"


@pytest.fixture(scope="module")
def ab_results(tmp_path_factory) -> Results:
    measured = fake_results(tmp_path_factory.mktemp("session"))
    return as_ab_session(dataclasses.replace(measured, tests=tuple(measured.test(t) for t in SHOWN)))


@pytest.fixture(scope="module")
def page(ab_results) -> str:
    return render_report(ab_results)


def verdict_header(page: str) -> str:
    return page.split('<table id="verdict-table">')[1].split("</thead>")[0]


def section(page: str, test_id: str) -> str:
    anchor = "test-" + re.sub(r"[^A-Za-z0-9]+", "-", test_id).strip("-")
    return page.split(f'<details class="test" id="{anchor}"')[1].split("</details>")[0]


def figure(page: str, figure_id: str) -> str:
    return page.split(f'id="{figure_id}"')[1].split("</figure>")[0]


def text_y(svg: str, text: str) -> float:
    """Where matplotlib put a text element, from the top of its figure."""
    found = re.search(rf'<text [^>]*\by="([0-9.]+)"[^>]*>{re.escape(text)}</text>', svg)
    assert found, f"no text {text!r} in the figure"
    return float(found.group(1))


def marker_ys(svg: str, group_id: str) -> list[float]:
    """The y of each marker matplotlib drew in one line's group (gid), in the line's order."""
    group = svg.split(f'<g id="{group_id}">')[1].split("</g>")[0]
    return [float(y) for y in re.findall(r'<use [^>]*\by="([0-9.]+)"', group)]


def test_the_header_names_ref_its_commit_the_current_tree_the_order_and_the_test(page, ab_results):
    header = page.split("</header>")[0]
    assert "A/B against REF origin/main (3f2a9c1d0e4b), current tree at 4f1de97c0ffe" in header
    assert 'id="ab-session"' in header, "said beside the overall verdict, not only in the facts"
    assert "nothing was compared with stored baselines" in header
    assert markup.escape(AGAINST.order) in header
    assert markup.escape(ab_results.policy.test) in header and "Wilcoxon" in header


def test_the_verdict_table_names_sides_a_and_b_and_no_baseline(page):
    header = verdict_header(page)
    for heading in (">A: REF<", ">B: current<", ">pair ratio<", ">ratio CI<"):
        assert heading in header, heading
    assert "baseline" not in header.lower()
    assert "Mann-Whitney" not in header and "Wilcoxon" in header, "the column notes name the paired test"


def test_each_test_names_its_sides_in_counters_latencies_and_status(page):
    body = section(page, SHOWN[0])
    assert "<th>A: REF</th><th>B: current</th>" in body
    assert "<dt>compared with</dt><dd>A/B against origin/main (3f2a9c1d0e4b)</dd>" in body
    assert "dashed: A, the REF side" in body
    cdf = body.split('<figure class="plot">')[1].split("</figure>")[0]
    assert ">A: REF</text>" in cdf and ">B: current</text>" in cdf
    assert ">baseline</text>" not in cdf and ">current</text>" not in cdf


def test_pair_ratios_are_b_over_a_pair_by_pair(ab_results):
    ratios = {pair.metric: pair for pair in pair_ratios(ab_results.test(SHOWN[0]))}
    assert sorted(ratios) == ["median_e2el_ms", "median_tpot_ms", "median_ttft_ms", "output_throughput"]
    assert ratios["output_throughput"].ratios == pytest.approx(PAIR_RATIOS)
    assert ratios["median_ttft_ms"].ratios == pytest.approx([1 / r for r in PAIR_RATIOS]), "latency: A is faster"
    assert ratios["output_throughput"].orders == ("AB", "BA", "AB")


def test_each_test_plots_its_pair_ratios(page):
    for test_id in SHOWN:
        anchor = "test-" + re.sub(r"[^A-Za-z0-9]+", "-", test_id).strip("-")
        plot = figure(section(page, test_id), f"pair-ratios-{anchor}")
        assert "<svg" in plot and "within min effect ±3%" in plot
        first_ab, last_ab = marker_ys(plot, "pair-ratios-output_throughput-AB")  # pairs 1 and 3: A ran first
        assert len(marker_ys(plot, "pair-ratios-output_throughput-BA")) == 1
        assert first_ab > last_ab, "pair 1's ratio (0.91) is drawn below pair 3's (0.92)"


def test_each_test_stacks_a_timeline_of_a_above_one_of_b(page):
    for test_id in SHOWN:
        anchor = "test-" + re.sub(r"[^A-Za-z0-9]+", "-", test_id).strip("-")
        timelines = figure(section(page, test_id), f"timelines-{anchor}")
        assert timelines.count("<svg") == 1, "one figure, both runs on one time axis"
        assert timelines.count(">slot 0</text>") == 2 and timelines.count(">queue</text>") == 2
        assert text_y(timelines, REFERENCE_TITLE) < text_y(timelines, CURRENT_TITLE), "A above B"


def test_the_static_vs_inflight_timeline_says_it_is_side_b(page):
    caption = figure(page, "timeline-figure").split("<figcaption>")[1]
    assert "Both are runs of side B, the current tree" in caption


def test_cli_report_renders_an_ab_results_file(ab_results, tmp_path):
    path = tmp_path / "results.json"
    write_results(path, ab_results)
    assert main(["report", str(path)]) == 0
    written = (tmp_path / "report.html").read_text()
    assert "A/B against REF origin/main (3f2a9c1d0e4b)" in written
    assert "baseline" not in verdict_header(written).lower()
    assert written.count('class="plot ab-timelines"') == written.count('class="plot pair-ratios"') == len(SHOWN)
