"""Is the current run worse than the baseline? Pure functions over samples.

A regression must be both statistically significant and large enough to
matter (asv combines its Mann-Whitney U test with a factor threshold the same
way):

- significance: a one-sided Mann-Whitney U test that the current samples are
  worse than the baseline's, with p-values adjusted across every comparison
  of the session by the Benjamini-Hochberg procedure;
- size: the change of the median beyond ``min_effect`` (a fraction).

Benjamini-Hochberg rather than Holm. When the code did not change, every
null hypothesis of the session is true, and then Benjamini-Hochberg's false
discovery rate *is* the chance of any false alarm: the session fails on
unchanged code at most alpha of the time, as with Holm. When something did
slow down, it is usually many tests at once (a slower kernel slows every
test), and Benjamini-Hochberg lets those small p-values support each other
where Holm divides alpha by the whole session for the first of them. The
price is that among flagged rows a share (at most alpha on average) may be
false; a session that found a real regression fails either way.
bench/calibrate.py measured the difference on the 2-core CI machine: see the
calibration table in docs/benchmarks.md.

The confidence interval is a seeded percentile bootstrap of the ratio of
medians, current over baseline.
"""

from __future__ import annotations

import enum
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace


class Direction(enum.Enum):
    HIGHER_IS_BETTER = "higher"
    LOWER_IS_BETTER = "lower"


class Verdict(enum.Enum):
    IMPROVED = "improved"
    UNCHANGED = "unchanged"
    REGRESSED = "regressed"
    INCONCLUSIVE = "inconclusive"
    NOISY = "noisy"  # the machine was busy with other work while the test ran: inconclusive, never regressed


@dataclass(frozen=True, slots=True)
class Comparison:
    """One metric of one test, baseline against current."""

    metric: str
    direction: Direction
    n_baseline: int
    n_current: int
    baseline_median: float
    current_median: float
    change: float  # current median / baseline median - 1
    ci_low: float  # bootstrap CI of current median / baseline median
    ci_high: float
    p_worse: float  # raw one-sided p: current worse than baseline
    p_better: float  # raw one-sided p: current better than baseline
    p_adjusted: float  # Benjamini-Hochberg-adjusted p of the side the verdict is about
    verdict: Verdict
    min_detectable_effect: float | None = None  # perfsuite.judge.power: from the baseline's own spread

    @property
    def change_percent(self) -> float:
        return 100 * self.change

    def describe(self, sides: tuple[str, str] = ("baseline", "current")) -> str:
        """One line; ``sides`` names what was compared (an A/B session: ("REF (A)", "current (B)"))."""
        reference, current = sides
        return (
            f"{self.metric}: {reference} median {self.baseline_median:.4g}, {current} median "
            f"{self.current_median:.4g} ({self.change_percent:+.1f}%), ratio CI "
            f"[{self.ci_low:.3f}, {self.ci_high:.3f}], adjusted p={self.p_adjusted:.3g} -> {self.verdict.value}"
        )


# Against a stored baseline, measured hours or weeks ago on a machine whose speed has moved since, only a
# change past 10% stands out; side by side (--perf-against) both see one machine (docs/baselines-and-ci.md).
STORED_MIN_EFFECT = 0.10
PAIRED_MIN_EFFECT = 0.03


@dataclass(frozen=True, slots=True)
class Policy:
    """What counts as a regression."""

    alpha: float = 0.05
    min_effect: float = STORED_MIN_EFFECT
    min_samples: int = 3
    confidence: float = 0.95
    n_bootstrap: int = 2000

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.min_effect < 0:
            raise ValueError(f"min_effect must be >= 0, got {self.min_effect}")
        if self.min_samples < 2:
            raise ValueError(f"min_samples must be >= 2, got {self.min_samples}")


def compare(
    metric: str,
    baseline: Sequence[float],
    current: Sequence[float],
    direction: Direction,
    policy: Policy = Policy(),
    seed: int = 0,
) -> Comparison:
    """Compare one metric; the verdict uses the raw p until ``adjust`` runs."""
    baseline, current = [float(v) for v in baseline], [float(v) for v in current]
    if not baseline or not current:
        raise ValueError(f"{metric}: need samples on both sides, got {len(baseline)} baseline, {len(current)} current")
    base_median, cur_median = statistics.median(baseline), statistics.median(current)
    p_worse, p_better = _one_sided_p_values(baseline, current, direction)
    ci_low, ci_high = bootstrap_ratio_ci(baseline, current, policy.confidence, policy.n_bootstrap, seed)
    comparison = Comparison(
        metric=metric,
        direction=direction,
        n_baseline=len(baseline),
        n_current=len(current),
        baseline_median=base_median,
        current_median=cur_median,
        change=_relative_change(base_median, cur_median),
        ci_low=ci_low,
        ci_high=ci_high,
        p_worse=p_worse,
        p_better=p_better,
        p_adjusted=min(p_worse, p_better),
        verdict=Verdict.INCONCLUSIVE,
    )
    return _with_verdict(comparison, p_worse, p_better, policy)


Correction = Callable[[Sequence[float]], list[float]]


def adjust(
    comparisons: Sequence[Comparison], policy: Policy = Policy(), correction: Correction | None = None
) -> list[Comparison]:
    """Adjust every comparison of a session (Benjamini-Hochberg by default) and settle the verdicts."""
    correction = correction or benjamini_hochberg
    worse = correction([_family_p(c, c.p_worse) for c in comparisons])
    better = correction([_family_p(c, c.p_better) for c in comparisons])
    return [_with_verdict(c, w, b, policy) for c, w, b in zip(comparisons, worse, better)]


