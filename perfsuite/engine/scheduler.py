"""Scheduling policies: which tokens of which requests the next step computes.

Pure Python, no torch. The interface follows vLLM v1: ``add_request``,
``schedule() -> SchedulerOutput`` and ``update_from_output``. There is no
separate prefill phase: each request has ``num_computed_tokens`` and a step
gives it a number of tokens, so chunked prefill falls out of the token budget.

Static and in-flight batching differ only in ``schedule``; everything else
(validation, stop rules, slot release) is shared so that comparing the two
engines compares batching and nothing else.
"""

from __future__ import annotations

import abc
import operator
from collections import deque
from collections.abc import Sequence as Seq
from typing import Generic, Protocol, TypeVar

from perfsuite.engine.kv_cache import KVCacheManager
from perfsuite.engine.sequence import Sequence, SequenceStatus
from perfsuite.engine.types import (
    FinishReason,
    Request,
    ScheduledChunk,
    SchedulerOutput,
    StepOutput,
    check_new_request_id,
)


class KVAccounting(Protocol):
    """What the shared bookkeeping reads of its KV manager: a slot ``KVCacheManager`` or a paged ``BlockManager``."""

    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def num_used_blocks(self) -> int: ...
    def free(self, request_id: str) -> None: ...


KV = TypeVar("KV", bound=KVAccounting)


