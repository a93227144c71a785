"""A server's ``/metrics`` page (Prometheus' text format) read under vLLM v1's metric names, and a run's
``ServerMetrics`` from the pages read before, during and after it.

The names (``VLLM_*`` below) are vLLM's; ``perfsuite serve`` writes the same ones. A metric's series are
summed over their labels, except that where some series carry the served model's ``model_name`` only those
count (a server serving several models); the KV cache usage gauge takes the fullest series instead of a sum
(a fraction per engine). ``vllm:gpu_cache_usage_perc`` (vLLM before 0.10) is read where
``vllm:kv_cache_usage_perc`` is missing. Parsing is ``prometheus_client``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perfsuite.engine.server_metrics import GaugeReadings, HistogramDelta, ServerMetrics

HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "tpot": "vllm:time_per_output_token_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
    "prompt_tokens": "vllm:request_prompt_tokens",
    "generation_tokens": "vllm:request_generation_tokens",
}
KV_CACHE_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
GAUGES = {"num_waiting": "vllm:num_requests_waiting", "num_running": "vllm:num_requests_running"}
COUNTERS = {
    "num_preemptions": "vllm:num_preemptions_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
}


# Where a server counts the requests it finished (read to know the last scrape has the whole run).
REQUEST_SUCCESS = "vllm:request_success_total"
# Every metric read: a page's other lines are dropped before parsing (a vLLM page has hundreds that parse slowly).
READ_NAMES = (*HISTOGRAMS.values(), *KV_CACHE_USAGE, *GAUGES.values(), *COUNTERS.values(), REQUEST_SUCCESS)
# What a scrape while the run is in flight is read for: the load.
GAUGE_NAMES = (*KV_CACHE_USAGE, *GAUGES.values())
_COMMENTS = ("# HELP ", "# TYPE ")


def read_lines(text: str, names: tuple[str, ...] = READ_NAMES) -> str:
    """The page's lines about ``names``: their samples and their HELP and TYPE comments (no parsing: cheap)."""
    kept = []
    for line in text.splitlines():
        name = line[len("# HELP ") :] if line.startswith(_COMMENTS) else line
        if name.startswith(names):
            kept.append(line)
    return "\n".join(kept) + "\n"


class MetricsTextError(ValueError):
    """The page is not Prometheus' text format."""


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


@dataclass(frozen=True, slots=True)
class Scrape:
    """One reading of the page: the samples of ``READ_NAMES``, by sample name (``_bucket``, ``_sum``, ``_total``
    included)."""

    samples: dict[str, tuple[Sample, ...]]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        from prometheus_client.parser import text_string_to_metric_families

        by_name: dict[str, list[Sample]] = {}
        try:
            for family in text_string_to_metric_families(read_lines(text)):
                for s in family.samples:
                    by_name.setdefault(s.name, []).append(Sample(s.name, tuple(sorted(s.labels.items())), s.value))
        except ValueError as error:
            raise MetricsTextError(f"not Prometheus' text format: {error}") from None
        return cls({name: tuple(samples) for name, samples in by_name.items()})

    def knows_vllm(self) -> bool:
        """Whether any metric this module reads is on the page."""
        names = [*KV_CACHE_USAGE, *GAUGES.values(), *COUNTERS.values(), *(f"{h}_count" for h in HISTOGRAMS.values())]
        return any(name in self.samples for name in names)

    def series(self, name: str, model: str | None) -> tuple[Sample, ...]:
        """``name``'s samples: the served model's where some are labelled with it, else all."""
        samples = self.samples.get(name, ())
        mine = tuple(s for s in samples if model is not None and s.label("model_name") == model)
        return mine or samples

    def total(self, name: str, model: str | None) -> float | None:
        samples = self.series(name, model)
        return sum(s.value for s in samples) if samples else None

    def kv_cache_usage(self, model: str | None) -> float | None:
        for name in KV_CACHE_USAGE:
            samples = self.series(name, model)
            if samples:
                return max(s.value for s in samples)
        return None

    def buckets(self, histogram: str, model: str | None) -> dict[float, float]:
        """Cumulative count per upper bound (``+Inf`` included), summed over the series."""
        counts: dict[float, float] = {}
        for s in self.series(f"{histogram}_bucket", model):
            bound = s.label("le")
            if bound is not None:
                counts[float(bound)] = counts.get(float(bound), 0.0) + s.value
        return counts


def histogram_delta(before: Scrape, after: Scrape, histogram: str, model: str | None) -> HistogramDelta | None:
    """What the run added to ``histogram``; None where either page lacks it or its buckets changed."""
    first, last = before.buckets(histogram, model), after.buckets(histogram, model)
    count_before, count_after = (s.total(f"{histogram}_count", model) for s in (before, after))
    sum_before, sum_after = (s.total(f"{histogram}_sum", model) for s in (before, after))
    if not last or first.keys() != last.keys() or None in (count_before, count_after, sum_before, sum_after):
        return None
    bounds = tuple(sorted(b for b in last if b != float("inf")))
    assert count_before is not None and count_after is not None and sum_before is not None and sum_after is not None
    return HistogramDelta(
        bounds=bounds,
        cumulative_counts=tuple(last[b] - first[b] for b in bounds),
        count=count_after - count_before,
        total=sum_after - sum_before,
    )


def counter_delta(before: Scrape, after: Scrape, name: str, model: str | None) -> float | None:
    first, last = before.total(name, model), after.total(name, model)
    return None if first is None or last is None else last - first


def run_server_metrics(
    before: Scrape, during: Sequence[Scrape], after: Scrape, model: str | None
) -> ServerMetrics | None:
    """A run's figures: histograms and counters from the pages read before and after it, gauges over the pages
    read while it ran (none in a run shorter than the scrape interval); None when no page had a metric of
    vLLM's (a server that exposes other metrics only)."""
    if not any(s.knows_vllm() for s in (before, *during, after)):
        return None

    def histogram(field: str) -> HistogramDelta | None:
        return histogram_delta(before, after, HISTOGRAMS[field], model)

    def gauge(name: str) -> GaugeReadings | None:
        return GaugeReadings.of([v for s in during if (v := s.total(name, model)) is not None])

    def counter(field: str) -> float | None:
        return counter_delta(before, after, COUNTERS[field], model)

    return ServerMetrics(
        num_scrapes_during=len(during),
        ttft=histogram("ttft"),
        itl=histogram("itl"),
        tpot=histogram("tpot"),
        e2e=histogram("e2e"),
        prompt_tokens=histogram("prompt_tokens"),
        generation_tokens=histogram("generation_tokens"),
        kv_cache_usage=GaugeReadings.of([v for s in during if (v := s.kv_cache_usage(model)) is not None]),
        num_waiting=gauge(GAUGES["num_waiting"]),
        num_running=gauge(GAUGES["num_running"]),
        num_preemptions=counter("num_preemptions"),
        prefix_cache_queries=counter("prefix_cache_queries"),
        prefix_cache_hits=counter("prefix_cache_hits"),
    )
