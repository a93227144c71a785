"""The engine loop: schedule, run the model, apply the results, record times.

The engine records monotonic timestamps and nothing else; latencies and
throughput are computed later from ``RunResult`` by ``perfsuite.measure.metrics``.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from perfsuite.engine.admission import ArrivalQueue, RecordBuilder
from perfsuite.engine.block_manager import BlockManager
from perfsuite.engine.kv_cache import KVCacheManager
from perfsuite.engine.kv_memory import KVSizing, check_kv_memory, default_paged_pool, paged_pool, slot_cache
from perfsuite.engine.names import INFLIGHT, PAGED, PAGED_PREFIX, STATIC
from perfsuite.engine.paged_scheduler import PagedScheduler
from perfsuite.engine.prefix_cache import PrefixCachingBlockManager
from perfsuite.engine.scheduler import InflightScheduler, Scheduler, StaticScheduler
from perfsuite.engine.types import (
    EngineCounters,
    FinishReason,
    Request,
    RequestRecord,
    RunResult,
    SchedulerOutput,
    StepOutput,
    StepTrace,
    check_new_request_id,
)
from perfsuite.engine.work import ModelShape, step_work

# Tokens per KV block of the paged engine (vLLM's default on GPU).
DEFAULT_KV_BLOCK_SIZE = 16


class Runner(Protocol):
    """What an engine needs from a model runner (the real one or a fake).

    ``new_paged_kv_cache`` is needed only by the paged engine. A runner that
    also has ``kv_layout`` (a ``KVLayout``) and ``device`` has every cache an
    engine asks of it checked against that device's memory first
    (``perfsuite.engine.kv_memory``); a fake without them is not checked. A
    runner that also has ``with_paged_decode(kv_cache, *, max_num_seqs,
    max_seq_len)`` is handed the paged engine's pool and limits once, at
    build, and the engine keeps the pool it returns (``ModelRunner`` captures
    its decode steps there).
    """

    def new_kv_cache(self, num_slots: int, max_seq_len: int) -> Any: ...

    def new_paged_kv_cache(self, num_blocks: int, block_size: int) -> Any: ...

    def execute(self, output: SchedulerOutput, kv_cache: Any) -> list[int]: ...


class Engine:
    """One scheduler over one runner and a KV cache that the engine owns."""

    greedy_equal = True  # held to it by tests/test_equivalence.py
    resolves_follow_ups = True  # Engine.run feeds a finished turn's output to the next (multi-turn workloads)

    def __init__(
        self,
        name: str,
        runner: Runner,
        scheduler: Scheduler,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.name = name
        self.runner = runner
        self.scheduler = scheduler
        kv = scheduler.kv_cache
        self.kv_cache: Any  # the runner's: slots, or a block pool
        if isinstance(kv, BlockManager):
            self.kv_cache = runner.new_paged_kv_cache(kv.num_blocks, kv.block_size)
            with_paged_decode = getattr(runner, "with_paged_decode", None)
            if with_paged_decode is not None:
                self.kv_cache = with_paged_decode(
                    self.kv_cache, max_num_seqs=scheduler.max_num_running, max_seq_len=scheduler.max_seq_len
                )
        else:
            self.kv_cache = runner.new_kv_cache(kv.num_slots, kv.max_seq_len)
        self._clock = clock
        self._sleep = sleep
        # A runner that says its model's shape (ModelRunner) has every step's FLOPs and bytes counted.
        self._model_shape: ModelShape | None = getattr(runner, "model_shape", None)
        self._reset_accounting()

    def _reset_accounting(self) -> None:
        self._records: dict[str, RecordBuilder] = {}
        self._counters = EngineCounters()
        self._steps: deque[StepTrace] = deque()

    @property
    def batch_size(self) -> int:
        return self.scheduler.max_num_running

    @property
    def max_seq_len(self) -> int:
        return self.scheduler.max_seq_len

    @property
    def attention(self) -> str | None:
        """How the engine's decode attends: "in place" or "gather", as its runner says; None where that is not
        recorded.

        The two paths are the same outputs at different speeds, so a stored run
        records which one it measured (``PerfRecorder``): a runner that cannot
        build the kernel (no C compiler) is never judged against one that could.
        A paged engine records both. A slot engine (static, in-flight) records
        only "gather": its runs from before its decode read the slots in place
        recorded nothing, and stay comparable with the in-place ones (the
        change is a speed-up a baseline should see).
        """
        path = getattr(self.runner, "paged_attention", None)
        if path is None:
            return None
        kind = path.partition(":")[0]
        return kind if isinstance(self.scheduler.kv_cache, BlockManager) or kind == "gather" else None

    @property
    def attention_fallback(self) -> str | None:
        """Why the engine's decode gathers though its runner wanted the kernel, and the fix (``ModelRunner``)."""
        return getattr(self.runner, "paged_attention_fallback", None)

    @property
    def batch_invariant(self) -> bool:
        """Whether a request's outputs are the same bits whatever else is in its batch (its runner's mode)."""
        return bool(getattr(self.runner, "batch_invariant", False))

    @property
    def counters(self) -> EngineCounters:
        """Counted since the last ``run`` started, or since ``forget_finished`` last found nothing in flight."""
        return self._counters

    # -- requests -----------------------------------------------------------

    def add_request(self, request: Request, arrival_time: float | None = None) -> None:
        """Queue a request; bad input raises ``ValueError`` and changes nothing."""
        check_new_request_id(request.request_id, self._records, "was already used in this run")
        self.scheduler.add_request(request)
        arrival = self._clock() if arrival_time is None else arrival_time
        self._records[request.request_id] = RecordBuilder(request, arrival)

    def abort_request(self, request_id: str) -> bool:
        """Stop a request wherever it is; False when it is not in flight."""
        if not self.scheduler.abort_request(request_id):
            return False
        self._records[request_id].finish(FinishReason.ABORT, self._clock())
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def forget_finished(self) -> list[RequestRecord]:
        """Return the records of finished and aborted requests, and drop them.

        A long-lived caller (a server) that never starts a ``run`` calls this
        after every step to keep its memory flat, even under a load that never
        lets the engine go idle: the step traces that ended before the oldest
        request still in flight arrived are dropped too, so what is kept spans
        the lifetime of the requests in flight. Once no request is left in
        flight, the counters and step traces start over, as a new run would
        start them.
        """
        finished_ids = [rid for rid, builder in self._records.items() if builder.is_finished]
        records = [self._records.pop(rid).build() for rid in finished_ids]
        if not self._records:
            self._reset_accounting()
        else:
            self._drop_steps_before(min(builder.arrival_time for builder in self._records.values()))
        return records

    def _drop_steps_before(self, oldest_arrival: float) -> None:
        while self._steps and self._steps[0].end_time < oldest_arrival:
            self._steps.popleft()

    # -- the loop -----------------------------------------------------------

    def step(self) -> list[StepOutput]:
        output = self.scheduler.schedule()
        if output.is_empty:
            return []
        start = self._clock()
        for chunk in output.chunks:
            if not chunk.is_padding:  # a padding row's request has finished; its record may be handed out
                record = self._records[chunk.request_id]
                if record.first_scheduled_time is None:
                    record.scheduled_at(start, self.scheduler.num_cached_tokens(chunk.request_id))
        sampled = self.runner.execute(output, self.kv_cache)
        now = self._clock()
        step_outputs = self.scheduler.update_from_output(output, sampled)
        logprobs = getattr(self.runner, "last_logprobs", None)  # a ModelRunner(logprobs=True)'s, one per sample
        if logprobs is not None:
            step_outputs = _with_logprobs(output, step_outputs, logprobs)
        for step_output in step_outputs:
            self._records[step_output.request_id].add(step_output, now)
        work = None if self._model_shape is None else step_work(output.chunks, self._model_shape)
        self._counters = self._counters.plus(output, work)
        self._steps.append(
            StepTrace(
                start,
                now,
                output.num_waiting,
                output.chunks,
                num_kv_blocks_used=output.num_kv_blocks_used,
                num_kv_tokens_used=output.num_kv_tokens_used,
                preempted_request_ids=output.preempted_request_ids,
                work=work,
            )
        )
        return step_outputs

    def run(
        self,
        requests: Iterable[Request],
        on_step: Callable[[list[StepOutput]], None] | None = None,
        max_concurrency: int | None = None,
    ) -> RunResult:
        """Serve ``requests``, each added once ``arrival_time`` seconds have passed.

        With ``max_concurrency`` the run is a closed loop, as a fixed number of
        clients would make it: a request that has arrived waits outside the
        engine until fewer than ``max_concurrency`` requests are in flight, and
        its arrival is the moment it gets in. ``on_step`` sees each step's
        outputs (for progress).
        """
        if self.has_unfinished_requests():
            raise RuntimeError(f"engine {self.name!r} still has unfinished requests; finish or abort them first")
        requests = tuple(requests)
        for request in requests:  # refused before any runs: a refusal mid-run would leave the others half served
            self.scheduler.check_request(request)
        arrivals = ArrivalQueue(requests, max_concurrency, clock=self._clock, resolves_follow_ups=True)
        self._reset_accounting()
        start = arrivals.start()
        while arrivals or self.has_unfinished_requests():
            engine_free_since = self._steps[-1].end_time if self._steps else None
            num_unfinished = self.scheduler.num_waiting + self.scheduler.num_running
            for admission in arrivals.admit(num_unfinished, engine_free_since):
                self.add_request(admission.request, arrival_time=admission.arrival_time)
                self._records[admission.request.request_id] = RecordBuilder.admitted(admission)  # with send times
            if self.has_unfinished_requests():
                step_outputs = self.step()
                self._release_follow_ups(arrivals, step_outputs)
                if on_step is not None:
                    on_step(step_outputs)
            elif arrivals:
                self._sleep(arrivals.seconds_to_next_arrival())
        return self.result(start, self._clock())

    def _release_follow_ups(self, arrivals: ArrivalQueue, step_outputs: list[StepOutput]) -> None:
        for output in step_outputs:
            if output.finished:
                record = self._records[output.request_id]
                assert record.finished_time is not None, "a finished output finishes its record"
                arrivals.finished(record.request, record.token_ids, record.finished_time)

    def result(self, start_time: float, end_time: float) -> RunResult:
        """Everything recorded since the last ``run`` started."""
        return RunResult(
            engine_name=self.name,
            records=tuple(b.build() for b in self._records.values()),
            start_time=start_time,
            end_time=end_time,
            counters=self._counters,
            steps=tuple(self._steps),
            num_kv_blocks=self.scheduler.kv_cache.num_blocks,
            kv_block_size=self.scheduler.kv_cache.block_size,
        )


