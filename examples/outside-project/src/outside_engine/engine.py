"""A continuous-batching engine over perfsuite's model runner.

Each step, requests that have arrived take a free KV slot (``batch_size``
slots in all) and prefill their whole prompt, while every other running
request decodes one token. perfsuite's runner does the model work:
``runner.new_kv_cache(num_slots, max_seq_len)`` once, then
``runner.execute(SchedulerOutput, kv_cache)`` each step, which returns the
greedy token of every chunk, in order. Which slot a joining request gets is
the engine's ``slot_policy``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from perfsuite.engine import (
    EngineCounters,
    FinishReason,
    Request,
    RequestRecord,
    RunResult,
    ScheduledChunk,
    SchedulerOutput,
    StepOutput,
)

SlotPolicy = Callable[[Collection[int], int], int]
"""``(slots held by running requests, number of slots) -> the slot for a joining request``."""


def lowest_free_slot(held: Collection[int], num_slots: int) -> int:
    return min(set(range(num_slots)) - set(held))


def slot_after_the_running(held: Collection[int], num_slots: int) -> int:
    """A batching bug: slot number = how many run, as if requests always left in the order they joined.

    When an earlier request finishes first, the slot this hands out is still
    held by a later one, and the two write their keys and values over each other.
    """
    return len(held)


@dataclass(slots=True)
class _Live:
    """A request from its arrival to its last token."""

    request: Request
    arrival_time: float
    slot: int = -1
    first_scheduled_time: float | None = None
    output: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)

    def next_chunk(self) -> ScheduledChunk:
        """Its whole prompt when it has just joined, else its last token."""
        request = self.request
        if not self.output:
            return ScheduledChunk(request.request_id, self.slot, request.prompt_token_ids, 0, True, True)
        position = request.num_prompt_tokens + len(self.output) - 1
        return ScheduledChunk(request.request_id, self.slot, (self.output[-1],), position, True, False)

    def record(self, finish_reason: FinishReason) -> RequestRecord:
        return RequestRecord(
            request_id=self.request.request_id,
            num_prompt_tokens=self.request.num_prompt_tokens,
            output_token_ids=tuple(self.output),
            arrival_time=self.arrival_time,
            first_scheduled_time=self.first_scheduled_time,
            token_times=tuple(self.token_times),
            finished_time=self.token_times[-1],
            finish_reason=finish_reason,
        )


class ContinuousBatchingEngine:
    """perfsuite's ``BatchingEngine`` protocol: ``name``, ``greedy_equal``, ``batch_size``, ``run``."""

    greedy_equal = True

    def __init__(
        self,
        name: str,
        runner: Any,
        batch_size: int,
        max_seq_len: int,
        eos_token_id: int | None,
        slot_policy: SlotPolicy = lowest_free_slot,
    ) -> None:
        self.name = name
        self._runner = runner
        self._batch_size = batch_size
        self.max_seq_len = max_seq_len
        self._eos_token_id = eos_token_id
        self._slot_policy = slot_policy
        self._kv_cache = runner.new_kv_cache(batch_size, max_seq_len)

    @property
    def batch_size(self) -> int:
        return self._batch_size

    def run(
        self,
        requests: Iterable[Request],
        on_step: Callable[[list[StepOutput]], None] | None = None,
        max_concurrency: int | None = None,
    ) -> RunResult:
        """Serve each request once its ``arrival_time`` has passed; a closed loop of ``max_concurrency`` clients."""
        pending = deque(sorted(requests, key=lambda request: request.arrival_time))
        self._check(pending)
        queue: deque[_Live] = deque()
        running: list[_Live] = []
        records: list[RequestRecord] = []
        counters = EngineCounters()
        start = time.perf_counter()
        while pending or queue or running:
            now = time.perf_counter()
            while pending and start + pending[0].arrival_time <= now:
                if max_concurrency is not None and len(queue) + len(running) >= max_concurrency:
                    break
                request = pending.popleft()  # in a closed loop it arrives when a client gets it in
                queue.append(_Live(request, now if max_concurrency else start + request.arrival_time))
            while queue and len(running) < self._batch_size:
                joining = queue.popleft()
                joining.slot = self._slot_policy([live.slot for live in running], self._batch_size)
                running.append(joining)
            if not running:
                time.sleep(max(0.0, start + pending[0].arrival_time - time.perf_counter()))
                continue
            output = SchedulerOutput(
                tuple(live.next_chunk() for live in running), len(queue) + len(pending), len(running)
            )
            step_outputs = self._step(output, running, records)
            counters = counters.plus(output)
            if on_step is not None:
                on_step(step_outputs)
        return RunResult(self.name, tuple(records), start, time.perf_counter(), counters)

    def _step(self, output: SchedulerOutput, running: list[_Live], records: list[RequestRecord]) -> list[StepOutput]:
        started = time.perf_counter()
        for live in running:
            if live.first_scheduled_time is None:
                live.first_scheduled_time = started
        sampled = self._runner.execute(output, self._kv_cache)
        now = time.perf_counter()
        step_outputs = []
        for live, token in zip(list(running), sampled, strict=True):
            live.output.append(int(token))
            live.token_times.append(now)
            reason = live.request.sampling_params.finish_reason(int(token), len(live.output), self._eos_token_id)
            step_outputs.append(StepOutput(live.request.request_id, int(token), reason))
            if reason is not None:
                running.remove(live)
                records.append(live.record(reason))
        return step_outputs

    def _check(self, requests: Collection[Request]) -> None:
        if len({request.request_id for request in requests}) != len(requests):
            raise ValueError("request ids repeat; give every request a unique id")
        for request in requests:
            request.check_fits(self.max_seq_len)
