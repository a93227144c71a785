"""The regression gate, end to end through pytester: which runs are compared, and what a verdict can rest on.

Perf tests here run on a fake backend whose steps sleep (see tests/test_plugin.py),
so nothing depends on this machine's speed; a busy machine is simulated by
replacing the CPU meter.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat

import pytest

from perfsuite.judge.catalogue import PROBE

pytest_plugins = ["pytester"]

CONFTEST = """
import os, time, pytest
from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.adapters import Backend

if os.environ.get("FAKE_BUSY_SHARE"):
    import dataclasses
    import perfsuite.measure.repeats
    from perfsuite.measure.contention import CpuMeter

    class BusyMeter(CpuMeter):
        # The real meter's reading, as if other work had used this share of the machine and the hypervisor
        # none (a VM's real steal would re-run a repeat of a test that fakes a quiet machine).
        def stop(self):
            use = super().stop()
            share = float(os.environ["FAKE_BUSY_SHARE"])
            return use and dataclasses.replace(
                use, foreign_share=share, steal_share=0.0, wall_seconds=max(use.wall_seconds, 1.0))

    perfsuite.measure.repeats.CpuMeter = BusyMeter
    perfsuite.measure.repeats.QUIET_WAIT_SECONDS = 0.0

@pytest.fixture(scope="session")
def perf_backend():
    delay = float(os.environ.get("FAKE_STEP_SECONDS", "0.004"))
    probe_seconds = float(os.environ.get("FAKE_PROBE_SECONDS", "0"))
    runner = FakeRunner(vocab_size=97, on_execute=lambda output: time.sleep(delay))
    if os.environ.get("FAKE_ATTENTION"):  # as ModelRunner.paged_attention reads
        runner.paged_attention = os.environ["FAKE_ATTENTION"]
    if os.environ.get("FAKE_ATTENTION_FALLBACK"):  # as ModelRunner.paged_attention_fallback reads
        runner.paged_attention_fallback = os.environ["FAKE_ATTENTION_FALLBACK"]
    tokenize = lambda text: [3 + b % 90 for b in text.encode()][:12]

    readings = iter(range(1, 10_000))

    def probe(device):
        time.sleep(probe_seconds)
        # FAKE_PROBE_COUNTS: the n-th reading is n seconds, so a test can tell which readings a repeat got.
        return float(next(readings)) if os.environ.get("FAKE_PROBE_COUNTS") else 0.01

    # Sleeping steps do not follow the machine's speed: no probe, and no busy-machine check, unless a test asks.
    measured = probe_seconds or os.environ.get("FAKE_BUSY_SHARE") or os.environ.get("FAKE_PROBE_COUNTS")
    return Backend(runner=runner, tokenize=tokenize, eos_token_id=None, max_context=512, device="cpu",
                   probe=probe if measured else None)
"""

PERF_TESTS = """
import pytest

@pytest.mark.perf
@pytest.mark.parametrize("batch", [2, 3, 4, 5])
def test_speed(perf, perf_engine_factory, perf_workload, batch):
    perf.measure(perf_engine_factory("inflight", batch_size=batch), perf_workload)
    perf.assert_no_regression()
