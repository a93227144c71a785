"""Parametrize the shipped perf tests from the chosen ``--perf-profile``."""

import pytest

from perfsuite.plugin.stash import perf_options


def pytest_generate_tests(metafunc):
    options = perf_options(metafunc.config)
    profile = options.profile
    if "engine_kind" in metafunc.fixturenames:
        metafunc.parametrize("engine_kind", options.engines)
    if "batch_size" in metafunc.fixturenames:
        metafunc.parametrize("batch_size", profile.batch_sizes, ids=[f"B{b}" for b in profile.batch_sizes])
    if "lengths" in metafunc.fixturenames:
        metafunc.parametrize("lengths", list(profile.lengths))
    if "arrival_rate" in metafunc.fixturenames:
        metafunc.parametrize("arrival_rate", profile.arrival_rates, ids=[f"{r:g}rps" for r in profile.arrival_rates])
    if "sweep_case" in metafunc.fixturenames:
        if options.sweep is None:
            skip = pytest.mark.skip(reason="no sweep config: run it with --perf-config examples/sweep.toml")
            metafunc.parametrize("sweep_case", [pytest.param(None, marks=skip)], ids=["no-config"])
        else:
            cases = options.sweep.cases()
            metafunc.parametrize("sweep_case", cases, ids=[case.id for case in cases])
