"""What a test's repeats add up to: per-repeat samples, vLLM's summary, per-request samples, the timeline.

Pure functions of ``measure.metrics.RunMetrics`` and the engine's records,
returning frozen dataclasses; the judge compares what they return, the report
draws it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perfsuite.engine.server_metrics import ServerMetrics
from perfsuite.engine.types import EngineCounters, Request, RequestRecord, RunResult
from perfsuite.measure.metrics import SLO, Distribution, RequestMetrics, RunMetrics, goodput, run_metrics
from perfsuite.measure.peaks import MachinePeaks
from perfsuite.measure.prefix_cache import CachedPrompts, cached_prompts, ttft_by_cache_hit
from perfsuite.measure.quantiles import DEFAULT_CONFIDENCE, PercentileInterval, percentile_interval
from perfsuite.measure.send_lag import SendLag, client_bound_reason, worst_send_lag
from perfsuite.measure.utilization import UTILIZATION_KEYS, utilization_samples

GOODPUT = "request_goodput"

# Seconds of measure.machine_probe around each repeat. A change to what the probe
# times must rename this key (it was "probe_seconds" for the memory part alone, taken
# before the repeat): baselines with the old key then lose their probe
# and are compared as measured, instead of being rescaled by a foreign unit.
PROBE = "probe_bracket_seconds"

# Other work's share of the machine's CPU during each repeat (perfsuite.measure.contention); stored, never compared.
BUSY_SHARE = "cpu_busy_share"

# torch.cuda.max_memory_allocated over each repeat, in bytes (CUDA only, measure.timing.DevicePeakMemory);
# stored, never compared: it depends on the allocator and the torch build as much as on the code.
DEVICE_MEMORY = "max_memory_allocated_bytes"

# NVML's energy counter over each repeat per output token, in joules (measure.gpu_telemetry); stored, never compared.
ENERGY_PER_TOKEN = "energy_per_output_token_j"

LATENCIES = ("ttft", "tpot", "itl", "e2el")

# The percentiles a LatencySummary reports, with each one's q; each gets a distribution-free interval.
PERCENTILES = {"median": 50.0, "p90": 90.0, "p99": 99.0}


@dataclass(frozen=True, slots=True)
class SizingParameters:
    """The six numbers a person sizing a deployment asks for first."""

    model: str
    precision: str
    input_length: float  # mean prompt tokens
    output_length: float  # mean requested new tokens
    concurrency: int  # batch slots, or clients in a closed loop
    tensor_parallelism: int = 1


@dataclass(frozen=True, slots=True)
class Repeats:
    """A test's timed repeats and what was measured around each of them."""

    runs: tuple[RunResult, ...]
    probes: tuple[float, ...] = ()  # machine probe seconds around each repeat (before and after, geometric mean)
    busy_shares: tuple[float, ...] = ()  # other work's share of the machine's CPU during each repeat
    noisy: str | None = None  # why these repeats cannot support a verdict (perfsuite.measure.contention)
    device_memory: tuple[int, ...] = ()  # CUDA: peak bytes allocated during each repeat; none on CPU
    energy_per_token: tuple[float, ...] = ()  # CUDA with NVML: joules per output token of each repeat; none on CPU


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """One latency over every request of every repeat, in milliseconds.

    Each percentile has its distribution-free interval (``measure.quantiles``,
    95%, in ms); one the sample cannot bound on both sides (p99 of fewer than
    368 values) is *unsupported* and is shown as such, never as a precise
    figure. ``None``: not recorded (a file older than the intervals).
    """

    mean_ms: float
    median_ms: float
    std_ms: float
    p90_ms: float
    p99_ms: float
    median_ci: PercentileInterval | None = None
    p90_ci: PercentileInterval | None = None
    p99_ci: PercentileInterval | None = None

    @classmethod
    def of(cls, seconds: Sequence[float]) -> LatencySummary:
        distribution = Distribution.of(seconds)
        return cls(
            mean_ms=1e3 * distribution.mean,
            median_ms=1e3 * distribution.median,
            std_ms=1e3 * distribution.std,
            p90_ms=1e3 * distribution.p90,
            p99_ms=1e3 * distribution.p99,
            **{f"{name}_ci": _interval_ms(seconds, q) for name, q in PERCENTILES.items()},
        )

    def interval(self, statistic: str) -> PercentileInterval | None:
        """``median``, ``p90`` or ``p99``'s interval; None when not recorded."""
        return getattr(self, f"{statistic}_ci")


