"""bench/batching.py: one KV budget for static, slot in-flight and paged engines, and its figures (fake runner)."""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import batching  # noqa: E402
from perfsuite.engine.fake_runner import FakeRunner  # noqa: E402
from perfsuite.engine.types import Request, SamplingParams  # noqa: E402


def requests(lengths=(5, 40, 12, 60, 3, 33, 20, 8)) -> list[Request]:
    return [Request(f"r{i}", (3, 4, 5, 6), SamplingParams(n, ignore_eos=True)) for i, n in enumerate(lengths)]


def test_a_budget_buys_slots_of_max_seq_len_for_slot_engines_and_blocks_for_paged():
    budget = batching.KVBudget(kv_tokens=1000, block_size=16)
    assert budget.num_blocks == 62 and budget.slots(192) == 5 and budget.slots(1000) == 1
    engines = batching.build_engines(FakeRunner(), budget, max_seq_len=192, paged_batch_size=32, eos_token_id=None)
    assert [e.name for e in engines.values()] == ["static", "inflight", "paged"]
    assert engines["static"].batch_size == engines["inflight"].batch_size == 5
    paged = engines["paged"].run(requests())
    assert (paged.num_kv_blocks, paged.kv_block_size) == (62, 16)


@pytest.mark.parametrize(
    ("kv_tokens", "max_seq_len", "message"),
    [(8, None, "holds no block of 16"), (128, 192, "holds no slot of max_seq_len 192.*raise --kv-tokens")],
)
def test_a_budget_too_small_for_a_block_or_a_slot_says_what_to_change(kv_tokens, max_seq_len, message):
    with pytest.raises(ValueError, match=message):
        batching.KVBudget(kv_tokens, 16).slots(max_seq_len)


def test_at_the_same_memory_paged_runs_more_requests_at_once_and_preempts_when_it_runs_out():
    runner = FakeRunner()
    runner.reset = lambda: None
    runner.compute_seconds = 0.0
    runner.max_context = 256
    args = argparse.Namespace(paged_batch_size=8, repeats=2)
    long = requests((50, 60, 55, 58, 45, 52, 60, 48))  # 472 tokens in all, 128 in the budget
    cell = batching.measure_cell("w", long, runner, batching.KVBudget(128, 4), args, "cpu", None)
    assert cell.max_seq_len == 64 and cell.slots == 2
    assert cell.reserved_tokens == {"static": 128, "inflight": 128, "paged": 128}
    static, paged = cell.runs["static"], cell.runs["paged"]
    assert static.counters.peak_num_running == 2 < paged.counters.peak_num_running
    assert paged.counters.num_preemptions > 0, "8 requests of about 60 tokens in 32 blocks of 4 must preempt"
    assert all(len(values) == 2 for values in cell.throughput.values())
    rows = cell.rows()
    assert [row[0] for row in rows] == ["static", "inflight", "paged"]
    assert rows[2][4] == f"{paged.counters.peak_kv_blocks_used}/32"
    assert rows[2][6] == f"{paged.counters.num_preemptions} ({paged.counters.num_recomputed_tokens})"
    line = cell.ratio_line()
    assert line.startswith("inflight/static=") and " paged/static=" in line and " paged/inflight=" in line


def test_ratios_are_taken_within_each_repeat():
    cell = batching.CellResult("w", 64, 2, throughput={"static": [10.0, 20.0], "inflight": [15.0, 20.0],
                                                        "paged": [30.0, 60.0]})  # fmt: skip
    assert cell.ratio("paged", "static") == 3.0 and cell.ratio("inflight", "static") == 1.25
    assert "overhead=nan%" in cell.ratio_line(), "no slot in-flight run measured: no overhead"


def test_a_short_run_is_refused_not_measured():
    run = types.SimpleNamespace(records=[types.SimpleNamespace(request_id="r0", output_token_ids=(1, 2))])
    with pytest.raises(RuntimeError, match="paged: 1 requests did not make their max_new_tokens"):
        batching.check_complete("paged", run, requests((3,)))


def test_the_budget_in_mib_is_counted_in_the_models_kv_bytes_per_token():
    config = types.SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                   hidden_size=576)  # SmolLM2-135M  # fmt: skip
    per_token = batching.kv_bytes_per_token(config, element_size=4)
    assert per_token == 2 * 30 * 3 * 64 * 4
    args = batching.parse_args(["--kv-mib", "45", "--block-size", "32"])
    assert batching.resolve_budget(args, per_token) == batching.KVBudget(45 * 2**20 // per_token, 32)
    assert batching.resolve_budget(batching.parse_args([]), per_token).kv_tokens == batching.DEFAULT_KV_TOKENS


@pytest.mark.parametrize(
    "argv", [["--kv-tokens", "10", "--kv-mib", "1"], ["--kv-mib", "0"], ["--workloads", "mixed,bursty"]]
)
def test_contradicting_or_unknown_options_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit):
        batching.parse_args(argv)
    assert "error" in capsys.readouterr().err
