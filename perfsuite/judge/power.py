"""Can this session detect a regression at all, and how small a one?

Two limits follow from the test perfsuite.judge.stats uses, before anything is run:

- with n baseline and n current repeats, the one-sided exact Mann-Whitney U
  p-value can never go below 1 / C(2n, n) (both samples fully separated);
  Benjamini-Hochberg multiplies a lone small p-value by the session's number
  of comparisons, so past a certain session size no lone regression can be
  flagged, however large (``plan_power``);
- each comparison's baseline has its own spread, and the smaller the spread
  the smaller the slowdown that would stand out from it
  (``minimum_detectable_effect``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from perfsuite.judge.stats import Direction

MAX_SUGGESTED_REPEATS = 1000


def smallest_p_value(n_baseline: int, n_current: int) -> float:
    """The smallest one-sided exact Mann-Whitney U p-value: 1 / C(n_baseline + n_current, n_current)."""
    if n_baseline < 1 or n_current < 1:
        raise ValueError(f"need at least one sample on each side, got {n_baseline} and {n_current}")
    return 1 / math.comb(n_baseline + n_current, n_current)


def max_comparisons_for_lone_regression(n_baseline: int, n_current: int, alpha: float) -> int:
    """The largest session size m in which a lone regression (every other p = 1) can be flagged.

    Benjamini-Hochberg turns a lone p-value into m * p, so this is the largest
    m with m * smallest_p < alpha; 0 when not even one comparison can be.
    """
    return max_comparisons_for_p_value(smallest_p_value(n_baseline, n_current), alpha)


def max_comparisons_for_p_value(smallest_p: float, alpha: float) -> int:
    """The largest m with m * smallest_p < alpha, as benjamini_hochberg computes it; 0 when none."""
    comparisons = max(0, math.ceil(alpha / smallest_p) - 1)
    # The same float arithmetic as benjamini_hochberg, so the two agree at the edge.
    while (comparisons + 1) * smallest_p < alpha:
        comparisons += 1
    while comparisons > 0 and not comparisons * smallest_p < alpha:
        comparisons -= 1
    return comparisons


def repeats_for_lone_regression(num_comparisons: int, alpha: float) -> int | None:
    """The fewest repeats per side (baseline and current alike) for which a lone regression can be flagged."""
    for repeats in range(1, MAX_SUGGESTED_REPEATS + 1):
        if max_comparisons_for_lone_regression(repeats, repeats, alpha) >= num_comparisons:
            return repeats
    return None


@dataclass(frozen=True, slots=True)
class PowerPlan:
    """Whether a session of this size can flag a lone regression at all."""

    num_comparisons: int
    n_baseline: int
    n_current: int
    alpha: float
    smallest_p: float
    max_comparisons: int

    @property
    def can_flag_lone_regression(self) -> bool:
        return self.num_comparisons <= self.max_comparisons

    def suggested_repeats(self) -> int | None:
        """The fewest repeats per side that can flag a lone regression in this session (None: over 1000)."""
        return repeats_for_lone_regression(self.num_comparisons, self.alpha)

    def describe_samples(self) -> str:
        return f"{self.n_baseline} baseline and {self.n_current} current repeats"

    def advice(self) -> str | None:
        """One sentence on what to change, or ``None`` when a lone regression can be flagged."""
        if self.can_flag_lone_regression:
            return None
        needed = self.suggested_repeats()
        more_repeats = f"--perf-repeats {needed}" if needed is not None else "many more repeats (--perf-repeats)"
        return (
            f"this session makes {self.num_comparisons} comparisons, but with {self.describe_samples()} "
            f"the smallest possible p-value is {self.smallest_p:.3g}, so a lone "
            f"regression can be flagged in at most {self.max_comparisons} comparisons at alpha={self.alpha:g}: "
            f"use {more_repeats}, fewer engines with --perf-engines, or fewer tests with -k"
        )


def plan_power(num_comparisons: int, n_baseline: int, n_current: int, alpha: float) -> PowerPlan:
    """Can a lone regression among ``num_comparisons`` be flagged with these repeats at this alpha?"""
    if num_comparisons < 0:
        raise ValueError(f"num_comparisons must be >= 0, got {num_comparisons}")
    return PowerPlan(
        num_comparisons=num_comparisons,
        n_baseline=n_baseline,
        n_current=n_current,
        alpha=alpha,
        smallest_p=smallest_p_value(n_baseline, n_current),
        max_comparisons=max_comparisons_for_lone_regression(n_baseline, n_current, alpha),
    )


def minimum_detectable_effect(
    baseline: Sequence[float], direction: Direction, alpha: float, min_effect: float
) -> float | None:
    """The smallest relative slowdown these repeats could show: the baseline's own spread, shifted onto itself.

    If the current run's samples were the baseline's own samples made d slower
    (throughput times 1 - d, latency times 1 + d), the one-sided Mann-Whitney
    p-value (the call perfsuite.judge.stats makes) falls below ``alpha`` from some
    d on; that d, raised to ``min_effect`` (which also gates a verdict), is
    returned. ``None`` when not even complete separation gets below ``alpha``.

    Exact, not a grid: U changes only where a scaled sample crosses an
    unscaled one, at d = 1 - x_i / x_j (throughput) or x_i / x_j - 1
    (latency), so p is constant between those candidates. U only grows with
    d and p only falls as U grows, so a bisection over the gaps between
    candidates finds the first gap where p < alpha; its lower end is the
    answer.
    """
    samples = [float(v) for v in baseline]
    if not samples:
        raise ValueError("need at least one baseline sample")
    candidates = _crossing_slowdowns(samples, direction)
    probes = _points_between(candidates, direction)
    first = _first_true(len(probes), lambda k: _p_worse(samples, probes[k], direction) < alpha)
    if first == len(probes):
        return None
    return max(candidates[first], min_effect)


def _crossing_slowdowns(samples: list[float], direction: Direction) -> list[float]:
    """0 and every d > 0 at which a scaled sample meets an unscaled one, in increasing order."""
    higher_is_better = direction is Direction.HIGHER_IS_BETTER
    largest = 1.0 if higher_is_better else math.inf  # throughput cannot fall by 100% or more
    crossings = {0.0}
    for unscaled in samples:
        for scaled in samples:
            if scaled <= 0 or unscaled <= 0:
                continue  # zero stays zero when scaled; negative rates and latencies do not occur
            d = 1 - unscaled / scaled if higher_is_better else unscaled / scaled - 1
            if 0 < d < largest:
                crossings.add(d)
    return sorted(crossings)


def _points_between(candidates: list[float], direction: Direction) -> list[float]:
    """A slowdown inside each gap after a candidate, where p has the gap's value."""
    beyond_last = (candidates[-1] + 1) / 2 if direction is Direction.HIGHER_IS_BETTER else 2 * candidates[-1] + 1
    return [(low + high) / 2 for low, high in itertools.pairwise(candidates)] + [beyond_last]


def _first_true(count: int, predicate: Callable[[int], bool]) -> int:
    """The first index in range(count) where a monotone predicate holds; ``count`` when none does."""
    low, high = 0, count
    while low < high:
        middle = (low + high) // 2
        if predicate(middle):
            high = middle
        else:
            low = middle + 1
    return low


def _slowed(samples: list[float], slowdown: float, direction: Direction) -> list[float]:
    factor = 1 - slowdown if direction is Direction.HIGHER_IS_BETTER else 1 + slowdown
    return [v * factor for v in samples]


def _p_worse(baseline: list[float], slowdown: float, direction: Direction) -> float:
    from scipy.stats import mannwhitneyu  # imported here for the reason given in perfsuite.judge.stats

    current = _slowed(baseline, slowdown, direction)
    if len(set(baseline) | set(current)) == 1:
        return 1.0  # every sample equal, as perfsuite.judge.stats treats it
    alternative = "less" if direction is Direction.HIGHER_IS_BETTER else "greater"
    return float(mannwhitneyu(current, baseline, alternative=alternative).pvalue)