"""

ARGS = ["--perf", "--perf-profile", "smoke", "--perf-repeats", "6", "-p", "no:randomly"]
ONE_TEST = ["-k", "speed and 2"]
# For a compare that checks the baseline plumbing, not speed. These tests run beside another xdist worker, and
# there the fake engine's 4 ms sleeps once swung a run's TTFT by +15% against a baseline saved seconds before
# (p=0.026): a verdict on that would be the machine's, not the code's. 50% is far outside such swings.
PLUMBING_ONLY = ["--perf-min-effect", "0.5"]


@pytest.fixture
def project(pytester, monkeypatch):
    monkeypatch.delenv("FAKE_BUSY_SHARE", raising=False)
    monkeypatch.delenv("FAKE_PROBE_SECONDS", raising=False)
    monkeypatch.delenv("FAKE_PROBE_COUNTS", raising=False)
    monkeypatch.setenv("FAKE_STEP_SECONDS", "0.004")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_speed=PERF_TESTS)
    return pytester


def results_json(pytester, report_dir="reports") -> dict:
    return json.loads((pytester.path / report_dir / "results.json").read_text())


def baseline_files(pytester, baseline_dir="baselines"):
    return sorted((pytester.path / baseline_dir).rglob("*.json"))


# -- a baseline knows what it measured ----------------------------------------


@pytest.mark.parametrize(
    ("changed", "difference"),
    [
        (["--perf-decode-mode", "static"], "decode_mode: packed -> static"),
        (["--perf-repeats", "5"], "repeats: 6 -> 5"),
        (["--perf-profile", "ci"], "profile: smoke -> ci"),
    ],
    ids=["decode-mode", "repeats", "profile"],
)
def test_a_run_of_another_configuration_is_not_compared(project, monkeypatch, changed, difference):
    project.runpytest_subprocess(*ARGS, *ONE_TEST, "--perf-save-baseline").assert_outcomes(passed=1, deselected=3)
    monkeypatch.setenv("FAKE_STEP_SECONDS", "0.008")  # would regress if it were compared
    result = project.runpytest_subprocess(*ARGS, *ONE_TEST, *changed, "-rs")
    result.assert_outcomes(skipped=1, deselected=3)  # judged nothing: skipped, not failed
    result.stdout.fnmatch_lines([
        f"*warning: *the baseline measured another configuration (*{difference}*); not compared*",
        "*perfsuite: judged 0 of 4 comparisons: its baseline measured another configuration; re-record it*",
    ])  # fmt: skip
    [test] = results_json(project)["tests"]
    assert test["judgement"]["baseline_status"] == "other configuration" and test["judgement"]["comparisons"] == []


def test_another_workload_under_the_same_test_id_is_not_compared(project):
    """The ci and full profiles run different workloads under one id; here the smoke workload's length changes."""
    project.runpytest_subprocess(*ARGS, *ONE_TEST, "--perf-save-baseline").assert_outcomes(passed=1, deselected=3)
    project.makepyfile(test_speed=PERF_TESTS.replace("perf_workload)", "perf_workload[:3])"))
    result = project.runpytest_subprocess(*ARGS, *ONE_TEST)
    result.stdout.fnmatch_lines(["*another configuration (workload_digest: * -> *; num_requests: 4 -> 3)*"])


def test_a_paged_run_that_gathers_is_not_judged_against_one_that_attended_in_place(project, monkeypatch):
    """A runner with no C compiler gathers the paged blocks: the same outputs, another speed."""
    project.makepyfile(test_speed=PERF_TESTS.replace('"inflight"', '"paged"'))
    monkeypatch.setenv("FAKE_ATTENTION", "in place")
    project.runpytest_subprocess(*ARGS, *ONE_TEST, "--perf-save-baseline").assert_outcomes(passed=1, deselected=3)
    monkeypatch.setenv("FAKE_ATTENTION", "gather: no C compiler (cc) on PATH")
    monkeypatch.setenv("FAKE_STEP_SECONDS", "0.008")  # would regress if it were compared
    result = project.runpytest_subprocess(*ARGS, *ONE_TEST)
    result.assert_outcomes(skipped=1, deselected=3)
    result.stdout.fnmatch_lines(["*another configuration (engine_knobs: {*attention=in place*} -> "
                                 "{*attention=gather*}*); not compared*"])  # fmt: skip


def test_a_paged_run_whose_kernel_could_not_be_built_says_why_and_the_fix_on_the_terminal(project, monkeypatch):
    """CC=/bin/false: results.json recorded attention=gather, and the terminal said nothing."""
    project.makepyfile(test_speed=PERF_TESTS.replace('"inflight"', '"paged"'))
    reason = "/bin/false could not build paged_attention.c: exit 1; install a C compiler (gcc or clang) or set CC"
    monkeypatch.setenv("FAKE_ATTENTION", f"gather: {reason}")
    monkeypatch.setenv("FAKE_ATTENTION_FALLBACK", reason)
    result = project.runpytest_subprocess(*ARGS, "-k", "speed and (2 or 3)")
    result.assert_outcomes(skipped=2, deselected=2)  # no baselines
    line = f"warning: decode attention gathered the keys instead of reading them in place (slower; * {reason}"
    result.stdout.fnmatch_lines([f"*{line}*"])
    assert sum("gathered the keys" in text for text in result.outlines) == 1, "one line, not one a test"


