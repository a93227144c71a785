"""perfsuite.measure.quantiles: order-statistic intervals for percentiles, and when a sample cannot support one."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfsuite.measure.quantiles import (
    binomial_cdfs,
    min_sample_size,
    percentile_interval,
    rank_interval,
)

PERCENTILES = st.sampled_from([1.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9])
CONFIDENCES = st.sampled_from([0.8, 0.9, 0.95, 0.99])


def exact_cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(0, min(k, n) + 1)) if k >= 0 else 0.0


@given(st.integers(1, 60), st.floats(0.01, 0.99))
def test_the_binomial_cdf_matches_the_textbook_sum(n, p):
    cdfs = binomial_cdfs(n, p)
    for k in range(n + 1):
        assert cdfs[k] == pytest.approx(exact_cdf(k, n, p), abs=1e-9)


@given(st.integers(1, 600), PERCENTILES, CONFIDENCES)
def test_each_end_leaves_at_most_half_the_miss_rate_and_no_tighter_rank_would(n, q, confidence):
    ranks = rank_interval(n, q, confidence)
    p, tail = q / 100, (1 - confidence) / 2
    cdf = binomial_cdfs(n, p)

    def at_most(k):
        return 0.0 if k < 0 else cdf[min(k, n)]

    if ranks.low_rank is not None:
        assert at_most(ranks.low_rank - 1) <= tail, "the low end lies above the quantile too often"
        if ranks.low_rank < n:
            assert at_most(ranks.low_rank) > tail, "one rank higher would still do: not the tightest"
    else:
        assert at_most(0) > tail, "an open low end although the smallest value would do"
    if ranks.high_rank is not None:
        assert 1 - at_most(ranks.high_rank - 1) <= tail
        if ranks.high_rank > 1:
            assert 1 - at_most(ranks.high_rank - 2) > tail
    else:
        assert 1 - at_most(n - 1) > tail, "an open high end although the largest value would do"
    assert ranks.coverage >= confidence - 1e-9


@pytest.mark.parametrize(("q", "n"), [(50, 15), (90, 200), (99, 1000)])
def test_the_interval_covers_a_known_distributions_percentile_at_its_stated_rate(q, n):
    """Exponential(1) latencies: the true q-th percentile is -ln(1 - q/100)."""
    rng, trials = random.Random(20261125), 1500
    truth = -math.log(1 - q / 100)
    interval = rank_interval(n, q)
    covered = 0
    for _ in range(trials):
        found = percentile_interval([rng.expovariate(1.0) for _ in range(n)], q)
        assert found.supported
        covered += found.low <= truth <= found.high
    rate = covered / trials
    spread = 4 * math.sqrt(interval.coverage * (1 - interval.coverage) / trials)
    assert abs(rate - interval.coverage) < spread, f"covered {rate:.3f}, the binomial law says {interval.coverage:.3f}"
    assert rate >= 0.95 - spread


def test_p99_of_a_hundred_values_is_not_supported_and_has_no_upper_end():
    values = [float(i) for i in range(1, 101)]
    p99 = percentile_interval(values, 99)
    assert not p99.supported and p99.high is None and p99.low is not None
    assert p99.as_list() == [p99.low, None]
    median = percentile_interval(values, 50)
    assert median.supported and median.low < 50.5 < median.high


@pytest.mark.parametrize("q", [50, 90, 99])
def test_the_smallest_sample_that_supports_a_percentile_is_the_fewest(q):
    n = min_sample_size(q)
    assert rank_interval(n, q).is_bounded and not rank_interval(n - 1, q).is_bounded


def test_min_sample_size_of_p99_at_95_percent():
    # 0.99^n <= 0.025 first at n = 368: below that even the maximum is too likely to lie under the true p99.
    assert min_sample_size(99) == 368 and min_sample_size(50) == 6


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: rank_interval(10, 100), "strictly between 0 and 100"),
        (lambda: rank_interval(10, 0), "strictly between 0 and 100"),
        (lambda: rank_interval(10, 50, 1.0), "confidence must be strictly between 0 and 1"),
        (lambda: rank_interval(0, 50), "at least one value"),
        (lambda: percentile_interval([], 50), "at least one value"),
        (lambda: binomial_cdfs(3, 0.0), "strictly between 0 and 1"),
    ],
)
def test_bad_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
