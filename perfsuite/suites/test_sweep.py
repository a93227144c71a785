"""The cases of a TOML sweep config (``--perf-config``): engines x batch sizes x workloads.

With a ``[capacity]`` section, also a capacity test per engine x batch size x
prompts x output lengths, judged like ``test_capacity``; the ``arrivals`` axis
is ignored for them, as the search sets the load (a rate or a concurrency).
"""

import pytest

from perfsuite.plugin.stash import perf_options


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


@pytest.mark.perf
def test_sweep_capacity(perf, perf_engine_factory, perf_requests_for, sweep_capacity_case, request):
    from perfsuite.plugin.capacity import probe_size, skip_without_slo

    skip_without_slo(perf_options(request.config))
    case = sweep_capacity_case
    num_requests = probe_size(case.workload.num_requests)

    def requests_at(rate):
        return perf_requests_for(case.workload_at(rate, num_requests))

    engine = perf_engine_factory(case.engine, batch_size=case.batch_size, requests=requests_at(1.0))
    settings = case.settings
    perf.measure_capacity(
        engine,
        requests_at,
        by=settings.by,
        target_share=settings.target_share,
        tolerance=settings.tolerance,
        repeats=case.repeats,
    )
    perf.assert_no_regression()
