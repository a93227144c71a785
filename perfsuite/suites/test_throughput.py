"""Offline throughput: every request at t0, over batch size x output lengths x engine."""

import pytest


@pytest.mark.perf
def test_throughput(perf, perf_engine_factory, perf_workload_factory, engine_kind, batch_size, lengths):
    requests = perf_workload_factory(lengths)
    engine = perf_engine_factory(engine_kind, batch_size=batch_size, requests=requests)
    perf.measure(engine, requests)
    perf.assert_no_regression()