# -- power is planned ----------------------------------------------------------


def test_a_session_too_large_to_flag_a_lone_regression_is_warned_before_running(project):
    # 5 repeats a side: the smallest p is 1/252, so at most 12 comparisons (3 tests of 4 metrics).
    args = ["--perf", "--perf-profile", "smoke", "--perf-repeats", "5", "-p", "no:randomly"]
    result = project.runpytest_subprocess(*args)
    result.assert_outcomes(skipped=4)  # no baselines: each test judged nothing
    result.stdout.fnmatch_lines(
        ["*perfsuite warning: *16 comparisons*--perf-repeats 6*--perf-engines*-k*", "*test_speed*"]
    )
    assert any("16 comparisons" in w for w in results_json(project)["warnings"])

    strict = project.runpytest_subprocess(*args, "--perf-strict")
    assert strict.ret == pytest.ExitCode.USAGE_ERROR
    strict.stderr.fnmatch_lines(["*--perf-strict: *16 comparisons*"])


def test_deselected_tests_are_not_planned(project):
    args = ["--perf", "--perf-profile", "smoke", "--perf-repeats", "5", "-p", "no:randomly", "-k", "not 5"]
    result = project.runpytest_subprocess(*args, "--perf-strict")
    result.assert_outcomes(skipped=3, deselected=1)
    assert "warning" not in result.stdout.str()
    assert results_json(project)["policy"]["num_planned_comparisons"] == 12
    # ran (no usage error), but with no baselines it judged nothing, which --perf-strict fails
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "perfsuite: --perf-strict fails this session: 12 of 12 planned comparisons were not judged",
        "perfsuite: judged 0 of 12 planned comparisons (12 without a baseline for this environment): *",
    ])  # fmt: skip


def test_each_comparison_reports_its_minimum_detectable_effect(project):
    project.runpytest_subprocess(*ARGS, *ONE_TEST, "--perf-save-baseline").assert_outcomes(passed=1, deselected=3)
    result = project.runpytest_subprocess(*ARGS, *ONE_TEST)
    result.stdout.fnmatch_lines(["*MDE*verdict*", "*output_throughput*%*unchanged*"])
    [test] = results_json(project)["tests"]
    for comparison in test["judgement"]["comparisons"]:
        assert comparison["min_detectable_effect"] >= 0.10, comparison  # never below the minimum effect


# -- a busy machine is inconclusive, never a regression -------------------------


def test_a_busy_machine_makes_a_slow_run_noisy_not_regressed(project, monkeypatch):
    project.runpytest_subprocess(*ARGS, *ONE_TEST, "--perf-save-baseline").assert_outcomes(passed=1, deselected=3)
    monkeypatch.setenv("FAKE_STEP_SECONDS", "0.008")
    monkeypatch.setenv("FAKE_BUSY_SHARE", "0.5")
    result = project.runpytest_subprocess(*ARGS, *ONE_TEST)
    result.assert_outcomes(skipped=1, deselected=3)  # judged nothing: skipped, never failed
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        "*output_throughput*noisy: inconclusive*", "*warning: *noisy, judges nothing: the machine was busy*",
        "perfsuite: judged 0 of 4 planned comparisons (4 noisy (the machine was busy)): run on a quiet runner",
    ])  # fmt: skip
    [test] = results_json(project)["tests"]
    assert test["measurement"]["noisy"] and {c["verdict"] for c in test["judgement"]["comparisons"]} == {"noisy"}
    assert all(share == 0.5 for share in test["measurement"]["samples"]["cpu_busy_share"])

    monkeypatch.delenv("FAKE_BUSY_SHARE")  # the same slowdown on a quiet machine is caught
    quiet = project.runpytest_subprocess(*ARGS, *ONE_TEST)
    quiet.assert_outcomes(failed=1, deselected=3)


def test_a_baseline_is_never_recorded_on_a_busy_machine(project, monkeypatch):
    monkeypatch.setenv("FAKE_BUSY_SHARE", "0.5")
    result = project.runpytest_subprocess(*ARGS, *ONE_TEST, "--perf-save-baseline")
    result.assert_outcomes(failed=1, deselected=3)
    result.stdout.fnmatch_lines(["*baseline not saved: the machine was busy*record it on a quiet machine*"])
    assert baseline_files(project) == []


