"""The paged engine: admission by blocks, preemption of the newest, recomputation, and refusals."""

from __future__ import annotations

import pytest

from perfsuite.engine import Request, SamplingParams, paged_engine
from perfsuite.engine.names import OWN_ENGINES
from perfsuite.engine.fake_runner import FakeRunner, fake_reference, next_token
from own_engines import own_engine

VOCAB = 97


def _request(request_id, prompt_len, max_new_tokens):
    return Request(request_id, tuple(range(1, prompt_len + 1)), SamplingParams(max_new_tokens, ignore_eos=True))


def _engine(num_kv_blocks, block_size=4, batch_size=4, budget=64, max_seq_len=64):
    return paged_engine(FakeRunner(VOCAB), decode_batch_size=batch_size, max_seq_len=max_seq_len,
                        eos_token_id=None, num_kv_blocks=num_kv_blocks, kv_block_size=block_size,
                        max_num_batched_tokens=budget)  # fmt: skip


def _check_outputs(result, requests):
    for request in requests:
        expected = fake_reference(request.prompt_token_ids, request.sampling_params, None, VOCAB)
        assert result.outputs()[request.request_id] == expected, request.request_id


def test_the_newest_request_is_preempted_and_recomputed_with_its_tokens_kept():
    # Two requests of 4 prompt tokens in 4 blocks of 4: both prefill (2 blocks, leaving the watermark of
    # 2 free), each takes its second block at its first decode, and at position 8 "old" needs a third
    # and none is left.
    engine = _engine(num_kv_blocks=4)
    requests = [_request("old", 4, 6), _request("new", 4, 6)]
    result = engine.run(requests)
    _check_outputs(result, requests)
    preempting = [step for step in result.steps if step.preempted_request_ids]
    assert preempting[0].preempted_request_ids == ("new",)
    assert {c.request_id for c in preempting[0].chunks} == {"old"}, "a step that preempts admits nobody"
    counters = result.counters
    assert counters.num_preemptions == len(preempting) >= 1
    # "new" had its prompt and one sampled token cached: 4 tokens + nothing else; it recomputes all.
    assert counters.num_recomputed_tokens >= 4
    assert counters.peak_kv_blocks_used == 4
    assert (result.num_kv_blocks, result.kv_block_size) == (4, 4)
    assert all(step.num_kv_blocks_used <= 4 for step in result.steps)


def test_a_preempted_request_goes_back_to_the_front_of_the_queue():
    engine = _engine(num_kv_blocks=4, batch_size=2)
    for request in (_request("old", 4, 6), _request("new", 4, 6), _request("later", 2, 1)):
        engine.add_request(request)
    scheduler = engine.scheduler
    _steps_until_preempted(engine)
    assert [s.request_id for s in scheduler.waiting] == ["new", "later"]
    assert scheduler.waiting[0].num_computed_tokens == 0
    assert scheduler.waiting[0].num_output_tokens >= 1, "its generated tokens are kept"
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.kv_cache.num_used_blocks == 0


def test_recomputation_is_one_prefill_of_prompt_and_output_counted_as_recomputed():
    engine = _engine(num_kv_blocks=4, budget=64)
    result = engine.run([_request("old", 4, 6), _request("new", 4, 6)])
    recompute = next(
        chunk for step in result.steps for chunk in step.chunks
        if chunk.request_id == "new" and chunk.start_position == 0 and step is not result.steps[0]
    )
    assert recompute.is_prefill and recompute.samples
    assert recompute.num_tokens > 4, "the prompt and the tokens generated before the preemption"


def test_a_pool_that_holds_everything_never_preempts_and_matches_the_slot_engine_memory():
    engine = own_engine("paged", FakeRunner(VOCAB), batch_size=3, max_seq_len=40, eos_token_id=None)
    assert (engine.scheduler.kv_cache.num_blocks, engine.scheduler.kv_cache.block_size) == (9, 16)  # 3 x ceil(40/16)
    requests = [_request(f"r{i}", 10 + i, 20) for i in range(6)]
    result = engine.run(requests)
    _check_outputs(result, requests)
    assert result.counters.num_preemptions == 0 and result.counters.peak_num_running == 3
    assert "paged" in OWN_ENGINES and engine.name == "paged" and engine.batch_size == 3


