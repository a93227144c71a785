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
rightly call their runs noisy. Three tiers stand beside ``make test``, each a
phase of its own that ``make test`` leaves out: ``cluster`` (``make
test-cluster``) runs the tests marked ``cluster``, which start a real
multi-node Ray cluster on this machine, minutes of a 2-core runner; and
``browser`` (``make test-browser``, which installs Chromium first) runs the
tests marked ``browser``, which render the report in headless Chromium, a
dependency the suite does not install; ``transformers4`` (``make
test-transformers4``, which makes a venv with transformers 4.57 first) runs
the tests marked ``transformers4``, which load files that ``perfsuite serve``
hands its clients with the transformers 4.x that many of them pin; and
``instructions`` (``make test-instructions``) runs the tests marked
``instructions``, which count instructions under Valgrind many times
(minutes). Unset (a plain ``pytest``), every test runs.

In the parallel phase each worker runs on a CPU of its own: torch sizes its
thread pool by the CPUs a process may use, so two workers with two threads
each would put four compute threads on two cores, and OpenMP's spinning
threads then made a SmolLM2 test ten times slower (16 s to 181 s).
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
# The perf sessions the tests start would append their summaries to the real job summary of a CI run of this suite.
os.environ.pop("GITHUB_STEP_SUMMARY", None)


PHASE_VARIABLE = "PERFSUITE_TEST_PHASE"
PHASES = ("parallel", "timing", "cluster", "browser", "transformers4", "instructions")
TIERS = ("cluster", "browser", "transformers4", "instructions")  # markers whose tests run only in their own phase (a make target of their own)
ROOT = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ...: set in each xdist worker
    if worker and os.environ.get(PHASE_VARIABLE) == "parallel" and config.rootpath == ROOT:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) > 1:  # sessions its tests start inherit the one CPU, and size their threads by it
            os.sched_setaffinity(0, {cpus[int(worker.removeprefix("gw")) % len(cpus)]})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    phase = os.environ.get(PHASE_VARIABLE)
    # A session some test starts (pytester, a subprocess) inherits the variable, and loads this file too where it
    # collects the shipped suite (--pyargs perfsuite.suites lies below it): only perfsuite's own session is split.
    if not phase or config.rootpath != ROOT:
        return
    if phase not in PHASES:
        raise pytest.UsageError(f"{PHASE_VARIABLE}={phase!r}: choose {' or '.join(PHASES)}, or unset it to run all")
    deselected = [item for item in items if _phase_of(item) != phase]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


def _phase_of(item: pytest.Item) -> str:
    for tier in TIERS:
        if item.get_closest_marker(tier) is not None:
            return tier
    return "timing" if item.get_closest_marker("timing") is not None else "parallel"