def _with_logprobs(output: SchedulerOutput, step_outputs: list[StepOutput], logprobs) -> list[StepOutput]:
    """``step_outputs`` with the runner's log-probabilities, one per sampling chunk of ``output``, in order."""
    sampling_ids = [chunk.request_id for chunk in output.chunks if chunk.samples]
    if len(logprobs) != len(sampling_ids):
        raise RuntimeError(f"runner returned {len(logprobs)} log-probabilities for {len(sampling_ids)} sampling chunks")
    by_id = dict(zip(sampling_ids, logprobs, strict=True))
    return [dataclasses.replace(step, logprob=by_id[step.request_id]) for step in step_outputs]


def check_kv_fits(runner: Runner, sizing: KVSizing) -> None:
    """``KVMemoryError`` if the cache would not fit the runner's device; called before anything is allocated."""
    layout, device = getattr(runner, "kv_layout", None), getattr(runner, "device", None)
    if layout is not None and device is not None:
        check_kv_memory(sizing, layout, device)


def static_engine(
    runner: Runner, *, batch_size: int, max_seq_len: int, eos_token_id: int | None, **engine_kwargs
) -> Engine:
    check_kv_fits(runner, slot_cache(STATIC, "batch_size", batch_size, max_seq_len))
    kv = KVCacheManager(num_slots=batch_size, max_seq_len=max_seq_len)
    return Engine(STATIC, runner, StaticScheduler(kv, eos_token_id, batch_size), **engine_kwargs)