def test_the_token_budget_and_batch_sizes_still_hold_under_preemption():
    engine = _engine(num_kv_blocks=5, budget=5, batch_size=3)
    requests = [_request(f"r{i}", 3 + 2 * i, 5) for i in range(6)]
    result = engine.run(requests)
    _check_outputs(result, requests)
    assert result.counters.num_preemptions > 0
    for step in result.steps:
        assert sum(c.num_tokens for c in step.chunks) <= 5
        assert len({c.slot for c in step.chunks}) == len(step.chunks) <= 3
    assert result.counters.peak_num_running <= 3


def test_a_request_larger_than_the_whole_pool_is_refused_when_added():
    engine = _engine(num_kv_blocks=3, block_size=4)
    with pytest.raises(ValueError, match=r"'big': prompt \+ max_new_tokens = 13 tokens need 4 KV blocks of 4 tokens, "
                                         r"more than the whole pool of 3; it could never run. Raise num_kv_blocks"):
        engine.add_request(_request("big", 9, 4))
    assert not engine.has_unfinished_requests()
    fits = _request("fits", 8, 4)  # 12 tokens: exactly the pool
    _check_outputs(engine.run([fits]), [fits])


def _steps_until_preempted(engine, limit=100):
    for _ in range(limit):
        if any(step.preempted_request_ids for step in engine._steps):
            return
        engine.step()
    raise AssertionError(f"no preemption in {limit} steps")


def test_admission_keeps_a_watermark_of_free_blocks_for_the_running_requests_growth():
    # 3 blocks of 4: "old" (4 tokens, 1 block) runs; admitting "new" (1 block) would leave 1 free, under
    # the watermark of 2 (one block of growth for each of the two), so it waits and nobody is preempted.
    engine = _engine(num_kv_blocks=3)
    requests = [_request("old", 4, 6), _request("new", 4, 6)]
    for request in requests:
        engine.add_request(request)
    engine.step()
    scheduler = engine.scheduler
    assert [s.request_id for s in scheduler.running] == ["old"] and scheduler.num_watermark_blocks == 2
    assert [s.request_id for s in scheduler.waiting] == ["new"]
    result = _engine(num_kv_blocks=3).run(requests)
    _check_outputs(result, requests)
    assert result.counters.num_preemptions == 0 and result.counters.peak_num_running == 1
    steps_of = {rid: [i for i, step in enumerate(result.steps) if rid in {c.request_id for c in step.chunks}]
                for rid in ("old", "new")}  # fmt: skip
    assert steps_of["old"][-1] < steps_of["new"][0], "old grew into the blocks new would have taken"


def test_with_nothing_running_the_watermark_is_waived_so_a_request_of_the_whole_pool_runs():
    engine = _engine(num_kv_blocks=3)
    whole = _request("whole", 11, 1)  # its prompt takes every block: under any watermark it would wait forever
    result = engine.run([whole])
    _check_outputs(result, [whole])
    assert result.counters.peak_kv_blocks_used == 3


def test_the_watermark_is_at_least_vllms_share_of_a_large_pool():
    engine = _engine(num_kv_blocks=1000, block_size=1)
    assert engine.scheduler.num_watermark_blocks == 10  # 1% of 1000 blocks, more than one running + 1
    engine.add_request(_request("a", 4, 2))
    engine.step()
    assert engine.scheduler.num_watermark_blocks == 10
    assert _engine(num_kv_blocks=50).scheduler.num_watermark_blocks == 1  # int(0.5): the growth term rules


@pytest.mark.parametrize("value", [-0.1, 1, 1.5, "1%"])
def test_a_bad_watermark_is_refused(value):
    from perfsuite.engine import BlockManager, PagedScheduler

    with pytest.raises(ValueError, match=r"watermark must be a share of the pool in \[0, 1\), got"):
        PagedScheduler(BlockManager(4, 4), None, max_seq_len=16, decode_batch_size=2, watermark=value)


def test_a_run_with_a_request_larger_than_the_pool_refuses_before_serving_any():
    # Refused at its arrival mid-run, it would leave the requests before it half served.
    engine = _engine(num_kv_blocks=3, block_size=4)
    fits, big = _request("fits", 4, 2), _request("big", 9, 4)
    with pytest.raises(ValueError, match=r"'big': prompt \+ max_new_tokens = 13 tokens need 4 KV blocks"):
        engine.run([fits, big])
    assert not engine.has_unfinished_requests() and engine.scheduler.kv_cache.num_used_blocks == 0
    assert engine._steps == type(engine._steps)(), "nothing ran"
    _check_outputs(engine.run([fits]), [fits])


