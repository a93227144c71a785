"""The instruction lane (``--perf-instructions``): cachegrind's totals, the count per step, the threshold verdict,
the stored figure, results.json, and one real count under Valgrind (skipped, with the reason, where it is absent).

The slow checks (repeats agree to the instruction; a session saves then flags a 1% slowdown) are the
``instructions`` tier: ``make test-instructions``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil

import pytest

from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.judge.baselines import BaselineError
from perfsuite.judge.instructions import InstructionBaselineStore, InstructionResult, judge_instructions
from perfsuite.judge.results import read_results, write_results
from perfsuite.measure.instruction_workload import InstructionWorkload, engine_of, requests_of
from perfsuite.measure.instructions import (
    NO_VALGRIND,
    EventCounts,
    InstructionCount,
    InstructionCountError,
    child_environment,
    count_instructions,
    count_process,
    per_step,
    prime,
    read_cachegrind_totals,
    steps_from_output,
    valgrind_unavailable,
)
from perfsuite.measure.instructions_child import serve
from perfsuite.plugin.options import instructions_threshold
from results_builders import make_result, make_results

pytest_plugins = ["pytester"]

WORKLOAD = InstructionWorkload()
FIGURES = InstructionBaselineStore("unused", interpreter="cpython-3.11.7-x86_64")
TINY = InstructionWorkload(num_requests=2, prompt_len=4, max_new_tokens=4, batch_size=2, max_seq_len=16)

NO_CACHE_SIM = """desc: I1 cache:         32768 B, 64 B, 8-way associative
cmd: python -m perfsuite.measure.instructions_child
events: Ir
fl=???
fn=0x0000000000001000
0 5
summary: 392727785
"""
CACHE_SIM = """events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw
summary: 1000 10 1 400 20 2 300 30 3
"""


def count_of(per_step_figure: float, workload: InstructionWorkload = WORKLOAD, steps: int = 48) -> InstructionCount:
    return InstructionCount(workload, per_step_figure, steps, 2, None, None, 7.5, "valgrind-3.19.0")


def test_cachegrinds_totals_are_read_from_its_events_and_summary_lines():
    assert read_cachegrind_totals(NO_CACHE_SIM) == EventCounts(392727785)
    assert read_cachegrind_totals(CACHE_SIM) == EventCounts(1000, l1_misses=10 + 20 + 30, last_level_misses=1 + 2 + 3)


@pytest.mark.parametrize(
    "text", ["not cachegrind output\n", "events: Ir Dr\nsummary: 5\n", "events: Dr\nsummary: 5\n"]
)
def test_an_output_file_that_is_not_cachegrinds_is_refused_by_name(text):
    with pytest.raises(InstructionCountError, match="cachegrind"):
        read_cachegrind_totals(text)


def test_the_count_per_step_is_the_measured_runs_difference_over_their_steps():
    count = per_step(WORKLOAD, EventCounts(1_000_000, 10, 1), EventCounts(1_960_000, 58, 5), [48, 48], 3.0, "v")
    assert count.instructions_per_step == 960_000 / 96
    assert (count.l1_misses_per_step, count.last_level_misses_per_step) == (0.5, 4 / 96)
    assert (count.steps_per_run, count.measured_runs) == (48, 2)


@pytest.mark.parametrize("steps", [[48, 47], [0, 0], []])
def test_runs_whose_steps_differ_or_are_none_cannot_be_counted_per_step(steps):
    with pytest.raises(InstructionCountError, match="engine steps"):
        per_step(WORKLOAD, EventCounts(10), EventCounts(20), steps, 1.0, "v")


def test_measured_runs_that_counted_no_more_than_the_setup_are_an_error():
    with pytest.raises(InstructionCountError, match="different paths"):
        per_step(WORKLOAD, EventCounts(20), EventCounts(20), [4], 1.0, "v")


def test_the_childs_step_counts_are_its_last_json_line_and_anything_else_is_an_error():
    assert steps_from_output('noise\n{"steps_per_run": [3, 3]}\n') == [3, 3]
    for bad in ("", "{}", '{"steps_per_run": ["3"]}'):
        with pytest.raises(InstructionCountError, match="step counts"):
            steps_from_output(bad)


@pytest.mark.parametrize("engine", ["static", "inflight", "paged", "paged-prefix"])
def test_each_own_engine_serves_the_workload_in_the_same_number_of_steps_every_run(engine):
    steps = serve(InstructionWorkload(engine=engine), 2)
    assert steps[0] == steps[1] > 0


def test_a_users_engine_is_built_by_its_import_path_over_the_fake_runner(tmp_path, monkeypatch):
    (tmp_path / "my_engines.py").write_text(
        "from perfsuite.engine import inflight_engine\n"
        "def build(runner, workload):\n"
        "    return inflight_engine(runner, decode_batch_size=workload.batch_size,\n"
        "                           max_seq_len=workload.max_seq_len, eos_token_id=None)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    runner = FakeRunner(TINY.vocab_size)
    result = engine_of(InstructionWorkload(**{**TINY.to_json(), "engine": "my_engines:build"}), runner).run(
        requests_of(TINY)
    )
    assert [len(record.output_token_ids) for record in result.records] == [TINY.max_new_tokens] * TINY.num_requests


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"engine": "hf-static"}, "module:function"),
        ({"engine": "not a path:x"}, "module:function"),
        ({"prompt_len": 100, "max_new_tokens": 100}, "exceeds max_seq_len"),
        ({"batch_size": 0}, "batch_size must be a positive int"),
    ],
)
def test_a_workload_the_lane_cannot_count_is_refused_naming_the_field_and_fix(fields, message):
    with pytest.raises(ValueError, match=message):
        InstructionWorkload(**fields)


def test_a_rise_above_the_threshold_is_a_regression_and_one_at_or_below_it_is_not():
    baseline = FIGURES.figure("t", count_of(100_000.0))
    assert judge_instructions("t", count_of(100_600.0), baseline, 0.5).regressed
    assert not judge_instructions("t", count_of(100_500.0), baseline, 0.5).regressed
    faster = judge_instructions("t", count_of(90_000.0), baseline, 0.5)
    assert not faster.regressed and faster.change_percent == pytest.approx(-10.0)
    assert "+0.600%" in judge_instructions("t", count_of(100_600.0), baseline, 0.5).describe()


def test_no_stored_figure_or_one_of_another_workload_is_not_compared_and_says_why():
    missing = judge_instructions("t", count_of(1.0), None, 0.5)
    assert missing.change_percent is None and not missing.regressed and "no stored figure" in missing.describe()
    other = FIGURES.figure("t", count_of(1.0, InstructionWorkload(engine="static")))
    result = judge_instructions("t", count_of(2.0), other, 0.5)
    assert result.change_percent is None and "another workload" in result.describe()


def test_a_schedule_that_takes_other_steps_is_still_compared_and_noted():
    result = judge_instructions("t", count_of(1.0, steps=40), FIGURES.figure("t", count_of(1.0)), 0.5)
    assert result.change_percent == 0.0 and "48 -> 40" in (result.note or "")


def test_a_saved_figure_reads_back_under_its_interpreters_folder_and_no_temporary_file_is_left(tmp_path):
    store = InstructionBaselineStore(tmp_path, interpreter="cpython-3.11.7-x86_64")
    path = store.save("tests/perf/test_x.py::test_steps[inflight]", count_of(1234.5))
    assert path.relative_to(tmp_path).parts[:2] == ("instructions", "cpython-3.11.7-x86_64")
    loaded = store.load("tests/perf/test_x.py::test_steps[inflight]")
    assert loaded == store.figure("tests/perf/test_x.py::test_steps[inflight]", count_of(1234.5))
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    assert store.load("tests/perf/test_x.py::test_other") is None


def test_a_corrupt_stored_figure_is_an_error_naming_the_file_and_the_fix(tmp_path):
    store = InstructionBaselineStore(tmp_path)
    path = store.path_for("t")
    path.parent.mkdir(parents=True)
    path.write_text('{"schema_version": 1, "test_id": "t"')
    with pytest.raises(BaselineError, match="--perf-instructions --perf-save-baseline"):
        store.load("t")


def test_results_json_carries_each_count_with_its_verdict_and_reads_it_back(tmp_path):
    counted = InstructionResult("tests/perf/test_x.py::test_steps", count_of(101_000.0), 0.5, 100_000.0)
    results = make_results(make_result("timed"), instructions=(counted,))
    path = tmp_path / "results.json"
    write_results(path, results)
    written = json.loads(path.read_text())["instructions"][0]
    assert written["regressed"] is True and written["change_percent"] == pytest.approx(1.0)
    assert written["count"]["instructions_per_step"] == 101_000.0
    assert read_results(path) == results
    write_results(path, make_results(make_result("timed")))
    assert "instructions" not in json.loads(path.read_text())


def test_without_valgrind_the_lane_says_what_is_missing_and_how_to_install_it(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert valgrind_unavailable() == NO_VALGRIND
    with pytest.raises(InstructionCountError, match="apt-get install valgrind"):
        count_instructions(TINY)


@pytest.mark.skipif(valgrind_unavailable() is not None, reason=valgrind_unavailable() or "")
def test_smoke_the_workloads_process_runs_under_cachegrind_and_its_totals_and_steps_are_read(tmp_path):
    """One process, not the lane's two (seconds each under Valgrind): the difference is tested above, and
    the whole lane in the ``instructions`` tier."""
    totals, steps = count_process(TINY, 1, False, tmp_path / "cachegrind.out", None)
    assert len(steps) == 1 and steps[0] > 0
    assert totals.instructions > 10_000_000  # the interpreter's start alone is hundreds of millions
    assert totals.l1_misses is None  # no cache simulation asked for


def test_a_workload_whose_engine_cannot_be_built_fails_in_its_native_run_with_the_error(tmp_path):
    broken = InstructionWorkload(engine="no_such_module_here:build")
    with pytest.raises(InstructionCountError, match="No module named 'no_such_module_here'"):
        prime(broken, tmp_path)


def test_the_threshold_option_takes_a_percent_above_0_and_at_most_100():
    assert instructions_threshold("0.5") == 0.5
    for bad in ("0", "-1", "101", "half", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="percent"):
            instructions_threshold(bad)


def test_perf_instructions_without_perf_is_a_usage_error_naming_both(pytester):
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess("--perf-instructions", "-p", "no:randomly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--perf-instructions counts in perf tests, so it needs --perf as well*"])


def test_the_counted_process_gets_a_fixed_environment_whatever_the_callers(monkeypatch, tmp_path):
    """The environment's size moves the heap, and with it a count (0.3% between two pytest sessions)."""
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "x" * 40)
    monkeypatch.setenv("PERFSUITE_KNOB", "1")
    environment = child_environment(tmp_path)
    fixed = {"PATH", "PYTHONPATH", "PYTHONHASHSEED", "PYTHONUTF8"}
    assert {name for name in environment if not name.startswith("PERFSUITE_")} == fixed
    assert environment["PERFSUITE_KNOB"] == "1" and environment["PYTHONHASHSEED"] == "0"
    assert environment["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)
