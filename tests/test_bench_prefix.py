"""bench/prefix.py's pure parts: its two workloads, both engines at one pool, and its summary (fake runner)."""

from __future__ import annotations

import argparse
import random
import re

import pytest

from bench_modules import load_bench
from perfsuite.engine.fake_runner import FakeRunner

prefix = load_bench("prefix")
VOCAB = 500


def test_shared_prefix_requests_share_a_prefix_within_a_group_round_robin():
    requests = prefix.shared_prefix_requests(3, 2, prefix_len=10, suffix_len=4, output_len=5, vocab_size=VOCAB)
    assert [r.request_id for r in requests] == ["g0-p0", "g1-p0", "g2-p0", "g0-p1", "g1-p1", "g2-p1"]
    by_id = {r.request_id: r.prompt_token_ids for r in requests}
    assert all(len(prompt) == 14 for prompt in by_id.values())
    assert by_id["g1-p0"][:10] == by_id["g1-p1"][:10] and by_id["g1-p0"][10:] != by_id["g1-p1"][10:]
    assert by_id["g0-p0"][:10] != by_id["g1-p0"][:10]
    assert all(prefix.FIRST_TOKEN_ID <= token < VOCAB for prompt in by_id.values() for token in prompt)
    assert requests == prefix.shared_prefix_requests(3, 2, 10, 4, 5, VOCAB)  # seeded
    assert all(r.sampling_params.max_new_tokens == 5 and r.sampling_params.ignore_eos for r in requests)


def test_each_turn_is_the_conversation_so_far_and_a_new_message():
    rng = random.Random(0)
    first = prefix.first_turns(2, system_len=6, user_len=3, vocab_size=VOCAB, rng=rng)
    assert [len(c.prompt) for c in first] == [9, 9] and first[0].prompt[:6] != first[1].prompt[:6]
    answered = [prefix.Conversation(c.session, c.prompt, (7, 8)) for c in first]
    second = prefix.next_turns(answered, user_len=3, vocab_size=VOCAB, rng=rng)
    assert [c.prompt[:11] for c in second] == [c.prompt + (7, 8) for c in first]
    assert [len(c.prompt) for c in second] == [14, 14]
    assert [r.request_id for r in prefix.turn_requests(second, 1, answer_len=4)] == ["s0-t1", "s1-t1"]


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
    results = {workload: prefix.measure(workload, runner, args, VOCAB, None, max_context=256)
               for workload in prefix.WORKLOADS}  # fmt: skip
    shared = results["shared-prefix"]
    assert [len(runs) for runs in shared.runs.values()] == [2, 2]
    paged, cached = shared.runs["paged"][-1], shared.runs["paged-prefix"][-1]
    assert paged.counters.prefix_cache_hit_rate is None and shared.hit_rate() > 0
    assert cached.counters.num_prefill_tokens < paged.counters.num_prefill_tokens
    assert paged.outputs() == cached.outputs() and len(paged.outputs()) == 6
    turns = results["multi-turn"]
    run = turns.runs["paged-prefix"][-1]
    assert len(run.results) == 3 and run.results[0].counters.num_prefix_cache_hit_tokens == 0
    assert turns.hit_rate(later_turns=True) > turns.hit_rate() > 0  # the first turn has nothing to hit
    assert [row[0] for row in shared.rows()] == ["paged", "paged-prefix"] and shared.rows()[0][4] == "-"
    assert re.fullmatch(r"ttft prefix/paged=\d+\.\d\d throughput prefix/paged=\d+\.\d\d", shared.ratio_line())
    line = prefix.summary_line(results)
    assert re.fullmatch(r"prefix/paged=\d+\.\d\d hit_rate=0\.\d\d", line)
    assert line.endswith(f"hit_rate={turns.hit_rate(later_turns=True):.2f}")


def test_a_workload_longer_than_the_models_context_and_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="shared-prefix needs 19 tokens of context, the model has 16"):
        prefix.measure("shared-prefix", FakeRunner(VOCAB), _args(), VOCAB, None, max_context=16)
    with pytest.raises(argparse.ArgumentTypeError, match="unknown workload.*choose from shared-prefix, multi-turn"):
        prefix.workload_names("shared,multi-turn")
    with pytest.raises(SystemExit):
        prefix.parse_args(["--kv-tokens", "8", "--block-size", "16"])
