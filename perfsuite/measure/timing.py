"""Measurement hygiene shared by the CLI and the benchmarks.

Warm-up runs are thrown away, the device is synced around the timed region,
and ``time.perf_counter`` is the clock (gpt-fast's rules).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from perfsuite.engine import Request, RunResult, SamplingParams


class Runs(Protocol):
    """What timing needs of an engine: the ``run`` of ``perfsuite.adapters.BatchingEngine``."""

    def run(
        self,
        requests: Iterable[Request],
        on_step: Callable | None = None,
        max_concurrency: int | None = None,
    ) -> RunResult: ...


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but CUDA is not available; use --device cpu or auto")
    if name != "cpu" and not name.startswith("cuda"):
        raise ValueError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N")
    return name


def configure_threads(num_threads: int | None) -> int:
    """One intra-op thread per core and one inter-op thread.

    Measured with bench/threads.py on the 2-core CI machine (SmolLM2, B=8):
    2 threads 124 ms per decode step, 1 thread 152 ms, 4 threads 149 ms (more
    threads than cores oversubscribe). The spread was 15-19% at every
    setting: it comes from the VM, not the thread count, which is why
    comparisons are normalised by a machine probe. Inter-op parallelism has
    nothing to overlap in a decode step.
    """
    import torch

    num_threads = num_threads or default_num_threads()
    torch.set_num_threads(num_threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # only settable once, before any parallel work
        pass
    return num_threads


def default_num_threads() -> int:
    """The intra-op threads ``configure_threads(None)`` sets: one per CPU this process may run on."""
    return len(os.sched_getaffinity(0))


def synchronize(device: str) -> None:
    if device.startswith("cuda"):  # nothing to wait for elsewhere, nor torch to import (a server's client has none)
        import torch

        torch.cuda.synchronize(device)


class DevicePeakMemory:
    """``torch.cuda.max_memory_allocated`` over what runs inside it, on a CUDA device; None on any other.

    The peak is reset on entry (``torch.cuda.reset_peak_memory_stats``), so
    what it reads on exit is the most this run had allocated at once: the
    weights and KV cache it found allocated plus what it added at its
    busiest. Nothing is read when the run raised.
    """

    def __init__(self, device: str) -> None:
        self.device = device
        self.peak_bytes: int | None = None

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def __enter__(self) -> DevicePeakMemory:
        if self.on_cuda:
            import torch

            synchronize(self.device)  # what earlier work still has queued is not this run's
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, error_type, error, traceback) -> None:
        if self.on_cuda and error_type is None:
            import torch

            synchronize(self.device)
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))


def max_seq_len_for(requests: Sequence[Request], max_context: int) -> int:
    """The smallest per-slot cache length that fits every request, rounded up to 64."""
    longest = max(r.max_total_tokens for r in requests)
    rounded = -(-longest // 64) * 64
    if longest > max_context:
        raise ValueError(
            f"the longest request needs {longest} tokens but the model's context is {max_context}; "
            "lower max_new_tokens or use shorter prompts"
        )
    return min(rounded, max_context)


def warm_up(engine: Runs, requests: Sequence[Request], num_requests: int = 2, max_new_tokens: int = 4) -> None:
    """A short throw-away run so allocation and thread start-up are not timed."""
    short = [
        Request(f"warmup-{i}", r.prompt_token_ids, SamplingParams(max_new_tokens, ignore_eos=True))
        for i, r in enumerate(requests[:num_requests])
    ]
    engine.run(short)


def timed_run(
    engine: Runs,
    requests: Sequence[Request],
    device: str,
    on_step: Callable | None = None,
    max_concurrency: int | None = None,
) -> RunResult:
    synchronize(device)
    result = engine.run(requests, on_step=on_step, max_concurrency=max_concurrency)
    synchronize(device)
    return result
