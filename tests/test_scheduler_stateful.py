"""A Hypothesis state machine over the three schedulers and the KV accounting.

Rules are the primitive actions (add, step, abort); the invariants run after
each one. The paged scheduler gets a small block pool, so requests are
preempted and recomputed. The fake runner makes outputs a function of the whole sequence and
refuses a chunk that does not start where its slot's cache ends, so a lost,
repeated or misplaced token shows up as a failure that shrinks to a short
program.
"""

from __future__ import annotations

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from perfsuite.engine import (
    BlockManager,
    FinishReason,
    Request,
    SamplingParams,
    inflight_engine,
    paged_engine,
    static_engine,
)
from perfsuite.engine.fake_runner import FakeRunner, fake_reference
from perfsuite.engine.sequence import SequenceStatus

VOCAB = 53
EOS = 7
MAX_SEQ_LEN = 24
REQUEST_ARGS = {
    "prompt": st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12),
    "max_new_tokens": st.integers(1, 12),
    "ignore_eos": st.booleans(),
}


def small_paged_engine(runner, batch_size, prefill_batch_size, max_num_batched_tokens, kv_block_size, num_kv_tokens,
                       enable_prefix_caching=False):  # fmt: skip
    return paged_engine(
        runner,
        decode_batch_size=batch_size,
        prefill_batch_size=min(prefill_batch_size, batch_size),
        max_num_batched_tokens=max_num_batched_tokens,
        max_seq_len=MAX_SEQ_LEN,
        eos_token_id=EOS,
        num_kv_blocks=-(-num_kv_tokens // kv_block_size),
        kv_block_size=kv_block_size,
        enable_prefix_caching=enable_prefix_caching,
    )


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        policy=st.sampled_from(["static", "inflight", "paged", "paged"]),  # paged twice: preemption needs examples
        batch_size=st.integers(1, 4),
        prefill_batch_size=st.integers(1, 4),
        max_num_batched_tokens=st.integers(1, 30),
        kv_block_size=st.integers(1, 6),
        num_kv_tokens=st.integers(8, MAX_SEQ_LEN),
        initial_requests=st.lists(st.tuples(*REQUEST_ARGS.values()), max_size=6),
    )
    def build(
        self, policy, batch_size, prefill_batch_size, max_num_batched_tokens, kv_block_size, num_kv_tokens,
        initial_requests,
    ):
        # A pool of about one request (8 to 24 tokens; a request is 2 to 24): a second running request soon
        # needs a preemption, and a request larger than the pool must be refused when it is added.
        self.runner = FakeRunner(VOCAB)
        self.num_preemptions = 0
        if policy == "paged":
            engine = small_paged_engine(self.runner, batch_size, prefill_batch_size, max_num_batched_tokens,
                                        kv_block_size, num_kv_tokens)  # fmt: skip
            self._start(engine, max_num_batched_tokens)
        elif policy == "static":
            self._start(static_engine(self.runner, batch_size=batch_size, max_seq_len=MAX_SEQ_LEN, eos_token_id=EOS))
        else:
            engine = inflight_engine(
                self.runner,
                decode_batch_size=batch_size,
                prefill_batch_size=min(prefill_batch_size, batch_size),
                max_num_batched_tokens=max_num_batched_tokens,
                max_seq_len=MAX_SEQ_LEN,
                eos_token_id=EOS,
            )
            self._start(engine, max_num_batched_tokens)
        for request_args in initial_requests:  # a queue from the start, so pools fill and preempt
            self._add(*request_args)

    def _start(self, engine, max_num_batched_tokens: int | None = None) -> None:
        self.engine = engine
        self.max_num_batched_tokens = max_num_batched_tokens
        self.scheduler = self.engine.scheduler
        self.kv = self.scheduler.kv_cache
        self.requests: dict[str, Request] = {}
        self.aborted: set[str] = set()
        self.outputs: dict[str, list[int]] = {}
        self.finish: dict[str, FinishReason] = {}

    @rule(**REQUEST_ARGS)
    def add(self, prompt, max_new_tokens, ignore_eos):
        self._add(prompt, max_new_tokens, ignore_eos)

    def _add(self, prompt, max_new_tokens, ignore_eos):
        request = Request(f"r{len(self.requests)}", tuple(prompt), SamplingParams(max_new_tokens, ignore_eos=ignore_eos))
        if request.max_total_tokens > MAX_SEQ_LEN or not self._fits_the_pool(request):
            try:
                self.engine.add_request(request)
            except ValueError as error:
                assert "max_new_tokens" in str(error)
                return
            raise AssertionError("an over-long request was accepted")
        self.engine.add_request(request)
        self.requests[request.request_id] = request
        self.outputs[request.request_id] = []

    @precondition(lambda self: self.engine.has_unfinished_requests())
    @rule()
    def step(self):
        output = self.scheduler.schedule()
        if self.max_num_batched_tokens is not None:
            assert output.num_scheduled_tokens <= self.max_num_batched_tokens
        sampled = self.runner.execute(output, self.engine.kv_cache)
        self.num_preemptions += len(output.preempted_request_ids)
        assert len(set(output.preempted_request_ids)) == len(output.preempted_request_ids)
        assert not set(output.preempted_request_ids) & {c.request_id for c in output.chunks}
        for step_output in self.scheduler.update_from_output(output, sampled):
            self.outputs[step_output.request_id].append(step_output.token_id)
            if step_output.finished:
                self.finish[step_output.request_id] = step_output.finish_reason
        assert not output.is_empty, "a step with unfinished requests scheduled nothing"

    @precondition(lambda self: any(self.scheduler.is_active(r) for r in self.requests))
    @rule(data=st.data())
    def abort(self, data):
        active = sorted(r for r in self.requests if self.scheduler.is_active(r))
        request_id = data.draw(st.sampled_from(active))
        assert self.scheduler.abort_request(request_id) is True
        self.aborted.add(request_id)
        self.finish[request_id] = FinishReason.ABORT

    def _fits_the_pool(self, request):
        return not isinstance(self.kv, BlockManager) or self.kv.fits(request.max_total_tokens)

    @invariant()
    def no_slot_leaked(self):
        holders = {s.request_id for s in self.scheduler.running if s.slot is not None}
        assert set(self.kv.owners()) == holders
        if isinstance(self.kv, BlockManager):
            return
        assert self.kv.num_free_slots + self.kv.num_used_slots == self.kv.num_slots
        assert sorted(self.kv.owners().values()) == sorted(set(self.kv.owners().values()))

    @invariant()
    def every_block_is_free_or_in_exactly_one_table(self):
        if not isinstance(self.kv, BlockManager):
            return
        tables = self.kv.owners()
        used = [block for table in tables.values() for block in table]
        assert len(used) == len(set(used)), f"a block in two tables: {tables}"
        assert self.kv.num_free_blocks + len(used) == self.kv.num_blocks
        assert self.kv.num_used_blocks == len(used)
        for sequence in self.scheduler.running:
            # a running request's table holds its computed tokens, and no more blocks than they need plus a step's
            table = tables[sequence.request_id]
            assert len(table) >= self.kv.num_blocks_for(sequence.num_computed_tokens)
            assert len(table) <= self.kv.num_blocks_for(sequence.num_tokens)
        for sequence in self.scheduler.waiting:
            assert sequence.request_id not in tables and sequence.num_computed_tokens == 0

    @invariant()
    def running_within_limit(self):
        assert len(self.scheduler.running) <= self.engine.batch_size

    @invariant()
    def nobody_both_waiting_and_running(self):
        waiting = {s.request_id for s in self.scheduler.waiting}
        running = {s.request_id for s in self.scheduler.running if not s.is_finished}
        assert not waiting & running
        assert all(s.status is SequenceStatus.WAITING for s in self.scheduler.waiting)

    @invariant()
    def no_request_lost(self):
        waiting = {s.request_id for s in self.scheduler.waiting}
        running = {s.request_id for s in self.scheduler.running if not s.is_finished}
        for request_id in self.requests:
            places = (request_id in waiting) + (request_id in running) + (request_id in self.finish)
            assert places == 1, f"{request_id} is in {places} places"

    @invariant()
    def finished_outputs_match_the_reference(self):
        for request_id, reason in self.finish.items():
            if reason is FinishReason.ABORT:
                continue
            request = self.requests[request_id]
            expected = fake_reference(request.prompt_token_ids, request.sampling_params, EOS, VOCAB)
            assert tuple(self.outputs[request_id]) == expected
            if request.sampling_params.ignore_eos:
                assert len(expected) == request.sampling_params.max_new_tokens

    def teardown(self):
        if not hasattr(self, "engine"):
            return
        for _ in range(1_000):
            if not self.engine.has_unfinished_requests():
                break
            self.step()
        assert self.kv.num_used_blocks == 0, "KV still held after every request finished"
        assert set(self.finish) == set(self.requests)
        if isinstance(self.kv, BlockManager):
            event(f"paged: preempted {'some' if self.num_preemptions else 'none'}")


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(max_examples=150, stateful_step_count=40)


