"""Prefix cache figures: the hit rate (engine counters, else the requests' cached_tokens), evictions, and TTFT
split by hit and miss, from the records through results.json to the terminal, the report and `perfsuite run`."""

from __future__ import annotations

import dataclasses

import pytest

from perfsuite.engine.types import EngineCounters, FinishReason, RequestRecord, RunResult
from perfsuite.judge.catalogue import exact_counter_changes
from perfsuite.judge.results import read_results, write_results
from perfsuite.measure.metrics import run_metrics
from perfsuite.measure.prefix_cache import (
    TTFT_HIT,
    TTFT_MISS,
    CachedPrompts,
    HitRateSource,
    cached_prompts,
    prefix_cache_figures,
    ttft_split,
)
from perfsuite.measure.summaries import Repeats, summarise
from perfsuite.report.render import render_report
from perfsuite.report.table import PREFIX_CACHE_COLUMNS, format_table, prefix_cache_rows, prefix_cache_table
from results_builders import make_result, make_results

CACHING = EngineCounters(
    num_forward_passes=9, num_prefix_cache_queried_tokens=2048, num_prefix_cache_hit_tokens=1280, num_evicted_blocks=3
)  # fmt: skip


def record(request_id: str, ttft: float, cached: int | None, prompt: int = 100, aborted: bool = False) -> RequestRecord:
    return RequestRecord(
        request_id=request_id, num_prompt_tokens=prompt, output_token_ids=(1, 2), arrival_time=10.0,
        first_scheduled_time=10.0, token_times=(10.0 + ttft, 10.5 + ttft), finished_time=10.5 + ttft,
        finish_reason=FinishReason.ABORT if aborted else FinishReason.LENGTH, num_cached_tokens=cached,
    )  # fmt: skip


def run(*records: RequestRecord, counters: EngineCounters = EngineCounters()) -> RunResult:
    return RunResult("server", records, start_time=10.0, end_time=12.0, counters=counters)


SERVED = run(record("a", 0.010, 64), record("b", 0.030, 0), record("c", 0.020, 96), record("d", 0.040, 0))


def test_the_requests_cached_tokens_sum_to_sglangs_hit_rate_over_those_that_said():
    result = run(record("a", 0.01, 64), record("b", 0.02, 0, prompt=60), record("c", 0.03, None, prompt=999),
                 record("d", 0.04, 50, aborted=True))  # fmt: skip
    prompts = cached_prompts(run_metrics(result).requests)
    assert prompts == CachedPrompts(num_requests=2, num_hits=1, num_prompt_tokens=160, num_cached_tokens=64)
    assert prompts.hit_rate == 64 / 160
    assert cached_prompts(run_metrics(run(record("x", 0.01, None))).requests) is None


def test_summarise_splits_ttft_by_hit_and_miss_over_every_repeat_and_keeps_the_reports():
    measured = summarise(Repeats((SERVED, SERVED)), ("output_throughput",))
    assert measured.request_samples[TTFT_HIT] == pytest.approx((10.0, 20.0) * 2)
    assert measured.request_samples[TTFT_MISS] == pytest.approx((30.0, 40.0) * 2)
    assert measured.cached_prompts == CachedPrompts(8, 4, 800, 320)
    split = ttft_split(measured.request_samples)
    assert (split.num_hits, split.hit_p50_ms, split.num_misses, split.miss_p50_ms) == (4, pytest.approx(15.0), 4,
                                                                                        pytest.approx(35.0))


def test_no_split_where_no_request_hit_nor_where_none_said():
    none_hit = summarise(Repeats((run(record("a", 0.01, 0), record("b", 0.02, 0)),)), ("output_throughput",))
    unknown = summarise(Repeats((run(record("a", 0.01, None)),)), ("output_throughput",))
    for measured in (none_hit, unknown):
        assert not {TTFT_HIT, TTFT_MISS} & set(measured.request_samples)
    assert unknown.cached_prompts is None and none_hit.cached_prompts.num_hits == 0
    assert ttft_split({"ttft_ms": (1.0,)}) is None


def test_the_engines_counters_win_and_the_requests_reports_stand_in_only_for_an_engine_that_counts_no_steps():
    prompts = CachedPrompts(4, 2, 400, 160)
    engine = prefix_cache_figures(CACHING, prompts)
    assert (engine.source, engine.hit_rate, engine.num_evicted_blocks) == (HitRateSource.ENGINE, 0.625, 3)
    assert engine.describe() == "62.5% of 2,048 prompt tokens looked up (engine counters)"
    server = prefix_cache_figures(EngineCounters(), prompts)
    assert (server.source, server.hit_rate, server.num_evicted_blocks) == (HitRateSource.REQUESTS, 0.4, None)
    # perfsuite's engine without a cache reports 0 cached tokens per request: no hit rate, not a measured 0%
    assert prefix_cache_figures(EngineCounters(num_forward_passes=5), CachedPrompts(4, 0, 400, 0)) is None
    assert prefix_cache_figures(EngineCounters(), None) is None
    assert prefix_cache_figures(EngineCounters(), CachedPrompts(4, 0, 400, 0)).hit_rate == 0.0  # a server's 0%