def _interval_ms(seconds: Sequence[float], q: float) -> PercentileInterval:
    if not seconds:
        return PercentileInterval(q, None, None, DEFAULT_CONFIDENCE, 0)
    interval = percentile_interval(seconds, q)
    low, high = (None if end is None else 1e3 * end for end in (interval.low, interval.high))
    return PercentileInterval(q, low, high, interval.confidence, interval.num_values)


@dataclass(frozen=True, slots=True)
class RunSummary:
    """vLLM's benchmark figures, pooled over the requests of every repeat."""

    request_throughput: float
    output_throughput: float
    completed: int
    total_output_tokens: int
    ttft: LatencySummary
    tpot: LatencySummary
    itl: LatencySummary
    e2el: LatencySummary
    request_goodput: float | None = None  # with an SLO (--perf-slo) only
    total_input_tokens: int | None = None  # prompt tokens, the server's count where it said one; None: older file
    # The prompts as perfsuite built them, where a server counted otherwise (a chat template's tokens); None: same
    total_client_input_tokens: int | None = None

    def vllm_keys(self) -> dict[str, float]:
        """The figures under the flat keys vLLM's benchmark JSON uses (``median_ttft_ms``...)."""
        keys: dict[str, float] = {
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "completed": self.completed,
            "total_output_tokens": self.total_output_tokens,
        }
        if self.total_input_tokens is not None:
            keys["total_input_tokens"] = self.total_input_tokens
        if self.request_goodput is not None:
            keys[GOODPUT] = self.request_goodput
        for name in LATENCIES:
            latency: LatencySummary = getattr(self, name)
            for statistic in ("mean", "median", "std", "p90", "p99"):
                keys[f"{statistic}_{name}_ms"] = getattr(latency, f"{statistic}_ms")
        return keys

    def interval_keys(self) -> dict[str, object]:
        """Beside each percentile key, its interval and whether the sample supports it.

        ``p99_ttft_ms_ci``: [low, high] in ms, null for an open end;
        ``p99_ttft_ms_supported``: false when an end is open; ``ttft_num_values``:
        the values the percentiles were taken over. Kept out of ``vllm_keys``,
        whose values are all numbers, as vLLM's benchmark writes them.
        """
        keys: dict[str, object] = {}
        for name in LATENCIES:
            latency: LatencySummary = getattr(self, name)
            for statistic in PERCENTILES:
                interval = latency.interval(statistic)
                if interval is None:
                    continue
                keys[f"{statistic}_{name}_ms_ci"] = interval.as_list()
                keys[f"{statistic}_{name}_ms_supported"] = interval.supported
                keys[f"{name}_num_values"] = interval.num_values
        return keys

    @classmethod
    def from_vllm_keys(cls, keys: Mapping[str, Any]) -> RunSummary:
        """The summary from ``vllm_keys`` and, where present, ``interval_keys`` (an older file has none).

        A figure the run did not define (NaN: no TPOT when every output is one
        token) is null in results.json, which is standard JSON; it reads as NaN.
        """
        return cls(
            request_throughput=_defined_or_nan(keys["request_throughput"]),
            output_throughput=_defined_or_nan(keys["output_throughput"]),
            completed=int(keys["completed"]),
            total_output_tokens=int(keys["total_output_tokens"]),
            request_goodput=keys.get(GOODPUT),
            total_input_tokens=keys.get("total_input_tokens"),
            ttft=_latency_from_keys(keys, "ttft"),
            tpot=_latency_from_keys(keys, "tpot"),
            itl=_latency_from_keys(keys, "itl"),
            e2el=_latency_from_keys(keys, "e2el"),
        )


