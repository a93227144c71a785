"""In-flight batching over a paged KV cache, with preemption (vLLM v1's policy).

The slot engine (``InflightScheduler``, engine ``inflight``) reserves a
request's whole ``max_seq_len`` before it runs. This one (engine ``paged``)
gives a request blocks only as its tokens need them, so at the same KV
memory more requests run at once; the price is that memory can run out
mid-flight, and then the newest running request is preempted: its blocks
are freed, it goes back to the front of the queue, and when it runs again
its prompt and the tokens it had generated are computed again as one
prefill (the generated tokens are kept, not sampled again).

Why a separate engine and not the slot engine replaced by paged with
``block_size = max_seq_len``: the stored baselines and A/B runs of
``inflight`` measure the slot cache and its static decode and CUDA graph
paths, which attend over a slot's fixed shape; keeping it lets them stay
comparable, and the benchmark compares slots and pages at the same memory
in one run. Static batching is unchanged.

Pure Python, no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from perfsuite.engine.block_manager import BlockManager
from perfsuite.engine.free_ids import FreeIds
from perfsuite.engine.scheduler import Scheduler
from perfsuite.engine.sequence import Sequence, SequenceStatus
from perfsuite.engine.types import Request, ScheduledChunk, SchedulerOutput


class PagedScheduler(Scheduler[BlockManager]):
    """Continuous batching, first come first served, admitted by free blocks.

    Each step continues the running requests oldest first, growing each one's
    block table for the tokens it computes; when a table cannot grow, the
    newest running request is preempted until it can (the request itself,
    when it is the newest). Then, unless the step preempted, waiting requests
    are admitted while their first chunk's blocks fit with a watermark of
    free blocks left over (``num_watermark_blocks``, below). As for the slot
    engine: at most ``prefill_batch_size`` admissions per step,
    ``decode_batch_size`` running requests and ``max_num_batched_tokens``
    tokens per step. A request that could not fit the whole pool on its own
    is refused when it is added.

    **Admission watermark** (vLLM's ``BlockSpaceManager`` watermark, against
    thrashing). Admitting whenever a prompt's blocks fit runs the pool full:
    the next decode step needs a block for every running request whose last
    block just filled, none is free, and the newest is preempted, only to be
    readmitted into the blocks it freed and preempted again (on
    bench/batching.py's tiny-random run: 106 preemptions recomputing 55%
    extra tokens). So while others run, a request is admitted only if, after
    its blocks, at least ``num_watermark_blocks`` stay free:
    ``max(floor(watermark x num_blocks), num_running + 1)``. The second term
    is the running requests' next growth, the candidate included: a decode
    step adds one token per request, so at most one block each, and keeping
    that many free means the step after an admission cannot preempt for
    decode growth. The first is vLLM's default (``watermark=0.01``, 1% of the
    pool); it only binds for pools over a hundred blocks per running
    request. Preemption stays possible (requests keep growing past that one
    step) and is still how a full pool makes room. With nothing running the
    watermark is waived: the request fits the pool on its own (checked when
    it was added), and holding blocks back from it would only starve it.

    **Prefix caching** (engine ``paged-prefix``: a ``PrefixCachingBlockManager``,
    see ``perfsuite.engine.prefix_cache``). A request being admitted, new or
    readmitted after a preemption, first looks up the longest cached prefix of
    its full blocks, shares those blocks and starts its first chunk after
    them; the admission check and the watermark count only the blocks it
    takes from the free ones (evictable cached blocks count as free). Once a
    step has run, each request's newly computed full blocks are cached. The
    step's output counts the tokens looked up and found, and the cached
    blocks evicted. With a plain ``BlockManager`` nothing is found and
    nothing counted.

    **A prefix being computed is waited for** (cache-aware admission, as
    SGLang's scheduler favours cached prefixes). A block is shared only once
    the step that computed it has run, so a request admitted while another
    is still prefilling the same prefix would compute it a second time: on
    a shared-prefix workload whose groups arrive shuffled, that cost a fifth
    of the hits. So when the first block a waiting request would have to
    compute is one a running request is computing now, admission stops for
    this step (first come, first served: nobody overtakes it); the next step,
    or the one after the prefix's last chunk, finds it cached. This never
    stalls: the request computing it runs (its chunks come before any
    admission) or is preempted, and either way the wait ends.
    """

    def __init__(
        self,
        block_manager: BlockManager,
        eos_token_id: int | None,
        *,
        max_seq_len: int,
        decode_batch_size: int,
        prefill_batch_size: int | None = None,
        max_num_batched_tokens: int | None = None,
        watermark: float = 0.01,
    ) -> None:
        if not isinstance(watermark, (int, float)) or not 0 <= watermark < 1:
            raise ValueError(f"watermark must be a share of the pool in [0, 1), got {watermark!r}")
        prefill_batch_size = decode_batch_size if prefill_batch_size is None else prefill_batch_size
        if max_num_batched_tokens is None:
            max_num_batched_tokens = decode_batch_size * max_seq_len
        for name, value in (
            ("max_seq_len", max_seq_len),
            ("decode_batch_size", decode_batch_size),
            ("prefill_batch_size", prefill_batch_size),
            ("max_num_batched_tokens", max_num_batched_tokens),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        super().__init__(block_manager, eos_token_id)
        self._max_seq_len = max_seq_len
        self.decode_batch_size = decode_batch_size
        self.prefill_batch_size = prefill_batch_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.watermark = watermark
        self._free_rows = FreeIds(decode_batch_size)  # timeline lanes for running requests

    @property
    def max_seq_len(self) -> int:
        return self._max_seq_len

    @property
    def max_num_running(self) -> int:
        return self.decode_batch_size

    @property
    def num_watermark_blocks(self) -> int:
        """Blocks admission leaves free while requests run: the pool's share, or the next step's growth."""
        return max(int(self.watermark * self.kv_cache.num_blocks), len(self.running) + 1)

    def _validate(self, request: Request) -> None:
        super()._validate(request)
        blocks = self.kv_cache
        if not blocks.fits(request.max_total_tokens):
            raise ValueError(
                f"request {request.request_id!r}: prompt + max_new_tokens = {request.max_total_tokens} tokens need "
                f"{blocks.num_blocks_for(request.max_total_tokens)} KV blocks of {blocks.block_size} tokens, more "
                f"than the whole pool of {blocks.num_blocks}; it could never run. Raise num_kv_blocks "
                "(--perf-kv-blocks), or shorten the prompt or max_new_tokens"
            )

    # -- one step -----------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[str] = []
        lookups = PrefixLookups()
        num_evicted_before = self.kv_cache.num_evicted_blocks
        index = 0
        while index < len(self.running) and budget > 0:
            sequence = self.running[index]
            num_tokens = min(sequence.num_uncomputed_tokens, budget)
            if not self._grow_or_preempt(sequence, sequence.num_computed_tokens + num_tokens, preempted):
                break  # it was the newest, so every request after it is preempted too
            chunks.append(self._chunk_for(sequence, budget))
            budget -= num_tokens
            index += 1
        if not preempted:  # as vLLM v1: memory just ran out, so admitting more would only preempt again
            budget = self._admit_waiting(chunks, budget, lookups)
        output = dataclasses.replace(
            self._output(chunks, tuple(preempted), sum(map(_num_recomputed, chunks, self._sequences(chunks)))),
            num_prefix_cache_queried_tokens=lookups.num_queried_tokens,
            num_prefix_cache_hit_tokens=lookups.num_hit_tokens,
            num_evicted_blocks=self.kv_cache.num_evicted_blocks - num_evicted_before,
        )
        assert output.num_scheduled_tokens <= self.max_num_batched_tokens
        assert len(self.running) <= self.decode_batch_size
        return output

    def _admit_waiting(self, chunks: list[ScheduledChunk], budget: int, lookups: PrefixLookups) -> int:
        num_admitted = 0
        while (
            self.waiting
            and budget > 0
            and num_admitted < self.prefill_batch_size
            and len(self.running) < self.decode_batch_size
        ):
            sequence = self.waiting[0]
            cached_blocks = self.kv_cache.cached_prefix(sequence.all_token_ids)
            if self.kv_cache.has_prefix_cache and self._computing(sequence, len(cached_blocks)):
                break
            num_cached_tokens = len(cached_blocks) * self.kv_cache.block_size
            num_new_tokens = min(sequence.num_tokens - num_cached_tokens, budget)
            if not self._can_admit(num_cached_tokens + num_new_tokens, cached_blocks):
                break
            self.waiting.popleft()
            self._admit_with(sequence, num_cached_tokens + num_new_tokens, cached_blocks)
            sequence.num_computed_tokens = num_cached_tokens
            if self.kv_cache.has_prefix_cache:
                lookups.add(sequence.num_tokens, num_cached_tokens)
            if sequence.num_cached_tokens is None:  # a readmission after preemption keeps its first admission's
                sequence.num_cached_tokens = num_cached_tokens
            chunks.append(self._chunk_for(sequence, budget))
            budget -= num_new_tokens
            num_admitted += 1
        return budget

    def _computing(self, sequence: Sequence, num_cached_blocks: int) -> bool:
        """Whether the block after ``sequence``'s cached prefix is being computed by a running request."""
        block_size = self.kv_cache.block_size
        wanted = self.kv_cache.full_block_hashes(sequence.all_token_ids, num_cached_blocks, num_cached_blocks + 1)
        if not wanted or (num_cached_blocks + 1) * block_size > sequence.num_tokens - 1:
            return False  # no full block left to share: one token short of all, as a lookup is
        index = num_cached_blocks
        return any(
            running.num_computed_tokens // block_size <= index < running.num_tokens // block_size
            and self.kv_cache.full_block_hashes(running.all_token_ids, index, index + 1) == wanted
            for running in self.running
        )

    def _can_admit(self, num_tokens: int, cached_blocks: tuple[int, ...]) -> bool:
        if not self.running:
            return self.kv_cache.can_allocate(num_tokens, cached_blocks)
        num_left = self.kv_cache.num_free_blocks - self.kv_cache.num_blocks_taken(num_tokens, cached_blocks)
        return num_left >= self.num_watermark_blocks

    def _grow_or_preempt(self, sequence: Sequence, num_tokens: int, preempted: list[str]) -> bool:
        """Grow ``sequence``'s table to ``num_tokens`` tokens, preempting the newest until it fits.

        False when ``sequence`` itself had to be preempted.
        """
        while not self.kv_cache.can_append(sequence.request_id, num_tokens):
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is sequence:
                return False
        self.kv_cache.append_slots(sequence.request_id, num_tokens)
        return True

    def _preempt(self, sequence: Sequence) -> None:
        self._release(sequence)
        sequence.num_previously_computed_tokens = max(
            sequence.num_previously_computed_tokens, sequence.num_computed_tokens
        )
        sequence.num_computed_tokens = 0
        sequence.status = SequenceStatus.WAITING
        self.waiting.appendleft(sequence)

    def _sequences(self, chunks: list[ScheduledChunk]) -> list[Sequence]:
        return [self._active[chunk.request_id] for chunk in chunks]

    # -- blocks and rows ----------------------------------------------------

    def _admit_with(self, sequence: Sequence, num_tokens: int, cached_blocks: tuple[int, ...]) -> None:
        self.kv_cache.allocate(sequence.request_id, num_tokens, cached_blocks)
        sequence.slot = self._free_rows.pop()
        sequence.status = SequenceStatus.RUNNING
        self.running.append(sequence)

    def _block_table(self, sequence: Sequence) -> tuple[int, ...]:
        return self.kv_cache.block_table(sequence.request_id)

    def _release(self, sequence: Sequence) -> None:
        if sequence.slot is not None:
            self.kv_cache.free(sequence.request_id)
            self._free_rows.push(sequence.slot)
            sequence.slot = None
        if sequence in self.running:
            self.running.remove(sequence)

    def _on_computed(self, sequence: Sequence) -> None:
        # After the step, not when it is scheduled: a block becomes shareable once its KV is written.
        self.kv_cache.cache_computed_blocks(sequence.request_id, sequence.all_token_ids, sequence.num_computed_tokens)

    def _on_finished(self, sequence: Sequence) -> None:
        self._release(sequence)


@dataclass(slots=True)
class PrefixLookups:
    """One step's admissions: prompt tokens looked up in the prefix cache, and those found there."""

    num_queried_tokens: int = 0
    num_hit_tokens: int = 0

    def add(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        self.num_queried_tokens += num_queried_tokens
        self.num_hit_tokens += num_hit_tokens


def _num_recomputed(chunk: ScheduledChunk, sequence: Sequence) -> int:
    """Tokens of ``chunk`` that the sequence had computed before it was preempted."""
    return max(
        0, min(chunk.start_position + chunk.num_tokens, sequence.num_previously_computed_tokens) - chunk.start_position
    )
