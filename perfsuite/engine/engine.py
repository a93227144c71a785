"""The engine loop: schedule, run the model, apply the results, record times.

The engine records monotonic timestamps and nothing else; latencies and
throughput are computed later from ``RunResult`` by ``perfsuite.measure.metrics``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from perfsuite.engine.kv_cache import KVCacheManager
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
    check_unique_ids,
)


class Runner(Protocol):
    """What an engine needs from a model runner (the real one or a fake)."""

    def new_kv_cache(self, num_slots: int, max_seq_len: int) -> Any: ...

    def execute(self, output: SchedulerOutput, kv_cache: Any) -> list[int]: ...


@dataclass(slots=True)
class _RecordBuilder:
    request: Request
    arrival_time: float
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    finished_time: float | None = None
    finish_reason: FinishReason | None = None

    def build(self) -> RequestRecord:
        return RequestRecord(
            request_id=self.request.request_id,
            num_prompt_tokens=self.request.num_prompt_tokens,
            output_token_ids=tuple(self.output_token_ids),
            arrival_time=self.arrival_time,
            first_scheduled_time=self.first_scheduled_time,
            token_times=tuple(self.token_times),
            finished_time=self.finished_time,
            finish_reason=self.finish_reason,
        )


class Engine:
    """One scheduler over one runner and a KV cache that the engine owns."""

    greedy_equal = True  # held to it by tests/test_equivalence.py

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
        self.kv_cache = runner.new_kv_cache(kv.num_slots, kv.max_seq_len)
        self._clock = clock
        self._sleep = sleep
        self._reset_accounting()

    def _reset_accounting(self) -> None:
        self._records: dict[str, _RecordBuilder] = {}
        self._counters = EngineCounters()
        self._steps: deque[StepTrace] = deque()

    @property
    def batch_size(self) -> int:
        return self.scheduler.kv_cache.num_slots

    @property
    def max_seq_len(self) -> int:
        return self.scheduler.kv_cache.max_seq_len

    # -- requests -----------------------------------------------------------

    def add_request(self, request: Request, arrival_time: float | None = None) -> None:
        """Queue a request; bad input raises ``ValueError`` and changes nothing."""
        if request.request_id in self._records:
            raise ValueError(
                f"request_id {request.request_id!r} was already used in this run; give every request a unique id"
            )
        self.scheduler.add_request(request)
        arrival = self._clock() if arrival_time is None else arrival_time
        self._records[request.request_id] = _RecordBuilder(request, arrival)

    def abort_request(self, request_id: str) -> bool:
        aborted = self.scheduler.abort_request(request_id)
        if aborted is None:
            return False
        builder = self._records[request_id]
        builder.finished_time = self._clock()
        builder.finish_reason = FinishReason.ABORT
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
        finished_ids = [rid for rid, builder in self._records.items() if builder.finished_time is not None]
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
            builder = self._records.get(chunk.request_id)
            if builder is not None and builder.first_scheduled_time is None:
                builder.first_scheduled_time = start
        sampled = self.runner.execute(output, self.kv_cache)
        now = self._clock()
        step_outputs = self.scheduler.update_from_output(output, sampled)
        for step_output in step_outputs:
            builder = self._records[step_output.request_id]
            builder.token_times.append(now)
            builder.output_token_ids.append(step_output.token_id)
            if step_output.finished:
                builder.finished_time = now
                builder.finish_reason = step_output.finish_reason
        self._counters = self._counters.plus(output)
        self._steps.append(StepTrace(start, now, output.num_waiting, output.chunks))
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
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 or None, got {max_concurrency}")
        if self.has_unfinished_requests():
            raise RuntimeError(f"engine {self.name!r} still has unfinished requests; finish or abort them first")
        pending = deque(sorted(requests, key=lambda r: r.arrival_time))
        check_unique_ids(pending)
        self._reset_accounting()
        start = self._clock()
        while pending or self.has_unfinished_requests():
            elapsed = self._clock() - start
            while pending and pending[0].arrival_time <= elapsed and self._has_room(max_concurrency):
                request = pending.popleft()
                arrival = None if max_concurrency else start + request.arrival_time
                self.add_request(request, arrival_time=arrival)
            if self.has_unfinished_requests():
                step_outputs = self.step()
                if on_step is not None:
                    on_step(step_outputs)
            elif pending:
                self._sleep(max(0.0, pending[0].arrival_time - (self._clock() - start)))
        return self.result(start, self._clock())

    def _has_room(self, max_concurrency: int | None) -> bool:
        if max_concurrency is None:
            return True
        in_flight = self.scheduler.num_waiting + self.scheduler.num_running
        return in_flight < max_concurrency

    def result(self, start_time: float, end_time: float) -> RunResult:
        """Everything recorded since the last ``run`` started."""
        return RunResult(
            engine_name=self.name,
            records=tuple(b.build() for b in self._records.values()),
            start_time=start_time,
            end_time=end_time,
            counters=self._counters,
            steps=tuple(self._steps),
        )


def static_engine(
    runner: Runner, *, batch_size: int, max_seq_len: int, eos_token_id: int | None, **engine_kwargs
) -> Engine:
    kv = KVCacheManager(num_slots=batch_size, max_seq_len=max_seq_len)
    return Engine("static", runner, StaticScheduler(kv, eos_token_id, batch_size), **engine_kwargs)


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
    kv = KVCacheManager(num_slots=decode_batch_size, max_seq_len=max_seq_len)
    scheduler = InflightScheduler(
        kv,
        eos_token_id,
        decode_batch_size=decode_batch_size,
        prefill_batch_size=prefill_batch_size,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    return Engine("inflight", runner, scheduler, **engine_kwargs)


ENGINE_KINDS = ("static", "inflight")


def build_engine(
    kind: str,
    runner: Runner,
    *,
    batch_size: int,
    max_seq_len: int,
    eos_token_id: int | None,
    prefill_batch_size: int | None = None,
    max_num_batched_tokens: int | None = None,
    **engine_kwargs,
) -> Engine:
    """An engine by name; ``batch_size`` is the static batch or the in-flight ``decode_batch_size``."""
    if kind == "static":
        return static_engine(
            runner, batch_size=batch_size, max_seq_len=max_seq_len, eos_token_id=eos_token_id, **engine_kwargs
        )
    if kind == "inflight":
        return inflight_engine(
            runner,
            decode_batch_size=batch_size,
            max_seq_len=max_seq_len,
            eos_token_id=eos_token_id,
            prefill_batch_size=prefill_batch_size,
            max_num_batched_tokens=max_num_batched_tokens,
            **engine_kwargs,
        )
    raise ValueError(f"unknown engine {kind!r}; choose one of {', '.join(ENGINE_KINDS)}")
