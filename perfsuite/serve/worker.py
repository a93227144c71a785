"""The engine's one thread: adds, aborts and steps, and each request's token stream.

The engine is not thread-safe, so every engine call (add, abort, step) runs on
one worker thread, a single-thread executor. The asyncio loop owns the HTTP
side; its engine-loop task submits one ``step`` at a time while the engine has
work, and hands each step's tokens to the waiting handlers. Adds and aborts
are submitted to the same executor, so they run between steps.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from perfsuite.engine import Engine, EngineCounters, FinishReason, Request, RequestRecord, StepOutput
from perfsuite.serve.errors import EngineFailure, invalid_request
from perfsuite.serve.histograms import ServedHistograms

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """The engine's occupancy after its latest call, for ``/health``."""

    num_running: int
    num_waiting: int
    num_free_slots: int
    num_slots: int
    kv_cache_usage: float = 0.0  # the share of the KV cache held by requests, 0..1 (vLLM's kv_cache_usage_perc)


@dataclass(frozen=True, slots=True)
class ServedTotals:
    """What the engine has done since the server started, for ``/metrics``: every figure only grows.

    ``engine``: the engine's exact counters (prefix cache lookups, preemptions), summed step by step (the engine
    starts its own over whenever it goes idle); prompt tokens count each request as it is added, generation
    tokens each token as it is made, finished requests each as it leaves, by why it finished.
    """

    engine: EngineCounters = EngineCounters()
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_stopped: int = 0
    num_length_capped: int = 0
    num_aborted: int = 0

    def after_step(self, before: EngineCounters, after: EngineCounters, num_tokens: int) -> ServedTotals:
        return replace(
            self,
            engine=self.engine.combined(after.since(before)),
            num_generation_tokens=self.num_generation_tokens + num_tokens,
        )

    def after_finishing(self, records: Sequence[RequestRecord]) -> ServedTotals:
        reasons = [r.finish_reason for r in records]
        return replace(
            self,
            num_stopped=self.num_stopped + reasons.count(FinishReason.STOP),
            num_length_capped=self.num_length_capped + reasons.count(FinishReason.LENGTH),
            num_aborted=self.num_aborted + reasons.count(FinishReason.ABORT),
        )


class TokenStream:
    """The step outputs of one HTTP request's engine requests, passed from the engine loop to its handler.

    An HTTP request with several prompts has one engine request per prompt;
    their outputs interleave on one stream, which ends once all have finished.
    The queue is unbounded in type but not in use: the engine produces at most
    ``max_tokens`` outputs per engine request.
    """

    def __init__(self, num_requests: int) -> None:
        self._queue: asyncio.Queue[StepOutput | EngineFailure] = asyncio.Queue()
        self._num_unfinished = num_requests

    def put(self, output: StepOutput) -> None:
        self._queue.put_nowait(output)

    def fail(self, failure: EngineFailure) -> None:
        self._queue.put_nowait(failure)

    async def outputs(self) -> AsyncIterator[StepOutput]:
        while True:
            item = await self._queue.get()
            if isinstance(item, EngineFailure):
                raise item
            yield item
            if item.finished:
                self._num_unfinished -= 1
                if not self._num_unfinished:
                    return


