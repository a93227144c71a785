"""Capacity under --perf-slo: the highest Poisson rate at which 90% of requests meet the SLO, per engine.

Each repeat is a whole search (bracket, then bisect to 10%) over open-loop
probes of the profile's uniform-lengths requests (``perfsuite.plugin.capacity``);
the capacities are compared with the baseline's, higher is better.
"""

import pytest

from perfsuite.plugin.stash import perf_options


@pytest.mark.perf
def test_capacity(perf, perf_engine_factory, perf_workload_factory, engine_kind, request):
    from perfsuite.plugin.capacity import probe_size, skip_without_slo

    options = perf_options(request.config)
    skip_without_slo(options)
    num_requests = probe_size(options.profile.num_requests)

    def requests_at(rate):
        return perf_workload_factory("uniform", rate=rate, num_requests=num_requests)

    engine = perf_engine_factory(engine_kind, requests=requests_at(1.0))
    perf.measure_capacity(engine, requests_at)
    perf.assert_no_regression()
