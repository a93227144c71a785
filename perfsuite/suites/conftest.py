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
    if "sweep_capacity_case" in metafunc.fixturenames:
        cases = options.sweep.capacity_cases() if options.sweep is not None else []
        metafunc.parametrize("sweep_capacity_case", cases or [None], ids=[case.id for case in cases] or ["none"])


def pytest_collection_modifyitems(config, items):
    """No [capacity] section, no capacity cases: deselected, not one more skip in every session (test_sweep's
    skip already says how to give a sweep config)."""
    without_cases = [item for item in items if _lacks_its_capacity_case(item)]
    if without_cases:
        config.hook.pytest_deselected(items=without_cases)
        items[:] = [item for item in items if not _lacks_its_capacity_case(item)]


def _lacks_its_capacity_case(item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return "sweep_capacity_case" in params and params["sweep_capacity_case"] is None
