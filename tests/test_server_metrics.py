"""A server's Prometheus metrics read by the openai-http client: parsing vLLM's names, deltas, histogram
quantiles as Prometheus computes them, pooling repeats, and a server without them (pure, on fixtures)."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest

from perfsuite.adapters.prometheus_text import Scrape, run_server_metrics
from perfsuite.adapters.server_scrape import RunScraper
from perfsuite.engine.server_metrics import GaugeReadings, HistogramDelta, ServerMetrics, pooled
from perfsuite.judge.results import TestResult
from perfsuite.measure.environment import ServerEnvironment
from perfsuite.report.server_metrics import NOT_EXPOSED, server_metrics_facts
from perfsuite.engine.types import RunResult
from perfsuite.measure.summaries import Repeats, summarise
from results_builders import changed, make_result

DATA = Path(__file__).parent / "data"
BEFORE = (DATA / "vllm_metrics_before.txt").read_text()
AFTER = (DATA / "vllm_metrics_after.txt").read_text()
MODEL = "served-model"


def during(kv: float, waiting: float, running: float) -> str:
    """The before page with the load gauges at these values."""
    return (
        BEFORE.replace('vllm:kv_cache_usage_perc{engine="0",model_name="served-model"} 0.0',
                       f'vllm:kv_cache_usage_perc{{engine="0",model_name="served-model"}} {kv}')
        .replace('vllm:num_requests_waiting{engine="0",model_name="served-model"} 0.0',
                 f'vllm:num_requests_waiting{{engine="0",model_name="served-model"}} {waiting}')
        .replace('vllm:num_requests_running{engine="0",model_name="served-model"} 0.0',
                 f'vllm:num_requests_running{{engine="0",model_name="served-model"}} {running}')
    )  # fmt: skip


def fixture_run() -> ServerMetrics:
    pages = [Scrape.parse(page) for page in (during(0.5, 3, 4), during(0.25, 1, 2))]
    metrics = run_server_metrics(Scrape.parse(BEFORE), pages, Scrape.parse(AFTER), MODEL)
    assert metrics is not None
    return metrics


def test_ttft_is_the_histograms_change_with_its_mean_and_quantiles_as_prometheus_interpolates():
    ttft = fixture_run().ttft
    assert ttft is not None
    assert ttft.bounds == (0.01, 0.02, 0.04, 0.08)
    assert ttft.cumulative_counts == (1, 4, 8, 9) and ttft.count == 10
    assert ttft.mean == pytest.approx(0.030)  # (0.37 - 0.07) / (14 - 4)
    # rank 5 falls in (0.02, 0.04] holding the 5th..8th observations: 0.02 + 0.02 * (5 - 4) / 4
    assert ttft.quantile(0.5) == pytest.approx(0.025)
    assert ttft.quantile(0.05) == pytest.approx(0.005), "the first bucket starts at 0"
    assert ttft.quantile(0.99) == 0.08, "a rank in the +Inf bucket is the highest finite bound, as Prometheus says"


def test_a_histogram_that_observed_nothing_in_the_run_has_no_mean_or_quantile():
    itl = fixture_run().itl
    assert itl is not None and itl.count == 0
    assert itl.mean is None and itl.quantile(0.5) is None


def test_gauges_are_the_max_and_mean_over_the_scrapes_while_in_flight_and_counters_their_change():
    metrics = fixture_run()
    assert metrics.kv_cache_usage == GaugeReadings(max=0.5, mean=0.375, num_scrapes=2), "idle before and after"
    assert metrics.num_waiting is not None and metrics.num_waiting.max == 3
    assert metrics.num_running is not None and metrics.num_running.max == 4
    assert metrics.num_preemptions == 2
    assert (metrics.prefix_cache_queries, metrics.prefix_cache_hits) == (400, 100)
    assert metrics.prefix_cache_hit_rate == pytest.approx(0.25)


def test_a_metric_the_server_does_not_expose_is_none_not_zero():
    metrics = fixture_run()
    assert metrics.tpot is None and metrics.e2e is None and metrics.prompt_tokens is None


def test_the_served_models_series_are_read_and_another_models_ignored():
    other = BEFORE.replace("served-model", "other-model")
    page = Scrape.parse(BEFORE + other.replace("# HELP", "# IGNORE").replace("# TYPE", "# IGNORE"))
    assert page.total("vllm:num_preemptions_total", MODEL) == 5
    assert page.total("vllm:num_preemptions_total", None) == 10, "no served model named: every series summed"


def test_only_the_metrics_read_are_parsed_so_other_lines_cost_nothing_and_cannot_break_the_page():
    other = '# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.0\nsome_exporter_garbage{{{ 1\n'
    page = Scrape.parse(other + BEFORE)
    assert "process_cpu_seconds_total" not in page.samples
    assert page.total("vllm:num_preemptions_total", MODEL) == 5


def test_older_vllms_gpu_cache_usage_is_read_where_kv_cache_usage_is_missing():
    old = during(0.75, 0, 0).replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert Scrape.parse(old).kv_cache_usage(MODEL) == 0.75


def test_a_page_without_vllms_metrics_gives_nothing():
    page = "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.0\n"
    assert run_server_metrics(Scrape.parse(page), [], Scrape.parse(page), MODEL) is None


def test_a_run_shorter_than_the_scrape_interval_has_no_gauges_but_its_counters():
    metrics = run_server_metrics(Scrape.parse(BEFORE), [], Scrape.parse(AFTER), MODEL)
    assert metrics is not None and metrics.num_scrapes_during == 0
    assert metrics.kv_cache_usage is None and metrics.num_waiting is None, "never read while the run was in flight"
    assert metrics.num_preemptions == 2 and metrics.ttft is not None


def test_repeats_pool_exactly_histograms_add_up_and_gauges_keep_their_max():
    run = fixture_run()
    quieter = dataclasses.replace(run, kv_cache_usage=GaugeReadings(0.1, 0.1, 2), num_preemptions=0)
    both = pooled([run, quieter, dataclasses.replace(run, num_scrapes_during=0, kv_cache_usage=None)])
    assert both is not None and both.ttft is not None
    assert both.ttft.count == 30 and both.ttft.mean == pytest.approx(0.030)
    assert both.ttft.quantile(0.5) == run.ttft.quantile(0.5)  # type: ignore[union-attr]
    assert both.kv_cache_usage == GaugeReadings(0.5, pytest.approx((0.375 + 0.1) / 2), 4), "a short run adds none"
    assert both.num_preemptions == 4 and both.num_scrapes_during == 4
    assert pooled([run, dataclasses.replace(run, ttft=None)]).ttft is None  # type: ignore[union-attr]


def test_histograms_with_other_buckets_are_not_pooled():
    one = HistogramDelta((0.1,), (1,), 1, 0.05)
    with pytest.raises(ValueError, match="different buckets"):
        one.plus(HistogramDelta((0.2,), (1,), 1, 0.05))


def as_session_result(run: RunResult) -> TestResult:
    """``run`` as the one repeat of a test against a server, through results.json and back."""
    measured = summarise(Repeats((run,)), ("output_throughput",))
    result = changed(remote_result(measured.server_metrics), summary=measured.summary)
    return TestResult.from_json(result.to_json())


def remote_result(server_metrics: tuple[ServerMetrics, ...]) -> TestResult:
    return make_result("t::openai-http", engine_name="openai-http", environment=ServerEnvironment("served-model"),
                       server_metrics=server_metrics)  # fmt: skip


def test_results_json_keeps_each_repeats_server_metrics_and_the_report_shows_client_minus_server_ttft():
    result = remote_result((fixture_run(),))
    read_back = TestResult.from_json(result.to_json())
    assert read_back.measurement.server_metrics == result.measurement.server_metrics
    facts = dict(server_metrics_facts(read_back))
    # the client's mean TTFT in make_result is 10 ms; the server's 30 ms
    assert facts["client - server TTFT (mean)"].startswith("-20 ms")
    assert facts["server TTFT mean / p50 / p99"].startswith("30 / 25 / 80 ms")
    assert facts["server KV cache usage max / mean"] == "50.0% / 37.5% (2 scrapes while in flight)"
    assert facts["server preemptions"] == "2"


def test_a_server_without_metrics_says_not_exposed_and_an_in_process_test_says_nothing():
    assert server_metrics_facts(remote_result(())) == [("server metrics", NOT_EXPOSED)]
    assert server_metrics_facts(make_result("t::static")) == []


def test_the_report_shows_both_prompt_counts_where_the_server_counted_a_template():
    result = changed(remote_result(()), summary=dataclasses.replace(
        make_result("t").measurement.summary, total_input_tokens=570, total_client_input_tokens=384))  # fmt: skip
    assert ("prompt tokens, server's usage / as sent", "570 / 384 (the server counts its template too)") in (
        server_metrics_facts(result)
    )
    assert not any("prompt tokens" in label for label, _ in server_metrics_facts(remote_result(())))


def test_the_terminal_line_says_the_server_ttft_the_gap_and_the_load_or_not_exposed():
    from perfsuite.report.server_metrics import server_metrics_line

    line = server_metrics_line("openai-http", 32.5, fixture_run())
    assert line == (
        "server metrics (openai-http): TTFT mean 30 ms, client - server 2.5 ms; KV cache usage max 50.0%; "
        "queue max 3; 2 preemptions; prefix cache hits 25.0%"
    )
    short = dataclasses.replace(fixture_run(), num_scrapes_during=0, kv_cache_usage=None)
    assert "KV cache usage not read (the run was shorter than the scrape interval)" in server_metrics_line(
        "openai-http", 32.5, short
    )
    assert server_metrics_line("openai-http", 32.5, None) == "server metrics (openai-http): not exposed"


class FixturePage:
    """A server's /metrics as ``MetricsPage`` reads it: BEFORE at first, a loaded page while in flight, AFTER."""

    def __init__(self) -> None:
        self.pages = [BEFORE]

    def read(self) -> Scrape:
        return Scrape.parse(self.pages[-1])

    def read_text(self) -> str:
        return self.pages[-1]


