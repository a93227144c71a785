"""``hf-cb``: transformers' own continuous batching (``ContinuousBatchingManager``).

The manager runs its generation loop on a background thread; this adapter
submits each request from the caller's thread once it has arrived (or, in a
closed loop, once a client is free) with its own ``max_new_tokens`` and stop
ids, and collects the results. ``generate_batch`` is not used: it takes one
``max_new_tokens`` for every request.

Sizing. On CPU the manager's defaults size the paged KV cache at 60% of free
RAM, so it is sized from ``EngineConfig`` instead: room for B requests of
``max_seq_len`` tokens (``num_blocks``), B requests per step, and the same
token budget as perfsuite's in-flight engine (``max_num_batched_tokens``, else B x
``max_seq_len``). The free-block safety margin is 0, since the cache holds B
full requests, so the concurrency limit is B and nothing else. Prefix sharing
is off: perfsuite's engines do not cache prefixes, and the shipped prompts
repeat, so it would measure prefix caching rather than batching.
``prefill_batch_size`` has no counterpart and is ignored.

Timestamps. ``created_time``, ``lifespan`` and the per-token ``timestamps`` of
a result are ``time.perf_counter()`` values taken in this process
(transformers' ``requests.py``), the clock of ``RequestRecord``, so they are
used as they are; ``lifespan[0]``, when the request left the waiting queue, is
its first scheduled time. A result whose times fall outside the run is
refused, in case a later transformers changes clocks.

Counters. The number of steps depends on when the caller's submissions land
relative to the background loop, so no count is exact: all counters stay 0.

Greedy equality. It holds (tests/test_adapter_equivalence.py): on tiny-random
in float64, 60 generated scenarios (365 requests, 3612 tokens) and on SmolLM2
in float32, 25 scenarios plus the shipped prompts at B=3 and 8 (600 tokens)
matched unbatched greedy decoding token for token, without a near-tie. The
manager picks tokens from float32 logits, as ``generate`` does, so in float64
only a top-2 margin below float32 resolution could tell them apart.

Failures. A request the manager fails, a dead background thread or no step for
``stall_timeout_s`` while requests are unfinished raise, and the manager is
stopped hard. Every run joins the manager's thread before it returns or
raises, or raises saying the thread would not stop.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator

from transformers import ContinuousBatchingConfig, GenerationConfig

from perfsuite.adapters.peer_support import check_requests_fit
from perfsuite.adapters.protocol import Backend, EngineConfig
from perfsuite.engine.admission import ArrivalQueue, RecordBuilder
from perfsuite.engine.names import HF_CB
from perfsuite.engine.types import EngineCounters, Request, RunResult, SamplingParams, StepOutput

PAGE_SIZE = 32  # tokens per KV page; small, so a request wastes at most 31 slots
POLL_SECONDS = 0.05  # how often a waiting caller checks that the manager is alive
JOIN_TIMEOUT_SECONDS = 30.0
NO_STOP_ID = -1  # the manager skips negative ids: "stop on nothing"


class HFContinuousBatchingEngine:
    """transformers' continuous batching behind the ``BatchingEngine`` protocol."""

    name = HF_CB
    greedy_equal = True  # held to it by tests/test_adapter_equivalence.py

    def __init__(self, model, eos_token_id: int | None, config: EngineConfig, stall_timeout_s: float = 120.0) -> None:
        self.model = model
        self.eos_token_id = eos_token_id
        self.config = config
        self.stall_timeout_s = stall_timeout_s

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    def run(
        self,
        requests: Iterable[Request],
        on_step: Callable[[list[StepOutput]], None] | None = None,
        max_concurrency: int | None = None,
    ) -> RunResult:
        """Serve ``requests`` with ``Engine.run``'s semantics (see ``perfsuite.engine.admission``).

        ``on_step`` sees a request's outputs when its result arrives, all at
        once: the manager reports finished requests, not steps.
        """
        arrivals = ArrivalQueue(requests, max_concurrency, engine_name=self.name)
        check_requests_fit(arrivals.requests, self.config.max_seq_len, self.model.get_input_embeddings().num_embeddings)
        if not arrivals.requests:
            start = arrivals.start()
            return RunResult(self.name, (), start, start, EngineCounters())
        with _manager(self.model, self.config) as manager:
            start = arrivals.start()
            serving = _Serving(self, manager, arrivals, on_step)
            # The requests already there go in before the loop starts, so that its
            # first step sees all of them, as the first step of perfsuite's engines does.
            serving.submit_arrived()
            manager.start()
            serving.serve()
            end = time.perf_counter()  # before shutting the manager down, which is not serving
        records = tuple(r.build() for r in serving.records.values())
        return RunResult(self.name, records, start, end, EngineCounters())

    def stop_token_ids(self, params: SamplingParams) -> list[int]:
        stop = list(params.stop_token_ids)
        if not params.ignore_eos and self.eos_token_id is not None:
            stop.append(self.eos_token_id)
        return stop or [NO_STOP_ID]


