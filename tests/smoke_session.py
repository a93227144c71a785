"""Run the shipped perf tests in a pytester directory: smoke profile, tiny-random, CPU."""

from __future__ import annotations

from pathlib import Path

SHIPPED_PERF_TESTS = Path(__file__).parents[1] / "perfsuite" / "suites"


def run_shipped_smoke_session(pytester, *extra_args, conftest_addition: str = ""):
    """``conftest_addition`` is appended to the shipped conftest.py, as a user's project would add to its own."""
    for source in SHIPPED_PERF_TESTS.glob("*.py"):
        text = source.read_text()
        if source.name == "conftest.py":
            text += "\n" + conftest_addition
        (pytester.path / source.name).write_text(text)
    return pytester.runpytest_subprocess(
        "--perf", "--perf-profile", "smoke", "--perf-model", "tiny-random", "--perf-device", "cpu", "-p", "no:randomly",
        # These tests check the plumbing, not the machine: another job on the runner must not stop their repeats.
        "--perf-busy-threshold", "0.99",
        *extra_args,
    )
