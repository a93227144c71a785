"""The pure parts of bench/calibrate_ab.py (no session is run): commands, the injected slowdown, the table."""

import re
import time
from pathlib import Path
from types import SimpleNamespace

from bench_modules import load_bench

calibrate = load_bench("calibrate_ab")  # as a script, it puts bench/ on sys.path for calibrate_e2e: not for the tests

LAST_LINE = re.compile(r"^ab_false_alarm=(\d+%|n/a) ab_detect5=(\d+%|n/a) ab_detect10=(\d+%|n/a) stored_detect10=(\d+%|n/a)$")
ARGS = SimpleNamespace(model="tiny-random", profile="smoke", repeats=5, select="inflight", pytest_args=["-x"])
TREES = {"reference": Path("/work/reference"), "aa": Path("/work/aa")}


def test_each_mode_runs_what_it_says():
    ab = calibrate.pytest_command(ARGS, "ab", TREES, Path("/work"), Path("/out"))
    assert "--perf-against=/work/reference" in ab and "--perf-baseline-dir" not in " ".join(ab)
    assert ab[ab.index("--perf-repeats") + 1] == "5" and ab[-2:] == ["-x", "--perf-against=/work/reference"]
    stored = calibrate.pytest_command(ARGS, "stored", TREES, Path("/work"), Path("/out"))
    assert stored[stored.index("--perf-baseline-dir") + 1] == "/work/baselines-5"
    twice = calibrate.pytest_command(ARGS, "stored-2x", TREES, Path("/work"), Path("/out"), save=True)
    assert twice[twice.index("--perf-repeats") + 1] == "10" and twice[-1] == "--perf-save-baseline"
    assert twice[twice.index("--perf-baseline-dir") + 1] == "/work/baselines-10"
    assert not any(a.startswith("--perf-against") for a in stored + twice)


def test_the_injected_slowdown_busy_waits_its_fraction_of_each_call(tmp_path, monkeypatch):
    class ModelRunner:
        def execute(self, output, kv_cache):
            deadline = time.perf_counter() + 0.02
            while time.perf_counter() < deadline:
                pass
            return [output]

    namespace = {"ModelRunner": ModelRunner}
    exec(calibrate.SLOWDOWN_CODE.format(fraction=0.5, env=calibrate.INJECTION_REPORT_ENV), namespace)
    start = time.perf_counter()
    assert ModelRunner().execute(7, None) == [7]
    assert time.perf_counter() - start >= 0.03, "20 ms of work plus 50% of it busy-waiting"


def _session(cell, flagged_tests, change=-0.05):
    mode, condition = cell.split(":")
    tests = [
        {"test_id": f"t{i}", "judged": True, "flagged": flagged, "noisy": False,
         "comparisons": [{"metric": "output_throughput", "verdict": "regressed" if flagged else "unchanged",
                          "change": change}]}
        for i, flagged in enumerate(flagged_tests)
    ]  # fmt: skip
    return {"condition": cell, "mode": mode, "round": 0, "exit_code": int(any(flagged_tests)), "wall_s": 10.0,
            "injected": {"added_s": 0.0}, "flagged": any(flagged_tests), "regressed_in_results": any(flagged_tests),
            "tests": tests}  # fmt: skip


def test_the_last_line_gives_per_test_rates_of_the_four_cells():
    cells = ["ab:aa", "ab:slow5", "ab:slow10", "stored-2x:slow10"]
    sessions = [_session("ab:aa", [False, False, False, True]), _session("ab:slow5", [True, False]),
                _session("ab:slow10", [True, True, True, False]), _session("stored-2x:slow10", [True])]  # fmt: skip
    report = calibrate.report({"model": "m", "profile": "p", "repeats": 7, "select": "s", "rounds": 1,
                               "cells": cells, "sessions": sessions})  # fmt: skip
    last = report.splitlines()[-1]
    assert LAST_LINE.match(last), last
    assert last == "ab_false_alarm=25% ab_detect5=50% ab_detect10=75% stored_detect10=100%"
    assert "-5.0%" in report, "the median throughput change of each cell"


def test_a_cell_not_run_shows_na():
    report = calibrate.report({"model": "m", "profile": "p", "repeats": 7, "select": "s", "rounds": 1,
                               "cells": ["ab:aa"], "sessions": [_session("ab:aa", [False])]})  # fmt: skip
    assert report.splitlines()[-1] == "ab_false_alarm=0% ab_detect5=n/a ab_detect10=n/a stored_detect10=n/a"


def test_ab_allcores_holds_every_worker_to_a_thread_per_usable_core(monkeypatch):
    monkeypatch.setattr(calibrate.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    command = calibrate.pytest_command(ARGS, "ab-allcores", TREES, Path("/work"), Path("/out"))
    assert command[-3:] == ["--perf-against=/work/reference", "--perf-against-threads", "3"]
    assert "--perf-against-threads" not in calibrate.pytest_command(ARGS, "ab", TREES, Path("/work"), Path("/out"))


def test_the_table_gives_each_cells_throughput_mde_threads_and_other_works_share():
    loaded = _session("ab:loaded-aa", [False, False])
    for test, mde, threads in zip(loaded["tests"], (0.08, 0.12), (1, 1)):
        test["comparisons"][0]["min_detectable_effect"] = mde
        test["num_threads"], test["busy_shares"] = threads, [0.5, 0.48, 0.52]
    quiet = _session("ab-allcores:aa", [False])
    quiet["tests"][0]["comparisons"][0]["min_detectable_effect"] = 0.04
    quiet["tests"][0]["num_threads"] = 2
    report = calibrate.report({"model": "m", "profile": "p", "repeats": 12, "select": "s", "rounds": 1,
                               "cells": ["ab:loaded-aa", "ab-allcores:aa"], "sessions": [loaded, quiet]})  # fmt: skip
    [loaded_row] = [line.split() for line in report.splitlines() if line.startswith("ab:loaded-aa")]
    assert loaded_row[-6:-2] == ["12.0%", "12.0%", "1", "50%"], "median and max MDE, threads, other work's share"
    [quiet_row] = [line.split() for line in report.splitlines() if line.startswith("ab-allcores:aa")]
    assert quiet_row[-6:-2] == ["4.0%", "4.0%", "2", "n/a"]


def test_a_loaded_condition_runs_its_trees_code_under_a_busy_neighbour():
    assert calibrate.LOADED == {"loaded-aa": "aa", "loaded-slow10": "slow10"}
    assert all(tree in calibrate.SLOWDOWNS for tree in calibrate.LOADED.values())