def served_test(test_id="t.py::test_served[openai-http]"):
    measured = summarise(Repeats((SERVED,)), ("output_throughput",))
    return make_result(test_id, counters=EngineCounters(), cached_prompts=measured.cached_prompts,
                       request_samples=measured.request_samples)  # fmt: skip


def test_results_json_keeps_the_reports_and_the_split_and_an_older_test_reads_as_unrecorded(tmp_path):
    engine = make_result("t.py::test_x[paged]", counters=CACHING)
    path = tmp_path / "results.json"
    write_results(path, make_results(served_test(), engine))
    served, paged = read_results(path).tests
    assert served.measurement.cached_prompts == CachedPrompts(4, 2, 400, 160)
    assert served.prefix_cache.hit_rate == 0.4 and served.ttft_by_cache_hit.num_hits == 2
    assert paged.prefix_cache.num_evicted_blocks == 3 and paged.ttft_by_cache_hit is None
    older = make_result("t.py::test_old", counters=EngineCounters(), unrecorded_counters=("num_evicted_blocks",))
    assert older.prefix_cache is None and older.measurement.cached_prompts is None


def test_the_terminal_table_has_a_row_per_test_that_looked_anything_up():
    rows = prefix_cache_rows([served_test(), make_result("t.py::test_x[paged]", counters=CACHING),
                              make_result("t.py::test_static")])  # fmt: skip
    assert rows == [
        ["test_served[openai-http]", "40.0%", "160 / 400", "-", "15.00 / 35.00 (2 / 2)", "requests' cached_tokens"],
        ["test_x[paged]", "62.5%", "1,280 / 2,048", "3", "-", "engine counters"],
    ]
    table = prefix_cache_table([served_test()])
    assert table.splitlines()[0] == "Prefix cache:" and table.endswith(format_table(PREFIX_CACHE_COLUMNS, rows[:1]))
    assert prefix_cache_table([make_result("t.py::test_static")]) is None


def test_the_report_shows_the_hit_rate_evictions_and_ttft_of_hits_and_misses_only_where_there_are_any():
    split = {"ttft_ms": (1.0, 2.0, 3.0), TTFT_HIT: (1.0, 2.0), TTFT_MISS: (3.0,)}
    paged = make_result("t.py::test_x[paged]", counters=CACHING, request_samples=split)
    html = render_report(make_results(paged, make_result("t.py::test_static")))
    paged_section, static_section = html.split('id="test-')[1:3]
    for text in ("prefix cache hit rate", "62.5% of 2,048 prompt tokens looked up", "prefix cache evicted blocks",
                 "TTFT p50 / p90 ms, cache hit", "1.5 / 1.9 (2 requests)", "3 / 3 (1 request)",
                 "prefix cache hit</text>", "split TTFT into the requests that found"):  # fmt: skip
        assert text in paged_section, text
    assert "prefix cache" not in static_section and "split TTFT" not in static_section


def test_a_change_in_the_prefix_cache_counters_is_an_exact_counter_change_unless_a_side_did_not_record_them():
    fewer_hits = dataclasses.replace(CACHING, num_prefix_cache_hit_tokens=1024, num_evicted_blocks=5)
    changes = {c.name: (c.baseline, c.current) for c in exact_counter_changes(CACHING, fewer_hits, None)}
    assert changes == {"num_prefix_cache_hit_tokens": (1280, 1024), "num_evicted_blocks": (3, 5)}
    older = ("num_prefix_cache_queried_tokens", "num_prefix_cache_hit_tokens", "num_evicted_blocks")
    assert exact_counter_changes(EngineCounters(num_forward_passes=9), CACHING, None, older) == []


def test_perfsuite_run_prints_a_hit_rate_line_only_for_a_run_that_looked_anything_up():
    from perfsuite.cli import prefix_cache_line

    paged = run(record("a", 0.01, 64), counters=CACHING)
    assert prefix_cache_line(paged, run_metrics(paged)) == (
        "prefix cache (server): hit rate 62.5% of 2,048 prompt tokens looked up (engine counters); 3 blocks evicted"
    )
    assert prefix_cache_line(SERVED, run_metrics(SERVED)).endswith("40.0% of 400 prompt tokens looked up "
                                                                   "(requests' cached_tokens)")  # fmt: skip
    static = run(record("a", 0.01, 0), counters=EngineCounters(num_forward_passes=3))
    assert prefix_cache_line(static, run_metrics(static)) is None


def test_perfsuite_compare_prints_the_prefix_cache_table_when_the_new_run_looked_anything_up(tmp_path, capsys):
    from perfsuite.cli import main

    for name, counters in (("cached", CACHING), ("plain", EngineCounters(num_forward_passes=9))):
        write_results(tmp_path / f"{name}.json", make_results(make_result("t.py::test_x[paged]", counters=counters)))
    main(["compare", str(tmp_path / "plain.json"), str(tmp_path / "cached.json")])
    out = capsys.readouterr().out
    assert "Prefix cache:\n" in out and "1,280 / 2,048" in out and out.index("Prefix cache") < out.index("overall:")
    assert "num_prefix_cache_hit_tokens" in out, "a counter changed row"
    main(["compare", str(tmp_path / "cached.json"), str(tmp_path / "plain.json")])
    assert "Prefix cache:" not in capsys.readouterr().out
