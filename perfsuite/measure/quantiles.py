"""Distribution-free confidence intervals for percentiles, from order statistics.

Pure Python. For a sample of n values from any continuous distribution, the
number B of values below the true q-quantile is Binomial(n, q). The interval
[x_(l), x_(u)] between the l-th and u-th smallest values therefore covers the
quantile with probability P(l <= B <= u - 1), whatever the distribution.

A percentile the sample cannot support is one whose interval needs an order
statistic the sample does not have: p99 of 100 latencies is (nearly) the
maximum, and nothing in the sample bounds the true p99 from above. Such a
percentile is reported with ``supported = False`` and an open upper (or
lower) end, instead of as a precise figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True, slots=True)
class RankInterval:
    """1-based ranks of the order statistics bounding a quantile; ``None`` where the sample has none."""

    low_rank: int | None
    high_rank: int | None
    coverage: float  # exact P(low <= quantile <= high) under any continuous distribution

    @property
    def is_bounded(self) -> bool:
        return self.low_rank is not None and self.high_rank is not None


@dataclass(frozen=True, slots=True)
class PercentileInterval:
    """A percentile's distribution-free interval; an open end is ``None``."""

    q: float  # 0-100
    low: float | None
    high: float | None
    confidence: float
    num_values: int

    @property
    def supported(self) -> bool:
        """Whether the sample bounds the percentile on both sides at this confidence."""
        return self.low is not None and self.high is not None

    def as_list(self) -> list[float | None]:
        return [self.low, self.high]

    @property
    def min_num_values(self) -> int:
        """The fewest values that would support this percentile at this confidence."""
        return min_sample_size(self.q, self.confidence)

    def unsupported_text(self, scale: float = 1.0, what: str = "requests") -> str | None:
        """What to show instead of the figure when the sample cannot support it (ends times ``scale``); else None.

        p99 of 100 requests is (nearly) their maximum: what the sample does
        say is the interval's lower end, e.g. ``≥ 812 (p99 needs 368 requests, has 100)``.
        """
        if self.supported:
            return None
        label = "p50" if self.q == 50 else f"p{self.q:g}"
        needs = f"{label} needs {self.min_num_values} {what}, has {self.num_values}"
        if self.low is not None:
            return f"≥ {self.low * scale:.4g} ({needs})"
        if self.high is not None:
            return f"≤ {self.high * scale:.4g} ({needs})"
        return f"unsupported ({needs})"


def binomial_cdfs(n: int, p: float) -> list[float]:
    """[P(B <= k) for k in 0..n], B ~ Binomial(n, p): the pmf in log space, so large n stays accurate."""
    if not 0 < p < 1:
        raise ValueError(f"p must be strictly between 0 and 1, got {p}")
    log_p, log_q, log_n = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    log_pmf = [log_n - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q for k in range(n + 1)]
    top = max(log_pmf)
    weights = [math.exp(t - top) for t in log_pmf]
    total = math.fsum(weights)
    cdfs, running = [], 0.0
    for weight in weights:
        running += weight
        cdfs.append(min(1.0, running / total))
    cdfs[-1] = 1.0
    return cdfs


def min_sample_size(q: float, confidence: float = DEFAULT_CONFIDENCE) -> int:
    """The fewest values whose order statistics bound the q-th percentile on both sides."""
    _check(q, confidence)
    n = 1
    while not rank_interval(n, q, confidence).is_bounded:
        n = n * 2 if n < 64 else n + max(1, n // 16)
    low = n // 2
    while low + 1 < n:  # the bounded-ness is monotone in n: bisect down to the fewest
        middle = (low + n) // 2
        if rank_interval(middle, q, confidence).is_bounded:
            n = middle
        else:
            low = middle
    return n


def rank_interval(n: int, q: float, confidence: float = DEFAULT_CONFIDENCE) -> RankInterval:
    """The equal-tailed order-statistic interval for the q-th percentile (q in 0-100) of n values.

    Each end is chosen so that at most (1 - confidence) / 2 of the probability
    lies beyond it; an end that would need rank 0 or rank n + 1 is open.
    """
    _check(q, confidence)
    if n < 1:
        raise ValueError(f"need at least one value, got {n}")
    tail = (1 - confidence) / 2
    cdf = binomial_cdfs(n, q / 100)

    def at_most(k: int) -> float:  # P(B <= k)
        return 0.0 if k < 0 else cdf[min(k, n)]

    # The l-th smallest value lies above the quantile when B < l: the largest l with P(B <= l - 1) <= tail.
    low = 0
    while low < n and at_most(low) <= tail:
        low += 1
    # The u-th smallest lies below it when B >= u: the smallest u with P(B >= u) <= tail.
    high = n + 1
    while high > 1 and 1 - at_most(high - 2) <= tail:
        high -= 1
    low_rank = low if low >= 1 else None
    high_rank = high if high <= n else None
    coverage = at_most((high_rank or n + 1) - 1) - at_most((low_rank or 0) - 1)
    return RankInterval(low_rank, high_rank, coverage)


def percentile_interval(
    values: Sequence[float], q: float, confidence: float = DEFAULT_CONFIDENCE
) -> PercentileInterval:
    """The q-th percentile's interval from ``values``' order statistics."""
    ordered = sorted(values)
    ranks = rank_interval(len(ordered), q, confidence)
    low = ordered[ranks.low_rank - 1] if ranks.low_rank is not None else None
    high = ordered[ranks.high_rank - 1] if ranks.high_rank is not None else None
    return PercentileInterval(q, low, high, confidence, len(ordered))


def _check(q: float, confidence: float) -> None:
    if not 0 < q < 100:
        raise ValueError(f"percentile must be strictly between 0 and 100, got {q}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence}")
