"""The report's KV cache and memory: per-test facts, counters not recorded, and the timeline's KV lane."""

from __future__ import annotations

import dataclasses
import re

import pytest

from perfsuite.judge.results import KV_COUNTERS, Results
from perfsuite.measure.summaries import DEVICE_MEMORY
from perfsuite.report.render import render_report
from report_fixtures import THROUGHPUT, fake_results
from results_builders import changed


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Results:
    return fake_results(tmp_path_factory.mktemp("session"))


def timeline_svg(html: str) -> str:
    return html.split('id="timeline-figure"')[1].split("</figure>")[0]


def section(html: str, test_name: str) -> str:
    anchor = "test-" + re.sub(r"[^A-Za-z0-9]+", "-", test_name).strip("-")
    return html.split(f'id="{anchor}"')[1].split("</details>")[0]


def with_paged_test(results: Results) -> Results:
    """The in-flight B4 uniform test again as a paged engine's, whose third step preempted two requests."""
    inflight = results.test(THROUGHPUT.format(engine="inflight", batch=4, lengths="uniform"))
    steps = list(inflight.measurement.timeline.steps)
    steps[2] = dataclasses.replace(steps[2], preempted_request_ids=("req-5", "req-6"))
    steps[5] = dataclasses.replace(steps[5], preempted_request_ids=("req-6",))
    measured = inflight.measurement
    paged = changed(
        dataclasses.replace(inflight, test_id=THROUGHPUT.format(engine="paged", batch=4, lengths="uniform")),
        engine_name="paged",
        timeline=dataclasses.replace(measured.timeline, steps=tuple(steps), num_kv_blocks=12, kv_block_size=16),
        counters=dataclasses.replace(measured.counters, num_preemptions=3, num_recomputed_tokens=21),
        samples={**measured.samples, DEVICE_MEMORY: (300 * 2**20, 310 * 2**20, 305 * 2**20)},
    )
    return dataclasses.replace(results, tests=(*results.tests, paged))


@pytest.fixture(scope="module")
def html(measured) -> str:
    return render_report(with_paged_test(measured))


def test_the_timeline_sets_static_in_flight_and_paged_side_by_side_with_a_kv_lane_and_preemptions(html):
    svg = timeline_svg(html)
    for text in ("static: test_throughput[static-B4-uniform]", "inflight: test_throughput[inflight-B4-uniform]",
                 "paged: test_throughput[paged-B4-uniform]", "KV blocks", "queue", "preemption"):  # fmt: skip
        assert text in svg, text
    assert svg.count('id="kv-blocks') == 3 and svg.count('id="kv-pool') == 3
    assert svg.count('id="preemptions') == 1, "only the paged run preempted"
    caption = svg.split("<figcaption>")[1]
    assert "red markers: steps that preempted requests" in caption


def test_a_timeline_without_kv_figures_has_no_kv_lane(measured):
    tests = tuple(changed(t, timeline=dataclasses.replace(t.measurement.timeline, num_kv_blocks=None))
                  for t in measured.tests)  # fmt: skip
    svg = timeline_svg(render_report(dataclasses.replace(measured, tests=tests)))
    assert "queue" in svg and "KV blocks" not in svg and "preemption" not in svg


def test_each_test_shows_its_kv_cache_and_cuda_peak(html, measured):
    paged = section(html, "tests/perf/test_throughput.py::test_throughput[paged-B4-uniform]")
    assert "<dt>KV pool</dt><dd>12 blocks of 16 tokens</dd>" in paged
    assert "<dt>preemptions</dt><dd>3 (21 tokens recomputed)</dd>" in paged
    assert "<dt>CUDA peak allocated</dt><dd>310.0 MiB</dd>" in paged
    inflight = measured.test(THROUGHPUT.format(engine="inflight", batch=4, lengths="uniform"))
    shown = section(html, inflight.test_id)
    assert f"<dt>max concurrent requests</dt><dd>{inflight.measurement.counters.peak_num_running}</dd>" in shown
    assert "<dt>KV pool</dt><dd>4 blocks of 64 tokens</dd>" in shown, "a slot engine: its slots, max_seq_len each"
    assert "CUDA peak" not in shown, "nothing measured on CPU"


def test_counters_a_file_did_not_record_say_so_instead_of_a_change(measured):
    test = measured.tests[0]
    older_run = changed(test, unrecorded_counters=KV_COUNTERS)
    older_baseline = changed(test, baseline_status="compared", comparisons=measured.tests[1].judgement.comparisons,
                             baseline_unrecorded_counters=KV_COUNTERS)  # fmt: skip
    for judged, current, baseline in ((older_run, "not recorded", "-"), (older_baseline, "0", "not recorded")):
        page = render_report(dataclasses.replace(measured, tests=(judged,)))
        cells = r"\s*<td>([^<]*)</td>" * 3
        row = re.search(r'<td class="text">num_preemptions</td>' + cells, page)
        assert row.groups() == (baseline, current, "-")
    assert "KV pool" not in section(render_report(dataclasses.replace(measured, tests=(older_run,))), test.test_id)
