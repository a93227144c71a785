"""A perf test that judged nothing is skipped, and the session's last line says how many comparisons were judged.

The counting and the wording are pure functions over results (``perfsuite.judge.tally``), tested on
hand-built results; the terminal's lines and ``perfsuite compare``'s without a session; and one small
pytester session on a fake backend (steps that sleep, no model) shows ``perf_strict`` in the ini file
failing a session that judged nothing. Sessions that exist anyway cover the rest: a first run skipped
with its ``-rs`` reason, last line and exit status 0 (test_plugin.py, the first --perf run), ``--perf-strict``
on the command line (test_gate.py, deselected tests), a noisy test (test_gate.py, a busy machine), the
skip decided on xdist workers (test_gate.py, the shipped suite under xdist), and a test with a verdict
passing with "judged 4 of 4" (test_plugin.py, the baseline round trip).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfsuite.cli import main
from perfsuite.judge.compare import policy_of, rejudge
from perfsuite.judge.judge import adjust_family
from perfsuite.judge.results import CapacityRecord, read_results, write_results
from perfsuite.judge.stats import Comparison, Direction, Policy, Verdict
from perfsuite.judge.tally import (
    MISSING_ON_ONE_SIDE,
    NOT_MEASURED,
    RECORD_BASELINES,
    RECORD_ONE,
    Tally,
    Unjudged,
    num_judged,
    skip_reason,
    tally,
)
from perfsuite.measure.capacity import Capacity
from perfsuite.plugin.terminal import WrittenFiles, write_summary
from fake_backend import FAKE_BACKEND_CONFTEST
from report_fixtures import fake_session
from results_builders import ENVIRONMENT, make_result, make_results

pytest_plugins = ["pytester"]

METRICS = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "median_e2el_ms")
CAPACITY = CapacityRecord(
    searches=(Capacity(12.5, (12.5, 14.0), (), "bracket narrower than the tolerance", 0.9, 0.05),),
    slo_ttft_ms=500.0,
    slo_tpot_ms=None,
)


def comparison(verdict: Verdict, metric: str = "output_throughput", n: int = 7, p_worse: float = 0.5) -> Comparison:
    return Comparison(
        metric=metric, direction=Direction.HIGHER_IS_BETTER, n_baseline=n, n_current=n, baseline_median=100.0,
        current_median=99.0, change=-0.01, ci_low=0.97, ci_high=1.01, p_worse=p_worse, p_better=1 - p_worse,
        p_adjusted=p_worse, verdict=verdict,
    )  # fmt: skip


def compared(test_id: str, *verdicts: Verdict, **changes):
    comparisons = tuple(comparison(verdict, metric) for verdict, metric in zip(verdicts, METRICS))
    return make_result(test_id, comparisons=comparisons, baseline_status="compared", **changes)


# -- counting ----------------------------------------------------------------------------------------------------


def test_improved_unchanged_and_regressed_are_judged_noisy_and_inconclusive_are_not():
    results = [
        compared("t.py::a", Verdict.IMPROVED, Verdict.UNCHANGED, Verdict.REGRESSED, Verdict.UNCHANGED),
        compared("t.py::b", *[Verdict.NOISY] * 4, noisy="the machine was busy"),
        compared("t.py::c", *[Verdict.INCONCLUSIVE] * 4),
    ]
    assert num_judged(results) == 4
    assert tally(results, 4) == Tally(12, 4, (
        Unjudged("noisy (the machine was busy)", 4, "run on a quiet runner"),
        Unjudged("inconclusive (too few repeats)", 4, "raise --perf-repeats (a verdict needs 3 samples a side)"),
    ))  # fmt: skip


def test_a_session_without_baselines_says_in_its_line_how_many_and_what_to_do():
    """Two recorded tests without a baseline, one of another environment's, one planned test that recorded none."""
    results = [
        make_result("t.py::a", baseline_status="no baseline"),
        make_result("t.py::b", baseline_status="no baseline"),
        make_result("t.py::c", baseline_status="other environment only"),
    ]
    counted = tally(results, 4, num_planned_tests=4)
    assert (counted.num_planned, counted.num_judged, counted.all_judged) == (16, 0, False)
    assert counted.line() == (
        "perfsuite: judged 0 of 16 planned comparisons (8 without a baseline for this environment, "
        f"4 with baselines only for other environments, 4 {NOT_MEASURED}): {RECORD_BASELINES}"
    )


def test_a_session_that_judged_everything_says_so_in_its_line():
    counted = tally([compared("t.py::a", *[Verdict.UNCHANGED] * 4)], 4, num_planned_tests=1)
    assert counted.all_judged and counted.line() == "perfsuite: judged 4 of 4 planned comparisons"


