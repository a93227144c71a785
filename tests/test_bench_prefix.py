"""bench/prefix.py's pure parts: its two workloads, both engines at one pool, and its summary (fake runner)."""

from __future__ import annotations

import argparse
import re

import pytest

from bench_modules import load_bench
from perfsuite.engine.fake_runner import FakeRunner

prefix = load_bench("prefix")
VOCAB = 500


def test_the_workloads_are_perfsuites_with_the_bench_options_and_later_turns_follow_the_last():
    args = _args()
    vocab = prefix.bench_vocab(VOCAB, eos_token_id=101)
    shared = prefix.workload_requests("shared-prefix", args, vocab)
    assert shared == prefix.workload_requests("shared-prefix", args, vocab)  # seeded
    by_id = {r.request_id: r.prompt_token_ids for r in shared}
    assert sorted(by_id) == ["g0-p0", "g0-p1", "g0-p2", "g1-p0", "g1-p1", "g1-p2"]
    assert all(len(prompt) == 15 for prompt in by_id.values())
    assert by_id["g1-p0"][:12] == by_id["g1-p1"][:12] and by_id["g1-p0"][12:] != by_id["g1-p1"][12:]
    assert by_id["g0-p0"][:12] != by_id["g1-p0"][:12]
    assert all(prefix.FIRST_TOKEN_ID <= token < VOCAB and token != 101 for p in by_id.values() for token in p)
    assert all(r.sampling_params.max_new_tokens == 4 and r.sampling_params.ignore_eos for r in shared)
    turns = {r.request_id: r for r in prefix.workload_requests("multi-turn", args, vocab)}
    assert sorted(turns) == ["s0-t0", "s0-t1", "s0-t2", "s1-t0", "s1-t1", "s1-t2"]
    assert turns["s0-t0"].follows is None and turns["s0-t0"].num_prompt_tokens == 8 + 3
    assert turns["s1-t2"].follows.parent_id == "s1-t1" and turns["s1-t2"].num_prompt_tokens == 3
    assert max(r.max_total_tokens for r in turns.values()) == 8 + 3 * (3 + 3)  # system + turns x (user + answer)


def _args(**overrides):
    args = prefix.parse_args(["--kv-tokens", "256", "--block-size", "4", "--batch-size", "4",
                              "--max-num-batched-tokens", "32", "--groups", "2", "--prompts-per-group", "3",
                              "--prefix-len", "12", "--suffix-len", "3", "--output-len", "4", "--sessions", "2",
                              "--turns", "3", "--system-len", "8", "--user-len", "3", "--answer-len", "3",
                              "--repeats", "2"])  # fmt: skip
    return argparse.Namespace(**{**vars(args), **overrides})


def test_both_engines_serve_both_workloads_at_one_pool_and_the_summary_reads_them():
    args = _args()
    runner = FakeRunner(VOCAB)
    vocab = prefix.bench_vocab(VOCAB, None)
    results = {workload: prefix.measure(workload, runner, args, vocab, None, max_context=256)
               for workload in prefix.WORKLOADS}  # fmt: skip
    shared = results["shared-prefix"]
    assert [len(runs) for runs in shared.runs.values()] == [2, 2]
    paged, cached = shared.runs["paged"][-1], shared.runs["paged-prefix"][-1]
    assert paged.counters.prefix_cache_hit_rate is None and shared.hit_rate() > 0
    assert cached.counters.num_prefill_tokens < paged.counters.num_prefill_tokens
    assert paged.outputs() == cached.outputs() and len(paged.outputs()) == 6
    turns = results["multi-turn"]
    run = turns.runs["paged-prefix"][-1]
    assert len(run.result.records) == 6 and run.follow_up_ids == {"s0-t1", "s0-t2", "s1-t1", "s1-t2"}
    first_turns = [r for r in run.result.records if r.request_id.endswith("-t0")]
    assert [r.num_cached_tokens for r in first_turns] == [0, 0]
    later = [r for r in run.result.records if r.request_id in run.follow_up_ids]
    expected = sum(r.num_cached_tokens for r in later) / sum(r.num_prompt_tokens for r in later)
    assert turns.hit_rate(later_turns=True) == expected > turns.hit_rate() > 0  # the first turn has nothing to hit
    assert turns.runs["paged"][-1].later_turns_hit_rate() == 0
    assert [row[0] for row in shared.rows()] == ["paged", "paged-prefix"] and shared.rows()[0][4] == "-"
    assert re.fullmatch(r"ttft prefix/paged=\d+\.\d\d throughput prefix/paged=\d+\.\d\d", shared.ratio_line())
    line = prefix.summary_line(results)
    assert re.fullmatch(r"prefix/paged=\d+\.\d\d hit_rate=0\.\d\d", line)
    assert line.endswith(f"hit_rate={turns.hit_rate(later_turns=True):.2f}")


def test_a_workload_longer_than_the_models_context_and_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="shared-prefix needs 19 tokens of context, the model has 16"):
        prefix.measure("shared-prefix", FakeRunner(VOCAB), _args(), prefix.bench_vocab(VOCAB, None), None, 16)
    with pytest.raises(argparse.ArgumentTypeError, match="unknown workload.*choose from shared-prefix, multi-turn"):
        prefix.workload_names("shared,multi-turn")
    with pytest.raises(SystemExit):
        prefix.parse_args(["--kv-tokens", "8", "--block-size", "16"])