def _defined_or_nan(figure: float | None) -> float:
    return math.nan if figure is None else figure


def _latency_from_keys(keys: Mapping[str, Any], name: str) -> LatencySummary:
    """One latency of ``RunSummary.from_vllm_keys``: its figures, and the intervals where the file has them."""
    mean, median, std, p90, p99 = (
        _defined_or_nan(keys[f"{s}_{name}_ms"]) for s in ("mean", "median", "std", "p90", "p99")
    )
    return LatencySummary(
        mean,
        median,
        std,
        p90,
        p99,
        median_ci=_interval_from_keys(keys, "median", name),
        p90_ci=_interval_from_keys(keys, "p90", name),
        p99_ci=_interval_from_keys(keys, "p99", name),
    )


def _interval_from_keys(keys: Mapping[str, Any], statistic: str, name: str) -> PercentileInterval | None:
    ends = keys.get(f"{statistic}_{name}_ms_ci")
    if ends is None:
        return None  # not recorded
    low, high = ends
    return PercentileInterval(PERCENTILES[statistic], low, high, DEFAULT_CONFIDENCE, int(keys[f"{name}_num_values"]))


@dataclass(frozen=True, slots=True)
class TimelineChunk:
    """What one batch slot computed in one step."""

    slot: int
    request_id: str
    num_tokens: int
    is_prefill: bool
    is_padding: bool


@dataclass(frozen=True, slots=True)
class TimelineStep:
    start: float  # seconds since the run started
    end: float
    num_waiting: int  # requests queued while it ran
    chunks: tuple[TimelineChunk, ...]
    num_kv_blocks_used: int = 0  # KV blocks held once the step ran
    num_kv_tokens_used: int = 0  # tokens held in them
    preempted_request_ids: tuple[str, ...] = ()  # preempted to make room for this step


@dataclass(frozen=True, slots=True)
class TimelineRequest:
    request_id: str
    arrival: float  # seconds since the run started
    first_token: float | None
    finished: float | None
    send_lag: float | None = None  # open loop: seconds the load generator sent it late (measure.send_lag)


@dataclass(frozen=True, slots=True)
class RunTimeline:
    """One timed run: which request held which slot at every step, and the queue."""

    duration: float
    num_slots: int
    steps: tuple[TimelineStep, ...]  # none for an engine that shows no steps (a server)
    requests: tuple[TimelineRequest, ...]
    num_kv_blocks: int | None = None  # the KV pool (a slot cache: its slots); None: the engine does not say
    kv_block_size: int | None = None  # tokens per block (a slot cache: max_seq_len)


@dataclass(frozen=True, slots=True)
class MemoryUse:
    """What a test's runs held: the KV pool, how much of it was used, what was preempted; and the device's peak.

    The KV figures are of one run (the last repeat), from the engine's exact
    counters and the pool the timeline names; the device's peak is the most
    over the repeats. A reader's view, built by ``memory_use``: results.json
    stores the counters, timeline and samples it comes from, and writes this
    beside them.
    """

    num_kv_blocks: int | None  # None: the engine does not say (a server, a peer)
    kv_block_size: int | None
    peak_kv_blocks_used: int
    mean_kv_blocks_used: float
    kv_utilisation: float  # tokens held over the capacity of the blocks holding them, over all steps
    num_preemptions: int
    num_recomputed_tokens: int
    peak_num_running: int  # the most requests running at once
    max_memory_allocated_bytes: int | None  # CUDA only


def memory_use(
    counters: EngineCounters, timeline: RunTimeline | None, samples: Mapping[str, Sequence[float]]
) -> MemoryUse | None:
    """The KV and device memory figures of a test, or None when it recorded neither (a server; an older file)."""
    num_blocks = timeline.num_kv_blocks if timeline is not None else None
    peaks = samples.get(DEVICE_MEMORY)
    if num_blocks is None and not peaks:
        return None
    return MemoryUse(
        num_kv_blocks=num_blocks,
        kv_block_size=timeline.kv_block_size if timeline is not None else None,
        peak_kv_blocks_used=counters.peak_kv_blocks_used,
        mean_kv_blocks_used=counters.mean_kv_blocks_used,
        kv_utilisation=counters.kv_utilisation,
        num_preemptions=counters.num_preemptions,
        num_recomputed_tokens=counters.num_recomputed_tokens,
        peak_num_running=counters.peak_num_running,
        max_memory_allocated_bytes=int(max(peaks)) if peaks else None,
    )