# -- the probe -------------------------------------------------------------------


@pytest.mark.timing  # times the target against a slow probe: run alone (conftest.py)
def test_the_machine_probe_runs_outside_the_timed_target(project, monkeypatch):
    monkeypatch.setenv("FAKE_PROBE_SECONDS", "0.5")
    quiet_or_not = ["--perf-busy-threshold", "0.99"]  # this test is about the probe, whatever else runs
    result = project.runpytest_subprocess(*ARGS, *ONE_TEST, *quiet_or_not, "--benchmark-json=bench.json")
    result.assert_outcomes(skipped=1, deselected=3)  # measured, then skipped: no baseline to judge it by
    [bench] = json.loads((project.path / "bench.json").read_text())["benchmarks"]
    assert bench["stats"]["rounds"] == 6
    assert bench["stats"]["max"] < 0.5, "pytest-benchmark timed the probe"
    data = results_json(project)
    assert data["probe"]["unit"] == "seconds" and "matmul" in data["probe"]["measures"]
    assert len(data["tests"][0]["measurement"]["samples"][PROBE]) == 6


@pytest.mark.timing  # the real meter's steal share can re-run a repeat: run alone (conftest.py)
def test_each_repeat_gets_the_probes_just_before_and_just_after_it(project, monkeypatch):
    # The machine's speed drifts during a repeat; the reading before it alone misses that.
    monkeypatch.setenv("FAKE_PROBE_COUNTS", "1")
    # The meter reads a quiet machine whatever else runs here: a repeat re-run as disturbed would add readings.
    monkeypatch.setenv("FAKE_BUSY_SHARE", "0")
    project.runpytest_subprocess(*ARGS, *ONE_TEST).assert_outcomes(skipped=1, deselected=3)  # no baseline
    probes = results_json(project)["tests"][0]["measurement"]["samples"][PROBE]
    # Readings 1..7 around 6 repeats: repeat i sits between reading i and reading i + 1.
    assert probes == pytest.approx([math.sqrt(i * (i + 1)) for i in range(1, 7)])
    assert "before and just after" in results_json(project)["probe"]["measures"]


# -- bad baselines and unwritable directories --------------------------------------


def test_save_baseline_replaces_a_corrupt_baseline_as_its_error_advises(project):
    project.runpytest_subprocess(*ARGS, *ONE_TEST, "--perf-save-baseline").assert_outcomes(passed=1, deselected=3)
    [path] = baseline_files(project)
    path.write_text(path.read_text().replace('"output_throughput": [', '"output_throughput": [NaN, '))
    broken = project.runpytest_subprocess(*ARGS, *ONE_TEST)
    broken.assert_outcomes(failed=1, deselected=3)
    shown = str(path).replace("[", "[[]")
    broken.stdout.fnmatch_lines([f"*{shown}*output_throughput*nan*--perf-save-baseline*"])
    assert "Traceback" not in broken.stdout.str()
    failures = broken.stdout.str().split(" FAILURES ")[1].split(" short test summary info ")[0]
    assert failures.count(f"baseline {path}") == 1, "once, not again after the exceptions it was raised from"
    unrecorded = [w for w in results_json(project)["warnings"] if f"{path}" in w]
    assert results_json(project)["tests"] == [], "not the previous session's results.json, with its one test"
    assert unrecorded and unrecorded[0].startswith("test_speed.py::test_speed[2]: no result recorded: baseline ")

    fixed = project.runpytest_subprocess(*ARGS, *ONE_TEST, "--perf-save-baseline")
    fixed.assert_outcomes(passed=1, deselected=3)
    fixed.stdout.fnmatch_lines(["*warning: *baseline*--perf-save-baseline replaces it with this run*"])
    project.runpytest_subprocess(*ARGS, *ONE_TEST, *PLUMBING_ONLY).assert_outcomes(passed=1, deselected=3)
    assert results_json(project)["tests"][0]["judgement"]["baseline_status"] == "compared"