def inflight_engine(
    runner: Runner,
    *,
    decode_batch_size: int,
    max_seq_len: int,
    eos_token_id: int | None,
    prefill_batch_size: int | None = None,
    max_num_batched_tokens: int | None = None,
    **engine_kwargs,
) -> Engine:
    check_kv_fits(runner, slot_cache(INFLIGHT, "decode_batch_size", decode_batch_size, max_seq_len))
    kv = KVCacheManager(num_slots=decode_batch_size, max_seq_len=max_seq_len)
    scheduler = InflightScheduler(
        kv,
        eos_token_id,
        decode_batch_size=decode_batch_size,
        prefill_batch_size=prefill_batch_size,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    return Engine(INFLIGHT, runner, scheduler, **engine_kwargs)


def paged_engine(
    runner: Runner,
    *,
    decode_batch_size: int,
    max_seq_len: int,
    eos_token_id: int | None,
    prefill_batch_size: int | None = None,
    max_num_batched_tokens: int | None = None,
    num_kv_blocks: int | None = None,
    kv_block_size: int = DEFAULT_KV_BLOCK_SIZE,
    enable_prefix_caching: bool = False,
    **engine_kwargs,
) -> Engine:
    """In-flight batching over ``num_kv_blocks`` blocks of ``kv_block_size`` tokens, with preemption.

    Without ``num_kv_blocks`` the pool holds what the slot engine's cache
    holds, ``decode_batch_size`` x ``max_seq_len`` tokens, so it never
    preempts and the two compare at the same memory.

    ``enable_prefix_caching`` shares cached full blocks between requests
    (``perfsuite.engine.prefix_cache``); the engine is then named
    ``paged-prefix``, a kind of its own, so that stored runs of ``paged``
    keep measuring the engine without it (see docs/prefix-caching.md).
    """
    if num_kv_blocks is None:
        num_kv_blocks = _default_pool(runner, decode_batch_size, max_seq_len, kv_block_size)
    else:
        check_kv_fits(runner, paged_pool(num_kv_blocks, kv_block_size))
    manager = PrefixCachingBlockManager if enable_prefix_caching else BlockManager
    scheduler = PagedScheduler(
        manager(num_kv_blocks, kv_block_size),
        eos_token_id,
        max_seq_len=max_seq_len,
        decode_batch_size=decode_batch_size,
        prefill_batch_size=prefill_batch_size,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    return Engine(PAGED_PREFIX if enable_prefix_caching else PAGED, runner, scheduler, **engine_kwargs)


def _default_pool(runner: Runner, decode_batch_size: int, max_seq_len: int, kv_block_size: int) -> int:
    """The blocks that hold what the slot engine's cache holds (``decode_batch_size`` x ``max_seq_len``), checked."""
    blocks_per_request = -(-max_seq_len // kv_block_size)
    check_kv_fits(runner, default_paged_pool(decode_batch_size, blocks_per_request, kv_block_size))
    return decode_batch_size * blocks_per_request
