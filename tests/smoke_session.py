"""Run the shipped perf suite from a pytester directory, as another project would: smoke profile, tiny-random, CPU."""

from __future__ import annotations

SMOKE_ARGS = (
    "--perf", "--perf-profile", "smoke", "--perf-model", "tiny-random", "--perf-device", "cpu", "-p", "no:randomly",
    # These tests check the plumbing, not the machine: another job on the runner must not stop their repeats.
    "--perf-busy-threshold", "0.99",
)  # fmt: skip


def run_shipped_smoke_session(pytester, *extra_args, conftest_addition: str = ""):
    """``conftest_addition`` is the pytester project's own conftest.py (registering an engine, overriding a fixture)."""
    if conftest_addition:
        pytester.makeconftest(conftest_addition)
    return pytester.runpytest_subprocess("--pyargs", "perfsuite.suites", *SMOKE_ARGS, *extra_args)