def test_the_first_output_gets_a_reading_even_in_a_run_shorter_than_the_interval():
    page = FixturePage()
    scraper = RunScraper(page, MODEL, interval_s=3600)  # no reading by the clock in this test
    assert scraper.start()
    page.pages.append(during(0.5, 3, 4))
    scraper.nudge()  # the client's first output
    page_after = AFTER
    metrics = _finished(scraper, page, page_after)
    assert metrics.num_scrapes_during == 1 and metrics.kv_cache_usage == GaugeReadings(0.5, 0.5, 1)


def _finished(scraper: RunScraper, page: FixturePage, after: str) -> ServerMetrics:
    # the nudged reading may still be pending as the run ends: finish reads it before it stops
    while scraper.is_reading and not scraper._during:  # noqa: SLF001 - waits for the thread, not a timed assertion
        threading.Event().wait(0.01)
    page.pages.append(after)
    metrics = scraper.finish(num_requests=10)
    assert metrics is not None
    return metrics


def test_a_failed_run_stops_the_readings():
    scraper = RunScraper(FixturePage(), MODEL, interval_s=0.01)
    assert scraper.start() and scraper.is_reading
    scraper.stop()
    scraper._thread.join(5)  # noqa: SLF001
    assert not scraper.is_reading


def test_a_page_without_vllms_metrics_starts_nothing():
    page = FixturePage()
    page.pages = ["# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.0\n"]
    scraper = RunScraper(page, MODEL)
    assert not scraper.start() and not scraper.is_reading