# -- prefix caching ------------------------------------------------------------------------------------------------

STEM_TOKENS = st.lists(st.integers(0, VOCAB - 1), min_size=4, max_size=10)
SHARING_REQUEST_ARGS = {
    "stem_index": st.integers(0, 1),
    "shared_len": st.integers(0, 10),
    "suffix": st.lists(st.integers(0, VOCAB - 1), max_size=4),
    "max_new_tokens": st.integers(1, 8),
    "ignore_eos": st.booleans(),
}
class PrefixCacheMachine(SchedulerMachine):
    """The paged engine with prefix caching, on prompts cut from two shared stems.

    Every invariant of ``SchedulerMachine`` holds, except that a block may sit
    in several tables; in its place, after every rule:

    - each block's reference count is the number of tables that hold it (so
      never negative, and given back by every free and preemption);
    - a block held by a table is never evictable, and only a cached block is;
    - a block a request is still writing (at or past its computed tokens) is
      held by that request alone and is not cached: a block being written is
      never shared; a shared block is cached, full and computed by every holder;
    - every block is free, cached and evictable, or held, exactly one of these;
    - each step's admissions: the hit tokens are where their first chunks
      start, the queried tokens are their tokens, and queried - hit is what
      the runner is left to compute; a record's ``num_cached_tokens`` is its
      first admission's hit.

    It kills the mutants of tests/test_prefix_equivalence.py. Measured by
    applying each in turn (its seams there) under the ci profile with
    generation only, counting machine runs, invalid ones included, up to the
    first that failed: reuse of a partially filled block at run 5 (a block
    being written is cached); eviction of a referenced block at run 9 (a
    held block is evictable); refcount not decremented on preemption at run
    16 (a step schedules nothing: the leaked blocks leave a lone request no
    room); hash without the parent at run 93 (the fake runner reads a block
    computed under another prefix).
    """

    @initialize(
        batch_size=st.integers(1, 4),
        prefill_batch_size=st.integers(1, 4),
        max_num_batched_tokens=st.integers(1, 16),
        kv_block_size=st.integers(1, 4),
        num_kv_tokens=st.integers(8, 16),
        stems=st.lists(STEM_TOKENS, min_size=2, max_size=2),
        initial_requests=st.lists(st.tuples(*SHARING_REQUEST_ARGS.values()), min_size=1, max_size=6),
    )
    def build(self, batch_size, prefill_batch_size, max_num_batched_tokens, kv_block_size, num_kv_tokens, stems,
              initial_requests):  # fmt: skip
        self.runner = FakeRunner(VOCAB)
        self.num_preemptions = 0
        engine = small_paged_engine(self.runner, batch_size, prefill_batch_size, max_num_batched_tokens,
                                    kv_block_size, num_kv_tokens, enable_prefix_caching=True)  # fmt: skip
        self._start(engine, max_num_batched_tokens)
        self.stems = stems
        self.first_hits: dict[str, int] = {}
        self.num_hit_tokens = 0
        for request_args in initial_requests:
            self.add(*request_args)

    @rule(**SHARING_REQUEST_ARGS)
    def add(self, stem_index, shared_len, suffix, max_new_tokens, ignore_eos):
        prompt = [*self.stems[stem_index][:shared_len], *suffix] or [0]
        self._add(prompt, max_new_tokens, ignore_eos)

    @precondition(lambda self: self.engine.has_unfinished_requests())
    @rule()
    def step(self):
        waiting = {sequence.request_id: sequence for sequence in self.scheduler.waiting}
        output = self.scheduler.schedule()
        admitted = [(chunk, waiting[chunk.request_id]) for chunk in output.chunks if chunk.request_id in waiting]
        assert output.num_prefix_cache_hit_tokens == sum(chunk.start_position for chunk, _ in admitted)
        assert output.num_prefix_cache_queried_tokens == sum(sequence.num_tokens for _, sequence in admitted)
        for chunk, sequence in admitted:
            assert chunk.start_position % self.kv.block_size == 0 and chunk.start_position < sequence.num_tokens
            assert sequence.num_tokens - chunk.start_position == sequence.num_uncomputed_tokens
            self.first_hits.setdefault(sequence.request_id, chunk.start_position)
            assert sequence.num_cached_tokens == self.first_hits[sequence.request_id]
        self.num_hit_tokens += output.num_prefix_cache_hit_tokens
        sampled = self.runner.execute(output, self.engine.kv_cache)
        self.num_preemptions += len(output.preempted_request_ids)
        for step_output in self.scheduler.update_from_output(output, sampled):
            self.outputs[step_output.request_id].append(step_output.token_id)
            if step_output.finished:
                self.finish[step_output.request_id] = step_output.finish_reason
        assert not output.is_empty, "a step with unfinished requests scheduled nothing"

    @invariant()
    def every_block_is_free_or_in_exactly_one_table(self):
        """Replaced: blocks are shared here (``blocks_are_counted_shared_only_when_full_and_never_evicted_held``)."""

    @invariant()
    def blocks_are_counted_shared_only_when_full_and_never_evicted_held(self):
        tables = self.kv.owners()
        holders: dict[int, list[str]] = {}
        for request_id, table in tables.items():
            for block in table:
                holders.setdefault(block, []).append(request_id)
        for block in range(self.kv.num_blocks):
            assert self.kv.ref_count(block) == len(holders.get(block, ())), f"block {block}: wrong reference count"
        evictable = set(self.kv.evictable_blocks())
        free = self.kv.free_block_ids()
        assert not evictable & set(holders), "a held block is evictable"
        assert not free & (evictable | set(holders)), "a free block is also evictable or held"
        assert len(free) + len(evictable) + len(holders) == self.kv.num_blocks, "a block is lost"
        assert all(self.kv.is_cached(block) for block in evictable)
        assert self.kv.num_used_blocks == len(holders)
        sequences = {s.request_id: s for s in self.scheduler.running}
        for request_id, table in tables.items():
            num_computed_blocks = sequences[request_id].num_computed_tokens // self.kv.block_size
            for block in table[num_computed_blocks:]:  # still being written
                assert holders[block] == [request_id], f"block {block} is shared while {request_id} writes it"
                assert not self.kv.is_cached(block), f"block {block} is cached while {request_id} writes it"
        for block, owners in holders.items():
            if len(owners) > 1:
                assert self.kv.is_cached(block)
        for sequence in self.scheduler.waiting:
            assert sequence.request_id not in tables and sequence.num_computed_tokens == 0

    def teardown(self):
        if not hasattr(self, "engine"):
            return
        super().teardown()
        assert self.kv.num_free_blocks == self.kv.num_blocks
        event(f"paged-prefix: hits {'some' if self.num_hit_tokens else 'none'}")
        event(f"paged-prefix: evicted {'some' if self.kv.num_evicted_blocks else 'none'}")


TestPrefixCache = PrefixCacheMachine.TestCase
TestPrefixCache.settings = settings(max_examples=60, stateful_step_count=30)
