"""Our engine's throughput, next to perfsuite's in-flight engine, with perfsuite's perf fixtures.

Run with ``pytest --perf`` (pyproject.toml picks tiny-random and the smoke
profile); without ``--perf`` perfsuite skips these tests.
"""

import pytest


@pytest.mark.perf
@pytest.mark.parametrize("engine_name", ["outside", "inflight"])
def test_throughput(perf, perf_engine_factory, perf_workload, engine_name):
    engine = perf_engine_factory(engine_name, requests=perf_workload)
    perf.measure(engine, perf_workload)
    perf.assert_no_regression()
