"""Workload sizes and times are refused from their parameters, in one line with the number, before any work."""

from __future__ import annotations

import json
import re
import time

import pytest

from perfsuite.cli import main
from perfsuite.workload import MultiTurn, ShapedWorkload, SharedPrefix, Trace, Vocab, Workload, parse_workload_option
from perfsuite.workload.arrivals import Arrivals
from perfsuite.workload.limits import LONG_GAP_SECONDS, MAX_ARRIVAL_SECONDS, MAX_NUM_REQUESTS, MAX_PROMPT_TOKENS

pytest_plugins = ["pytester"]

VOCAB = Vocab(1000, special_ids=(0, 1, 2))


def write_trace(path, timestamps, input_length=4, output_length=2):
    lines = [{"timestamp": t, "input_length": input_length, "output_length": output_length, "hash_ids": [0]}
             for t in timestamps]  # fmt: skip
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_shared_prefix_workload_of_too_many_requests_is_refused_at_once_naming_the_count():
    started = time.perf_counter()
    with pytest.raises(ValueError, match=rf"= 10000000000000000 requests, more than .*\({MAX_NUM_REQUESTS}\); lower"):
        parse_workload_option("shared_prefix:groups=100000000,prompts=100000000,prefix=4,suffix=0,output=1")
    assert time.perf_counter() - started < 1
    SharedPrefix(groups=MAX_NUM_REQUESTS // 10, prompts=10, prefix=1, suffix=0)  # the maximum itself is allowed


def test_prompt_tokens_over_the_maximum_are_refused_before_any_is_drawn():
    prefix = MAX_PROMPT_TOKENS // 1000 + 1
    with pytest.raises(ValueError, match=rf"= {1000 * prefix} prompt tokens, more than .*\({MAX_PROMPT_TOKENS}\)"):
        SharedPrefix(groups=1, prompts=1000, prefix=prefix, suffix=0)


def test_a_multi_turn_workload_of_too_many_turns_is_refused_before_building_a_prompt():
    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"sessions x turns = 1 x 1000000 = 1000000 requests"):
        parse_workload_option("multi_turn:sessions=1,turns=1000000")
    assert time.perf_counter() - started < 1


def test_a_session_outgrowing_the_context_is_refused_with_the_turns_that_fit():
    shape = MultiTurn(sessions=1, turns=1000)
    with pytest.raises(ValueError, match=r"needs 64032 tokens but the model's context is 256; at most 3 turns fit"):
        shape.check_context(256)
    fitting = MultiTurn(sessions=2, turns=3)
    fitting.check_context(256)
    requests = ShapedWorkload(fitting).requests(vocab=VOCAB)
    # The arithmetic is what the engines are sized from: the built requests' longest, and just above 3 turns' size.
    assert max(r.max_total_tokens for r in requests) == fitting.max_total_tokens <= 256
    assert MultiTurn(sessions=1, turns=4).max_total_tokens > 256
    with pytest.raises(ValueError, match="not even the first turn fits"):
        MultiTurn(sessions=1, turns=2, prompt=300).check_context(256)


def test_a_shared_prefix_request_longer_than_the_context_is_refused_naming_its_parts():
    with pytest.raises(ValueError, match=r"\(prefix \+ suffix \+ output = 200 \+ 50 \+ 10\) needs 260 tokens"):
        SharedPrefix(groups=2, prompts=2, prefix=200, suffix=50, output=10).check_context(256)
    SharedPrefix(groups=2, prompts=2, prefix=200, suffix=46, output=10).check_context(256)


@pytest.mark.parametrize("think_time", ["1e300", "1e308", str(MAX_ARRIVAL_SECONDS + 1)])
def test_a_think_time_past_the_horizon_is_refused_with_its_time(think_time):
    seconds = re.escape(f"{float(think_time):.10g}")
    with pytest.raises(ValueError, match=rf"arrives {seconds} s after .* past the 3600 s"):
        parse_workload_option(f"multi_turn:sessions=1,turns=2,think_time={think_time}")


def test_poisson_arrivals_past_the_horizon_are_refused_naming_the_first_late_request():
    with pytest.raises(ValueError, match=r"request req-\d+ arrives 36\d\d(\.\d+)? s after .*raise arrivals.rate"):
        Workload(1000, arrivals=Arrivals(rate=0.1))
    with pytest.raises(ValueError, match=r"request s\d+-t2 arrives .* lower sessions, turns or think_time"):
        ShapedWorkload(MultiTurn(sessions=400, turns=3, think_time=1000), Arrivals(rate=0.2))
    Workload(100, arrivals=Arrivals(rate=0.1))  # about 1000 s


