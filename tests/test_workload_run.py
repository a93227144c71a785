"""``perfsuite run --workload`` and a sweep's ``[workload]`` section, end to end on tiny-random."""

from __future__ import annotations

import json

import pytest

from perfsuite.cli import main

pytest_plugins = ["pytester"]

TRACE = [
    {"timestamp": 0, "input_length": 20, "output_length": 4, "hash_ids": [1, 2]},
    {"timestamp": 10, "input_length": 30, "output_length": 3, "hash_ids": [1, 2]},
    {"timestamp": 30, "input_length": 12, "output_length": 5, "hash_ids": [7]},
]


def rows_of(out: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in out.strip().splitlines()[2:]}


def test_run_replays_a_trace_on_each_engine(tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps(line) for line in TRACE) + "\n")
    code = main(["run", "--model", "tiny-random", "--engines", "inflight,paged", "--batch-size", "2", "--no-progress",
                 "--workload", f"trace:{trace},block_size=16"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "3 requests, workload trace_trace" in err
    assert set(rows_of(out)) == {"inflight", "paged"}


def test_run_serves_a_multi_turn_workload_on_perfsuites_engines_and_refuses_it_on_a_peer(capsys):
    code = main(["run", "--model", "tiny-random", "--engines", "static,paged", "--batch-size", "2", "--no-progress",
                 "--workload", "multi_turn:sessions=2,turns=2,prompt=8,message=4,output=3"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "4 requests, workload mt2x2-in8-msg4-out3-think0-offline" in err
    assert set(rows_of(out)) == {"static", "paged"}
    code = main(["run", "--model", "tiny-random", "--engines", "hf-static", "--no-progress",
                 "--workload", "multi_turn:sessions=2,turns=2,prompt=8,message=4,output=3"])  # fmt: skip
    assert code == 2
    assert "engine 'hf-static' cannot serve multi-turn follow-ups ('s0-t1', 's1-t1'" in capsys.readouterr().err


def test_a_bad_trace_line_fails_run_before_the_model_loads(tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps(TRACE[0]) + '\n{"timestamp": 5, "input_length": 20, "output_length": 4}\n')
    assert main(["run", "--model", "no-such-model", "--workload", f"trace:{trace},block_size=16"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"perfsuite: error: {trace} line 2: 'hash_ids' missing; each line needs timestamp, input_length, "
        "output_length, hash_ids"
    )


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--workload", "shared_prefix:groups=2,prompts=2,prefix=8,sufix=3"], "'sufix' (did you mean 'suffix'?)"),
        (["--workload", "chat:sessions=2"], "KIND:KEY=VALUE,... with KIND one of shared_prefix, multi_turn, trace"),
        (["--workload", "multi_turn:sessions=2,turns=2", "--num-requests", "4"],
         "--num-requests size the default workload, which --workload replaces"),
    ],
)
def test_bad_workload_arguments_exit_with_usage_naming_the_problem(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", *argv])
    assert exit_info.value.code == 2
    assert words in capsys.readouterr().err


SWEEP = """
[sweep]
engines = ["inflight"]
batch_sizes = [2]
repeats = 2

[[workload]]
kind = "shared_prefix"
groups = 2
prompts = 2
prefix = 16
suffix = 4
output = 3

[[workload]]
kind = "multi_turn"
sessions = 2
turns = 2
prompt = 8
message = 4
output = 3
"""


def test_a_sweep_session_measures_each_workload_section(pytester):
    from smoke_session import SMOKE_ARGS

    pytester.path.joinpath("sweep.toml").write_text(SWEEP)
    result = pytester.runpytest_inprocess("--pyargs", "perfsuite.suites", *SMOKE_ARGS, "--perf-config", "sweep.toml",
                                          "-k", "test_sweep", "-v")  # fmt: skip
    result.assert_outcomes(skipped=2)  # each measured, then judged nothing: no baselines here
    result.stdout.fnmatch_lines([
        "*test_sweep[[]inflight-B2-sp2x2-prefix16-suffix4-out3-offline[]]*",
        "*test_sweep[[]inflight-B2-mt2x2-in8-msg4-out3-think0-offline[]]*",
    ])  # fmt: skip
    tests = json.loads((pytester.path / "reports" / "results.json").read_text())["tests"]
    measured = {t["test_id"].split("[")[-1].rstrip("]"): t["measurement"] for t in tests}
    assert set(measured) == {"inflight-B2-sp2x2-prefix16-suffix4-out3-offline",
                             "inflight-B2-mt2x2-in8-msg4-out3-think0-offline"}  # fmt: skip
    multi_turn = measured["inflight-B2-mt2x2-in8-msg4-out3-think0-offline"]
    # each second turn's prompt is 8 + 3 + 4 tokens: the mean over 4 turns is (8 + 15) / 2
    assert multi_turn["parameters"]["input_length"] == pytest.approx(11.5)
