"""Where an engine's run goes: its steps by kind, and for each the forward pass against the host work around it.

Seen from outside the engine, the same way for perfsuite's engines and vLLM's:
each step ends with its outputs (``on_step``), and a step's wall time is the
time since the step before it ended (the first: since the run started), so the
host work between two steps (scheduling, preparing the next batch, the engine
loop) is in the step that follows it, and the steps add up to the run. A step
is of one kind, from its outputs and the requests seen before:

- ``prefill``: every output is some request's first token;
- ``mixed``: first tokens and decode tokens together;
- ``full decode``: only decode tokens, one for each of the batch's ``B`` slots;
- ``partial decode``: only decode tokens, fewer than ``B``.

A step with no output at all (a chunk of a prompt too long to finish in one
step) is not seen: its time is in the next step that has one.

The forward pass is timed inside the engine: for perfsuite's engines, the
runner's execute minus its preparation of the batch (``ProfiledRunner``:
the decoder, the logits and the greedy pick); for vLLM (in this process),
its model's ``forward`` (``*ForCausalLM``), ``compute_logits`` and its
``Sampler``, by forward hooks on the modules its engine hands back
(``ForwardHooks``, ``vllm_modules``). What is left of a step is host time:
everything that is not that compute.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


class StepKind(enum.Enum):
    PREFILL = "prefill"
    MIXED = "mixed"
    PARTIAL_DECODE = "partial decode"
    FULL_DECODE = "full decode"


def classify(num_first_tokens: int, num_outputs: int, batch_size: int) -> StepKind:
    """The kind of a step that gave ``num_outputs`` tokens, ``num_first_tokens`` of them some request's first."""
    if not 0 <= num_first_tokens <= num_outputs or num_outputs == 0:
        raise ValueError(f"a step of {num_outputs} outputs cannot hold {num_first_tokens} first tokens")
    if num_first_tokens == num_outputs:
        return StepKind.PREFILL
    if num_first_tokens:
        return StepKind.MIXED
    return StepKind.FULL_DECODE if num_outputs >= batch_size else StepKind.PARTIAL_DECODE


@dataclass(frozen=True, slots=True)
class StepTime:
    kind: StepKind
    wall_s: float  # since the step before it ended (or the run started)
    forward_s: float | None  # the compute in it; None: not measured for this engine


class StepRecorder:
    """An ``on_step`` callback that keeps each step's kind, wall time and forward time.

    ``forward_seconds`` reads the engine's cumulative forward time (None: not
    measured); the recorder takes its difference step by step.
    """

    def __init__(self, batch_size: int, forward_seconds: Callable[[], float] | None = None) -> None:
        self.batch_size = batch_size
        self.forward_seconds = forward_seconds
        self.steps: list[StepTime] = []
        self._seen: set[str] = set()
        self._last_end = time.perf_counter()
        self._last_forward = forward_seconds() if forward_seconds is not None else 0.0

    def __call__(self, outputs: Iterable[Any]) -> None:
        ids = [output.request_id for output in outputs]
        if not ids:
            return
        now = time.perf_counter()
        first = [request_id for request_id in ids if request_id not in self._seen]
        self._seen.update(first)
        forward = None
        if self.forward_seconds is not None:
            total = self.forward_seconds()
            forward, self._last_forward = total - self._last_forward, total
        self.steps.append(StepTime(classify(len(first), len(ids), self.batch_size), now - self._last_end, forward))
        self._last_end = now


@dataclass(frozen=True, slots=True)
class KindTotals:
    kind: StepKind
    num_steps: int
    wall_s: float
    forward_s: float | None

    @property
    def host_s(self) -> float | None:
        return None if self.forward_s is None else self.wall_s - self.forward_s

    @property
    def ms_per_step(self) -> float | None:
        return 1e3 * self.wall_s / self.num_steps if self.num_steps else None


