"""The pure parts of bench/calibrate_history.py and the fake commit of bench/slowdown_plugin.py (no subprocess)."""

import argparse
import json
import random
import re
from pathlib import Path

import pytest

from bench_modules import BENCH, load_bench
from history_builders import series_of, sessions, step_values
from perfsuite.history.changes import ChangePointPolicy


SAVED = BENCH / "results" / "calibrate_history.json"  # a real run's data, saved in results.json version 4
calibrate = load_bench("calibrate_history")
slowdown = load_bench("slowdown_plugin")
POLICY = ChangePointPolicy()


def test_the_creep_adds_two_percent_every_kth_session_cumulatively():
    assert [round(calibrate.slowdown_for(i, 3), 6) for i in range(7)] == [0, 0, 0, 0.02, 0.02, 0.02, 0.0404]
    assert calibrate.slowdown_for(0, 1) == 0
    past = calibrate.first_past(0.10, 3)
    assert past == 15  # 1.02**5 = 1.104
    assert calibrate.slowdown_for(past - 1, 3) <= 0.10 < calibrate.slowdown_for(past, 3)
    assert calibrate.first_past(0.04, 1) == 2 and calibrate.first_past(0.10, 2) == 10


def test_sessions_interleave_and_alternate_which_series_goes_first():
    assert calibrate.session_plan(3) == [("aa", 0), ("creep", 0), ("creep", 1), ("aa", 1), ("aa", 2), ("creep", 2)]


def test_each_session_has_a_commit_of_its_own_that_the_plugin_accepts():
    commits = {calibrate.fake_commit(name, i) for name in calibrate.SERIES_NAMES for i in range(30)}
    assert len(commits) == 60
    assert all(slowdown.parse_commit(commit) == commit for commit in commits)


def test_the_session_command_and_environment():
    args = argparse.Namespace(profile="ci", model="tiny-random", repeats=5, select="inflight and B8")
    command = calibrate.pytest_command(args, Path("/w/creep.sqlite"), Path("/w/creep-003"))
    text = " ".join(command)
    assert command[1:6] == ["-m", "pytest", "--pyargs", calibrate.SUITE, "--perf"]
    assert "--perf-history /w/creep.sqlite --perf-report-dir /w/creep-003" in text
    assert "--perf-repeats 5" in text and "--perf-busy-threshold 0.99" in text
    assert command[command.index("-k") + 1] == "inflight and B8"
    assert "-p slowdown_plugin" in text
    bare_args = argparse.Namespace(profile="ci", model="m", repeats=None, select=None)
    bare = calibrate.pytest_command(bare_args, Path("/w/a.sqlite"), Path("/w/a"))
    assert "-k" not in bare and "--perf-repeats" not in bare
    env = calibrate.session_environment({"PYTHONPATH": "/x"}, 0.0404, "ab" * 20, Path("/w/s.json"))
    assert env["PYTHONPATH"].split(":") == [str(calibrate.REPO), str(BENCH), "/x"]
    assert env["PERFSUITE_SLOWDOWN"] == "0.0404" and env["PERFSUITE_FAKE_COMMIT"] == "ab" * 20
    assert env["PERFSUITE_SLOWDOWN_REPORT"] == "/w/s.json"


def test_policy_text():
    policy = calibrate.policy_from_text("max_p_value=0.01, head_runs=3")
    assert (policy.max_p_value, policy.head_runs, policy.min_magnitude) == (0.01, 3, POLICY.min_magnitude)
    assert isinstance(policy.head_runs, int)
    assert calibrate.policy_from_text(None) == POLICY
    for bad in ("p=0.1", "max_p_value", "max_p_value=x"):
        with pytest.raises(ValueError, match="--policy"):
            calibrate.policy_from_text(bad)


