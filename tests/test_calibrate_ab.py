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