def test_a_capacity_test_plans_one_comparison_and_a_metric_missing_on_one_side_is_not_judged():
    capacity = make_result("t.py::cap", capacity=CAPACITY, baseline_status="compared",
                           comparisons=(comparison(Verdict.UNCHANGED, "capacity_under_slo"),))  # fmt: skip
    three_of_four = compared("t.py::one_token", Verdict.UNCHANGED, Verdict.UNCHANGED, Verdict.UNCHANGED)
    counted = tally([capacity, three_of_four], 4, num_planned_tests=2)
    assert (counted.num_planned, counted.num_judged) == (5, 4)
    assert counted.unjudged == (Unjudged(MISSING_ON_ONE_SIDE, 1),)
    assert counted.line() == f"perfsuite: judged 4 of 5 planned comparisons (1 {MISSING_ON_ONE_SIDE})"


def test_a_status_the_tally_does_not_know_is_counted_under_its_own_words():
    """perfsuite compare's statuses, for one: a test the old file lacks."""
    counted = tally([make_result("t.py::a", baseline_status="not in old.json")], 4)
    assert counted.line() == "perfsuite: judged 0 of 4 planned comparisons (4 not in old.json)"


def _comparisons(draw_verdicts):
    """Interim comparisons as a session makes them: noisy, too few samples (inconclusive), or judged on their p."""
    return [
        comparison(Verdict.NOISY if noisy else Verdict.INCONCLUSIVE if n < 3 else Verdict.UNCHANGED, n=n, p_worse=p)
        for noisy, n, p in draw_verdicts
    ]


@settings(max_examples=60)
@given(st.lists(st.lists(st.tuples(st.booleans(), st.sampled_from([2, 7]), st.floats(1e-6, 1.0)), min_size=1,
                         max_size=4), min_size=1, max_size=6))  # fmt: skip
def test_the_session_end_adjustment_never_changes_what_was_judged(tests):
    """So a skip decided while a test ran (on an xdist worker too) holds once every p-value is in."""
    results = [make_result(f"t.py::t{i}", comparisons=tuple(_comparisons(drawn))) for i, drawn in enumerate(tests)]
    adjusted, _ = adjust_family(results, Policy())
    assert [num_judged([r]) for r in adjusted] == [num_judged([r]) for r in results]


# -- the skip reason of one test -------------------------------------------------------------------------------------


def test_a_test_with_one_judged_comparison_is_not_skipped():
    assert skip_reason([compared("t.py::a", Verdict.NOISY, Verdict.REGRESSED)], 4) is None
    assert skip_reason([], 4) is None, "a test that recorded nothing is left as it ended"


@pytest.mark.parametrize(
    ("result", "reason"),
    [
        (make_result("t.py::a"),
         f"perfsuite: judged 0 of 4 comparisons: no baseline for this environment ({ENVIRONMENT.fingerprint()}); "
         f"{RECORD_ONE}"),
        (make_result("t.py::a", baseline_status="other environment only"),
         "perfsuite: judged 0 of 4 comparisons: baselines exist only for other environments, not for this one "
         f"({ENVIRONMENT.fingerprint()}); {RECORD_ONE}"),
        (make_result("t.py::a", baseline_status="other configuration"),
         "perfsuite: judged 0 of 4 comparisons: its baseline measured another configuration; "
         "re-record it with --perf-save-baseline if the change is intended"),
        (compared("t.py::a", *[Verdict.NOISY] * 4, noisy="the machine was busy with other work during 2 of 7 repeats"),
         "perfsuite: judged 0 of 4 comparisons: noisy: the machine was busy with other work during 2 of 7 repeats; "
         "run on a quiet runner"),
        (make_result("t.py::a", baseline_status="compared", comparisons=(comparison(Verdict.INCONCLUSIVE, n=2),)),
         "perfsuite: judged 0 of 4 comparisons: inconclusive: too few repeats (2 a side) for a verdict; "
         "raise --perf-repeats (a verdict needs 3 samples a side)"),
        (make_result("t.py::cap", capacity=CAPACITY),
         f"perfsuite: judged 0 of 1 comparisons: no baseline for this environment ({ENVIRONMENT.fingerprint()}); "
         f"{RECORD_ONE}"),
    ],
    ids=["no-baseline", "other-environment", "other-configuration", "noisy", "inconclusive", "capacity"],
)  # fmt: skip
def test_a_test_that_judged_nothing_says_why_and_what_to_do_in_one_line(result, reason):
    assert skip_reason([result], 4) == reason
    assert "\n" not in reason


# -- the terminal's last lines and perfsuite compare ----------------------------------------------------------------


