"""`perfsuite run`, the main job, on the tiny model."""

from __future__ import annotations

import pytest

from perfsuite.cli import main


def test_run_prints_a_row_per_engine_with_the_counters(capsys):
    code = main(["run", "--model", "tiny-random", "--num-requests", "6", "--max-new-tokens", "12", "--batch-size", "3"])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].split()[:3] == ["engine", "tok/s", "req/s"]
    assert "padded slot-tokens" in lines[0] and "forward passes" in lines[0]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"static", "inflight"}
    assert int(rows["inflight"][-1]) == 0, "in-flight batching never pads a slot"
    assert int(rows["static"][-1]) > 0, "uneven lengths leave static slots idle"
    assert "[inflight] 6/6 requests" in err, "progress is shown"


def test_one_engine_can_be_chosen(capsys):
    assert main(["run", "--model", "tiny-random", "--engines", "inflight", "--num-requests", "2",
                 "--max-new-tokens", "8", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "inflight" in out and "static" not in out


def test_unknown_model_is_a_clear_error(capsys):
    assert main(["run", "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "no-such-model" in err and "tiny-random" in err and "directory" in err


@pytest.mark.parametrize("argv", [["--batch-size", "0"], ["--engines", "turbo"], ["--num-requests", "x"]])
def test_bad_arguments_exit_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", *argv])
    assert exit_info.value.code == 2
    assert "error: argument" in capsys.readouterr().err


def test_min_above_max_names_both_fields(capsys):
    assert main(["run", "--model", "tiny-random", "--min-new-tokens", "9", "--max-new-tokens", "3"]) == 2
    err = capsys.readouterr().err
    assert "min_new_tokens" in err and "max_new_tokens" in err


def test_a_batch_too_large_for_memory_is_a_clear_error_naming_the_flag(capsys, monkeypatch):
    from perfsuite.engine import kv_memory

    monkeypatch.setattr(kv_memory, "available_memory", lambda device: 16 * 2**30)
    assert main(["run", "--model", "tiny-random", "--device", "cpu", "--batch-size", "100000000", "--engines",
                 "static", "--no-progress"]) == 2  # fmt: skip
    # the workload's longest request needs a 192-token slot; tiny-random in float32 keeps 512 B a token
    assert capsys.readouterr().err.splitlines()[-1] == (
        "perfsuite: error: the static engine's KV cache of 100000000 slots of 192 tokens needs 8.94 TiB (512 B a "
        "token) but cpu has 16.0 GiB available, of which 14.4 GiB (90%) may hold a KV cache: lower --batch-size to "
        "157286 or less"
    )
