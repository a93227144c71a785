"""The change-point defaults on simulated series: false head alarms on flat ones, and how soon a step is found.

    python bench/simulate_change_points.py [--noise 0.03] [--shape normal|t3|outliers] [--sequences 20]
                                           [--runs 100] [--step -0.10] [--creep-noise 0.03 0.05]
                                           [--trend-max-p 0.02] [--trend-step-margin 0.1] [--series 50]

Seeded, no machine measured: each run's value is 100 times (1 + noise x a
draw of ``--shape``): ``normal``, a standard normal; ``t3``, Student's t
with 3 degrees of freedom scaled to the same standard deviation (heavy
tails); ``outliers``, the normal, and in 5% of runs a slow session besides,
10-30% below the level (a neighbour took the machine), as real runs have.
``A/A``: ``--sequences`` flat series of ``--runs`` runs; after each run from
``min_points`` on, the head is searched over the newest ``window_len`` runs,
as a session does (``perfsuite.history.head``). Counted under the old rules
(every run with a change point at its head, any number of runs after it and
before it: ``min_after_runs=1``, ``min_before_runs=1``, per run) and the new
(each step once, when new, held by ``runs_to_hold`` runs, two for a
regression and three for an improvement, with ``min_before_runs`` before it:
``HeadStep.is_new``). ``step``: 50
series of 30 flat runs and then a ``--step`` change; how many runs after the
step the head search first finds it (within one run of where it is), under
each rule. ``creep``: 50 series of 40 runs, run i 1.02 ** (i // 3) times
slower, as bench/calibrate_history.py injects it; counting the run where the
slowdown first exceeds 10% as 1, the runs until the first new head
regression, with the head ``head_runs`` 5 (the old default) and the default.
Last, the step search and the trend test (``perfsuite.history.trend``)
together at each ``--creep-noise``: new steps plus new trends per 100 A/A
runs, the creep found by the first new regression of either kind (before it
passes 10% counts as found), and how often a 10% step was read as a trend;
the last line is ``creep3=N/50 creep5=M/50 false_per_100=X`` (the larger
false rate of the noises). docs/change-points.md quotes its output; the calibration on real sessions
(issue 24, item 5) is what tunes ``ChangePointPolicy``.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from calibrate_history import CREEP_TARGET, first_past, slowdown_for  # noqa: E402

from perfsuite.history.changes import ChangePointPolicy, detect, head_step  # noqa: E402
from perfsuite.history.series import Series, SeriesKey, SeriesPoint  # noqa: E402
from perfsuite.history.trend import TrendPolicy, trend_beside_steps  # noqa: E402
from perfsuite.judge.stats import Direction  # noqa: E402

NEW_RULES = ChangePointPolicy()
OLD_RULES = replace(NEW_RULES, min_after_runs=1, min_after_runs_improvement=1, min_before_runs=1)
OLD_HEAD = replace(NEW_RULES, head_runs=5)
OUTLIER_SHARE = 0.05
CREEP_EVERY, CREEP_RUNS = 3, 40  # as bench/calibrate_history.py runs it: +2% every 3 sessions, 40 sessions
TRENDS = TrendPolicy()
MAX_WITHIN = 5  # the creep target: found within this many runs after it passes 10%


def series_of(values: list[float]) -> Series:
    points = tuple(SeriesPoint(f"{i:07x}", f"{i:04d}", value, 5) for i, value in enumerate(values))
    return Series(SeriesKey("t", "output_throughput", "sim", None), Direction.HIGHER_IS_BETTER, points, "simulated")


def noise_draw(shape: str, rng: random.Random) -> Callable[[float], float]:
    """A run's factor around its level, 1 + noise x a draw of ``shape`` (module docstring)."""

    def t3() -> float:  # a normal over the root of a chi-square with 3 dof over 3; its variance is 3
        chi2 = sum(rng.gauss(0, 1) ** 2 for _ in range(3))
        return rng.gauss(0, 1) / math.sqrt(chi2 / 3) / math.sqrt(3)

    def factor(noise: float) -> float:
        if shape == "t3":
            return 1 + noise * t3()
        slow = rng.uniform(0.10, 0.30) if shape == "outliers" and rng.random() < OUTLIER_SHARE else 0.0
        return (1 + noise * rng.gauss(0, 1)) * (1 - slow)

    return factor


