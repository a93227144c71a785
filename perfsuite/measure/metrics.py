"""Latency and throughput from recorded timestamps. Pure functions, no torch.

Definitions follow vLLM's benchmark (all times in seconds, from
``RequestRecord``'s monotonic clock):

- TTFT: first token time minus arrival time (queueing included).
- E2E latency: last token time minus arrival time.
- TPOT: (E2E - TTFT) / (output tokens - 1); undefined for one-token outputs.
- ITL: every gap between consecutive tokens of a request. Tokens that one step
  produces together share a timestamp, so ITL is the step time seen by a request.
- Output throughput: output tokens of completed requests / run duration.
- Request throughput: completed requests / run duration.
- Goodput: completed requests that meet every SLO / run duration (DistServe's
  definition, as vLLM's ``--goodput``). TPOT is not defined for a one-token
  output, so it cannot miss a TPOT SLO.

Aborted requests count in ``num_aborted`` but not in latencies or throughput.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from perfsuite.engine.types import FinishReason, RequestRecord, RunResult

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation (numpy's default method)."""
    if not values:
        raise ValueError("percentile of an empty sequence is undefined")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in 0..100, got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Distribution:
    count: int
    mean: float
    std: float
    min: float
    median: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        if not values:
            nan = math.nan
            return cls(0, nan, nan, nan, nan, nan, nan, nan)
        mean = math.fsum(values) / len(values)
        variance = math.fsum((v - mean) ** 2 for v in values) / len(values)
        return cls(
            count=len(values),
            mean=mean,
            std=math.sqrt(variance),
            min=min(values),
            median=percentile(values, 50),
            p90=percentile(values, 90),
            p99=percentile(values, 99),
            max=max(values),
        )


SLO_METRICS = ("ttft", "tpot", "e2el")
_UNITS = {"ms": 1e-3, "s": 1.0}


@dataclass(frozen=True, slots=True)
class SLO:
    """Service-level objectives, in seconds; None where a metric has no objective."""

    ttft: float | None = None
    tpot: float | None = None
    e2el: float | None = None

    def __post_init__(self) -> None:
        limits = {name: getattr(self, name) for name in SLO_METRICS}
        if all(value is None for value in limits.values()):
            raise ValueError("an SLO needs at least one of ttft, tpot, e2el, e.g. ttft=500ms,tpot=50ms")
        for name, value in limits.items():
            if value is not None and not value > 0:
                raise ValueError(f"SLO {name} must be a positive time, got {value}")
            if value is not None and not math.isfinite(1e3 * value):  # the label and results.json give it in ms
                raise ValueError(f"SLO {name} must be a finite time, got {value} s")

    @classmethod
    def parse(cls, text: str) -> SLO:
        """``ttft=500ms,tpot=50ms,e2el=2s`` (units ms or s)."""
        limits: dict[str, float] = {}
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            name, sep, value = (piece.strip() for piece in item.partition("="))
            if not sep or name not in SLO_METRICS:
                raise ValueError(f"SLO item {item!r}: expected one of {', '.join(SLO_METRICS)} as name=value")
            if name in limits:
                raise ValueError(f"SLO {name} is given twice")
            unit = next((u for u in ("ms", "s") if value.endswith(u)), None)
            try:
                number = float(value[: -len(unit)] if unit else value)
            except ValueError:
                number = math.nan
            if unit is None or math.isnan(number):
                raise ValueError(f"SLO {name}={value!r}: expected a time with a unit, e.g. 500ms or 2s")
            seconds = number * _UNITS[unit]
            if number > 0 and not math.isfinite(1e3 * seconds):  # 1e400s parses as inf: no request can miss it
                raise ValueError(f"SLO {name}={value!r}: expected a finite time, e.g. 500ms or 2s")
            limits[name] = seconds
        return cls(**limits)

    @property
    def label(self) -> str:
        return ",".join(f"{n}={1e3 * getattr(self, n):g}ms" for n in SLO_METRICS if getattr(self, n) is not None)

    def is_met_by(self, request: RequestMetrics) -> bool:
        checks = ((self.ttft, request.ttft), (self.tpot, request.tpot), (self.e2el, request.e2e))
        return all(limit is None or value is None or value <= limit for limit, value in checks)


