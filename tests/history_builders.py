"""Run histories built by hand: sessions of one test whose throughput follows chosen values (no engine run)."""

from __future__ import annotations

import random

from perfsuite.history.series import Series, SeriesKey, SeriesPoint
from perfsuite.judge.results import Results
from perfsuite.judge.run_config import RunConfiguration
from perfsuite.judge.stats import Direction
from results_builders import make_result, make_results

TEST_ID = "tests/perf/test_throughput.py::test_throughput[static-B4-uniform]"
CONFIGURATION = RunConfiguration(
    profile="ci", workload_digest="0123456789abcdef", num_requests=16, engine="static",
    engine_knobs=(("batch_size", 4),), decode_mode="packed", max_seq_len=64, repeats=3,
)  # fmt: skip


def commit_of(index: int) -> str:
    return f"{index:04d}{'c0ffee' * 6}"[:40]


def stamp_of(index: int) -> str:
    return f"2026-01-{1 + index // 24:02d}T{index % 24:02d}:00:00+00:00"


def session(index: int, throughput: float, test_id: str = TEST_ID, **changes) -> Results:
    """Session ``index`` (its commit and time follow from it): one test, three repeats around ``throughput``."""
    samples = (throughput * 0.99, throughput, throughput * 1.01)
    test = make_result(test_id, **{"configuration": CONFIGURATION, "output_throughput": samples, **changes})
    return make_results(test, created_at=stamp_of(index), commit=commit_of(index))


def sessions(values: list[float], **changes) -> list[Results]:
    return [session(index, value, **changes) for index, value in enumerate(values)]


def step_values(num_before: int, num_after: int, step: float, noise: float = 0.02, seed: int = 1) -> list[float]:
    """``num_before`` values around 100, then ``num_after`` around 100 * (1 + step), each with ``noise`` (relative)."""
    rng = random.Random(seed)
    levels = [100.0] * num_before + [100.0 * (1 + step)] * num_after
    return [level * (1 + noise * rng.gauss(0, 1)) for level in levels]


def series_of(values: list[float], direction: Direction = Direction.HIGHER_IS_BETTER) -> Series:
    points = tuple(SeriesPoint(commit_of(i), stamp_of(i), value, 3) for i, value in enumerate(values))
    metric = "output_throughput" if direction is Direction.HIGHER_IS_BETTER else "median_tpot_ms"
    return Series(SeriesKey(TEST_ID, metric, "cpu-fake-0123456789", CONFIGURATION), direction, points, "as measured")