@dataclass(frozen=True, slots=True)
class Measured:
    """What a test's repeats add up to, before any judging."""

    engine_name: str
    samples: dict[str, tuple[float, ...]]  # metric -> one value per repeat
    counters: EngineCounters  # of the last repeat: exact, so every repeat has the same
    summary: RunSummary
    request_samples: dict[str, tuple[float, ...]]  # per request, all repeats
    timeline: RunTimeline  # of the last repeat
    noisy: str | None
    send_lag: SendLag | None = None  # open loop: the repeat whose sends kept the schedule worst
    cached_prompts: CachedPrompts | None = None  # what the requests said of the prefix cache; None: nothing
    server_metrics: tuple[ServerMetrics, ...] = ()  # a server's /metrics around each repeat; none: not exposed


def summarise(
    repeats: Repeats, metrics: Iterable[str], slo: SLO | None = None, peaks: MachinePeaks | None = None
) -> Measured:
    """The per-repeat samples of ``metrics`` (and the probes), the pooled summary and the last run's timeline.

    With ``peaks`` (this machine's, measured) a run whose engine counted its work also gets prefill MFU and
    decode MBU (``measure.utilization``), and its achieved rates whatever the peaks: stored, never compared.
    """
    per_run = [run_metrics(run) for run in repeats.runs]
    per_repeat = [repeat_samples(m, slo) | utilization_samples(run, peaks) for m, run in zip(per_run, repeats.runs)]
    # A metric some repeat lacks (MFU of an engine that counts no work, of a run with no prefill) is left out.
    present = [name for name in (*metrics, *UTILIZATION_KEYS) if all(name in s for s in per_repeat)]
    samples = {name: tuple(s[name] for s in per_repeat) for name in present}
    # A metric that is undefined in some repeat (TPOT when every request
    # made one token) has nothing to compare: dropped, not stored as NaN.
    samples = {name: values for name, values in samples.items() if all(map(math.isfinite, values))}
    if repeats.probes:
        samples[PROBE] = tuple(repeats.probes)
    if repeats.busy_shares:
        samples[BUSY_SHARE] = tuple(repeats.busy_shares)
    if repeats.device_memory:
        samples[DEVICE_MEMORY] = tuple(repeats.device_memory)
    if repeats.energy_per_token:
        samples[ENERGY_PER_TOKEN] = tuple(repeats.energy_per_token)
    last = repeats.runs[-1]
    return Measured(
        engine_name=last.engine_name,
        samples=samples,
        counters=last.counters,
        summary=vllm_summary(per_run, slo),
        request_samples={k: v for k, v in per_request_samples(per_run).items() if v},
        timeline=timeline_of(last),
        noisy=_with_client_bound(repeats.noisy, repeats.runs),
        send_lag=worst_send_lag(repeats.runs),
        cached_prompts=cached_prompts(m for r in per_run for m in r.requests),
        server_metrics=_all_server_metrics(repeats.runs),
    )


def _all_server_metrics(runs: Sequence[RunResult]) -> tuple[ServerMetrics, ...]:
    """One per repeat, or none: a test whose server stopped exposing its metrics midway pools none of them."""
    readings = [run.server_metrics for run in runs]
    return tuple(r for r in readings if r is not None) if all(r is not None for r in readings) else ()


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


