"""``vllm``: vLLM's own engine in this process, driven step by step (``pip install perfsuite[vllm]``).

Registered only where ``vllm`` is importable (``make peers`` builds such a
virtual environment, ``.venv-peers``). It serves perfsuite's requests with
``Engine.run``'s semantics (``perfsuite.engine.admission``): a request is
added to vLLM's ``LLMEngine`` once its arrival time has passed (or a closed-loop
client is free), between two ``step()`` calls, as perfsuite's engines add
requests between two forward steps. So ``--perf-engines inflight,vllm`` runs
both engines on the same workload in one process.

Sampling. Greedy (``temperature=0``), the prompt as token ids, ``max_tokens``
and ``ignore_eos`` from the request; EOS (unless ignored) and the request's
stop ids go in as ``stop_token_ids``, since vLLM is built without a tokenizer
(``skip_tokenizer_init``: nothing is detokenized, as in perfsuite's engines);
see ``sampling_arguments`` for ``min_tokens``. Each record is stopped by
perfsuite's own rule (``RecordBuilder``); a request vLLM goes on with after
that is aborted in vLLM, and one that vLLM finishes before it is an error
naming the request, never a short record.

Timestamps. vLLM's per-request statistics (``RequestOutput.metrics``, a
``RequestStateStats``; the engine is built with ``disable_log_stats=False`` so
they exist) hold ``scheduled_ts``, ``first_token_ts`` and ``last_token_ts``,
taken by vLLM with ``time.monotonic()`` (the engine core stamps each step's
outputs). A step's tokens are recorded at that step's ``last_token_ts``, so
``token_times[0]`` is vLLM's ``first_token_ts`` and ``token_times[-1]`` its
last token; ``first_scheduled_time`` is ``scheduled_ts``. They are moved onto
``RequestRecord``'s clock (``time.perf_counter``) by the offset between the two
clocks read at the start of each run (on Linux both read ``CLOCK_MONOTONIC``, so
it is about zero). Arrival is perfsuite's, as for every engine: the run start
plus the request's offset, or the moment a closed-loop client sent it. vLLM's
own ``arrival_time`` is a ``time.time()`` wall-clock value and is not used.
A time outside the run is refused, in case a later vLLM changes clocks.

Sizing. ``max_num_seqs`` is B, ``max_model_len`` the session's
``max_seq_len``, ``max_num_batched_tokens`` the in-flight engine's token budget
(else B x ``max_seq_len``); prefix caching is off (perfsuite's engines do not
cache prefixes, and the shipped prompts repeat). The KV cache
(``kv_cache_memory_bytes``) holds B requests of ``max_seq_len`` tokens plus a
block each (``kv_cache_bytes``), like perfsuite's engines' caches, rather than
vLLM's share of free memory: B requests always fit, and the engine fits beside
perfsuite's.

One process. ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (set by ``build`` unless
already set) keeps vLLM's engine core and its CPU worker in this process, as
perfsuite's engines are: ``step()`` runs one forward step in the caller's
thread, and the CPU the run uses is this process's, so the busy-machine check
(``perfsuite.measure.contention``) and the machine probe treat both engines alike.
Building vLLM's engine replaces ``torch.set_num_threads`` with a no-op and asks
for one thread "for serving"; ``build`` puts back the function and the thread
count perfsuite configured, so both engines compute with the same threads.
(With its default multiprocessing, vLLM on CPU binds its worker to all cores
but one, left for its scheduler process: on a 2-core machine, one thread.)

Counters. vLLM's steps are not perfsuite's forward passes (a step may chunk a
prefill), so the counters stay 0, as for ``hf-cb``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsuite.adapters.peer_support import check_requests_fit
from perfsuite.adapters.protocol import Backend, EngineConfig
from perfsuite.engine.admission import ArrivalQueue, RecordBuilder
from perfsuite.engine.names import VLLM
from perfsuite.engine.types import EngineCounters, Request, RunResult, SamplingParams, StepOutput

KV_BLOCK_TOKENS = 128  # vLLM's CPU block size: a request may waste up to one block
MIN_KV_CACHE_BYTES = 256 * 1024**2
DEFAULT_STALL_TIMEOUT_S = 120.0  # steps with no output while requests are unfinished: vLLM is stuck
IDLE_POLL_SECONDS = 0.05  # how long to sleep while nothing is in the engine and the next arrival is later
INSTALL_HINT = "install it with `pip install perfsuite[vllm]`, or use the peers environment (`make peers`)"


class VLLMEngineError(RuntimeError):
    """vLLM did something a run cannot record; the message names the request and the cause."""


@dataclass(frozen=True, slots=True)
class VLLMSettings:
    """What the ``vllm.LLM`` is built with (``engine_arguments``), derived from ``EngineConfig``."""

    model_dir: str
    dtype: str
    max_num_seqs: int
    max_model_len: int
    max_num_batched_tokens: int
    kv_cache_memory_bytes: int

    @classmethod
    def from_config(
        cls, model_dir: str | Path, dtype: str, config: EngineConfig, kv_bytes_per_token: int
    ) -> VLLMSettings:
        budget = config.max_num_batched_tokens or config.batch_size * config.max_seq_len
        kv_bytes = kv_cache_bytes(config, kv_bytes_per_token)
        return cls(str(model_dir), dtype, config.batch_size, config.max_seq_len, budget, kv_bytes)

    def engine_arguments(self) -> dict[str, Any]:
        return {
            "model": self.model_dir,
            "dtype": self.dtype,
            "max_num_seqs": self.max_num_seqs,
            "max_model_len": self.max_model_len,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "enable_prefix_caching": False,
            "skip_tokenizer_init": True,
            "disable_log_stats": False,  # RequestOutput.metrics is None without it
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "seed": 0,
        }


def kv_bytes_per_token(model_config: Any, dtype_bytes: int) -> int:
    """Keys and values of one token over every layer, from a Hugging Face config."""
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads
    kv_heads = getattr(model_config, "num_key_value_heads", None) or model_config.num_attention_heads
    return 2 * model_config.num_hidden_layers * kv_heads * head_dim * dtype_bytes


def kv_cache_bytes(config: EngineConfig, bytes_per_token: int) -> int:
    """Room for B requests of ``max_seq_len`` tokens, each rounded up by a block (at least ``MIN_KV_CACHE_BYTES``)."""
    tokens = config.batch_size * (config.max_seq_len + KV_BLOCK_TOKENS)
    return max(MIN_KV_CACHE_BYTES, tokens * bytes_per_token)


def sampling_arguments(params: SamplingParams, eos_token_id: int | None) -> dict[str, Any]:
    """``vllm.SamplingParams`` keywords for one request: greedy, and stopped as perfsuite stops it.

    vLLM, built without a tokenizer, knows no EOS of its own, so EOS (unless
    ignored) goes in with the request's stop ids. With ``min_tokens`` vLLM would
    mask EOS and the stop ids until then, which changes greedy choices;
    perfsuite masks nothing, so such a request runs in vLLM without stop ids and
    perfsuite's rule ends it (the run aborts it in vLLM).
    """
    arguments: dict[str, Any] = {"temperature": 0.0, "max_tokens": params.max_new_tokens}
    if params.min_tokens:
        return {**arguments, "ignore_eos": True, "stop_token_ids": []}
    stop = list(params.stop_token_ids)
    if not params.ignore_eos and eos_token_id is not None and eos_token_id not in stop:
        stop.append(eos_token_id)
    return {**arguments, "ignore_eos": params.ignore_eos, "stop_token_ids": stop}


def clock_offset() -> float:
    """What to add to a ``time.monotonic()`` value (vLLM's clock) to get ``time.perf_counter()``'s."""
    return time.perf_counter() - time.monotonic()


class VLLMEngine:
    """vLLM's ``LLMEngine`` behind the ``BatchingEngine`` protocol.

    ``llm_engine`` needs ``add_request(request_id, prompt, params)``, ``step()`` and
    ``abort_request(ids)``; ``make_params`` and ``make_prompt`` turn perfsuite's
    sampling parameters and prompt ids into vLLM's. ``build`` passes vLLM's own;
    tests pass fakes, so the loop is tested without vLLM installed.
    """

    name = VLLM
    # vLLM batches with its own kernels; tests/peers checks its outputs against
    # unbatched greedy decoding with the near-tie report rather than assuming it.
    greedy_equal = False

    def __init__(
        self,
        llm_engine: Any,
        make_params: Callable[[SamplingParams], Any],
        make_prompt: Callable[[tuple[int, ...]], Any],
        eos_token_id: int | None,
        config: EngineConfig,
        vocab_size: int,
        close: Callable[[], None] | None = None,
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
    ) -> None:
        self.llm_engine = llm_engine
        self.make_params = make_params
        self.make_prompt = make_prompt
        self.eos_token_id = eos_token_id
        self.config = config
        self.vocab_size = vocab_size
        self.stall_timeout_s = stall_timeout_s
        self._close = close

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    def run(
        self,
        requests: Iterable[Request],
        on_step: Callable[[list[StepOutput]], None] | None = None,
        max_concurrency: int | None = None,
    ) -> RunResult:
        """Serve ``requests`` with ``Engine.run``'s semantics; ``on_step`` sees each vLLM step's outputs."""
        arrivals = ArrivalQueue(requests, max_concurrency, engine_name=self.name)
        check_requests_fit(arrivals.requests, self.config.max_seq_len, self.vocab_size)
        serving = _Serving(self, arrivals, on_step)
        start = arrivals.start()
        try:
            serving.serve()
        except BaseException:
            serving.abort_unfinished()
            raise
        end = time.perf_counter()
        records = tuple(serving.records[r.request_id].build() for r in arrivals.requests)
        return RunResult(self.name, records, start, end, EngineCounters())

    def close(self) -> None:
        """Shut vLLM's engine down (its engine-core process, if any); the engine is unusable after."""
        if self._close is not None:
            self._close()
            self._close = None


class _Serving:
    """One run's traffic between the arrival queue and vLLM's engine."""

    def __init__(self, engine: VLLMEngine, arrivals: ArrivalQueue, on_step) -> None:
        self.engine = engine
        self.arrivals = arrivals
        self.on_step = on_step
        self.offset = clock_offset()
        self.records: dict[str, RecordBuilder] = {}
        self.unfinished: dict[str, RecordBuilder] = {}

    def serve(self) -> None:
        last_progress = time.perf_counter()
        while self.arrivals or self.unfinished:
            self.add_arrived()
            if not self.unfinished:
                time.sleep(min(IDLE_POLL_SECONDS, self.arrivals.seconds_to_next_arrival()))
                last_progress = time.perf_counter()
                continue
            outputs = [step_output for output in self.engine.llm_engine.step() for step_output in self.take(output)]
            if outputs:
                last_progress = time.perf_counter()
                if self.on_step is not None:
                    self.on_step(outputs)
            elif time.perf_counter() - last_progress > self.engine.stall_timeout_s:
                raise VLLMEngineError(
                    f"vllm: no output for {self.engine.stall_timeout_s:g} s with requests "
                    f"{sorted(self.unfinished)} unfinished; vLLM's engine is stuck or lost them"
                )

    def add_arrived(self) -> None:
        for admission in self.arrivals.admit(len(self.unfinished)):
            request = admission.request
            record = RecordBuilder(request, admission.arrival_time)
            self.records[request.request_id] = self.unfinished[request.request_id] = record
            self.engine.llm_engine.add_request(
                request.request_id,
                self.engine.make_prompt(request.prompt_token_ids),
                self.engine.make_params(request.sampling_params),
            )

    def take(self, output) -> list[StepOutput]:
        """One request's new tokens from a step, stamped with vLLM's time for that step."""
        record = self.unfinished.get(output.request_id)
        if record is None:
            raise VLLMEngineError(
                f"vllm: a step returned output for request {output.request_id!r}, which is not running"
            )
        completion = output.outputs[0]
        new_tokens = list(completion.token_ids)
        step_outputs = []
        if new_tokens:
            if record.first_scheduled_time is None:
                record.first_scheduled_time = self.vllm_time(output, "scheduled_ts")
            token_time = self.vllm_time(output, "last_token_ts")
            step_outputs = record.add_tokens(new_tokens, [token_time] * len(new_tokens), self.engine.eos_token_id)
        if record.is_finished:
            del self.unfinished[output.request_id]
            if not output.finished:  # perfsuite's stop rule met first: vLLM must not go on with it
                self.engine.llm_engine.abort_request([output.request_id])
        elif output.finished:
            raise VLLMEngineError(
                f"vllm: request {output.request_id!r} finished ({completion.finish_reason}) after "
                f"{len(record.token_ids)} of its {record.request.sampling_params.max_new_tokens} tokens without "
                "meeting perfsuite's stop rule; a short output would make vLLM look faster than it is"
            )
        return step_outputs

    def vllm_time(self, output, field_name: str) -> float:
        """A ``RequestStateStats`` timestamp on ``time.perf_counter``'s clock, checked to lie in the run."""
        metrics = getattr(output, "metrics", None)
        value = getattr(metrics, field_name, None)
        if not value:
            raise VLLMEngineError(
                f"vllm: request {output.request_id!r} has no {field_name} in RequestOutput.metrics "
                f"({type(metrics).__name__}); build the engine with disable_log_stats=False "
                "(this vLLM may no longer report per-request statistics there)"
            )
        moved = value + self.offset
        if not self.arrivals.start_time - 1e-3 <= moved <= time.perf_counter() + 1e-3:
            raise VLLMEngineError(
                f"vllm: request {output.request_id!r} has {field_name}={value} outside the run; vLLM no longer "
                "stamps with time.monotonic and vllm_engine must convert its clock"
            )
        return moved

    def abort_unfinished(self) -> None:
        """Leave vLLM's engine empty after a failed run, so the next run starts clean."""
        if self.unfinished:
            self.engine.llm_engine.abort_request(list(self.unfinished))


def model_directory(backend: Backend) -> Path:
    """The Hugging Face folder the backend's model was loaded from (vLLM loads it again from there)."""
    name_or_path = getattr(getattr(backend.model, "config", None), "_name_or_path", "") or ""
    if not name_or_path or not (Path(name_or_path) / "config.json").is_file():
        raise ValueError(
            "the vllm engine loads the model from its folder, and this backend's model has none "
            f"(name_or_path={name_or_path!r}); use smollm2-135m (perfsuite's safetensors cache) or a local "
            "Hugging Face model directory, not a model built in code such as tiny-random"
        )
    return Path(name_or_path)


def _torch_dtype_name(backend: Backend) -> str:
    return str(getattr(backend.model, "dtype", "float32")).removeprefix("torch.")


@contextlib.contextmanager
def _torch_threads_kept() -> Iterator[None]:
    """Undo what building vLLM's CPU worker does to torch's threads in this process."""
    import torch

    set_num_threads, num_threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(num_threads)


def build(backend: Backend, config: EngineConfig) -> VLLMEngine:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # one process: see the module's docstring
    try:
        import vllm
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind
    except ImportError as error:
        raise ImportError(f"the vllm engine needs vLLM ({error}); {INSTALL_HINT}") from error
    dtype_bytes = backend.model.dtype.itemsize
    per_token = kv_bytes_per_token(backend.model.config, dtype_bytes)
    settings = VLLMSettings.from_config(model_directory(backend), _torch_dtype_name(backend), config, per_token)
    with _torch_threads_kept():
        llm = vllm.LLM(**settings.engine_arguments())

    def make_params(params: SamplingParams):
        return vllm.SamplingParams(
            **sampling_arguments(params, backend.eos_token_id), detokenize=False, output_kind=RequestOutputKind.DELTA
        )

    def make_prompt(prompt_token_ids: tuple[int, ...]):
        return TokensPrompt(prompt_token_ids=list(prompt_token_ids))

    vocab_size = backend.vocab_size or backend.model.config.vocab_size
    engine_core = llm.llm_engine.engine_core  # neither LLM nor LLMEngine has a shutdown of its own
    return VLLMEngine(
        llm.llm_engine, make_params, make_prompt, backend.eos_token_id, config, vocab_size, engine_core.shutdown
    )
