"""The one protocol every measured engine implements, ours or a peer's.

An engine takes requests (with arrival times in seconds after the start of
the run) and returns a ``RunResult``: per-request token timestamps from which
``perfsuite.measure.metrics`` computes TTFT, TPOT, ITL and E2E latency. The harness
never looks inside; the same perf and correctness tests run against any
implementation.

An engine is built by a factory, ``factory(backend, config) -> BatchingEngine``,
registered by name (see ``perfsuite.adapters.registry``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from perfsuite.adapters.http_options import HttpClientOptions
from perfsuite.engine.admission import refuse_follow_ups
from perfsuite.engine.types import DecodeMode, Request, RunResult, StepOutput


@runtime_checkable
class BatchingEngine(Protocol):
    """What the harness drives.

    - ``name``: shown in results and reports;
    - ``batch_size``: the most requests it computes at once (the concurrency
      recorded for sizing);
    - ``greedy_equal``: true if its outputs equal unbatched greedy decoding
      token for token; the correctness tests then hold it to that;
    - ``run``: serve every request, each once its ``arrival_time`` has passed;
      with ``max_concurrency`` as a closed loop of that many clients. It must
      return a record for every request (none is dropped) and leave the engine
      ready for another run. ``on_step`` is called with the outputs of each
      forward step where the engine can observe steps (progress only).

    Optionally, ``runs_in_process = False`` says the work happens in another
    process (a server): its CPU use then does not count as other work when
    the recorder checks whether the machine was busy. ``resolves_follow_ups =
    True`` says ``run`` serves multi-turn follow-ups (``Request.follows``: a
    turn's prompt is made from its parent's output when the parent finishes,
    as ``Engine.run`` does); an engine without it is refused such a workload
    (``check_serves_follow_ups``). ``attention``, where not None, names a
    path that changes the speed but not the outputs (a paged engine's "in
    place" or "gather"): a stored run records it among its knobs, so runs of
    different paths are never compared; ``attention_fallback``, where not
    None, says why a path slower than the one wanted was taken and the fix
    (a paged engine whose kernel could not be built): the session prints it.
    """

    name: str
    greedy_equal: bool

    @property
    def batch_size(self) -> int: ...

    def run(
        self,
        requests: Iterable[Request],
        on_step: Callable[[list[StepOutput]], None] | None = None,
        max_concurrency: int | None = None,
    ) -> RunResult: ...


def check_serves_follow_ups(engine: BatchingEngine, requests: Sequence[Request]) -> None:
    """``ValueError`` naming the engine when ``requests`` hold follow-ups that its ``run`` would not resolve."""
    if getattr(engine, "resolves_follow_ups", False):
        return
    refuse_follow_ups(requests, f"engine {engine.name!r}")


@dataclass(frozen=True, slots=True)
class Backend:
    """One loaded model, as the engines and the perf fixtures see it.

    ``runner`` is perfsuite's model runner over the model (or a fake);
    ``model`` and ``tokenizer`` are the Hugging Face objects that peer
    adapters drive (None for a fake backend). ``endpoint`` is the base URL
    of an OpenAI-compatible server for the ``openai-http`` engine, and
    ``http_options`` how that engine talks to it. ``probe`` times the machine
    before each repeat: the plugin's ``perf_backend`` passes in
    ``perfsuite.measure.probe.machine_probe``. Without one (a fake that sleeps,
    whose speed does not follow the machine's) samples are not normalised by
    machine speed and the busy-machine check (``perfsuite.measure.contention``)
    is off.
    """

    runner: Any
    tokenize: Callable[[str], Sequence[int]]
    eos_token_id: int | None
    max_context: int
    device: str
    probe: Callable[[str], float] | None = None
    model: Any = None
    tokenizer: Any = None
    endpoint: str | None = None
    http_options: HttpClientOptions = HttpClientOptions()
    vocab_size: int | None = None  # ids synthetic prompts may use: 0..vocab_size-1
    special_token_ids: tuple[int, ...] = ()  # never drawn into a synthetic prompt

    @classmethod
    def held_elsewhere(cls, tokenize: Callable[[str], Sequence[int]], limits: Any) -> Backend:
        """The model as fixtures see it when other processes hold it (A/B workers, Ray actors): no runner here.

        ``limits``: what those processes reported of it (``eos_token_id``,
        ``max_context``, ``device``, ``vocab_size``, ``special_token_ids``).
        """
        return cls(
            runner=None,
            tokenize=tokenize,
            eos_token_id=limits.eos_token_id,
            max_context=limits.max_context,
            device=limits.device,
            vocab_size=limits.vocab_size,
            special_token_ids=tuple(limits.special_token_ids),
        )

    @classmethod
    def from_loaded(
        cls,
        loaded: Any,
        endpoint: str | None = None,
        decode_mode: DecodeMode | str = DecodeMode.PACKED,
        http_options: HttpClientOptions | None = None,
        probe: Callable[[str], float] | None = None,
        batch_invariant: bool = False,
    ) -> Backend:
        """The backend of a ``perfsuite.models.LoadedModel``, with perfsuite's runner over it (batch invariant, with
        ``batch_invariant``: ``ModelRunner``)."""
        from perfsuite.engine.model_runner import ModelRunner

        return cls(
            runner=ModelRunner(loaded.model, decode_mode=decode_mode, batch_invariant=batch_invariant),
            probe=probe,
            tokenize=lambda text: loaded.tokenizer(text)["input_ids"],
            eos_token_id=loaded.eos_token_id,
            max_context=loaded.max_context,
            device=str(loaded.model.device),
            model=loaded.model,
            tokenizer=loaded.tokenizer,
            endpoint=endpoint,
            http_options=http_options or HttpClientOptions(),
            vocab_size=min(len(loaded.tokenizer), loaded.model.config.vocab_size),
            special_token_ids=tuple(loaded.tokenizer.all_special_ids),
        )


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The knobs a test asks an engine for; an engine ignores what it does not have.

    ``batch_size`` is the static batch, the in-flight ``decode_batch_size`` or a
    peer's batch/concurrency limit. ``max_seq_len`` is the longest
    prompt + output any request of the session needs. ``batch_invariant``
    asks perfsuite's engines for a request's same bits whatever else is in its
    batch: their backend's runner must be built so (``ModelRunner(batch_invariant=True)``).
    ``kv_block_size`` is the tokens a paged engine's KV block holds, the unit
    ``num_kv_blocks`` counts in; None: the engine's own (perfsuite's paged
    engines: 16). An engine without blocks, or one that cannot change its
    block size, may ignore it.
    """

    batch_size: int
    max_seq_len: int
    prefill_batch_size: int | None = None
    max_num_batched_tokens: int | None = None  # the most tokens one step computes (vLLM's name)
    num_kv_blocks: int | None = None  # the paged engine's KV pool; None: batch_size x max_seq_len tokens of it
    batch_invariant: bool = False
    kv_block_size: int | None = None  # tokens a KV block holds; None: the engine's default (perfsuite's: 16)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.max_seq_len < 2:
            raise ValueError(f"max_seq_len must be >= 2, got {self.max_seq_len}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}; or leave it unset")
        if self.kv_block_size is not None and self.kv_block_size < 1:
            raise ValueError(f"kv_block_size must be >= 1, got {self.kv_block_size}; or leave it unset")

    def identity(self) -> dict[str, int | None]:
        """The knobs as a stored run's identity records them.

        A knob added after baselines were stored is left out while unset, so
        a run that does not use it keeps the identity its baselines carry.
        """
        knobs = dataclasses.asdict(self)
        for name, unset in _KNOBS_ADDED_LATER.items():
            if knobs[name] is unset:
                del knobs[name]
        return knobs


# each knob added after baselines were stored, with the value it is left out at
_KNOBS_ADDED_LATER = {"num_kv_blocks": None, "batch_invariant": False, "kv_block_size": None}


EngineFactory = Callable[[Backend, EngineConfig], BatchingEngine]
