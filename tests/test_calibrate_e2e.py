"""The pure parts of bench/calibrate_e2e.py and the env parsing of bench/slowdown_plugin.py (no subprocess)."""

import re

import pytest

from bench_modules import load_bench

calibrate = load_bench("calibrate_e2e")
slowdown = load_bench("slowdown_plugin")

LAST_LINE = re.compile(
    r"^sessions=\d+ false_alarm=(\d+%|n/a) loaded_false_alarm=(\d+%|n/a) detect10=(\d+%|n/a) "
    r"detect25=(\d+%|n/a) test_detect25=(\d+%|n/a)$"
)


def _comparison(verdict, metric="output_throughput"):
    return {"metric": metric, "verdict": verdict, "change": -0.01, "p_adjusted": 1.0,
            "baseline_median": 10.0, "current_median": 9.9}  # fmt: skip


def _results(*tests):
    """A results.json with one test per argument: a list of verdicts, or (verdicts, noisy)."""
    entries = []
    for index, spec in enumerate(tests):
        verdicts, noisy = spec if isinstance(spec, tuple) else (spec, None)
        entry = {"test_id": f"t{index}", "engine": "inflight", "parameters": {},
                 "comparisons": [_comparison(v, f"m{j}") for j, v in enumerate(verdicts)]}  # fmt: skip
        if noisy is not False:
            entry["noisy"] = noisy
        entries.append(entry)
    return {"schema_version": 1, "tests": entries}


def _session(condition, results, exit_code=0, wall_s=10.0):
    return {"condition": condition, "index": 0, "wall_s": wall_s, **calibrate.session_outcome(results, exit_code)}


def test_session_order_rotates_every_round():
    order = calibrate.session_order(["a", "b", "c"], 4)
    assert order == [("a", 0), ("b", 0), ("c", 0), ("b", 1), ("c", 1), ("a", 1),
                     ("c", 2), ("a", 2), ("b", 2), ("a", 3), ("b", 3), ("c", 3)]  # fmt: skip
    assert calibrate.session_order(["a"], 2) == [("a", 0), ("a", 1)]


def test_session_outcome_flags_regressed_verdicts_and_exit_1():
    clean = calibrate.session_outcome(_results(["unchanged", "improved"], ["unchanged"]), 0)
    assert not clean["flagged"] and [t["flagged"] for t in clean["tests"]] == [False, False]
    regressed = calibrate.session_outcome(_results(["unchanged", "regressed"], ["unchanged"]), 1)
    assert regressed["flagged"] and regressed["regressed_in_results"]
    assert [t["flagged"] for t in regressed["tests"]] == [True, False]
    # a late regression only in results.json, and an exit 1 with none in it, both flag the session
    assert calibrate.session_outcome(_results(["regressed"]), 0)["flagged"]
    exit_only = calibrate.session_outcome(_results(["unchanged"]), 1)
    assert exit_only["flagged"] and not exit_only["regressed_in_results"]


def test_noisy_tests_and_tests_without_baseline():
    outcome = calibrate.session_outcome(
        _results((["inconclusive"], "busy 60%"), ["noisy", "unchanged"], (["unchanged"], False), [], ([], "busy")), 0
    )
    tests = outcome["tests"]
    assert [t["noisy"] for t in tests] == [True, True, False, False, True]
    assert tests[0]["noisy_reason"] == "busy 60%"
    # no comparisons: no baseline, not judged; but a noisy test was judged (inconclusive) either way
    assert [t["judged"] for t in tests] == [True, True, True, False, True]
    assert not outcome["flagged"]
    only_noisy = calibrate.session_outcome(_results(([], "busy")), 0)  # judged, so no abort
    assert only_noisy["tests"][0]["judged"] and not only_noisy["flagged"]


@pytest.mark.parametrize("code", [2, 3, 4, 5])
def test_other_exit_codes_abort(code):
    with pytest.raises(calibrate.CalibrationAborted, match=f"exited {code}"):
        calibrate.session_outcome(_results(["unchanged"]), code)


def test_missing_results_or_nothing_judged_aborts():
    with pytest.raises(calibrate.CalibrationAborted, match="results.json"):
        calibrate.session_outcome(None, 0)
    with pytest.raises(calibrate.CalibrationAborted, match="no test was compared"):
        calibrate.session_outcome(_results([], []), 0)


def test_rates_table_and_last_line():
    sessions = [
        _session("aa", _results(["unchanged"], ["unchanged"]), wall_s=10),
        _session("aa", _results(["unchanged"], ["regressed"]), exit_code=1, wall_s=20),
        _session("loaded-aa", _results((["inconclusive"], "busy"), ["unchanged"])),
        _session("slow10", _results(["regressed"], ["unchanged"]), exit_code=1),
        _session("slow25", _results(["regressed"], ["regressed"]), exit_code=1, wall_s=13),
        _session("slow25", _results(["regressed"], ["unchanged"]), exit_code=1, wall_s=12),
        _session("loaded-slow25", _results(["regressed"], (["noisy"], "busy")), exit_code=1),
    ]
    rates = calibrate.condition_rates(sessions, list(calibrate.CONDITIONS))
    assert rates["aa"]["session_rate"] == 0.5 and rates["aa"]["mean_wall_s"] == 15
    assert rates["aa"]["test_rate"] == 0.25
    assert rates["loaded-aa"]["tests_noisy"] == 1 and rates["loaded-aa"]["session_rate"] == 0
    assert rates["slow25"]["tests_flagged"] == 3 and rates["slow25"]["tests_judged"] == 4
    line = calibrate.summary_line(rates, len(sessions))
    assert line == "sessions=7 false_alarm=50% loaded_false_alarm=0% detect10=100% detect25=100% test_detect25=75%"
    assert LAST_LINE.match(line)
    text = calibrate.report({"sessions": sessions, "conditions": list(calibrate.CONDITIONS)})
    assert text.splitlines()[-1] == line
    assert "loaded-slow25" in text and "1/2 (50%)" in text  # its noisy tests are shown
    assert "12.5" in text  # slow25's mean wall time


def test_last_line_with_conditions_not_run():
    sessions = [_session("aa", _results(["unchanged"]))]
    text = calibrate.report({"sessions": sessions, "conditions": ["aa", "slow25"]})
    last = text.splitlines()[-1]
    assert last == "sessions=1 false_alarm=0% loaded_false_alarm=n/a detect10=n/a detect25=n/a test_detect25=n/a"
    assert LAST_LINE.match(last)
    assert "slow25" not in text.splitlines()[1:-1][-1]  # a condition with no session has no row


def test_parse_args_settings():
    small = calibrate.parse_args([])
    assert small.select == calibrate.SMALL_SELECT and small.sessions == 3 and len(small.conditions) == 5
    full = calibrate.parse_args(["--setting", "full"])
    assert full.select is None and full.sessions > 3
    custom = calibrate.parse_args(["-k", "test_throughput", "--conditions", "aa,slow25", "--", "--perf-engines", "x"])
    assert custom.select == "test_throughput" and custom.conditions == ["aa", "slow25"]
    assert custom.pytest_args == ["--perf-engines", "x"]
    with pytest.raises(SystemExit):
        calibrate.parse_args(["--conditions", "aa,slow99"])


def test_slowdown_fraction_parsing():
    assert slowdown.parse_fraction(None) == 0.0
    assert slowdown.parse_fraction(" ") == 0.0
    assert slowdown.parse_fraction("0.25") == 0.25
    for bad in ("abc", "-0.1", "nan", "11"):
        with pytest.raises(pytest.UsageError):
            slowdown.parse_fraction(bad)