def false_head_alarms(draw, noise: float, sequences: int, runs: int) -> tuple[int, int, int]:
    """(runs with a head change point under the old rules, new steps under the new rules, runs searched)."""
    old = new = checked = 0
    for _ in range(sequences):
        values = [100 * draw(noise) for _ in range(runs)]
        for end in range(NEW_RULES.min_points, runs + 1):
            series = series_of(values[max(0, end - NEW_RULES.window_len) : end])
            checked += 1
            old += detect(series, OLD_RULES).head is not None
            step = head_step(detect(series, NEW_RULES))
            new += step is not None and step.is_new
    return old, new, checked


def runs_to_find_a_step(draw, noise: float, step: float, before: int = 30) -> tuple[int | None, int | None]:
    """Runs after the step until the old rules report it, and until the new rules report it as new."""
    values = [100 * draw(noise) for _ in range(before)]
    values += [100 * (1 + step) * draw(noise) for _ in range(NEW_RULES.head_runs)]
    found: list[int | None] = [None, None]
    for after in range(1, NEW_RULES.head_runs + 1):
        series = series_of(values[: before + after])
        old = detect(series, OLD_RULES).head
        new = head_step(detect(series, NEW_RULES))
        if found[0] is None and old is not None and abs(old.index - before) <= 1:
            found[0] = after
        if found[1] is None and new is not None and new.is_new and abs(new.change_point.index - before) <= 1:
            found[1] = after
    return found[0], found[1]


def runs_to_find_a_creep(draw, noise: float, policies: tuple[ChangePointPolicy, ...]) -> tuple[int | None, ...]:
    """Per policy: counting the run where the creep first exceeds 10% as 1, runs until a new head regression."""
    values = [100 / (1 + slowdown_for(run, CREEP_EVERY)) * draw(noise) for run in range(CREEP_RUNS)]
    past = first_past(CREEP_TARGET, CREEP_EVERY)
    found: list[int | None] = []
    for policy in policies:
        found.append(None)
        for end in range(past + 1, CREEP_RUNS + 1):
            step = head_step(detect(series_of(values[max(0, end - policy.window_len) : end]), policy))
            if step is not None and step.is_new and step.change_point.is_regression:
                found[-1] = end - past
                break
    return tuple(found)


def verdicts(values: list[float], trends: TrendPolicy) -> tuple[bool, bool, bool]:
    """After the newest of ``values``, as a session gives it: (a new step, a new trend, either a regression)."""
    series = series_of(values[-NEW_RULES.window_len :])
    detection = detect(series, NEW_RULES)
    step, trend = head_step(detection), trend_beside_steps(detection, trends)
    new_step = step is not None and step.is_new
    new_trend_ = trend is not None and trend.is_new
    regression = (new_step and step.change_point.is_regression) or (new_trend_ and trend.trend.is_regression)
    return new_step, new_trend_, bool(regression)


def false_changes(draw, noise: float, sequences: int, runs: int, trends: TrendPolicy) -> tuple[int, int, int]:
    """A/A: (new steps, new trends, runs searched), each run from ``min_points`` on, as a session searches."""
    num_steps = num_trends = checked = 0
    for _ in range(sequences):
        values = [100 * draw(noise) for _ in range(runs)]
        for end in range(NEW_RULES.min_points, runs + 1):
            new_step, new_trend_, _ = verdicts(values[:end], trends)
            num_steps, num_trends, checked = num_steps + new_step, num_trends + new_trend_, checked + 1
    return num_steps, num_trends, checked


def runs_to_find_a_creep_or_trend(draw, noise: float, trends: TrendPolicy) -> int | None:
    """Counting the run where the creep first exceeds 10% as 1, runs until the first new regression, step or trend.

    Searched after every run from ``min_points`` on: a regression flagged
    before the creep passes 10% (0 or less) found it early; the creep is real
    from its first 2% on.
    """
    values = [100 / (1 + slowdown_for(run, CREEP_EVERY)) * draw(noise) for run in range(CREEP_RUNS)]
    past = first_past(CREEP_TARGET, CREEP_EVERY)
    for end in range(NEW_RULES.min_points, CREEP_RUNS + 1):
        if verdicts(values[:end], trends)[2]:
            return end - past
    return None


def steps_read_as_trends(draw, noise: float, step: float, trends: TrendPolicy, num_series: int, before: int = 30) -> int:
    """Of ``num_series`` series with a ``step`` after ``before`` flat runs: in how many a new trend was flagged within the
    ``head_runs`` runs after it (the step is the step search's; a trend there names it wrongly)."""
    read = 0
    for _ in range(num_series):
        values = [100 * draw(noise) for _ in range(before)]
        values += [100 * (1 + step) * draw(noise) for _ in range(NEW_RULES.head_runs)]
        read += any(verdicts(values[:end], trends)[1] for end in range(before + 1, len(values) + 1))
    return read


