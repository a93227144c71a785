"""Is the current tree worse than a reference ref, judged on interleaved pairs of repeats?

``pytest --perf --perf-against REF`` runs each test's repeats alternately on
the reference (A) and the current tree (B) in the order ABBA ABBA...; each
adjacent (A, B) pair gives, per metric, one ratio current / reference. This
module judges those ratios and returns the same ``Comparison`` as
perfsuite.judge.stats, so ``adjust``, ``adjust_interim``, ``adjust_family``
and the report treat both judges alike.

The test is the exact one-sided Wilcoxon signed-rank test on the log ratios.

- Log ratios make it scale-free: a 10% slowdown is the same shift whether a
  test runs at 50 or 500 tok/s.
- Wilcoxon rather than the sign test, because it uses the sizes of the log
  ratios, not only their signs. With 7 pairs both reach p = 1/128 when all 7
  agree; but when 6 of 7 agree the sign test gives p = 8/128 = 0.0625, while
  Wilcoxon gives 2/128 when the one discordant pair is the smallest.
- Its assumption, log ratios symmetric about their centre under no change,
  holds by the design: the ABBA order puts an order effect (the second run of
  a pair faster, or slower) with a + sign in half the pairs and a - sign in
  the other half, so it widens the distribution symmetrically instead of
  shifting it; and a machine drift slower than one pair's duration cancels
  within the pair.

Pure Python, exact integer arithmetic for the null distributions; no scipy
(it takes about 1 s to import) and no numpy.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from perfsuite.judge.power import MAX_SUGGESTED_REPEATS, PowerPlan, max_comparisons_for_p_value
from perfsuite.judge.stats import Comparison, Direction, Policy, Verdict, with_verdict

# -- the exact Wilcoxon signed-rank test ---------------------------------------------------------------------------


def wilcoxon_signed_rank_upper_p(differences: Sequence[float]) -> float:
    """Exact one-sided p = P(T+ >= observed T+) under H0: the differences are symmetric about 0.

    Exact zeros are dropped (Wilcoxon's convention); 1.0 when nothing is
    left. Tied absolute values share their mid-rank; the ranks are doubled so
    that mid-ranks stay integers and the null distribution stays exact.
    """
    nonzero = [float(d) for d in differences if d != 0]
    if not nonzero:
        return 1.0
    doubled_ranks = _doubled_mid_ranks([abs(d) for d in nonzero])
    observed = sum(rank for rank, d in zip(doubled_ranks, nonzero) if d > 0)
    counts = _null_counts(tuple(sorted(doubled_ranks)))
    return sum(counts[observed:]) / 2 ** len(nonzero)


def _doubled_mid_ranks(values: list[float]) -> list[int]:
    """Twice each value's rank among ``values``, ties sharing the mid-rank (exact float equality)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + 1) + (end + 1)  # twice the mean of 1-based ranks start+1..end+1
        start = end + 1
    return ranks


@functools.lru_cache(maxsize=256)
def _null_counts(ranks: tuple[int, ...]) -> tuple[int, ...]:
    """counts[s]: how many of the 2^n sign assignments give the ranks of the positive ones a sum s."""
    counts = [1] + [0] * sum(ranks)
    reached = 0
    for rank in ranks:
        reached += rank
        for total in range(reached, rank - 1, -1):
            counts[total] += counts[total - rank]
    return tuple(counts)


def _untied_null_counts(n: int) -> tuple[int, ...]:
    return _null_counts(tuple(range(1, n + 1)))


# -- the Walsh averages: estimate and confidence interval of the centre ------------------------------------------


def walsh_averages(differences: Sequence[float]) -> list[float]:
    """The n(n+1)/2 averages (d_i + d_j) / 2, i <= j, sorted."""
    values = [float(d) for d in differences]
    return sorted((values[i] + values[j]) / 2 for i in range(len(values)) for j in range(i, len(values)))


def hodges_lehmann(differences: Sequence[float]) -> float:
    """The Hodges-Lehmann estimate of the centre: the median of the Walsh averages."""
    if not differences:
        raise ValueError("need at least one difference")
    return statistics.median(walsh_averages(differences))


def walsh_confidence_interval(differences: Sequence[float], confidence: float) -> tuple[float, float]:
    """Distribution-free CI of the centre (pseudo-median) of a symmetric distribution: [W_(k), W_(M+1-k)].

    W are the M = n(n+1)/2 sorted Walsh averages and k the largest integer
    with P(T+ <= k - 1) <= (1 - confidence) / 2 under the untied null
    distribution for n. When n is too small for any k >= 1 (2^-n above that
    tail: n <= 5 at 95%), the widest interval [min W, max W] is returned and
    its coverage, 1 - 2^(1-n), is below ``confidence``
    (``walsh_interval_coverage`` says what it is).
    """
    if not differences:
        raise ValueError("need at least one difference")
    averages = walsh_averages(differences)
    k = max(1, _walsh_order(len(differences), confidence))
    return averages[k - 1], averages[len(averages) - k]


def walsh_interval_coverage(n: int, confidence: float) -> float:
    """The exact coverage of ``walsh_confidence_interval`` for n untied differences: 1 - 2 P(T+ <= k - 1)."""
    k = max(1, _walsh_order(n, confidence))
    return 1 - 2 * sum(_untied_null_counts(n)[:k]) / 2**n


def _walsh_order(n: int, confidence: float) -> int:
    """The largest k with P(T+ <= k - 1) <= (1 - confidence) / 2 for n untied differences; 0 when none."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    tail = (1 - confidence) / 2
    below, k = 0, 0
    for count in _untied_null_counts(n):
        below += count
        if below / 2**n > tail:
            return k
        k += 1
    return k


# -- judging one metric -----------------------------------------------------------------------------------------


def compare_paired(
    metric: str,
    reference: Sequence[float],
    current: Sequence[float],
    direction: Direction,
    policy: Policy = Policy(),
    *,
    num_comparisons: int = 1,
) -> Comparison:
    """Judge one metric on pairs (reference[i], current[i]); the verdict uses the raw p until ``adjust`` runs.

    The fields read differently from perfsuite.judge.stats.compare's: ``change`` is the median pair ratio minus
    one, exp(median(log ratios)) - 1, a paired estimate rather than the ratio of the two medians; ``ci_low`` and
    ``ci_high`` bound the median ratio current / reference (exp of the Walsh interval of the log ratios: the ABBA
    order makes them symmetric about their centre, so their pseudo-median is their median); n_baseline and
    n_current are both the number of pairs. ``min_detectable_effect`` is the smallest further slowdown of every
    pair that a lone regression among ``num_comparisons`` would be flagged for (``paired_minimum_detectable_effect``).
    """
    log_ratios = _log_ratios(metric, reference, current)
    p_worse, p_better = _one_sided_p_values(_oriented(log_ratios, direction))
    log_low, log_high = walsh_confidence_interval(log_ratios, policy.confidence)
    comparison = Comparison(
        metric=metric,
        direction=direction,
        n_baseline=len(log_ratios),
        n_current=len(log_ratios),
        baseline_median=statistics.median(reference),
        current_median=statistics.median(current),
        change=math.expm1(statistics.median(log_ratios)),
        ci_low=math.exp(log_low),
        ci_high=math.exp(log_high),
        p_worse=p_worse,
        p_better=p_better,
        p_adjusted=min(p_worse, p_better),
        verdict=Verdict.INCONCLUSIVE,
        min_detectable_effect=_paired_mde(_oriented(log_ratios, direction), direction, policy, num_comparisons),
    )
    return with_verdict(comparison, p_worse, p_better, policy)


def _one_sided_p_values(oriented: list[float]) -> tuple[float, float]:
    """Wilcoxon's p that the current tree is worse, and that it is better (``oriented``: positive is worse)."""
    return wilcoxon_signed_rank_upper_p(oriented), wilcoxon_signed_rank_upper_p([-d for d in oriented])


def _paired_mde(oriented: list[float], direction: Direction, policy: Policy, num_comparisons: int) -> float | None:
    """From the pairs' spread alone (centred on no change), as the stored mode's MDE is from the baseline's.

    The smallest slowdown these conditions could show, not what is left to show beyond this run's change.
    """
    alpha = policy.alpha / max(1, num_comparisons)
    return paired_minimum_detectable_effect(_centred(oriented), direction, alpha, policy.min_effect)


def _log_ratios(metric: str, reference: Sequence[float], current: Sequence[float]) -> list[float]:
    """log(current_i) - log(reference_i): swapping the two sides negates each one exactly."""
    if len(reference) != len(current):
        raise ValueError(f"{metric}: {len(reference)} reference samples but {len(current)} current ones: not pairs")
    if not reference:
        raise ValueError(f"{metric}: no pairs to compare")
    for side, samples in (("reference", reference), ("current", current)):
        for index, value in enumerate(samples):
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{metric}: {side} sample {index} is {value!r}; a ratio needs finite samples above 0")
    return [math.log(c) - math.log(r) for r, c in zip(reference, current)]


def _centred(differences: list[float]) -> list[float]:
    centre = hodges_lehmann(differences)
    return [d - centre for d in differences]


def _oriented(log_ratios: list[float], direction: Direction) -> list[float]:
    """Log ratios with positive meaning worse: lower throughput, higher latency."""
    return [-d for d in log_ratios] if direction is Direction.HIGHER_IS_BETTER else list(log_ratios)


# -- how small a slowdown these pairs could show -------------------------------------------------------------------


def paired_minimum_detectable_effect(
    differences_oriented: Sequence[float], direction: Direction, alpha: float, min_effect: float
) -> float | None:
    """The smallest slowdown s whose addition to every pair makes the exact one-sided Wilcoxon p fall below alpha.

    A slowdown s is what perfsuite.judge.power means by it, the unit of
    ``Policy.min_effect`` and of the verdict's size gate: throughput times
    1 - s, latency times 1 + s. In oriented log ratios (positive = worse) it
    is a shift by -log(1 - s) or log(1 + s). ``min_effect`` is the floor;
    ``None`` when even all pairs worse cannot reach alpha (2^-n >= alpha).

    Exact, no search: T+ is the number of positive Walsh averages, which only
    grows with the shift. With t the smallest T+ whose untied tail
    P(T+ >= t) is below alpha, the answer is the shift that lifts the t-th
    largest Walsh average above 0. That is exact when no two log ratios are
    equal: a shift that puts no Walsh average at 0 leaves no ties and no
    zeros. Equal log ratios stay tied under any shift, and then the test's
    tie-corrected p can differ from the untied tail near this edge, either
    way; measured ratios are rarely equal.
    """
    if not differences_oriented:
        raise ValueError("need at least one pair")
    critical = _critical_count(len(differences_oriented), alpha)
    if critical is None:
        return None
    averages = walsh_averages(differences_oriented)
    shift = max(0.0, -averages[len(averages) - critical])
    slowdown = -math.expm1(-shift) if direction is Direction.HIGHER_IS_BETTER else math.expm1(shift)
    return max(slowdown, min_effect)


def _critical_count(n: int, alpha: float) -> int | None:
    """The smallest t with P(T+ >= t) < alpha for n untied differences; None when not even T+ = max gets there."""
    counts = _untied_null_counts(n)
    at_least = 0
    for t in range(len(counts) - 1, -1, -1):
        if (at_least + counts[t]) / 2**n >= alpha:
            return None if t == len(counts) - 1 else t + 1
        at_least += counts[t]
    return 0  # unreachable: P(T+ >= 0) = 1 >= alpha


# -- can a session of pairs flag a lone regression at all ----------------------------------------------------------


def smallest_paired_p_value(num_pairs: int) -> float:
    """The smallest exact one-sided Wilcoxon signed-rank p-value: 2^-num_pairs (every pair worse)."""
    if num_pairs < 1:
        raise ValueError(f"need at least one pair, got {num_pairs}")
    return 2.0**-num_pairs


def max_comparisons_for_lone_paired_regression(num_pairs: int, alpha: float) -> int:
    """The largest session size in which a lone paired regression (every other p = 1) can be flagged."""
    return max_comparisons_for_p_value(smallest_paired_p_value(num_pairs), alpha)


def pairs_for_lone_regression(num_comparisons: int, alpha: float) -> int | None:
    """The fewest pairs for which a lone regression among ``num_comparisons`` can be flagged."""
    for num_pairs in range(1, MAX_SUGGESTED_REPEATS + 1):
        if max_comparisons_for_lone_paired_regression(num_pairs, alpha) >= num_comparisons:
            return num_pairs
    return None


def paired_p_value_with_disagreement(num_pairs: int, rank_sum: int) -> float:
    """The exact p when the pairs that disagree (are better) hold ranks of |log ratio| summing to ``rank_sum``.

    P(T+ <= rank_sum) under the untied null for ``num_pairs``: 2^-n when every
    pair agrees (0), 2^(1-n) when only the smallest disagrees (1).
    """
    if num_pairs < 1 or rank_sum < 0:
        raise ValueError(f"need at least one pair and a rank sum of at least 0, got {num_pairs} and {rank_sum}")
    return sum(_untied_null_counts(num_pairs)[: rank_sum + 1]) / 2**num_pairs


def room_for_disagreement(num_pairs: int) -> int:
    """The rank sum against a regression that A/B mode's default pair count leaves room for: half the pairs.

    At 12 pairs, the three smallest pairs (1 + 2 + 3) or one middling pair (6)
    may go the other way. Why half: bench/calibrate_ab.py on a 2-core CPU with
    two workers a side detected a 10% slowdown in 67% of tests at 9 pairs
    (room for the smallest pair only) and in 92% at 12 pairs (room for 6).
    """
    return num_pairs // 2


def pairs_with_room_for_disagreement(num_comparisons: int, alpha: float) -> int | None:
    """The fewest pairs with which a lone regression is still flagged when pairs against it hold a rank sum of half
    the pairs (``room_for_disagreement``). A/B mode runs at least this many pairs unless told otherwise."""
    for num_pairs in range(2, MAX_SUGGESTED_REPEATS + 1):
        p = paired_p_value_with_disagreement(num_pairs, room_for_disagreement(num_pairs))
        if max_comparisons_for_p_value(p, alpha) >= num_comparisons:
            return num_pairs
    return None


@dataclass(frozen=True, slots=True)
class PairedPowerPlan(PowerPlan):
    """A PowerPlan whose repeats are pairs: n reference and n current repeats make n pairs."""

    def suggested_repeats(self) -> int | None:
        return pairs_for_lone_regression(self.num_comparisons, self.alpha)

    def describe_samples(self) -> str:
        return f"{self.n_current} A/B pairs"


def plan_paired_power(num_comparisons: int, num_pairs: int, alpha: float) -> PowerPlan:
    """Can a lone regression among ``num_comparisons`` be flagged with this many pairs at this alpha?"""
    if num_comparisons < 0:
        raise ValueError(f"num_comparisons must be >= 0, got {num_comparisons}")
    return PairedPowerPlan(
        num_comparisons=num_comparisons,
        n_baseline=num_pairs,
        n_current=num_pairs,
        alpha=alpha,
        smallest_p=smallest_paired_p_value(num_pairs),
        max_comparisons=max_comparisons_for_lone_paired_regression(num_pairs, alpha),
    )