def test_a_baseline_directory_outside_the_rootdir_works(project, tmp_path_factory):
    outside = tmp_path_factory.mktemp("elsewhere") / "baselines"
    saved = project.runpytest_subprocess(*ARGS, *ONE_TEST, "--perf-save-baseline", f"--perf-baseline-dir={outside}")
    saved.assert_outcomes(passed=1, deselected=3)
    assert results_json(project)["tests"][0]["judgement"]["baseline_status"].startswith(f"saved to {outside}")
    again = project.runpytest_subprocess(*ARGS, *ONE_TEST, f"--perf-baseline-dir={outside}", *PLUMBING_ONLY)
    again.assert_outcomes(passed=1, deselected=3)
    assert results_json(project)["tests"][0]["judgement"]["baseline_status"] == "compared"


def test_an_unwritable_report_directory_is_one_line_and_the_table_still_prints(project):
    (project.path / "blocker").write_text("a file where the report directory should be")
    result = project.runpytest_subprocess(*ARGS, *ONE_TEST, "--perf-report-dir=blocker/reports")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*test_speed*output_throughput*no baseline*",
        f"*perfsuite error: cannot write *blocker/reports/results.json: {project.path / 'blocker'} is not a directory*",
        "*; nothing written to *blocker/reports/results.json (see the error above)",
    ])  # fmt: skip
    assert "results in" not in result.stdout.str(), "the summary must not claim results that were not written"
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_an_unwritable_baseline_directory_fails_the_test_with_one_line(project):
    (project.path / "blocker").write_text("a file where the baselines should be")
    result = project.runpytest_subprocess(*ARGS, *ONE_TEST, "--perf-save-baseline", "--perf-baseline-dir=blocker/b")
    result.assert_outcomes(failed=1, deselected=3)
    result.stdout.fnmatch_lines(["*cannot write *blocker/b*--perf-baseline-dir*"])
    assert "Traceback" not in result.stdout.str()


def test_written_files_follow_the_umask(project):
    old = os.umask(0o022)
    try:
        project.runpytest_subprocess(*ARGS, *ONE_TEST, "--perf-save-baseline").assert_outcomes(passed=1, deselected=3)
    finally:
        os.umask(old)
    for path in [
        *baseline_files(project),
        *(project.path / "reports" / name for name in ("results.json", "report.html", "summary.md")),
    ]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path


# -- pytest-xdist ------------------------------------------------------------------


def test_under_xdist_the_controller_alone_adjusts_and_writes(project, monkeypatch):
    pytest.importorskip("xdist")
    project.runpytest_subprocess(*ARGS, "-n", "2", "--perf-save-baseline").assert_outcomes(passed=4)
    assert len(baseline_files(project)) == 4
    monkeypatch.setenv("FAKE_STEP_SECONDS", "0.008")
    result = project.runpytest_subprocess(*ARGS, "-n", "2")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*perfsuite*", "*test_speed*output_throughput*regressed*"])
    data = results_json(project)
    assert sorted(t["test_id"] for t in data["tests"]) == [f"test_speed.py::test_speed[{b}]" for b in (2, 3, 4, 5)]
    assert data["policy"]["num_planned_comparisons"] == 16
    assert all(t["judgement"]["baseline_status"] == "compared" for t in data["tests"])
    assert (project.path / "reports" / "report.html").exists()


def test_the_shipped_smoke_suite_runs_under_xdist(pytester):
    pytest.importorskip("xdist")
    from smoke_session import run_shipped_smoke_session

    # All but the throughput tests (test_report runs those): each kind of shipped test crosses the hand-off.
    result = run_shipped_smoke_session(pytester, "-n", "2", "-rs", "-k", "not test_throughput")
    # skipped: the sweep test (no config), the two capacity tests (no SLO), and on the workers the 4 measured
    # latency tests, which judged nothing (no baselines)
    result.assert_outcomes(skipped=7)
    assert len(results_json(pytester)["tests"]) == 4
    judged_nothing = [re.match(r"SKIPPED \[(\d+)\] .*: perfsuite: judged 0 of 4 comparisons: no baseline", line)
                      for line in result.stdout.lines]  # fmt: skip
    assert sum(int(match.group(1)) for match in judged_nothing if match) == 4, result.stdout.str()
    # the capacity tests skipped themselves on the workers: their comparisons are not counted as planned
    last = [line for line in result.stdout.lines if line.startswith("perfsuite")][-1]
    assert last.startswith("perfsuite: judged 0 of 16 planned comparisons (16 without a baseline for this environment)")
