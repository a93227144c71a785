"""Repo-local pytest defaults: Hypothesis profiles, and the two phases of ``make test``.

``ci`` (the default, and what CI uses) is derandomized with no deadline, so a
run is reproducible and slow CPU steps never count as failures. ``dev``
explores more examples: ``HYPOTHESIS_PROFILE=dev make test``. A failure found
with ``dev`` becomes an ``@example`` on its test so it stays fixed.

``make test`` runs the suite in two phases, chosen by ``PERFSUITE_TEST_PHASE``:
``parallel`` runs every test not marked ``timing`` under pytest-xdist (most
of them wait on subprocesses, and a 2-core runner has a core to spare),
then ``timing`` runs the ``timing`` ones alone. Those read the machine's
load or detect a slowdown; beside another xdist worker, perfsuite would
rightly call their runs noisy. Unset (a plain ``pytest``), every test runs.
"""

import os
from pathlib import Path

import pytest

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev",
    max_examples=300,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


PHASE_VARIABLE = "PERFSUITE_TEST_PHASE"
PHASES = ("parallel", "timing")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    phase = os.environ.get(PHASE_VARIABLE)
    # A session some test starts (pytester, a subprocess) inherits the variable, and loads this file too where it
    # collects the shipped suite (--pyargs perfsuite.suites lies below it): only perfsuite's own session is split.
    if not phase or config.rootpath != Path(__file__).resolve().parent:
        return
    if phase not in PHASES:
        raise pytest.UsageError(f"{PHASE_VARIABLE}={phase!r}: choose {' or '.join(PHASES)}, or unset it to run all")
    wanted = phase == "timing"
    deselected = [item for item in items if (item.get_closest_marker("timing") is not None) != wanted]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]
