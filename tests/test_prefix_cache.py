"""Prefix caching: full blocks found by a chained hash, shared by reference count, evicted least recent first."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from perfsuite.engine import Request, SamplingParams, paged_engine
from perfsuite.engine.fake_runner import FakeRunner, fake_reference
from perfsuite.engine.prefix_cache import PrefixCachingBlockManager, block_hash
from own_engines import own_engine

VOCAB = 97


def _computed(blocks, request_id, tokens, num_tokens=None):
    """Allocate ``tokens`` over their cached prefix and mark them all computed, as a finished prefill would."""
    cached = blocks.cached_prefix(tokens)
    table = blocks.allocate(request_id, len(tokens), cached)
    blocks.cache_computed_blocks(request_id, tokens, len(tokens) if num_tokens is None else num_tokens)
    return cached, table


def test_full_computed_blocks_are_found_by_their_prefix_and_shared():
    blocks = PrefixCachingBlockManager(num_blocks=8, block_size=2)
    _, table = _computed(blocks, "a", (1, 2, 3, 4, 5))  # blocks (1 2) (3 4) cached; (5) partial, never
    assert table == (0, 1, 2) and blocks.num_cached_blocks == 2
    assert blocks.cached_prefix((1, 2, 3, 4, 5, 6)) == (0, 1)
    assert blocks.cached_prefix((1, 2, 3, 9, 9)) == (0,)  # diverges mid-way through the second block
    assert blocks.cached_prefix((3, 4, 3, 4, 5)) == ()  # (3 4) is cached only after (1 2): the parent counts
    cached, table = _computed(blocks, "b", (1, 2, 3, 4, 7, 8, 9))
    assert cached == (0, 1) and table == (0, 1, 3, 4)
    assert [blocks.ref_count(block) for block in range(5)] == [2, 2, 1, 1, 1]


def test_a_lookup_leaves_at_least_one_token_to_compute():
    blocks = PrefixCachingBlockManager(num_blocks=8, block_size=2)
    _computed(blocks, "a", (1, 2, 3, 4))
    assert blocks.cached_prefix((1, 2, 3, 4)) == (0,)  # the whole prompt is cached, yet its last block is computed
    cached, table = _computed(blocks, "b", (1, 2, 3, 4))
    assert cached == (0,) and table == (0, 2)  # a fresh block for (3 4): a cached block is never written
    assert not blocks.is_cached(2)  # the same content is cached in block 1 already
    blocks.free("b")
    assert blocks.evictable_blocks() == () and blocks.num_free_blocks == 6  # block 2 went back to the free list


def test_only_computed_tokens_are_cached():
    blocks = PrefixCachingBlockManager(num_blocks=8, block_size=2)
    _computed(blocks, "a", (1, 2, 3, 4, 5, 6), num_tokens=3)  # a chunked prefill that has computed 3 tokens
    assert blocks.cached_prefix((1, 2, 3, 4, 5, 6, 7)) == (0,)
    blocks.cache_computed_blocks("a", (1, 2, 3, 4, 5, 6), 6)
    assert blocks.cached_prefix((1, 2, 3, 4, 5, 6, 7)) == (0, 1, 2)


def test_freed_cached_blocks_stay_findable_until_the_pool_needs_them_least_recent_first():
    blocks = PrefixCachingBlockManager(num_blocks=4, block_size=2)
    _computed(blocks, "a", (1, 2, 3, 4))
    _computed(blocks, "b", (5, 6, 7, 8))
    blocks.free("a")
    blocks.free("b")
    # freed last block first, so a request's tail is evicted before its head
    assert blocks.evictable_blocks() == (1, 0, 3, 2) and blocks.num_free_blocks == 4
    assert blocks.num_used_blocks == 0 and blocks.num_evicted_blocks == 0
    assert blocks.cached_prefix((5, 6, 7, 8, 9)) == (2, 3)
    cached, table = _computed(blocks, "c", (5, 6, 7, 8, 9))  # takes 2 and 3 back, evicts 1 for its third block
    assert cached == (2, 3) and table == (2, 3, 1)
    assert blocks.num_evicted_blocks == 1 and blocks.evictable_blocks() == (0,)
    assert blocks.cached_prefix((1, 2, 3, 4, 5)) == (0,)
    assert not blocks.can_allocate(4) and blocks.can_allocate(2)


def test_admission_counts_what_a_hit_takes_from_the_free_blocks():
    blocks = PrefixCachingBlockManager(num_blocks=3, block_size=2)
    _computed(blocks, "a", (1, 2, 3, 4, 5))
    blocks.free("a")  # blocks 0 and 1 cached and evictable, 2 free
    cached = blocks.cached_prefix((1, 2, 3, 4, 5, 6, 7))
    assert cached == (0, 1)
    assert blocks.num_blocks_taken(7, cached) == 4 and not blocks.can_allocate(7, cached)
    assert blocks.num_blocks_taken(6, cached) == 3 and blocks.can_allocate(6, cached)
    with pytest.raises(RuntimeError, match="cannot allocate 7 tokens"):
        blocks.allocate("b", 7, cached)


def test_a_hash_collision_cannot_give_another_blocks_kv():
    blocks = PrefixCachingBlockManager(num_blocks=8, block_size=2, hash_block=lambda parent, tokens: b"same")
    _computed(blocks, "a", (1, 2, 3, 4, 5))
    assert blocks.cached_prefix((7, 8, 3, 4, 5)) == ()  # the hash hits, the stored tokens do not match


def test_the_hash_chains_the_parent_and_is_the_same_in_every_process():
    assert block_hash(None, (1, 2)) != block_hash(block_hash(None, (0, 0)), (1, 2))
    code = (
        "from perfsuite.engine.prefix_cache import block_hash; print(block_hash(block_hash(None, (1,)), (2, 3)).hex())"
    )
    digests = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip()  # fmt: skip
        for seed in ("1", "2")
    }
    assert digests == {block_hash(block_hash(None, (1,)), (2, 3)).hex()}


def test_the_plain_block_manager_refuses_to_share():
    from perfsuite.engine import BlockManager

    blocks = BlockManager(num_blocks=4, block_size=2)
    assert blocks.cached_prefix((1, 2, 3)) == () and not blocks.has_prefix_cache
    with pytest.raises(RuntimeError, match="has no prefix cache"):
        blocks.allocate("a", 3, (0,))


# -- through the engine ------------------------------------------------------


def _prefix_engine(num_kv_blocks=16, block_size=4, budget=64, batch_size=4, enable_prefix_caching=True):
    return paged_engine(FakeRunner(VOCAB), decode_batch_size=batch_size, max_num_batched_tokens=budget,
                        max_seq_len=64, eos_token_id=None, num_kv_blocks=num_kv_blocks, kv_block_size=block_size,
                        enable_prefix_caching=enable_prefix_caching)  # fmt: skip


def _request(request_id, prompt, max_new_tokens=4, arrival_time=0.0):
    return Request(request_id, tuple(prompt), SamplingParams(max_new_tokens, ignore_eos=True), arrival_time)


def _check_outputs(result, requests):
    for request in requests:
        expected = fake_reference(request.prompt_token_ids, request.sampling_params, None, VOCAB)
        assert result.outputs()[request.request_id] == expected, request.request_id


def test_a_later_request_reuses_a_finished_ones_prefix_and_prefills_only_the_rest():
    engine = _prefix_engine()
    first = _request("a", range(1, 11))
    engine.run([first])
    second = _request("b", [*range(1, 9), 50, 51, 52])  # shares two full blocks of 4, then diverges
    result = engine.run([second])
    _check_outputs(result, [second])
    assert result.records[0].num_cached_tokens == 8
    assert result.steps[0].chunks[0].start_position == 8 and result.steps[0].chunks[0].num_tokens == 3
    counters = result.counters
    assert (counters.num_prefix_cache_queried_tokens, counters.num_prefix_cache_hit_tokens) == (11, 8)
    assert counters.prefix_cache_hit_rate == pytest.approx(8 / 11)
    assert counters.num_prefill_tokens == 3


def test_requests_that_arrive_while_the_sharer_prefills_reuse_what_it_has_computed():
    engine = _prefix_engine(budget=4)  # 4 tokens a step: a 16-token prompt takes four steps
    shared = list(range(1, 17))
    requests = [_request(f"r{i}", [*shared, 60 + i], max_new_tokens=3) for i in range(3)]
    result = engine.run(requests)
    _check_outputs(result, requests)
    assert result.counters.num_prefix_cache_hit_tokens > 0
    assert {record.request_id: record.num_cached_tokens for record in result.records}["r0"] == 0


def test_a_request_whose_prefix_is_being_computed_waits_for_it_and_then_hits():
    """Without the wait, r1 and r2 are admitted beside r0 in the first step and compute its prefix again."""
    engine = _prefix_engine(budget=64)  # room for all three prompts in one step
    shared = list(range(1, 13))  # three full blocks of 4
    requests = [_request(f"r{i}", [*shared, 60 + i], max_new_tokens=3) for i in range(3)]
    result = engine.run(requests)
    _check_outputs(result, requests)
    assert [c.request_id for c in result.steps[0].chunks] == ["r0"], "the others wait for r0's prefix"
    assert {r.request_id: r.num_cached_tokens for r in result.records} == {"r0": 0, "r1": 12, "r2": 12}
    assert result.counters.num_prefill_tokens == 13 + 1 + 1


def test_a_request_that_shares_nothing_being_computed_is_admitted_at_once():
    engine = _prefix_engine(budget=64)
    requests = [_request("a", range(1, 13)), _request("b", range(30, 42))]
    result = engine.run(requests)
    assert sorted(c.request_id for c in result.steps[0].chunks) == ["a", "b"]


def test_the_plain_paged_engine_queries_nothing_and_caches_nothing():
    engine = _prefix_engine(enable_prefix_caching=False)
    requests = [_request("a", range(1, 11)), _request("b", range(1, 11), arrival_time=0.0)]
    result = engine.run(requests)
    _check_outputs(result, requests)
    assert engine.name == "paged" and result.counters.prefix_cache_hit_rate is None
    assert [record.num_cached_tokens for record in result.records] == [0, 0]


def test_pool_pressure_evicts_cached_blocks_and_preempts_yet_outputs_stay_right():
    engine = _prefix_engine(num_kv_blocks=10, block_size=2, budget=8)
    requests = [_request(f"r{i}", [*range(1, 7), *range(10 * i, 10 * i + 3)], max_new_tokens=6) for i in range(6)]
    result = engine.run(requests)
    _check_outputs(result, requests)
    counters = result.counters
    assert counters.num_preemptions > 0 and counters.num_evicted_blocks > 0 and counters.num_prefix_cache_hit_tokens
    assert engine.scheduler.kv_cache.num_used_blocks == 0


def test_build_engine_knows_paged_prefix():
    engine = own_engine("paged-prefix", FakeRunner(VOCAB), batch_size=2, max_seq_len=32, eos_token_id=None)
    assert engine.name == "paged-prefix" and engine.scheduler.kv_cache.has_prefix_cache
    assert not own_engine("paged", FakeRunner(VOCAB), batch_size=2, max_seq_len=32,
                          eos_token_id=None).scheduler.kv_cache.has_prefix_cache  # fmt: skip
