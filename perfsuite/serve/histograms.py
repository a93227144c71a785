"""The latency and length histograms of ``/metrics``, with vLLM v1's bucket boundaries (``vllm/v1/metrics/loggers.py``).

Pure Python: each histogram is a frozen value that a finished request's record
turns into the next one, so the engine thread replaces it and a scrape reads
whichever it finds, as with the server's totals. Each finished request (aborted
ones too) adds its TTFT, its inter-token gaps, its mean time per output token
(TPOT), its end-to-end latency and its prompt and output lengths, from the engine's record of it
(``perfsuite.measure.metrics.request_metrics``: the engine's timestamps).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from perfsuite.engine import RequestRecord
from perfsuite.measure.metrics import request_metrics

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
INTER_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                       40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value``: vLLM's buckets of the token-count histograms."""
    buckets: list[int] = []
    power = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * power > max_value:
                return tuple(buckets)
            buckets.append(mantissa * power)
        power *= 10


@dataclass(frozen=True, slots=True)
class HistogramCounts:
    """Observations by bucket: ``bucket_counts[i]`` counts the values in (bound i-1, bound i], and one more
    entry counts those above the last bound (Prometheus' ``+Inf``)."""

    upper_bounds: tuple[float, ...]
    bucket_counts: tuple[int, ...]
    total: float = 0.0
    count: int = 0

    @classmethod
    def empty(cls, upper_bounds: Sequence[float]) -> HistogramCounts:
        bounds = tuple(upper_bounds)
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"histogram bounds must rise strictly, got {bounds}")
        return cls(bounds, (0,) * (len(bounds) + 1))

    def observed(self, values: Iterable[float]) -> HistogramCounts:
        counts = list(self.bucket_counts)
        total, count = self.total, self.count
        for value in values:
            counts[bisect.bisect_left(self.upper_bounds, value)] += 1  # a value equal to a bound is in its bucket
            total += value
            count += 1
        return replace(self, bucket_counts=tuple(counts), total=total, count=count)

    def cumulative(self) -> tuple[tuple[float, int], ...]:
        """(upper bound, observations at most that), as Prometheus' ``_bucket`` series; ``+Inf`` last."""
        running, pairs = 0, []
        for bound, number in zip((*self.upper_bounds, float("inf")), self.bucket_counts):
            running += number
            pairs.append((bound, running))
        return tuple(pairs)


@dataclass(frozen=True, slots=True)
class ServedHistograms:
    """What the finished requests took and made, as vLLM's histograms count it."""

    time_to_first_token: HistogramCounts
    inter_token_latency: HistogramCounts
    request_time_per_output_token: HistogramCounts
    e2e_request_latency: HistogramCounts
    prompt_tokens: HistogramCounts
    generation_tokens: HistogramCounts

    @classmethod
    def empty(cls, max_model_len: int) -> ServedHistograms:
        token_buckets = build_1_2_5_buckets(max_model_len)
        return cls(
            HistogramCounts.empty(TTFT_BUCKETS),
            HistogramCounts.empty(INTER_TOKEN_BUCKETS),
            HistogramCounts.empty(INTER_TOKEN_BUCKETS),
            HistogramCounts.empty(E2E_BUCKETS),
            HistogramCounts.empty(token_buckets),
            HistogramCounts.empty(token_buckets),
        )

    def after_finishing(self, records: Sequence[RequestRecord]) -> ServedHistograms:
        metrics = [request_metrics(record) for record in records]
        return ServedHistograms(
            self.time_to_first_token.observed(m.ttft for m in metrics if m.ttft is not None),
            self.inter_token_latency.observed(itl for m in metrics for itl in m.itls),
            # vLLM observes every finished request, 0 for one of fewer than two tokens
            self.request_time_per_output_token.observed(m.tpot or 0.0 for m in metrics),
            self.e2e_request_latency.observed(m.e2e for m in metrics if m.e2e is not None),
            self.prompt_tokens.observed(m.num_prompt_tokens for m in metrics),
            self.generation_tokens.observed(m.num_output_tokens for m in metrics),
        )
