"""``GET /metrics``: the server's load and totals in Prometheus' text format, under vLLM's metric names.

So that what reads a vLLM server (inference-perf's server-side metrics, a Grafana board) reads this one. Each
metric carries vLLM's ``model_name`` label (the served name):

- ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` (gauges): requests in the batch, and queued;
- ``vllm:kv_cache_usage_perc`` (gauge, 0..1: 1 is all of it, despite the name): the KV cache in use; vLLM
  0.10 renamed it from ``vllm:gpu_cache_usage_perc``, and this server writes the current name only;
- ``vllm:prefix_cache_queries_total``, ``vllm:prefix_cache_hits_total`` (counters, in tokens): prompt tokens
  looked up in the prefix cache and found there; their ratio is the hit rate;
- ``vllm:num_preemptions_total`` (counter): requests preempted to make room;
- ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total`` (counters): prompt tokens of the requests
  added, tokens generated;
- ``vllm:request_success_total`` (counter, also labelled ``finished_reason``: stop, length, abort): requests
  finished;
- histograms with vLLM v1's buckets (``perfsuite.serve.histograms``), of the finished requests:
  ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds`` and
  ``vllm:time_per_output_token_seconds`` (both: each gap between two tokens, as vLLM observes its older name),
  ``vllm:request_time_per_output_token_seconds`` (each request's mean TPOT),
  ``vllm:e2e_request_latency_seconds``, ``vllm:request_prompt_tokens``, ``vllm:request_generation_tokens``.

Each server has a registry of its own (never prometheus_client's global one), read from the engine worker's
``load``, ``totals`` and ``histograms`` at every scrape, so several servers in one process (tests) never clash.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from perfsuite.serve.worker import EngineWorker

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus' text exposition format
_LABELS = ["model_name"]


class _WorkerCollector(Collector):
    def __init__(self, worker: EngineWorker, model_name: str) -> None:
        self._worker = worker
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        yield from self._gauges()
        yield from self._counters()
        yield from self._histograms()

    def _gauges(self) -> Iterator[Metric]:
        load = self._worker.load
        gauges = (
            ("vllm:num_requests_running", "Requests in the running batch.", load.num_running),
            ("vllm:num_requests_waiting", "Requests waiting to be scheduled.", load.num_waiting),
            ("vllm:kv_cache_usage_perc", "KV cache usage: 1 means 100 percent.", load.kv_cache_usage),
        )
        for name, documentation, value in gauges:
            gauge = GaugeMetricFamily(name, documentation, labels=_LABELS)
            gauge.add_metric([self._model_name], value)
            yield gauge

    def _counters(self) -> Iterator[Metric]:
        totals = self._worker.totals
        counters = (
            (
                "vllm:prefix_cache_queries",
                "Prompt tokens looked up in the prefix cache.",
                totals.engine.num_prefix_cache_queried_tokens,
            ),
            (
                "vllm:prefix_cache_hits",
                "Prompt tokens found in the prefix cache.",
                totals.engine.num_prefix_cache_hit_tokens,
            ),
            ("vllm:num_preemptions", "Preemptions.", totals.engine.num_preemptions),
            ("vllm:prompt_tokens", "Prompt tokens of the requests added.", totals.num_prompt_tokens),
            ("vllm:generation_tokens", "Tokens generated.", totals.num_generation_tokens),
        )
        for name, documentation, value in counters:
            counter = CounterMetricFamily(name, documentation, labels=_LABELS)
            counter.add_metric([self._model_name], value)
            yield counter
        finished = CounterMetricFamily(
            "vllm:request_success", "Requests finished.", labels=[*_LABELS, "finished_reason"]
        )
        for reason, value in (
            ("stop", totals.num_stopped),
            ("length", totals.num_length_capped),
            ("abort", totals.num_aborted),
        ):
            finished.add_metric([self._model_name, reason], value)
        yield finished

    def _histograms(self) -> Iterator[Metric]:
        served = self._worker.histograms
        histograms = (
            ("vllm:time_to_first_token_seconds", "Time to first token in seconds.", served.time_to_first_token),
            ("vllm:inter_token_latency_seconds", "Inter-token latency in seconds.", served.inter_token_latency),
            # vLLM's older name of the same observations (each inter-token gap), which it still writes
            ("vllm:time_per_output_token_seconds", "Time per output token in seconds.", served.inter_token_latency),
            (
                "vllm:request_time_per_output_token_seconds",
                "Time per output token, a request's mean, in seconds.",
                served.request_time_per_output_token,
            ),
            ("vllm:e2e_request_latency_seconds", "End-to-end request latency in seconds.", served.e2e_request_latency),
            ("vllm:request_prompt_tokens", "Prompt tokens of the requests finished.", served.prompt_tokens),
            ("vllm:request_generation_tokens", "Tokens generated by the requests finished.", served.generation_tokens),
        )
        for name, documentation, counts in histograms:
            histogram = HistogramMetricFamily(name, documentation, labels=_LABELS)
            buckets = [(floatToGoString(bound), number) for bound, number in counts.cumulative()]
            histogram.add_metric([self._model_name], buckets, counts.total)
            yield histogram


def metrics_registry(worker: EngineWorker, model_name: str) -> CollectorRegistry:
    """A registry of this server's own, read from ``worker`` at every scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_WorkerCollector(worker, model_name))
    return registry


def metrics_text(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
