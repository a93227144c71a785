"""What a test's repeats add up to: per-repeat samples, vLLM's summary keys, per-request samples, the timeline.

Pure functions of ``measure.metrics.RunMetrics`` and the engine's records; the
judge compares what they return, the report draws it.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from perfsuite.engine.types import Request, RunResult
from perfsuite.measure.metrics import SLO, Distribution, RunMetrics, goodput

GOODPUT = "request_goodput"

@dataclass(frozen=True, slots=True)
class SizingParameters:
    """The six numbers a person sizing a deployment asks for first."""

    model: str
    precision: str
    input_length: float  # mean prompt tokens
    output_length: float  # mean requested new tokens
    concurrency: int  # batch slots, or clients in a closed loop
    tensor_parallelism: int = 1

def repeat_samples(metrics: RunMetrics, slo: SLO | None = None) -> dict[str, float]:
    samples = {
        "output_throughput": metrics.output_throughput,
        "request_throughput": metrics.request_throughput,
        "median_ttft_ms": 1e3 * metrics.ttft.median,
        "median_tpot_ms": 1e3 * metrics.tpot.median,
        "median_e2el_ms": 1e3 * metrics.e2el.median,
    }
    if slo is not None:
        samples[GOODPUT] = goodput(metrics, slo)
    return samples

def vllm_summary(runs: Sequence[RunMetrics], slo: SLO | None = None) -> dict[str, float]:
    """vLLM's benchmark keys, pooled over the requests of every repeat."""
    summary: dict[str, float] = {
        "request_throughput": statistics.fmean(r.request_throughput for r in runs),
        "output_throughput": statistics.fmean(r.output_throughput for r in runs),
        "completed": sum(r.num_completed for r in runs),
        "total_output_tokens": sum(r.num_output_tokens for r in runs),
    }
    if slo is not None:
        summary[GOODPUT] = statistics.fmean(goodput(r, slo) for r in runs)
    pooled = {
        "ttft": [m.ttft for r in runs for m in r.requests if m.ttft is not None],
        "tpot": [m.tpot for r in runs for m in r.requests if m.tpot is not None],
        "itl": [gap for r in runs for m in r.requests for gap in m.itls],
        "e2el": [m.e2e for r in runs for m in r.requests if m.e2e is not None],
    }
    for name, values in pooled.items():
        distribution = Distribution.of(values)
        summary[f"mean_{name}_ms"] = 1e3 * distribution.mean
        summary[f"median_{name}_ms"] = 1e3 * distribution.median
        summary[f"std_{name}_ms"] = 1e3 * distribution.std
        summary[f"p90_{name}_ms"] = 1e3 * distribution.p90
        summary[f"p99_{name}_ms"] = 1e3 * distribution.p99
    return summary

def per_request_samples(runs: Sequence[RunMetrics]) -> dict[str, tuple[float, ...]]:
    """TTFT, TPOT and E2E of every request of every repeat, in ms (for distributions)."""
    requests = [m for r in runs for m in r.requests]
    return {
        "ttft_ms": tuple(1e3 * m.ttft for m in requests if m.ttft is not None),
        "tpot_ms": tuple(1e3 * m.tpot for m in requests if m.tpot is not None),
        "e2el_ms": tuple(1e3 * m.e2e for m in requests if m.e2e is not None),
    }

def timeline_of(run: RunResult) -> dict[str, Any]:
    """Which request held which slot at every step, and the queue, relative to the run's start."""
    t0 = run.start_time
    return {
        "duration": run.duration,
        "num_slots": 1 + max((c.slot for step in run.steps for c in step.chunks), default=0),
        "steps": [
            {
                "start": step.start_time - t0,
                "end": step.end_time - t0,
                "waiting": step.num_waiting,
                "chunks": [[c.slot, c.request_id, c.num_tokens, c.is_prefill, c.is_padding] for c in step.chunks],
            }
            for step in run.steps
        ],
        "requests": [
            {
                "id": r.request_id,
                "arrival": r.arrival_time - t0,
                "first_token": r.token_times[0] - t0 if r.token_times else None,
                "finished": r.finished_time - t0 if r.finished_time is not None else None,
            }
            for r in run.records
        ],
    }

def counters_of(result: RunResult) -> dict[str, int]:
    return dataclasses.asdict(result.counters)

def sizing_parameters(
    requests: Sequence[Request], model: str, precision: str, concurrency: int
) -> SizingParameters:
    return SizingParameters(
        model=model,
        precision=precision,
        input_length=statistics.fmean(r.num_prompt_tokens for r in requests),
        output_length=statistics.fmean(r.sampling_params.max_new_tokens for r in requests),
        concurrency=concurrency,
    )
