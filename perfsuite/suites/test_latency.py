"""Latency (TTFT, TPOT, E2E) under Poisson arrivals and at fixed concurrency."""

import pytest

from perfsuite.plugin.stash import perf_options


@pytest.mark.perf
def test_latency_poisson(perf, perf_engine_factory, perf_workload_factory, engine_kind, arrival_rate):
    requests = perf_workload_factory("uniform", rate=arrival_rate)
    engine = perf_engine_factory(engine_kind, requests=requests)
    perf.measure(engine, requests, arrival_rate=arrival_rate)
    perf.assert_no_regression()


@pytest.mark.perf
def test_latency_fixed_concurrency(perf, perf_engine_factory, perf_workload_factory, engine_kind, request):
    concurrency = perf_options(request.config).profile.concurrency
    requests = perf_workload_factory("uniform")
    engine = perf_engine_factory(engine_kind, requests=requests)
    perf.measure(engine, requests, max_concurrency=concurrency)
    perf.assert_no_regression()