def vllm_summary(runs: Sequence[RunMetrics], slo: SLO | None = None) -> RunSummary:
    """vLLM's benchmark figures, pooled over the requests of every repeat."""
    requests = [m for r in runs for m in r.requests]
    return RunSummary(
        request_throughput=statistics.fmean(r.request_throughput for r in runs),
        output_throughput=statistics.fmean(r.output_throughput for r in runs),
        completed=sum(r.num_completed for r in runs),
        total_output_tokens=sum(r.num_output_tokens for r in runs),
        ttft=LatencySummary.of([m.ttft for m in requests if m.ttft is not None]),
        tpot=LatencySummary.of([m.tpot for m in requests if m.tpot is not None]),
        itl=LatencySummary.of([gap for m in requests for gap in m.itls]),
        e2el=LatencySummary.of([m.e2e for m in requests if m.e2e is not None]),
        request_goodput=statistics.fmean(goodput(r, slo) for r in runs) if slo is not None else None,
        total_input_tokens=sum(m.num_prompt_tokens for m in requests),
        total_client_input_tokens=_client_input_tokens(requests),
    )


def _client_input_tokens(requests: Sequence[RequestMetrics]) -> int | None:
    """The prompts' tokens as perfsuite built them; None where that is what the server counted too."""
    if all(m.num_client_prompt_tokens is None for m in requests):
        return None
    return sum(m.num_built_prompt_tokens for m in requests)


def per_request_samples(runs: Sequence[RunMetrics]) -> dict[str, tuple[float, ...]]:
    """TTFT, TPOT and E2E of every request of every repeat, in ms (for distributions); where some request hit
    the prefix cache, TTFT of the hits and of the misses too (``measure.prefix_cache``)."""
    requests = [m for r in runs for m in r.requests]
    return {
        "ttft_ms": tuple(1e3 * m.ttft for m in requests if m.ttft is not None),
        "tpot_ms": tuple(1e3 * m.tpot for m in requests if m.tpot is not None),
        "e2el_ms": tuple(1e3 * m.e2e for m in requests if m.e2e is not None),
        **ttft_by_cache_hit(requests),
    }


def timeline_of(run: RunResult) -> RunTimeline:
    """Which request held which slot at every step, the queue and the KV cache, relative to the run's start."""
    t0 = run.start_time
    return RunTimeline(
        duration=run.duration,
        num_slots=1 + max((c.slot for step in run.steps for c in step.chunks), default=0),
        steps=tuple(
            TimelineStep(
                start=step.start_time - t0,
                end=step.end_time - t0,
                num_waiting=step.num_waiting,
                chunks=tuple(
                    TimelineChunk(c.slot, c.request_id, c.num_tokens, c.is_prefill, c.is_padding) for c in step.chunks
                ),
                num_kv_blocks_used=step.num_kv_blocks_used,
                num_kv_tokens_used=step.num_kv_tokens_used,
                preempted_request_ids=step.preempted_request_ids,
            )
            for step in run.steps
        ),
        requests=tuple(
            TimelineRequest(
                request_id=r.request_id,
                arrival=r.arrival_time - t0,
                first_token=r.token_times[0] - t0 if r.token_times else None,
                finished=r.finished_time - t0 if r.finished_time is not None else None,
                send_lag=_send_lag_of(r),
            )
            for r in run.records
        ),
        num_kv_blocks=run.num_kv_blocks,
        kv_block_size=run.kv_block_size,
    )


def _send_lag_of(record: RequestRecord) -> float | None:
    if record.sent_time is None or record.send_ready_time is None:
        return None
    return max(0.0, record.sent_time - record.send_ready_time)


def sizing_parameters(requests: Sequence[Request], model: str, precision: str, concurrency: int) -> SizingParameters:
    return SizingParameters(
        model=model,
        precision=precision,
        # A follow-up's whole prompt is only known once its parent has run; its bound is exact under ignore_eos.
        input_length=statistics.fmean(r.max_prompt_tokens for r in requests),
        output_length=statistics.fmean(r.sampling_params.max_new_tokens for r in requests),
        concurrency=concurrency,
    )


def _with_client_bound(noisy: str | None, runs: Sequence[RunResult]) -> str | None:
    """A client-bound run's latencies are judged like a noisy one's: not at all (said once; the repeat loop may have)."""
    bound = client_bound_reason(runs)
    if bound is None or (noisy is not None and bound in noisy):
        return noisy
    return "; ".join(filter(None, (noisy, bound)))