def goodput(metrics: RunMetrics, slo: SLO) -> float:
    """Requests per second that met every objective."""
    good = sum(1 for request in metrics.requests if slo.is_met_by(request))
    return good / metrics.duration if metrics.duration > 0 else math.nan


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    request_id: str
    num_prompt_tokens: int
    num_output_tokens: int
    queue_time: float | None
    ttft: float | None
    tpot: float | None
    e2e: float | None
    itls: tuple[float, ...]
    num_cached_tokens: int | None = None  # prompt tokens found in the prefix cache; None: not known
    num_client_prompt_tokens: int | None = None  # the prompt as built, where the server counted it otherwise

    @property
    def num_built_prompt_tokens(self) -> int:
        """The prompt as perfsuite built it (``num_prompt_tokens`` is the server's count where it said one)."""
        return self.num_prompt_tokens if self.num_client_prompt_tokens is None else self.num_client_prompt_tokens


def request_metrics(record: RequestRecord) -> RequestMetrics:
    times = record.token_times
    ttft: float | None = None
    e2e: float | None = None
    tpot: float | None = None
    if times:
        ttft = times[0] - record.arrival_time
        e2e = times[-1] - record.arrival_time
        # Over the output's tokens, not its timestamps: a text-only stream has one time per chunk (RequestRecord).
        num_later_tokens = record.num_output_tokens - 1
        if len(times) >= 2 and num_later_tokens >= 1:
            tpot = (e2e - ttft) / num_later_tokens
    queue = None if record.first_scheduled_time is None else record.first_scheduled_time - record.arrival_time
    return RequestMetrics(
        request_id=record.request_id,
        num_prompt_tokens=record.num_prompt_tokens,
        num_output_tokens=record.num_output_tokens,
        queue_time=queue,
        ttft=ttft,
        tpot=tpot,
        e2e=e2e,
        itls=tuple(later - earlier for earlier, later in itertools.pairwise(times)),
        num_cached_tokens=record.num_cached_tokens,
        num_client_prompt_tokens=record.num_client_prompt_tokens,
    )


@dataclass(frozen=True, slots=True)
class RunMetrics:
    engine_name: str
    num_requests: int
    num_completed: int
    num_aborted: int
    num_output_tokens: int
    duration: float
    output_throughput: float  # tokens/s
    request_throughput: float  # requests/s
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2el: Distribution
    requests: tuple[RequestMetrics, ...]


def run_metrics(result: RunResult) -> RunMetrics:
    completed = [r for r in result.records if r.finish_reason is not None and r.finish_reason is not FinishReason.ABORT]
    per_request = tuple(request_metrics(r) for r in completed)
    num_output_tokens = sum(m.num_output_tokens for m in per_request)
    duration = result.duration
    return RunMetrics(
        engine_name=result.engine_name,
        num_requests=len(result.records),
        num_completed=len(completed),
        num_aborted=sum(1 for r in result.records if r.finish_reason is FinishReason.ABORT),
        num_output_tokens=num_output_tokens,
        duration=duration,
        output_throughput=num_output_tokens / duration if duration > 0 else math.nan,
        request_throughput=len(completed) / duration if duration > 0 else math.nan,
        ttft=Distribution.of([m.ttft for m in per_request if m.ttft is not None]),
        tpot=Distribution.of([m.tpot for m in per_request if m.tpot is not None]),
        itl=Distribution.of([gap for m in per_request for gap in m.itls]),
        e2el=Distribution.of([m.e2e for m in per_request if m.e2e is not None]),
        requests=per_request,
    )