def test_trend_policy_text_replays_the_trend_test_under_other_thresholds():
    """--trend-policy: the old two-sided 0.02 is one-sided 0.01 both ways."""
    old = calibrate.policy_from_text("max_p_value=0.01,max_p_value_improvement=0.01", calibrate.TRENDS, "--trend-policy")
    assert (old.max_p_value, old.max_p_value_improvement, old.window_runs) == (0.01, 0.01, calibrate.TRENDS.window_runs)
    with pytest.raises(ValueError, match="--trend-policy 'head_runs=3': give name=value, with a name among window_runs"):
        calibrate.policy_from_text("head_runs=3", calibrate.TRENDS, "--trend-policy")
    args = calibrate.parse_args(["--load", "x.json", "--trend-policy", "window_runs=30"])
    assert args.trend_policy.window_runs == 30 and args.policy == POLICY


def test_replay_finds_a_step_after_it_and_nothing_in_a_flat_series():
    stepped = sessions(step_values(18, 6, step=-0.12, noise=0.01))
    (run,) = calibrate.replay(stepped, POLICY)
    assert (run.metric, run.num_sessions, run.num_searched) == ("output_throughput", 24, 24 - POLICY.min_points + 1)
    assert run.regressions and run.regressions[0].first_after == 18
    first = run.regressions[0]
    assert 18 <= first.session <= 18 + POLICY.head_runs - 1 and first.relative_change < -0.08
    assert all(report.session - report.first_after < POLICY.head_runs for report in run.reports)
    (flat,) = calibrate.replay(sessions(step_values(24, 0, step=0.0, noise=0.01)), POLICY)
    assert flat.reports == () and flat.num_searched == 19


def test_replaying_values_counts_as_the_session_replay_does():
    values = step_values(18, 6, step=-0.12, noise=0.01)
    (run,) = calibrate.replay(sessions(values), POLICY)
    replayed = calibrate.replay_values(values, series_of(values), POLICY)
    assert (replayed.reports, replayed.num_searched) == (run.reports, run.num_searched)
    flat = calibrate.replay_values(step_values(24, 0, 0.0, noise=0.01), series_of(values), POLICY)
    assert (flat.reports, flat.num_searched) == ((), 19)


def test_a_step_shown_by_several_sessions_is_one_false_step_and_several_runs():
    """What an A/A series counts: each step once, when new; per run, every session that shows it (as before)."""
    (run,) = calibrate.replay(sessions(step_values(18, 6, step=-0.12, noise=0.01)), POLICY)
    assert len(run.reports) >= 2 and len(run.new_reports) == 1
    assert run.new_reports[0] == run.reports[0] and not any(r.is_new for r in run.reports[1:])
    values = step_values(18, 6, step=-0.12, noise=0.01)
    assert calibrate.replay_values(values, series_of(values), POLICY).new_reports == run.new_reports


def _report(session, first_after, regression=True, new=True):
    return calibrate.HeadReport(session, first_after, -0.05 if regression else 0.05, 1e-4, regression, new)


def test_creep_figures():
    run = calibrate.Replay("t", "output_throughput", 28, 23, (
        _report(10, 9), _report(11, 9), _report(13, 13), _report(16, 15), _report(20, 18, regression=False),
        _report(22, 21),
    ))  # fmt: skip
    figures = calibrate.creep_figures(run, every=3)
    assert figures.num_steps == 9  # boundaries 3, 6, ..., 27
    assert figures.steps_found == ((3, 2), (5, 2), (7, 2))  # 13 is no boundary; the improvement does not count
    assert figures.past_target == 15 and figures.runs_to_find == 2  # session 16 is the second at > 10%
    assert figures.first_regression.session == 10
    assert figures.runs_to_find_new == 2
    again = calibrate.Replay("t", "m", 28, 23, (_report(14, 12), _report(15, 12, new=False), _report(19, 18)))
    figures = calibrate.creep_figures(again, every=3)
    assert (figures.runs_to_find, figures.runs_to_find_new) == (1, 5), "a step still shown is no new verdict"
    late = calibrate.creep_figures(calibrate.Replay("t", "m", 28, 23, (_report(10, 9),)), every=3)
    assert late.runs_to_find is None and late.steps_found == ((3, 2),)