def adjust_interim(
    comparisons: Sequence[Comparison],
    earlier: Sequence[Comparison],
    num_comparisons: int,
    policy: Policy = Policy(),
    correction: Correction | None = None,
) -> list[Comparison]:
    """Verdicts for one test while its session is still running.

    ``earlier`` are the session's comparisons made so far; the rest of the
    ``num_comparisons`` are not measured yet and count as p = 1. Lowering
    any p-value can only lower Benjamini-Hochberg's adjusted p-values, so
    what this flags stays flagged when the session's last p-value is in.
    """
    correction = correction or benjamini_hochberg
    known = len(earlier) + len(comparisons)
    if num_comparisons < known:
        raise ValueError(f"num_comparisons {num_comparisons} is below the {known} comparisons made")
    pending = [1.0] * (num_comparisons - known)
    everything = [*earlier, *comparisons]
    worse = correction([_family_p(c, c.p_worse) for c in everything] + pending)[len(earlier) : known]
    better = correction([_family_p(c, c.p_better) for c in everything] + pending)[len(earlier) : known]
    return [_with_verdict(c, w, b, policy) for c, w, b in zip(comparisons, worse, better)]


def mark_noisy(comparison: Comparison) -> Comparison:
    """A comparison whose samples were taken on a busy machine: shown, never a verdict either way."""
    return replace(comparison, verdict=Verdict.NOISY)


def _family_p(comparison: Comparison, p_value: float) -> float:
    # A noisy comparison stays in the family (it was planned) but as p = 1:
    # its small p-values come from the other work, and under Benjamini-Hochberg
    # they would lower the bar for every other test of the session.
    return 1.0 if comparison.verdict is Verdict.NOISY else p_value


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (step-up, as R's ``p.adjust(method="BH")``), in input order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i], reverse=True)
    adjusted = [1.0] * m
    running = 1.0
    for position, index in enumerate(order):
        rank = m - position
        running = min(running, p_values[index] * (m / rank))
        adjusted[index] = min(1.0, running)
    return adjusted


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order (bench/calibrate.py compares it with BH)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def bootstrap_ratio_ci(
    baseline: Sequence[float], current: Sequence[float], confidence: float, n_bootstrap: int, seed: int
) -> tuple[float, float]:
    """Percentile bootstrap CI of median(current) / median(baseline)."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(n_bootstrap):
        base = statistics.median(rng.choices(baseline, k=len(baseline)))
        cur = statistics.median(rng.choices(current, k=len(current)))
        ratios.append(cur / base if base else math.inf if cur else 1.0)
    ratios.sort()
    tail = (1 - confidence) / 2
    low = ratios[int(tail * (n_bootstrap - 1))]
    high = ratios[math.ceil((1 - tail) * (n_bootstrap - 1))]
    return low, high


def _one_sided_p_values(baseline: list[float], current: list[float], direction: Direction) -> tuple[float, float]:
    # scipy.stats takes about 1 s to import: only a --perf run that compares pays it, not every pytest run.
    from scipy.stats import mannwhitneyu

    if len(set(baseline) | set(current)) == 1:
        return 1.0, 1.0  # every sample equal: no evidence either way
    # "worse" means lower throughput or higher latency.
    worse_alternative = "less" if direction is Direction.HIGHER_IS_BETTER else "greater"
    better_alternative = "greater" if worse_alternative == "less" else "less"
    p_worse = mannwhitneyu(current, baseline, alternative=worse_alternative).pvalue
    p_better = mannwhitneyu(current, baseline, alternative=better_alternative).pvalue
    return float(p_worse), float(p_better)


def _relative_change(baseline_median: float, current_median: float) -> float:
    if baseline_median == 0:
        return 0.0 if current_median == 0 else math.copysign(math.inf, current_median)
    return current_median / baseline_median - 1


def _with_verdict(comparison: Comparison, p_worse: float, p_better: float, policy: Policy) -> Comparison:
    if comparison.verdict is Verdict.NOISY:
        return replace(comparison, p_adjusted=min(p_worse, p_better))
    if min(comparison.n_baseline, comparison.n_current) < policy.min_samples:
        return replace(comparison, p_adjusted=min(p_worse, p_better), verdict=Verdict.INCONCLUSIVE)
    signed = comparison.change if comparison.direction is Direction.HIGHER_IS_BETTER else -comparison.change
    if p_worse < policy.alpha and signed < -policy.min_effect:
        return replace(comparison, p_adjusted=p_worse, verdict=Verdict.REGRESSED)
    if p_better < policy.alpha and signed > policy.min_effect:
        return replace(comparison, p_adjusted=p_better, verdict=Verdict.IMPROVED)
    return replace(comparison, p_adjusted=p_worse if signed < 0 else p_better, verdict=Verdict.UNCHANGED)


# The same rule judges a paired comparison (perfsuite.judge.paired).
with_verdict = _with_verdict


@dataclass(frozen=True, slots=True)
class CounterChange:
    """An exact counter (forward passes, padded slot-tokens...) that changed."""

    name: str
    baseline: int
    current: int


def compare_counters(baseline: dict[str, int], current: dict[str, int]) -> list[CounterChange]:
    """Exact counters are noise-free: any difference is reported."""
    names = sorted(set(baseline) | set(current))
    return [
        CounterChange(name, baseline.get(name, 0), current.get(name, 0))
        for name in names
        if baseline.get(name, 0) != current.get(name, 0)
    ]
