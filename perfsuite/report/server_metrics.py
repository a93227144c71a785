"""The report's view of what a server's own metrics said (``perfsuite.engine.server_metrics``), beside the client.

For a test against a server: the server's TTFT and ITL from its histograms, the client's TTFT minus the
server's (the network and the client's own overhead: what the server never sees), the KV cache usage, the
queue, preemptions and prefix cache hits, pooled over the repeats; or ``not exposed``.
"""

from __future__ import annotations

from perfsuite.engine.server_metrics import HistogramDelta, ServerMetrics
from perfsuite.judge.results import TestResult

NOT_EXPOSED = "not exposed"


def server_metrics_facts(test: TestResult) -> list[tuple[str, str]]:
    """Rows for the test's facts; none for a test measured in this process."""
    if not test.is_remote:
        return []
    counted = _prompt_count_facts(test)
    server = test.measurement.pooled_server_metrics
    if server is None:
        return [*counted, ("server metrics", NOT_EXPOSED)]
    facts = [
        (f"server {label} mean / p50 / p99", _latency_text(histogram))
        for label, histogram in (("TTFT", server.ttft), ("ITL", server.itl))
        if histogram is not None and histogram.count > 0
    ]
    gap = client_minus_server_ttft_ms(test.measurement.summary.ttft.mean_ms, server)
    if gap is not None:
        facts.append(("client - server TTFT (mean)", f"{gap:.3g} ms (network and client overhead)"))
    return counted + facts + _load_facts(server)


def _prompt_count_facts(test: TestResult) -> list[tuple[str, str]]:
    """The prompt tokens the server counted beside those perfsuite built, where they differ (a chat template)."""
    summary = test.measurement.summary
    if summary.total_client_input_tokens is None or summary.total_input_tokens is None:
        return []
    shown = f"{summary.total_input_tokens} / {summary.total_client_input_tokens} (the server counts its template too)"
    return [("prompt tokens, server's usage / as sent", shown)]


def client_minus_server_ttft_ms(client_mean_ms: float, server: ServerMetrics) -> float | None:
    """The client's mean TTFT minus the server's, in ms; None where the server has no TTFT histogram."""
    server_mean = server.ttft.mean if server.ttft is not None else None
    return None if server_mean is None else client_mean_ms - 1e3 * server_mean


def _latency_text(histogram: HistogramDelta) -> str:
    figures = [histogram.mean, histogram.quantile(0.5), histogram.quantile(0.99)]
    shown = " / ".join("-" if f is None else f"{1e3 * f:.3g}" for f in figures)
    return f"{shown} ms ({histogram.count:g} observed; quantiles within the server's buckets)"


def _load_facts(server: ServerMetrics) -> list[tuple[str, str]]:
    facts = []
    usage = server.kv_cache_usage
    if usage is not None:
        scrapes = f"{usage.num_scrapes} scrape{'s' if usage.num_scrapes != 1 else ''} while in flight"
        facts.append(("server KV cache usage max / mean", f"{usage.max:.1%} / {usage.mean:.1%} ({scrapes})"))
    elif server.num_scrapes_during == 0:
        facts.append(("server KV cache usage", "not read: every run was shorter than the scrape interval"))
    if server.num_waiting is not None:
        facts.append(("server queue (waiting) max", f"{server.num_waiting.max:g}"))
    if server.num_preemptions is not None:
        facts.append(("server preemptions", f"{server.num_preemptions:g}"))
    rate = server.prefix_cache_hit_rate
    if rate is not None:
        facts.append(("server prefix cache hits", f"{rate:.1%} of {server.prefix_cache_queries:g} prompt tokens"))
    return facts


def server_metrics_line(engine_name: str, client_mean_ttft_ms: float, server: ServerMetrics | None) -> str:
    """One line for a terminal: ``server metrics (openai-http): TTFT mean 12.3 ms, client - server 1.2 ms; ...``."""
    if server is None:
        return f"server metrics ({engine_name}): {NOT_EXPOSED}"
    parts = []
    gap = client_minus_server_ttft_ms(client_mean_ttft_ms, server)
    if gap is not None and server.ttft is not None and server.ttft.mean is not None:
        parts.append(f"TTFT mean {1e3 * server.ttft.mean:.3g} ms, client - server {gap:.3g} ms")
    if server.kv_cache_usage is not None:
        parts.append(f"KV cache usage max {server.kv_cache_usage.max:.1%}")
    elif server.num_scrapes_during == 0:
        parts.append("KV cache usage not read (the run was shorter than the scrape interval)")
    if server.num_waiting is not None:
        parts.append(f"queue max {server.num_waiting.max:g}")
    if server.num_preemptions is not None:
        parts.append(f"{server.num_preemptions:g} preemptions")
    if server.prefix_cache_hit_rate is not None:
        parts.append(f"prefix cache hits {server.prefix_cache_hit_rate:.1%}")
    return f"server metrics ({engine_name}): {'; '.join(parts) or 'none of the figures perfsuite reads'}"
