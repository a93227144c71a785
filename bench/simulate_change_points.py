"""The change-point defaults on simulated series: false head alarms on flat ones, and how soon a step is found.

    python bench/simulate_change_points.py [--noise 0.03] [--sequences 20] [--runs 100] [--step -0.10]

Seeded, no machine measured: each run's value is 100 times (1 + noise x a
standard normal), as a session's median might move. ``A/A``: ``--sequences``
flat series of ``--runs`` runs; after each run from ``min_points`` on, the
head is searched over the newest ``window_len`` runs, as a session does
(``perfsuite.history.head``), and each run with a change point at its head
counts. ``step``: 50 series of 30 flat runs and then a ``--step`` change;
how many runs after the step the head search first finds it (within one run
of where it is). docs/change-points.md quotes its output; the calibration
on real sessions (issue 24, item 5) is what tunes ``ChangePointPolicy``.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter

from perfsuite.history.changes import ChangePointPolicy, head_change
from perfsuite.history.series import Series, SeriesKey, SeriesPoint
from perfsuite.judge.stats import Direction

POLICY = ChangePointPolicy()


def series_of(values: list[float]) -> Series:
    points = tuple(SeriesPoint(f"{i:07x}", f"{i:04d}", value, 5) for i, value in enumerate(values))
    return Series(SeriesKey("t", "output_throughput", "sim", None), Direction.HIGHER_IS_BETTER, points, "simulated")


def false_head_alarms(rng: random.Random, noise: float, sequences: int, runs: int) -> tuple[int, int]:
    alarms = checked = 0
    for _ in range(sequences):
        values = [100 * (1 + noise * rng.gauss(0, 1)) for _ in range(runs)]
        for end in range(POLICY.min_points, runs + 1):
            checked += 1
            alarms += head_change(series_of(values[max(0, end - POLICY.window_len) : end]), POLICY) is not None
    return alarms, checked


def runs_to_find_a_step(rng: random.Random, noise: float, step: float, before: int = 30) -> int | None:
    values = [100 * (1 + noise * rng.gauss(0, 1)) for _ in range(before)]
    values += [100 * (1 + step) * (1 + noise * rng.gauss(0, 1)) for _ in range(POLICY.head_runs)]
    for after in range(1, POLICY.head_runs + 1):
        found = head_change(series_of(values[: before + after]), POLICY)
        if found is not None and abs(found.index - before) <= 1:
            return after
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--noise", type=float, default=0.03, help="relative spread of a run's value (0.03)")
    parser.add_argument("--sequences", type=int, default=20, help="flat series for the A/A count (20)")
    parser.add_argument("--runs", type=int, default=100, help="runs per flat series (100)")
    parser.add_argument("--step", type=float, default=-0.10, help="the step to find, -0.10 = 10%% slower (-0.10)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    alarms, checked = false_head_alarms(rng, args.noise, args.sequences, args.runs)
    print(f"{POLICY}\nA/A, noise {args.noise:.0%}: {alarms} runs with a head change point of {checked} "
          f"({100 * alarms / checked:.2f} per 100 runs)")  # fmt: skip
    found = Counter(runs_to_find_a_step(rng, args.noise, args.step) for _ in range(50))
    shown = ", ".join(f"{'never' if k is None else f'after {k}'}: {n}" for k, n in sorted(found.items(), key=str))
    print(f"a {args.step:+.0%} step, noise {args.noise:.0%}, 50 series: found {shown}")


if __name__ == "__main__":
    main()