def totals(steps: Iterable[StepTime]) -> dict[StepKind, KindTotals]:
    """Per kind (every kind, in ``StepKind``'s order): its steps, wall seconds and forward seconds."""
    steps = list(steps)
    out = {}
    for kind in StepKind:
        of_kind = [step for step in steps if step.kind is kind]
        forwards = [step.forward_s for step in of_kind]
        forward = None if any(f is None for f in forwards) else sum(f for f in forwards if f is not None)
        out[kind] = KindTotals(kind, len(of_kind), sum(step.wall_s for step in of_kind), forward)
    return out


class ForwardHooks:
    """vLLM's compute, timed in this process: its model's forward, ``compute_logits`` and its sampler.

    The modules are asked of vLLM's engine (``vllm_modules``: its public
    ``apply_model`` and ``collective_rpc``, which in one process hand back
    the objects themselves; ``gc`` does not see them, as vLLM freezes what
    it built). Each gets forward hooks of its own, so vLLM is not patched,
    and what vLLM compiles (the decoder inside the model) is not touched.
    ``compute_logits`` is a method, not a module call: it is wrapped on the
    model instance, and put back after.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started: dict[int, float] = {}

    @staticmethod
    def is_timed(module: Any) -> bool:
        cls = type(module)
        return cls.__module__.startswith("vllm") and (cls.__name__.endswith("ForCausalLM") or cls.__name__ == "Sampler")

    def _pre(self, module: Any, _args: Any) -> None:
        self._started[id(module)] = time.perf_counter()

    def _post(self, module: Any, _args: Any, _output: Any) -> None:
        started = self._started.pop(id(module), None)
        if started is not None:
            self.seconds += time.perf_counter() - started

    def _timed(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed

    @contextmanager
    def installed(self, modules: list[Any]) -> Iterator[ForwardHooks]:
        modules = [module for module in modules if self.is_timed(module)]
        if not modules:
            raise RuntimeError("no vLLM model or sampler to time: pass vllm_modules(engine.llm_engine)")
        handles = []
        patched = []
        for module in modules:
            handles += [module.register_forward_pre_hook(self._pre), module.register_forward_hook(self._post)]
            if type(module).__name__.endswith("ForCausalLM") and hasattr(module, "compute_logits"):
                patched.append(module)
                module.compute_logits = self._timed(module.compute_logits)
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()
            for module in patched:
                del module.compute_logits  # the instance attribute: the class's method shows again


def vllm_modules(llm_engine: Any) -> list[Any]:
    """vLLM's model and its sampler, from its ``LLMEngine`` in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    modules = list(llm_engine.apply_model(lambda model: model))
    modules += llm_engine.collective_rpc(lambda worker: worker.model_runner.sampler)
    return modules


def split_rows(engine: str, run_seconds: float, steps: list[StepTime]) -> list[list[Any]]:
    """Table rows for one engine's run: one per step kind that occurred, then the whole run."""
    rows = []
    by_kind = totals(steps)
    for kind_totals in by_kind.values():
        if not kind_totals.num_steps:
            continue
        rows.append([
            engine, kind_totals.kind.value, kind_totals.num_steps, kind_totals.wall_s,
            _share(kind_totals.wall_s, run_seconds), _or_na(kind_totals.forward_s), _or_na(kind_totals.host_s),
            _or_na(kind_totals.ms_per_step),
        ])  # fmt: skip
    forward = [t.forward_s for t in by_kind.values() if t.num_steps]
    forward_s = None if any(f is None for f in forward) else sum(f for f in forward if f is not None)
    after = max(0.0, run_seconds - sum(t.wall_s for t in by_kind.values()))  # from the last step to the run's end
    host = None if forward_s is None else run_seconds - forward_s
    rows.append([engine, "whole run", len(steps), run_seconds, "100%", _or_na(forward_s), _or_na(host),
                 f"after the last step: {1e3 * after:.0f} ms"])  # fmt: skip
    return rows


SPLIT_HEADER = ["engine", "steps", "n", "wall s", "of the run", "forward s", "host s", "ms a step"]


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "n/a"


def _or_na(value: float | None) -> Any:
    return "n/a" if value is None else value