def summary_lines(session) -> list[str]:
    written: list[str] = []
    write_summary(lambda text, **markup: written.extend(text.splitlines()), session, WrittenFiles(None, None), None)
    return written


def test_the_judged_line_is_the_last_the_summary_writes_and_strict_says_it_fails_the_session(tmp_path):
    session = fake_session(tmp_path)
    session.num_planned_tests = 3
    session.num_self_skipped_tests = 1  # a capacity test without --perf-slo: not planned after all
    session.results = [make_result("t.py::a"), compared("t.py::b", *[Verdict.UNCHANGED] * 4)]
    session.warnings = ["a warning"]
    line = "perfsuite: judged 4 of 8 planned comparisons (4 without a baseline for this environment): "
    assert summary_lines(session)[-1] == line + RECORD_BASELINES
    assert not session.fails_strict

    session.options = dataclasses.replace(session.options, strict=True)
    assert session.fails_strict
    *_, strict, last = summary_lines(session)
    assert strict == "perfsuite: --perf-strict fails this session: 4 of 8 planned comparisons were not judged"
    assert last == line + RECORD_BASELINES


def test_a_save_baseline_session_is_not_failed_by_strict_and_its_line_says_it_records(tmp_path):
    session = fake_session(tmp_path, save_baseline=True)
    session.options = dataclasses.replace(session.options, strict=True)
    session.num_planned_tests = 1
    session.results = [make_result("t.py::a", baseline_status="saved to baselines/x.json")]
    assert not session.fails_strict and session.judged_nothing("t.py::a") is None
    assert summary_lines(session)[-1] == (
        "perfsuite: --perf-save-baseline: judged 0 of 4 planned comparisons against the earlier baselines "
        "(shown, failing nothing)"
    )


def test_perfsuite_compare_ends_with_the_judged_line_and_strict_fails_when_not_all_were_judged(tmp_path, capsys):
    steady = {"output_throughput": (100.0, 101, 102, 103, 104, 105, 106)}
    write_results(tmp_path / "old.json", make_results(make_result("t.py::a", samples=steady)))
    write_results(tmp_path / "new.json", make_results(make_result("t.py::a", samples=steady), make_result("t.py::b")))
    old, new = str(tmp_path / "old.json"), str(tmp_path / "new.json")

    assert main(["compare", old, new]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    # t.py::a has throughput samples only: its three latencies are missing on both sides
    assert last == f"perfsuite: judged 1 of 8 planned comparisons (4 not in {old}, 3 {MISSING_ON_ONE_SIDE})"

    assert main(["compare", old, new, "--strict"]) == 1
    *_, strict, last_strict = capsys.readouterr().out.splitlines()
    assert strict == "perfsuite compare --strict: 7 of 8 comparisons were not judged: exit status 1"
    assert last_strict == last
    judged = rejudge(read_results(old), read_results(new), policy_of(read_results(new)), old_name=old)
    assert num_judged(judged.tests) == 1


# -- pytest sessions: the outcome, the -rs reason, the last line and the exit status ---------------------------------

CONFTEST = FAKE_BACKEND_CONFTEST + """
@pytest.fixture(scope="session")
def _perf_environment(perf_session):
    # The environment a fake backend would be fingerprinted by, without importing torch to describe it (seconds).
    from perfsuite.measure.environment import Environment

    perf_session.environment = Environment("cpu", "2.13.0", "5.23.0", "float32", "fake", "Some CPU @ 2GHz", 2)
    return perf_session.environment
"""

PERF_TESTS = """
import pytest

@pytest.mark.perf
@pytest.mark.parametrize("batch", [2, 3])
def test_speed(perf, perf_engine_factory, perf_workload, batch):
    perf.measure(perf_engine_factory("inflight", batch_size=batch), perf_workload)
    perf.assert_no_regression()

def test_plain():
    pass
"""

ARGS = ["--perf", "--perf-profile", "smoke", "-p", "no:randomly", "-p", "no:cacheprovider", "-rs"]


@pytest.fixture
def project(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_speed=PERF_TESTS)
    return pytester


def test_perf_strict_in_the_ini_file_fails_a_session_that_judged_nothing(project):
    project.makeini("[pytest]\nperf_strict = true\n")
    # 5 repeats: with 3 the session could flag no lone regression, which --perf-strict makes a usage error
    result = project.runpytest_subprocess(*ARGS, "--perf-repeats", "5", "-k", "speed and 2")
    result.assert_outcomes(skipped=1, deselected=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "perfsuite: --perf-strict fails this session: 4 of 4 planned comparisons were not judged",
        "perfsuite: judged 0 of 4 planned comparisons (4 without a baseline for this environment): *",
    ])  # fmt: skip