class _Serving:
    """One run's traffic between the arrival queue and a manager."""

    def __init__(self, engine: HFContinuousBatchingEngine, manager, arrivals: ArrivalQueue, on_step) -> None:
        self.engine = engine
        self.manager = manager
        self.arrivals = arrivals
        self.on_step = on_step
        self.records: dict[str, RecordBuilder] = {}
        self.unfinished: dict[str, RecordBuilder] = {}

    def submit_arrived(self) -> None:
        for admission in self.arrivals.admit(len(self.unfinished)):
            request = admission.request
            record = RecordBuilder(request, admission.arrival_time)
            self.records[request.request_id] = self.unfinished[request.request_id] = record
            submitted = self.manager.add_request(
                list(request.prompt_token_ids),
                request_id=request.request_id,
                max_new_tokens=request.sampling_params.max_new_tokens,
                eos_token_id=self.engine.stop_token_ids(request.sampling_params),
                record_timestamps=True,
            )
            if submitted is None:
                raise RuntimeError(f"hf-cb: the manager refused request {request.request_id!r}{self._cause()}")

    def serve(self) -> None:
        last_step, last_progress = self._num_steps(), time.perf_counter()
        while self.arrivals or self.unfinished:
            self.submit_arrived()
            result = self.manager.get_result(timeout=self._wait_seconds())
            if result is not None:
                self._take(result)
                continue
            if not self.manager.is_running():
                raise RuntimeError(f"hf-cb: the manager's generation thread died{self._cause()}")
            if self._num_steps() != last_step or not self.unfinished:
                last_step, last_progress = self._num_steps(), time.perf_counter()
            elif time.perf_counter() - last_progress > self.engine.stall_timeout_s:
                raise TimeoutError(
                    f"hf-cb: no generation step for {self.engine.stall_timeout_s:g} s with "
                    f"{len(self.unfinished)} requests unfinished; the manager is stuck"
                )

    def _wait_seconds(self) -> float:
        if not self.arrivals.has_room(len(self.unfinished)):
            return POLL_SECONDS
        return min(POLL_SECONDS, self.arrivals.seconds_to_next_arrival())

    def _num_steps(self) -> int:
        return getattr(self.manager, "current_batch", 0)  # set by the loop, one per forward step

    def _cause(self) -> str:
        error = self.manager.background_thread_status.fatal_error
        return f": {error!r}" if error is not None else ""

    def _take(self, result) -> None:
        record = self.unfinished.pop(result.request_id, None)
        if record is None:
            raise RuntimeError(f"hf-cb: the manager returned an unknown or repeated request {result.request_id!r}")
        if result.error is not None or not result.is_finished():
            raise RuntimeError(f"hf-cb: request {result.request_id!r} failed in the manager: {result.error}")
        self._check_times(result)
        record.first_scheduled_time = result.lifespan[0]
        outputs = record.add_tokens(result.generated_tokens, result.timestamps, self.engine.eos_token_id)
        if not record.is_finished:
            raise RuntimeError(
                f"hf-cb: request {result.request_id!r} ended after {len(result.generated_tokens)} tokens "
                "without meeting its stop rule"
            )
        if self.on_step is not None:
            self.on_step(outputs)

    def _check_times(self, result) -> None:
        times = result.timestamps or []
        if len(times) < len(result.generated_tokens):
            raise RuntimeError(
                f"hf-cb: request {result.request_id!r} has {len(result.generated_tokens)} tokens "
                f"but {len(times)} timestamps"
            )
        now = time.perf_counter()
        if not all(self.arrivals.start_time <= t <= now for t in (*times, *result.lifespan)):
            raise RuntimeError(
                f"hf-cb: request {result.request_id!r} has timestamps outside the run; transformers no longer "
                "records them with time.perf_counter and hf_cb must convert them"
            )


def continuous_batching_config(config: EngineConfig) -> ContinuousBatchingConfig:
    """Room for B requests of ``max_seq_len`` tokens, B per step, in-flight's token budget."""
    pages_per_request = -(-config.max_seq_len // PAGE_SIZE)
    return ContinuousBatchingConfig(
        page_size=PAGE_SIZE,
        num_blocks=config.batch_size * pages_per_request,
        max_batch_tokens=config.max_num_batched_tokens or config.batch_size * config.max_seq_len,
        max_requests_per_batch=config.batch_size,
        safety_margin=0.0,
        allow_block_sharing=False,
        seed=0,
    )


def _generation_config() -> GenerationConfig:
    # Greedy; stop ids come with each request. The manager does not fill unset
    # fields from the model's generation config, and an unset EOS makes it warn.
    return GenerationConfig(do_sample=False, eos_token_id=NO_STOP_ID)


@contextlib.contextmanager
def _manager(model, config: EngineConfig) -> Iterator:
    """A manager with its paged cache built (not started); stopped, joined and destroyed on exit."""
    manager = model.init_continuous_batching(
        generation_config=_generation_config(), continuous_batching_config=continuous_batching_config(config)
    )
    failed = True
    try:
        manager.warmup()  # builds the cache, so that allocating it is not timed; a no-op otherwise on CPU
        yield manager
        failed = False
    finally:
        _shut_down(manager, hard=failed)


def _shut_down(manager, hard: bool) -> None:
    if getattr(manager, "_generation_thread", None) is None:
        # stop() only tidies up (restores the model's attention implementation)
        # after a start, so a manager that never ran is started first.
        manager.start()
        hard = True
    # A hard stop fails what is still queued instead of finishing it.
    manager.stop(block=True, timeout=JOIN_TIMEOUT_SECONDS, hard_stop=hard)
    if manager.is_running():
        raise RuntimeError(f"hf-cb: the manager's generation thread did not stop within {JOIN_TIMEOUT_SECONDS:.0f} s")
    manager.destroy()


def build(backend: Backend, config: EngineConfig) -> HFContinuousBatchingEngine:
    if backend.model is None:
        raise ValueError("hf-cb drives a Hugging Face model; this backend has none (a fake runner?)")
    return HFContinuousBatchingEngine(backend.model, backend.eos_token_id, config)