def test_resampling_permutes_independent_values_and_bootstraps_blocks_of_a_trend():
    rng = random.Random(1)
    values = step_values(30, 0, 0.0, noise=0.02, seed=3)
    method, draw = calibrate.resampler(values, rng)
    assert method.startswith("permutation") and sorted(draw()) == sorted(values)
    trend = [100.0 + i for i in range(30)]
    method, draw = calibrate.resampler(trend, rng)
    assert method.startswith("block bootstrap, blocks of 3")
    drawn = draw()
    assert len(drawn) == 30 and set(drawn) <= set(trend) and drawn != trend
    assert all(drawn[i + 1] - drawn[i] == 1 for i in range(0, 30, 3) if i + 1 < 30)  # blocks stay in order


def _data(creep_values, aa_values, every=3):
    meta = [{"series": "aa", "wall_s": 20.0, "load_before": [1.5, 1.0, 1.0], "max_busy_share": 0.5}]
    return {
        "model": "tiny-random", "profile": "ci", "repeats": None, "select": "x", "sessions_per_series": len(aa_values),
        "every": every, "cpu_count": 2, "cpu_model": "cpu", "sessions": meta,
        "stores": {"creep": [s.to_json() for s in sessions(creep_values)],
                   "aa": [s.to_json() for s in sessions(aa_values)]},
    }  # fmt: skip


