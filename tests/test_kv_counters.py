"""The KV counters every perfsuite engine records (slots count as blocks of ``max_seq_len`` tokens)."""

from __future__ import annotations

import pytest

from perfsuite.engine import EngineCounters, Request, SamplingParams, inflight_engine, static_engine
from perfsuite.engine.fake_runner import FakeRunner


def _requests(*lengths):
    return [Request(f"r{i}", (1, 2, 3, 4), SamplingParams(n, ignore_eos=True)) for i, n in enumerate(lengths)]


@pytest.mark.parametrize("build", [static_engine, inflight_engine])
def test_slot_engines_count_their_slots_as_blocks(build):
    size = {"batch_size": 2} if build is static_engine else {"decode_batch_size": 2}
    engine = build(FakeRunner(), max_seq_len=32, eos_token_id=None, **size)
    result = engine.run(_requests(3, 3))
    counters = result.counters
    assert (result.num_kv_blocks, result.kv_block_size) == (2, 32)
    # Three steps: a 4-token prefill each, then two decodes; both slots held throughout.
    assert [step.num_kv_blocks_used for step in result.steps] == [2, 2, 2]
    assert [step.num_kv_tokens_used for step in result.steps] == [8, 10, 12]
    assert (counters.peak_kv_blocks_used, counters.peak_num_running) == (2, 2)
    assert (counters.kv_blocks_used_step_sum, counters.kv_tokens_used_step_sum) == (6, 30)
    assert counters.kv_token_capacity_step_sum == 6 * 32
    assert counters.mean_kv_blocks_used == 2.0
    assert counters.kv_utilisation == pytest.approx(30 / 192)
    assert (counters.num_preemptions, counters.num_recomputed_tokens) == (0, 0)
    assert all(step.preempted_request_ids == () for step in result.steps)


def test_the_static_batch_holds_a_finished_slot_until_the_batch_ends():
    engine = static_engine(FakeRunner(), batch_size=2, max_seq_len=32, eos_token_id=None)
    result = engine.run(_requests(1, 3))
    assert [step.num_kv_blocks_used for step in result.steps] == [2, 2, 2]
    assert result.counters.peak_num_running == 2
    assert [len(step.chunks) for step in result.steps] == [2, 2, 2]  # the finished one as a padding row


def test_counters_of_an_empty_run_are_zero_and_their_means_defined():
    counters = EngineCounters()
    assert (counters.mean_kv_blocks_used, counters.kv_utilisation) == (0.0, 0.0)


def test_counters_combine_as_one_runs_and_grow_since_an_earlier_reading():
    first = EngineCounters(num_prefill_tokens=10, num_evicted_blocks=1, peak_kv_blocks_used=7, peak_num_running=2)
    second = EngineCounters(num_prefill_tokens=4, num_evicted_blocks=2, peak_kv_blocks_used=3, peak_num_running=5)
    both = first.combined(second)
    assert (both.num_prefill_tokens, both.num_evicted_blocks, both.peak_kv_blocks_used, both.peak_num_running) == (
        14, 3, 7, 5), "sums, and the larger of each peak"  # fmt: skip
    grown = both.since(first)
    assert (grown.num_prefill_tokens, grown.num_evicted_blocks, grown.peak_kv_blocks_used) == (4, 2, 7)