def trend_section(draw, args, trends: TrendPolicy) -> str:
    """The step search and the trend test together at each of ``--creep-noise``: the closing line."""
    print(f"{trends}\nsteps and trends together, {args.shape} noise; a creep counts as found within 5 runs when "
          f"its first new regression (step or trend) comes at most 5 runs after it passes {CREEP_TARGET:.0%}, "
          "0 or less: before it")  # fmt: skip
    found, worst_false = [], 0.0
    for noise in args.creep_noise:
        num_steps, num_trends, checked = false_changes(draw, noise, args.sequences, args.runs, trends)
        per_100 = 100 * (num_steps + num_trends) / checked
        worst_false = max(worst_false, per_100)
        creeps = [runs_to_find_a_creep_or_trend(draw, noise, trends) for _ in range(args.series)]
        within = sum(run is not None and run <= MAX_WITHIN for run in creeps)
        found.append(within)
        print(f"noise {noise:.0%}: A/A {checked} runs searched: {num_steps} new steps + {num_trends} new trends = "
              f"{per_100:.2f} false changes per 100 runs; a creep: {_shown(Counter(creeps))}; within 5: {within} "
              f"of {args.series}; a {args.step:+.0%} step read as a trend: "
              f"{steps_read_as_trends(draw, noise, args.step, trends, args.series)} of {args.series}")  # fmt: skip
    counts = " ".join(f"creep{round(100 * n)}={k}/{args.series}" for n, k in zip(args.creep_noise, found))
    return f"{counts} false_per_100={worst_false:.2f}"


def _shown(found: Counter) -> str:
    return ", ".join(f"{'never' if k is None else f'after {k}'}: {n}" for k, n in sorted(found.items(), key=str))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--noise", type=float, default=0.03, help="relative spread of a run's value (0.03)")
    parser.add_argument("--shape", choices=("normal", "t3", "outliers"), default="normal", help="noise (normal)")
    parser.add_argument("--sequences", type=int, default=20, help="flat series for the A/A count (20)")
    parser.add_argument("--runs", type=int, default=100, help="runs per flat series (100)")
    parser.add_argument("--step", type=float, default=-0.10, help="the step to find, -0.10 = 10%% slower (-0.10)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--creep-noise", type=float, nargs="+", default=[0.03, 0.05],
                        help="noises of the steps-and-trends section (0.03 0.05)")
    parser.add_argument("--trend-max-p", type=float, default=TRENDS.max_p_value,
                        help=f"the trend test's max_p_value, to see the trade ({TRENDS.max_p_value})")
    parser.add_argument("--trend-step-margin", type=float, default=TRENDS.step_margin,
                        help=f"the trend test's step_margin ({TRENDS.step_margin})")
    parser.add_argument("--series", type=int, default=50,
                        help="creeps (and steps) per noise in the steps-and-trends section; more, for a closer estimate "
                        "of the rate than 50 give (50)")
    args = parser.parse_args()
    draw = noise_draw(args.shape, random.Random(args.seed))
    old, new, checked = false_head_alarms(draw, args.noise, args.sequences, args.runs)
    print(f"{NEW_RULES}\nA/A, {args.shape} noise {args.noise:.0%}, {checked} runs searched: old rules {old} runs with "
          f"a head change point ({100 * old / checked:.2f} per 100 runs); new rules {new} new steps "
          f"({100 * new / checked:.2f} per 100 runs)")  # fmt: skip
    finds = [runs_to_find_a_step(draw, args.noise, args.step) for _ in range(50)]
    print(f"a {args.step:+.0%} step, {args.shape} noise {args.noise:.0%}, 50 series: old rules found "
          f"{_shown(Counter(f[0] for f in finds))}; new rules {_shown(Counter(f[1] for f in finds))}")
    policies = (OLD_HEAD, NEW_RULES)
    creeps = [runs_to_find_a_creep(draw, args.noise, policies) for _ in range(50)]
    for column, policy in enumerate(policies):
        finds_of = [creep[column] for creep in creeps]
        within = sum(found is not None and found <= 5 for found in finds_of)
        print(f"a creep of +2% every {CREEP_EVERY} runs, {args.shape} noise {args.noise:.0%}, 50 series, "
              f"head_runs={policy.head_runs}: runs to find after it passes {CREEP_TARGET:.0%}: "
              f"{_shown(Counter(finds_of))}; within 5: {within} of 50")  # fmt: skip
    print(trend_section(draw, args, replace(TRENDS, max_p_value=args.trend_max_p, step_margin=args.trend_step_margin)))


if __name__ == "__main__":
    main()
