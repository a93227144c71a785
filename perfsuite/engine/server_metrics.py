"""What a server's own Prometheus metrics said about one run, beside the client's timings.

Read by the ``openai-http`` client (``perfsuite.adapters.server_scrape``) from the server's ``/metrics``
before, during and after a run, under vLLM's metric names. A histogram is kept as its change over the run
(``HistogramDelta``: the buckets, sum and count the run added), so the repeats of a test pool exactly, and its
quantiles are interpolated inside a bucket as Prometheus' ``histogram_quantile`` does. Pure Python.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HistogramDelta:
    """A histogram's change over a run: ``cumulative_counts[i]`` observations at most ``bounds[i]`` (finite bounds,
    ascending); ``count`` is the ``+Inf`` bucket, ``total`` the sum of the observations."""

    bounds: tuple[float, ...]
    cumulative_counts: tuple[float, ...]
    count: float
    total: float

    @property
    def mean(self) -> float | None:
        """Δsum / Δcount; None when the run observed nothing."""
        return self.total / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0..1) as Prometheus' ``histogram_quantile`` computes it; None when nothing was observed.

        Linear inside the bucket the rank falls in (the first bucket starts at 0); a rank in the ``+Inf`` bucket
        is the highest finite bound, as Prometheus answers.
        """
        if not 0 <= q <= 1:
            raise ValueError(f"q must be in 0..1, got {q}")
        if self.count <= 0 or not self.bounds:
            return None
        rank = q * self.count
        index = next((i for i, c in enumerate(self.cumulative_counts) if c >= rank), len(self.bounds))
        if index == len(self.bounds):
            return self.bounds[-1]
        if index == 0 and self.bounds[0] <= 0:
            return self.bounds[0]
        start = self.bounds[index - 1] if index > 0 else 0.0
        below = self.cumulative_counts[index - 1] if index > 0 else 0.0
        in_bucket = self.cumulative_counts[index] - below
        if in_bucket <= 0:
            return self.bounds[index]
        return start + (self.bounds[index] - start) * (rank - below) / in_bucket

    def plus(self, other: HistogramDelta) -> HistogramDelta:
        """Both runs' observations together; the bounds must be the same (one server's histogram)."""
        if self.bounds != other.bounds:
            raise ValueError(f"histograms with different buckets cannot be pooled: {self.bounds} and {other.bounds}")
        counts = tuple(a + b for a, b in zip(self.cumulative_counts, other.cumulative_counts))
        return HistogramDelta(self.bounds, counts, self.count + other.count, self.total + other.total)


@dataclass(frozen=True, slots=True)
class GaugeReadings:
    """A gauge over a run's scrapes."""

    max: float
    mean: float
    num_scrapes: int

    @classmethod
    def of(cls, values: Sequence[float]) -> GaugeReadings | None:
        finite = [v for v in values if math.isfinite(v)]
        return cls(max(finite), sum(finite) / len(finite), len(finite)) if finite else None

    def plus(self, other: GaugeReadings) -> GaugeReadings:
        num = self.num_scrapes + other.num_scrapes
        mean = (self.mean * self.num_scrapes + other.mean * other.num_scrapes) / num
        return GaugeReadings(max(self.max, other.max), mean, num)


@dataclass(frozen=True, slots=True)
class ServerMetrics:
    """The server's side of a run (or of a test's repeats pooled); each figure None where the server does not
    expose its metric. Latency histograms are in seconds, token histograms in tokens; ``kv_cache_usage`` is
    0..1; ``num_preemptions`` and the prefix-cache tokens are the counters' changes over the run. Gauges are
    read only while the run was in flight (``num_scrapes_during`` times): None too in a run shorter than the
    scrape interval."""

    num_scrapes_during: int = 0
    ttft: HistogramDelta | None = None
    itl: HistogramDelta | None = None
    tpot: HistogramDelta | None = None
    e2e: HistogramDelta | None = None
    prompt_tokens: HistogramDelta | None = None
    generation_tokens: HistogramDelta | None = None
    kv_cache_usage: GaugeReadings | None = None
    num_waiting: GaugeReadings | None = None
    num_running: GaugeReadings | None = None
    num_preemptions: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Δhits / Δqueries (tokens); None when the server does not say or looked nothing up."""
        if self.prefix_cache_queries is None or self.prefix_cache_hits is None or self.prefix_cache_queries <= 0:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries


HISTOGRAM_FIELDS = ("ttft", "itl", "tpot", "e2e", "prompt_tokens", "generation_tokens")
GAUGE_FIELDS = ("kv_cache_usage", "num_waiting", "num_running")
COUNTER_FIELDS = ("num_preemptions", "prefix_cache_queries", "prefix_cache_hits")


def pooled(runs: Sequence[ServerMetrics]) -> ServerMetrics | None:
    """Every run's observations together: histograms and counters add up, gauges keep the max and the mean over
    every scrape; a histogram or counter some run lacks is left out (None). None for no runs."""
    if not runs:
        return None
    values: dict[str, object] = {"num_scrapes_during": sum(run.num_scrapes_during for run in runs)}
    for name in HISTOGRAM_FIELDS:
        parts = [getattr(run, name) for run in runs]
        if all(part is not None for part in parts):
            try:
                values[name] = functools.reduce(HistogramDelta.plus, parts)
            except ValueError:  # the server's buckets changed between repeats (restarted): not poolable
                pass
    for name in GAUGE_FIELDS:  # a run without a scrape while in flight adds nothing
        readings = [reading for run in runs if (reading := getattr(run, name)) is not None]
        if readings:
            values[name] = functools.reduce(GaugeReadings.plus, readings)
    for name in COUNTER_FIELDS:
        counts = [getattr(run, name) for run in runs]
        if all(count is not None for count in counts):
            values[name] = sum(counts)
    return ServerMetrics(**values)  # type: ignore[arg-type]