@pytest.mark.parametrize("timestamp", [1e300, 1e11, MAX_ARRIVAL_SECONDS * 1000 + 1])
def test_a_trace_line_past_the_horizon_is_refused_naming_the_line_and_its_time(tmp_path, timestamp):
    trace = Trace(write_trace(tmp_path / "t.jsonl", [0, 10, timestamp]), block_size=4)
    shown = re.escape(f"{timestamp:.10g}")
    with pytest.raises(ValueError, match=rf'line 3 \("timestamp" {shown} ms\) arrives .*max_requests=2'):
        trace.lines()
    Trace(trace.path, block_size=4, time_scale=MAX_ARRIVAL_SECONDS * 500 / timestamp).lines()  # compressed


def test_a_long_gap_in_a_trace_is_warned_of_and_short_ones_are_not(tmp_path):
    gap_ms = (LONG_GAP_SECONDS + 1) * 1000
    trace = Trace(write_trace(tmp_path / "t.jsonl", [0, 500, 500 + gap_ms, 600 + gap_ms]), block_size=4)
    assert trace.long_gaps() == [
        f"{trace.path}: line 3 arrives {LONG_GAP_SECONDS + 1:g} s after line 2: the engine idles that long "
        f"(gaps over {LONG_GAP_SECONDS:g} s are warned of)"
    ]
    assert Trace(trace.path, block_size=4, time_scale=0.5).long_gaps() == []


def test_a_trace_longer_than_the_maximum_is_refused_unless_cut(tmp_path, monkeypatch):
    monkeypatch.setattr("perfsuite.workload.trace.MAX_NUM_REQUESTS", 3)
    monkeypatch.setattr("perfsuite.workload.limits.MAX_NUM_REQUESTS", 3)
    path = write_trace(tmp_path / "t.jsonl", [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"its first 4 lines = 4 requests, more than .* \(3\); .*max_requests=3"):
        Trace(path, block_size=4).lines()
    assert len(Trace(path, block_size=4, max_requests=3).lines()) == 3


def test_a_trace_line_longer_than_the_context_is_refused_naming_it(tmp_path):
    trace = Trace(write_trace(tmp_path / "t.jsonl", [0, 1], input_length=250, output_length=10), block_size=256)
    with pytest.raises(ValueError, match=r"line 1 \(input_length \+ output_length = 250 \+ 10\) needs 260 tokens"):
        trace.check_context(256)


def test_run_refuses_a_workload_that_outgrows_the_context_before_loading_the_model(capsys, monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("perfsuite.models.load_model", no_load)
    argv = ["run", "--model", "tiny-random", "--engines", "inflight", "--workload", "multi_turn:sessions=1,turns=100"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "perfsuite: error:" in err and "at most 3 turns fit" in err


def test_run_refuses_a_trace_beyond_the_horizon_before_loading_the_model(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("perfsuite.models.load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    path = write_trace(tmp_path / "t.jsonl", [0, 1e11])
    assert main(["run", "--model", "tiny-random", "--workload", f"trace:{path},block_size=4"]) == 2
    assert "line 2 (\"timestamp\" 1e+11 ms) arrives 100000000 s" in capsys.readouterr().err


def test_a_sweep_workload_that_outgrows_the_models_context_fails_the_session_once_before_any_model_loads(pytester):
    pytester.makepyfile(
        test_engines="""
import pytest

@pytest.fixture(scope="session")
def perf_model():
    pytest.fail("a model was loaded")
"""
    )
    pytester.path.joinpath("sweep.toml").write_text(
        "[sweep]\nengines = ['inflight']\nbatch_sizes = [2]\n"
        "[workload]\nkind = 'multi_turn'\nsessions = 2\nturns = 100\n"
    )
    result = pytester.runpytest_inprocess(
        "--perf", "--perf-model", "tiny-random", "--perf-config", "sweep.toml", "-p", "no:randomly"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = result.stdout.lines + result.stderr.lines
    matches = [line for line in lines if "--perf-config, workload mt2x100" in line and "at most 3 turns fit" in line]
    assert len(matches) == 1, "\n".join(lines)
    assert "a model was loaded" not in "\n".join(lines)


def test_run_refuses_an_unknown_model_name_in_one_line_before_loading_anything(capsys, monkeypatch):
    monkeypatch.setattr("perfsuite.models.load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["run", "--model", "nosuchmodel"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("perfsuite: error: unknown model 'nosuchmodel'; known names: smollm2-135m")
    assert "\n" not in err and "local Hugging Face model directory" in err
