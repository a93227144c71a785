"""The report's readings of the machine per test: the CPU other work used during the runs, and A/B's worker threads."""

from __future__ import annotations

import dataclasses

import pytest

from perfsuite.judge.catalogue import BUSY_SHARE
from perfsuite.judge.results import read_results, write_results
from perfsuite.report.render import render_report
from report_fixtures import as_ab_session, fake_results
from results_builders import changed, make_result, make_results
from test_report_ab import section


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    measured = fake_results(tmp_path_factory.mktemp("session"))
    return dataclasses.replace(measured, tests=measured.tests[:1])


def test_a_stored_test_shows_the_cpu_other_work_used_over_its_repeats(stored):
    [test] = stored.tests
    busy = changed(test, samples={**test.measurement.samples, BUSY_SHARE: (0.01, 0.03, 0.42)})
    page = render_report(dataclasses.replace(stored, tests=(busy,)))
    assert "CPU used by other work" in section(page, test.test_id)
    assert "median 3%, most 42% of the machine, over 3 repeats" in section(page, test.test_id)
    assert "worker threads" not in page


def test_a_test_without_readings_shows_none(stored):
    [test] = stored.tests
    quiet = changed(test, samples={k: v for k, v in test.measurement.samples.items() if k != BUSY_SHARE})
    assert "CPU used by other work" not in render_report(dataclasses.replace(stored, tests=(quiet,)))


def test_an_ab_test_shows_each_sides_cpu_readings_and_the_workers_threads(stored):
    [paired] = as_ab_session(stored).tests
    reference = dataclasses.replace(paired.reference, samples={**paired.reference.samples, BUSY_SHARE: (0.5, 0.5)},
                                    num_threads=1)  # fmt: skip
    paired = dataclasses.replace(paired, reference=reference)
    paired = changed(paired, samples={**paired.measurement.samples, BUSY_SHARE: (0.48, 0.52)})
    shown = section(render_report(dataclasses.replace(as_ab_session(stored), tests=(paired,))), paired.test_id)
    assert "A: median 50%, most 50% of the machine, over 2 runs; B: median 50%, most 52% of the machine" in shown
    assert "1 intra-op a worker, both sides" in shown


def test_each_test_measured_under_perf_ray_shows_its_own_node_after_results_json(tmp_path):
    first, second = "host-a (10.0.0.1, node 1a2b3c4d5e6f)", "host-b (10.0.0.2, node 6f5e4d3c2b1a)"
    tests = (
        make_result("tests/perf/test_x.py::test_x[a]", node=first),
        make_result("tests/perf/test_x.py::test_x[b]", node=second),
        make_result("tests/perf/test_x.py::test_x[local]"),
    )
    write_results(tmp_path / "results.json", make_results(*tests))
    page = render_report(read_results(tmp_path / "results.json"))
    assert f"<dt>measured on node</dt><dd>{first}</dd>" in section(page, tests[0].test_id)
    assert f"<dt>measured on node</dt><dd>{second}</dd>" in section(page, tests[1].test_id)
    assert second not in section(page, tests[0].test_id)
    assert "measured on node" not in section(page, tests[2].test_id)
