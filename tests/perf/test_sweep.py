"""The cases of a TOML sweep config (``--perf-config``): engines x batch sizes x workloads."""

import pytest


@pytest.mark.perf
def test_sweep(perf, perf_engine_factory, perf_requests_for, sweep_case):
    workload = sweep_case.workload
    requests = perf_requests_for(workload)
    engine = perf_engine_factory(sweep_case.engine, batch_size=sweep_case.batch_size, requests=requests)
    perf.measure(
        engine,
        requests,
        max_concurrency=workload.max_concurrency,
        arrival_rate=workload.arrivals.rate,
        repeats=sweep_case.repeats,
    )
    perf.assert_no_regression()
