"""Run the shipped perf tests in a pytester directory: smoke profile, tiny-random, CPU."""

from __future__ import annotations

from pathlib import Path

SHIPPED_PERF_TESTS = Path(__file__).parent / "perf"


def run_shipped_smoke_session(pytester):
    for source in SHIPPED_PERF_TESTS.glob("*.py"):
        (pytester.path / source.name).write_text(source.read_text())
    return pytester.runpytest_subprocess(
        "--perf", "--perf-profile", "smoke", "--perf-model", "tiny-random", "--perf-device", "cpu", "-p", "no:randomly"
    )