class EngineWorker:
    """Owns the engine: its one thread, the stepping task and the open streams."""

    def __init__(self, engine: Engine, num_recent_records: int) -> None:
        self._engine = engine
        self._executor: ThreadPoolExecutor | None = None
        self._drive_task: asyncio.Task | None = None
        self._has_work = asyncio.Event()
        self._streams: dict[str, TokenStream] = {}
        # Touched only on the engine thread:
        self._client_ids: dict[str, str] = {}
        # Written on the engine thread, read anywhere:
        self._load = self._current_load()
        self._recent_records: deque[RequestRecord] = deque(maxlen=num_recent_records)
        # Each finished request's cached prompt tokens, by engine request id, until its handler takes them; as
        # bounded as the records (an aborted request's handler has gone and never takes them).
        self._cached_tokens: OrderedDict[str, int | None] = OrderedDict()
        self._max_cached_tokens = num_recent_records
        self._records_lock = threading.Lock()
        self._totals = ServedTotals()
        self._histograms = ServedHistograms.empty(engine.max_seq_len)
        if not engine.has_unfinished_requests():
            engine.forget_finished()  # earlier runs (a warm-up) are not this server's requests
        self._counted = engine.counters  # the engine's counters when the totals last took them in

    # -- the asyncio side ---------------------------------------------------

    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="perfsuite-engine")
        self._drive_task = asyncio.create_task(self._drive())

    async def stop(self) -> None:
        if self._drive_task is not None:
            self._drive_task.cancel()
            await asyncio.gather(self._drive_task, return_exceptions=True)
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    @property
    def load(self) -> EngineLoad:
        return self._load

    @property
    def num_open_requests(self) -> int:
        return len(self._streams)

    @property
    def totals(self) -> ServedTotals:
        return self._totals

    @property
    def histograms(self) -> ServedHistograms:
        return self._histograms

    def recent_records(self) -> tuple[RequestRecord, ...]:
        """The engine's records of recently finished requests, named by their ``X-Request-Id`` when sent."""
        with self._records_lock:
            return tuple(self._recent_records)

    def take_cached_tokens(self, request_ids: Sequence[str]) -> int | None:
        """The prompt tokens the finished requests ``request_ids`` found in the prefix cache, summed; None when
        the engine did not say for one of them. Call once their last tokens have arrived (their records are
        archived in the step that made them)."""
        with self._records_lock:
            counts = [self._cached_tokens.pop(request_id, None) for request_id in request_ids]
        return None if None in counts else sum(counts)  # type: ignore[arg-type]

    async def open(self, requests: Sequence[Request], client_ids: Sequence[str | None]) -> TokenStream:
        """Add ``requests`` to the running batch; their outputs arrive on the returned stream.

        ``client_ids`` name each request's record (``recent_records``); None keeps its own id.
        """
        stream = TokenStream(len(requests))
        for request in requests:
            self._streams[request.request_id] = stream
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._add_all, requests, client_ids)
        except ValueError as error:
            for request in requests:
                del self._streams[request.request_id]
            raise invalid_request(str(error)) from None
        self._has_work.set()
        return stream

    def close(self, request_ids: Sequence[str]) -> None:
        """Forget requests; those still unfinished are aborted so their slots are freed."""
        for request_id in request_ids:
            if self._streams.pop(request_id, None) is not None:
                self._submit_abort(request_id)
        with self._records_lock:  # an answer without usage never took them
            for request_id in request_ids:
                self._cached_tokens.pop(request_id, None)

    def _submit_abort(self, request_id: str) -> None:
        assert self._executor is not None  # a stream exists only once start() made the executor
        try:
            self._executor.submit(self._abort, request_id)
        except RuntimeError:  # the executor is shut down: the server is stopping
            pass

    async def _drive(self) -> None:
        # Clearing before each step cannot lose a wake-up: an add submitted
        # after this step runs after it (one thread, FIFO) and sets the event.
        loop = asyncio.get_running_loop()
        while True:
            await self._has_work.wait()
            self._has_work.clear()
            try:
                outputs, is_busy = await loop.run_in_executor(self._executor, self._step)
            except Exception as error:
                log.exception("engine step failed; aborting its %d open requests", len(self._streams))
                self._fail_open_requests(EngineFailure(f"the engine failed: {type(error).__name__}: {error}"))
                continue
            self._deliver(outputs)
            if is_busy:
                self._has_work.set()

    def _deliver(self, outputs: list[StepOutput]) -> None:
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:  # closed while its step ran; its abort is queued
                continue
            stream.put(output)
            if output.finished:
                del self._streams[output.request_id]

    def _fail_open_requests(self, failure: EngineFailure) -> None:
        for request_id, stream in list(self._streams.items()):
            stream.fail(failure)
            self.close([request_id])

    # -- the engine thread --------------------------------------------------

    def _add_all(self, requests: Sequence[Request], client_ids: Sequence[str | None]) -> None:
        added: list[str] = []
        try:
            for request, client_id in zip(requests, client_ids, strict=True):
                self._engine.add_request(request)
                added.append(request.request_id)
                self._totals = replace(
                    self._totals, num_prompt_tokens=self._totals.num_prompt_tokens + request.num_prompt_tokens
                )
                if client_id is not None:
                    self._client_ids[request.request_id] = client_id
        except ValueError:
            for request_id in added:  # all of an HTTP request's prompts run, or none
                self._engine.abort_request(request_id)
            raise
        finally:
            self._settle()

    def _abort(self, request_id: str) -> None:
        try:
            self._engine.abort_request(request_id)
        except Exception:
            log.exception("aborting request %s failed", request_id)
        self._settle()

    def _step(self) -> tuple[list[StepOutput], bool]:
        outputs = self._engine.step()
        self._totals = self._totals.after_step(self._counted, self._engine.counters, len(outputs))
        self._settle()
        return outputs, self._engine.has_unfinished_requests()

    def _settle(self) -> None:
        self._load = self._current_load()
        self._archive_records()
        self._counted = self._engine.counters  # taken after forget_finished, which may start them over

    def _archive_records(self) -> None:
        # The engine keeps a record per request (and its step traces) until
        # told to forget them. Taking the finished ones after every call keeps
        # memory flat even under a load that never lets the engine go idle.
        records = self._engine.forget_finished()
        if not records:
            return
        self._totals = self._totals.after_finishing(records)
        self._histograms = self._histograms.after_finishing(records)
        named = [replace(r, request_id=self._client_ids.pop(r.request_id, r.request_id)) for r in records]
        with self._records_lock:
            self._recent_records.extend(named)
            for record in records:
                self._cached_tokens[record.request_id] = record.num_cached_tokens
            while len(self._cached_tokens) > self._max_cached_tokens:
                self._cached_tokens.popitem(last=False)

    def _current_load(self) -> EngineLoad:
        scheduler = self._engine.scheduler
        num_free_slots, num_slots = request_slots(scheduler)
        return EngineLoad(
            num_running=scheduler.num_running,
            num_waiting=scheduler.num_waiting,
            num_free_slots=num_free_slots,
            num_slots=num_slots,
            kv_cache_usage=kv_cache_usage(scheduler.kv_cache),
        )


def request_slots(scheduler: Any) -> tuple[int, int]:
    """Free and all request slots: a slot cache's, or for a paged pool (no slots) the running requests' limit."""
    kv_cache = scheduler.kv_cache
    if hasattr(kv_cache, "num_slots"):
        return kv_cache.num_free_slots, kv_cache.num_slots
    return max(0, scheduler.max_num_running - scheduler.num_running), scheduler.max_num_running


def kv_cache_usage(kv_cache: Any) -> float:
    """The share of a KV cache in use: a paged pool's blocks that are not free (a prefix-caching pool counts a
    cached block that no request holds as free, as vLLM does), else a slot cache's slots."""
    if hasattr(kv_cache, "num_free_blocks"):
        return 1.0 - kv_cache.num_free_blocks / kv_cache.num_blocks
    return 1.0 - kv_cache.num_free_slots / kv_cache.num_slots