def test_the_table_and_the_verdict_line():
    rng = random.Random(5)
    creep = [100 / (1 + calibrate.slowdown_for(i, 2)) * (1 + 0.003 * rng.gauss(0, 1)) for i in range(16)]
    data = _data(creep, step_values(16, 0, 0.0, noise=0.01), every=2)
    text = calibrate.report(data, POLICY, resamples=2)
    assert "| machine | cpu, 2 cores |" in text and "policy | max_p_value=0.001" in text
    assert "first exceeds 10% at session 10 (10.4%)" in text
    spread = r"\| A/A output_throughput per session, test_throughput\[static-B4-uniform\] \| median 10\d\S*, MAD 0\.\d%"
    assert re.search(spread, text)
    row = next(line for line in text.splitlines() if line.startswith("| test_throughput"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1] == "output_throughput"
    assert re.fullmatch(r"[1-7]/7: #\d+ \(\d\).*", cells[2])  # 7 steps in 16 sessions; the first is found
    assert re.fullmatch(r"session \d+ \(\d+% slower\), -\d+\.\d%", cells[3])
    assert re.fullmatch(r"session 10: (\d|not found) \(any report: (\d|not found)\)", cells[4])
    assert cells[5] == "0/11 runs = 0.0 (per run: 0 = 0.0)"  # A/A: 16 sessions, searched from the 6th
    assert re.fullmatch(r"0/22 runs = 0\.0 \(per run: 0 = 0\.0\) \(2 series, permutation .*\)", cells[6])
    assert any(line.startswith("output_throughput: creep found within 5 runs: ") for line in text.splitlines())
    trends = text.split("steps and trends together (TrendPolicy(")[1].splitlines()
    (headline,) = [line for line in trends if " output_throughput: " in line]
    assert re.search(r"creep (found at run -?\d+ after it passes 10%|not found) \(that run is 1; 0 or less: before\); A/A measured 0 new steps \+ 0 new trends in 11 "
                     r"runs; resampled \d\.\d\d per 100 \(\d+ of 22: \d+ steps \+ \d+ trends\)$", headline)  # fmt: skip
    grid = calibrate.grid_report(data, resamples=0)
    assert len(grid.splitlines()) == 4 * 3 * 2 * 2
    assert "max_p_value=0.05 min_magnitude=0.05 head_runs=3 min_after_runs=1: " in grid


def test_a_flagging_aa_series_misses_the_target():
    flagging = step_values(8, 4, step=-0.2, noise=0.005)
    analysis = calibrate.analyse(_data(flagging, flagging), POLICY, resamples=0)
    line = calibrate.verdict_line(analysis)
    assert "A/A <= 1 false step per 100 runs: no (measured 14.3, per run 42.9)" in line  # 1 step, 3 runs of 7
    assert line.endswith("both targets: missed")


def test_spread():
    assert calibrate.spread([100.0, 90.0, 110.0, 300.0, 100.0]) == "median 100, MAD 10.0% of it, range 90..300"
    assert calibrate.spread([]) == "n/a"


def test_parse_args():
    args = calibrate.parse_args(["--sessions", "10", "--every", "2", "--policy", "head_runs=3"])
    assert (args.sessions, args.every, args.policy.head_runs, args.select) == (10, 2, 3, calibrate.DEFAULT_SELECT)
    assert args.resamples == 100 and calibrate.parse_args(["--load", "x.json", "--grid"]).resamples == 0
    for bad in (["--sessions", "1"], ["--every", "0"], ["--grid"], ["--policy", "nope=1"]):
        with pytest.raises(SystemExit):
            calibrate.parse_args(bad)


def test_fake_commit_parsing_and_install():
    assert slowdown.parse_commit(None) is None and slowdown.parse_commit(" ") is None
    assert slowdown.parse_commit("abc1234") == "abc1234"
    for bad in ("xyz1234", "abc", "A" * 40, "a" * 41):
        with pytest.raises(pytest.UsageError, match="PERFSUITE_FAKE_COMMIT"):
            slowdown.parse_commit(bad)
    from perfsuite.measure import environment

    original = slowdown.install_fake_commit("f" * 40)
    try:
        assert environment.git_commit(Path(".")) == "f" * 40
    finally:
        slowdown.restore_git_commit(original)
    assert environment.git_commit is original


def test_saved_documents_drop_only_the_timelines():
    (document,) = [s.to_json() for s in sessions([100.0])]
    document["tests"][0]["measurement"]["timeline"] = {"steps": []}
    lean = calibrate.lean(document)
    lean_test, test = lean["tests"][0], document["tests"][0]
    assert lean_test["measurement"]["timeline"] is None and test["measurement"]["timeline"] == {"steps": []}
    assert {k: v for k, v in lean_test["measurement"].items() if k != "timeline"} == {
        k: v for k, v in test["measurement"].items() if k != "timeline"
    }
    assert {k: v for k, v in lean_test.items() if k != "measurement"} == {
        k: v for k, v in test.items() if k != "measurement"
    }
    read = calibrate.results_from_json(lean, "lean")
    assert read.tests[0].measurement.samples["output_throughput"] == (99.0, 100.0, 101.0)


def test_data_saved_in_the_version_4_layout_still_loads():
    data = json.loads(SAVED.read_text())
    (first, *_) = calibrate.documents_of(data, "aa")
    assert data["stores"]["aa"][0]["schema_version"] == 4 and first.tests[0].measurement.samples["output_throughput"]


@pytest.mark.parametrize("name", ["calibrate_history_smollm2.json", "calibrate_history_smollm2_fresh.json"])
def test_the_default_policy_meets_both_targets_on_the_recorded_smollm2_calibrations(name):
    """Real sessions (docs/change-points.md, Calibration). A creep is a slope: while it goes on, the best split falls
    mid-slope, behind the newest runs; in the first of these the creep's split lay 7 runs back when it was found,
    so a head of 5 runs reported it 18 runs after it passed 10%."""
    data = json.loads((BENCH / "results" / name).read_text())
    (headline, *_) = calibrate.analyse(data, POLICY, resamples=0)["rows"]
    assert headline["key"][1] == "output_throughput"
    creep = calibrate.creep_figures(headline["creep"], data["every"])
    assert creep.runs_to_find_new is not None and creep.runs_to_find_new <= 5
    assert headline["aa"].new_reports == ()