def test_a_request_past_max_seq_len_is_refused_as_by_the_slot_engine():
    with pytest.raises(ValueError, match="exceeds the engine's context of 64 tokens"):
        _engine(num_kv_blocks=100).add_request(_request("long", 60, 5))


@pytest.mark.parametrize(("knob", "value"), [("decode_batch_size", 0), ("max_num_batched_tokens", 0),
                                             ("prefill_batch_size", 0), ("max_seq_len", 0)])
def test_bad_knobs_are_refused(knob, value):
    kwargs = dict(decode_batch_size=2, max_seq_len=32, eos_token_id=None, num_kv_blocks=4) | {knob: value}
    with pytest.raises(ValueError, match=f"{knob} must be an integer >= 1, got 0"):
        paged_engine(FakeRunner(), **kwargs)


def test_an_aborted_preempted_request_leaves_nothing_behind():
    engine = _engine(num_kv_blocks=4)
    for request in (_request("old", 4, 6), _request("new", 4, 6)):
        engine.add_request(request)
    _steps_until_preempted(engine)
    assert engine.abort_request("new")
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.kv_cache.num_used_blocks == 0 and engine.scheduler.kv_cache.owners() == {}


def test_the_fake_runners_blocks_hold_kv_that_depends_on_the_whole_prefix():
    from perfsuite.engine.types import ScheduledChunk, SchedulerOutput

    runner = FakeRunner(VOCAB)
    cache = runner.new_paged_kv_cache(num_blocks=4, block_size=2)
    runner.execute(SchedulerOutput((ScheduledChunk("a", 0, (1, 2, 3, 4), 0, True, True, block_table=(0, 1)),),
                                   num_waiting=0), cache)  # fmt: skip
    # b shares a's first block (the same prefix) and computes its own second block: read as if it were its own
    shared = ScheduledChunk("b", 1, (3, 9), 2, samples=True, is_prefill=True, block_table=(0, 2))
    assert runner.execute(SchedulerOutput((shared,), num_waiting=0), cache) == [next_token((1, 2, 3, 9), VOCAB)]
    # c's prefix is (5, 6), so a's block 1, computed after (1, 2), holds the wrong KV for it even with equal tokens
    runner.execute(SchedulerOutput((ScheduledChunk("c", 2, (5, 6), 0, False, True, block_table=(3,)),),
                                   num_waiting=0), cache)  # fmt: skip
    stale = ScheduledChunk("c", 2, (7,), 4, samples=True, is_prefill=True, block_table=(3, 1, 2))
    with pytest.raises(AssertionError, match="'c' reads position 2 from block 1.*computed under another prefix"):
        runner.execute(SchedulerOutput((stale,), num_waiting=0), cache)


def test_the_fake_runner_catches_a_block_two_requests_share():
    from perfsuite.engine.types import ScheduledChunk, SchedulerOutput

    runner = FakeRunner(VOCAB)
    cache = runner.new_paged_kv_cache(num_blocks=4, block_size=4)
    first = ScheduledChunk("a", 0, (1, 2, 3), 0, samples=True, is_prefill=True, block_table=(1,))
    second = ScheduledChunk("b", 1, (4, 5), 0, samples=True, is_prefill=True, block_table=(1,))
    with pytest.raises(AssertionError, match="'a' reads position 2 from block 1, .*: a cell never filled, overwritten"):
        runner.execute(SchedulerOutput((first, second), num_waiting=0), cache)
    first = ScheduledChunk("a", 0, (1, 2), 0, samples=True, is_prefill=True, block_table=(1,))
    with pytest.raises(AssertionError, match=r"'a' wrote \(1, 2\) from position 0 but reads back \(4, 5\): a block"):
        runner.execute(SchedulerOutput((first, second), num_waiting=0), cache)
    past = ScheduledChunk("c", 0, (1,) * 5, 0, samples=True, is_prefill=True, block_table=(2,))
    with pytest.raises(AssertionError, match="'c' position 4 is past its 1 blocks"):
        runner.execute(SchedulerOutput((past,), num_waiting=0), cache)