class Scheduler(abc.ABC, Generic[KV]):
    """Shared request bookkeeping; subclasses decide what each step computes, over their own kind of KV manager."""

    def __init__(self, kv_cache: KV, eos_token_id: int | None) -> None:
        self.kv_cache = kv_cache
        self.eos_token_id = eos_token_id
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._active: dict[str, Sequence] = {}

    # -- requests in and out ------------------------------------------------

    def add_request(self, request: Request) -> None:
        self._validate(request)
        sequence = Sequence(request)
        self._active[request.request_id] = sequence
        self.waiting.append(sequence)

    def abort_request(self, request_id: str) -> bool:
        """Stop a request wherever it is and release its slot; False when the id is not active."""
        sequence = self._active.get(request_id)
        if sequence is None:
            return False
        if sequence.status is SequenceStatus.WAITING:
            self.waiting.remove(sequence)
        self._finish(sequence, FinishReason.ABORT)
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting) or any(not s.is_finished for s in self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return sum(1 for s in self.running if not s.is_finished)

    def is_active(self, request_id: str) -> bool:
        return request_id in self._active

    def num_cached_tokens(self, request_id: str) -> int:
        """Prompt tokens of an active request that a prefix cache held at its first admission (0 without one)."""
        return self._active[request_id].num_cached_tokens or 0

    @property
    @abc.abstractmethod
    def max_seq_len(self) -> int:
        """The longest prompt + output a request may ask for."""

    @property
    @abc.abstractmethod
    def max_num_running(self) -> int:
        """The most requests that run at once (the engine's batch size)."""

    # -- one step -----------------------------------------------------------

    @abc.abstractmethod
    def schedule(self) -> SchedulerOutput: ...

    def update_from_output(self, output: SchedulerOutput, sampled_token_ids: Seq[int]) -> list[StepOutput]:
        """Apply a step's results: one sampled token per chunk with ``samples``."""
        sampling_chunks = [c for c in output.chunks if c.samples]
        if len(sampled_token_ids) != len(sampling_chunks):
            raise RuntimeError(
                f"runner returned {len(sampled_token_ids)} tokens for {len(sampling_chunks)} sampling chunks"
            )
        for chunk in output.chunks:
            sequence = self._active.get(chunk.request_id)
            if sequence is not None and not chunk.is_padding:
                sequence.num_computed_tokens += chunk.num_tokens
                self._on_computed(sequence)
        step_outputs = []
        for chunk, token_id in zip(sampling_chunks, sampled_token_ids, strict=True):
            sequence = self._active.get(chunk.request_id)
            if sequence is None:  # aborted while its step was running
                continue
            token_id = _sampled_token_id(token_id, chunk.request_id)
            reason = sequence.append_token(token_id, self.eos_token_id)
            if reason is not None:
                self._finish(sequence, reason)
            step_outputs.append(StepOutput(chunk.request_id, token_id, reason))
        return step_outputs

    def check_request(self, request: Request) -> None:
        """Raise the ``ValueError`` that ``add_request`` would raise for ``request``, queueing nothing."""
        self._validate(request)

    # -- shared helpers -----------------------------------------------------

    def _validate(self, request: Request) -> None:
        check_new_request_id(request.request_id, self._active, "is already in use by an unfinished request")
        request.check_fits(self.max_seq_len)

    def _chunk_for(self, sequence: Sequence, max_tokens: int) -> ScheduledChunk:
        """The next ``<= max_tokens`` uncomputed tokens of ``sequence``.

        Uncomputed tokens are the rest of the prompt, the last sampled token
        (a decode), or after a preemption the prompt and the output so far.
        Only the last sampled token alone is a decode; anything else fills
        the cache as a prefill does.
        """
        start = sequence.num_computed_tokens
        stop = min(sequence.num_tokens, start + max_tokens)
        is_decode = start == sequence.num_tokens - 1 and start >= sequence.num_prompt_tokens
        slot = sequence.slot
        assert slot is not None, "a scheduled sequence holds a slot (a row of a paged cache)"
        return ScheduledChunk(
            request_id=sequence.request_id,
            slot=slot,
            token_ids=sequence.token_ids(start, stop),
            start_position=start,
            samples=stop == sequence.num_tokens,
            is_prefill=not is_decode,
            block_table=self._block_table(sequence),
        )

    def _block_table(self, sequence: Sequence) -> tuple[int, ...]:
        """The blocks a chunk of ``sequence`` attends through; a slot cache has none."""
        return ()

    def _output(
        self, chunks: list[ScheduledChunk], preempted_request_ids: tuple[str, ...] = (), num_recomputed_tokens: int = 0
    ) -> SchedulerOutput:
        """The step's chunks, and the KV cache as it will be once they are computed."""
        num_new_tokens = sum(chunk.num_tokens for chunk in chunks if not chunk.is_padding)
        num_blocks_used = self.kv_cache.num_used_blocks
        return SchedulerOutput(
            tuple(chunks),
            num_waiting=len(self.waiting),
            num_running=self.num_running,
            num_kv_blocks_used=num_blocks_used,
            num_kv_tokens_used=num_new_tokens + sum(s.num_computed_tokens for s in self.running),
            kv_token_capacity=num_blocks_used * self.kv_cache.block_size,
            preempted_request_ids=preempted_request_ids,
            num_recomputed_tokens=num_recomputed_tokens,
        )

    def _finish(self, sequence: Sequence, reason: FinishReason) -> None:
        sequence.status = SequenceStatus.FINISHED
        sequence.finish_reason = reason
        del self._active[sequence.request_id]
        self._on_finished(sequence)

    def _release(self, sequence: Sequence) -> None:
        if sequence.slot is not None:
            self.kv_cache.free(sequence.request_id)
            sequence.slot = None
        if sequence in self.running:
            self.running.remove(sequence)

    def _on_computed(self, sequence: Sequence) -> None:
        """A step computed more of ``sequence``'s tokens (the paged engine caches its full blocks then)."""

    @abc.abstractmethod
    def _on_finished(self, sequence: Sequence) -> None: ...


class SlotScheduler(Scheduler[KVCacheManager]):
    """A scheduler over a slot cache: a request holds one slot of ``max_seq_len`` tokens while it runs."""

    @property
    def max_seq_len(self) -> int:
        return self.kv_cache.max_seq_len

    def _admit(self, sequence: Sequence) -> None:
        sequence.slot = self.kv_cache.allocate(sequence.request_id, sequence.request.max_total_tokens)
        sequence.status = SequenceStatus.RUNNING
        self.running.append(sequence)


class StaticScheduler(SlotScheduler):
    """Classic static batching.

    When no batch is running it admits up to ``batch_size`` waiting requests
    (whatever is there; it does not wait to fill the batch) and runs them until
    every one has finished. A finished request keeps its slot and is computed
    as a padding row, as ``generate`` does with a finished sequence, until the
    whole batch is done: that idle slot time is what static batching costs.
    """

    def __init__(self, kv_cache: KVCacheManager, eos_token_id: int | None, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if batch_size > kv_cache.num_slots:
            raise ValueError(f"batch_size {batch_size} exceeds the KV cache's {kv_cache.num_slots} slots")
        super().__init__(kv_cache, eos_token_id)
        self.batch_size = batch_size

    @property
    def max_num_running(self) -> int:
        return self.batch_size

    def schedule(self) -> SchedulerOutput:
        if not self.running:
            while self.waiting and len(self.running) < self.batch_size:
                self._admit(self.waiting.popleft())
        chunks = []
        for sequence in self.running:
            if sequence.is_finished:
                chunks.append(self._padding_chunk(sequence))
            else:
                chunks.append(self._chunk_for(sequence, sequence.num_prompt_tokens))
        if all(c.is_padding for c in chunks):
            chunks = []
        return self._output(chunks)

    @staticmethod
    def _padding_chunk(sequence: Sequence) -> ScheduledChunk:
        # Recompute the last real position in place: the slot is owned and
        # finished, so overwriting its last cache entry harms nothing and the
        # row costs the same compute as a live decode row.
        last = sequence.num_tokens - 1
        assert sequence.slot is not None, "a finished sequence of a running static batch keeps its slot"
        return ScheduledChunk(
            request_id=sequence.request_id,
            slot=sequence.slot,
            token_ids=sequence.token_ids(last, last + 1),
            start_position=last,
            samples=False,
            is_prefill=False,
            is_padding=True,
        )

    def _on_finished(self, sequence: Sequence) -> None:
        if sequence.slot is None:
            return
        if all(s.is_finished for s in self.running):
            for done in list(self.running):
                self._release(done)


class InflightScheduler(SlotScheduler):
    """Continuous (in-flight) batching, first come, first served.

    Every step first continues the running requests in admission order (a
    decode token each, or the next chunk of an unfinished prefill), then admits
    waiting requests into free slots: at most ``prefill_batch_size`` new
    requests per step, at most ``decode_batch_size`` running at once, and never
    more than ``max_num_batched_tokens`` tokens in one step. A finished request
    frees its slot at once; the others keep their caches untouched.
    """

    def __init__(
        self,
        kv_cache: KVCacheManager,
        eos_token_id: int | None,
        *,
        decode_batch_size: int,
        prefill_batch_size: int | None = None,
        max_num_batched_tokens: int | None = None,
    ) -> None:
        prefill_batch_size = decode_batch_size if prefill_batch_size is None else prefill_batch_size
        max_num_batched_tokens = (
            decode_batch_size * kv_cache.max_seq_len if max_num_batched_tokens is None else max_num_batched_tokens
        )
        for name, value in (
            ("decode_batch_size", decode_batch_size),
            ("prefill_batch_size", prefill_batch_size),
            ("max_num_batched_tokens", max_num_batched_tokens),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if decode_batch_size > kv_cache.num_slots:
            raise ValueError(
                f"decode_batch_size {decode_batch_size} exceeds the KV cache's {kv_cache.num_slots} slots; "
                "build the runner with more slots"
            )
        super().__init__(kv_cache, eos_token_id)
        self.decode_batch_size = decode_batch_size
        self.prefill_batch_size = prefill_batch_size
        self.max_num_batched_tokens = max_num_batched_tokens

    @property
    def max_num_running(self) -> int:
        return self.decode_batch_size

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        chunks = []
        for sequence in self.running:
            if budget == 0:
                break
            chunk = self._chunk_for(sequence, budget)
            chunks.append(chunk)
            budget -= chunk.num_tokens
        num_admitted = 0
        while (
            self.waiting
            and budget > 0
            and num_admitted < self.prefill_batch_size
            and len(self.running) < self.decode_batch_size
            and self.kv_cache.can_allocate(self.waiting[0].request.max_total_tokens)
        ):
            sequence = self.waiting.popleft()
            self._admit(sequence)
            chunk = self._chunk_for(sequence, budget)
            chunks.append(chunk)
            budget -= chunk.num_tokens
            num_admitted += 1
        output = self._output(chunks)
        assert output.num_scheduled_tokens <= self.max_num_batched_tokens
        assert len(self.running) <= self.decode_batch_size
        return output

    def _on_finished(self, sequence: Sequence) -> None:
        self._release(sequence)


def _sampled_token_id(value: object, request_id: str) -> int:
    """The runner's token id for ``request_id`` as an int; a float (even 5.0) or a negative id is the runner's bug.

    ``int()`` would truncate 47.9 to 47 and hide a runner that samples from the wrong tensor.
    """
    try:
        token_id = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise RuntimeError(
            f"runner returned token id {value!r} ({type(value).__name__}) for request {request_id!r}; "
            "a runner's execute() returns one integer token id per sampling chunk (e.g. tensor.tolist() of an "
            "integer tensor, or argmax(...).tolist())"
        ) from None
    if token_id < 0:
        raise RuntimeError(f"runner returned token id {token_id} for request {request_id!r}; token ids are >= 0")
    return token_id
