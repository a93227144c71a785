"""perfsuite.judge.power: the smallest p-value, session size limits and minimum detectable effects."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import mannwhitneyu

from perfsuite.judge.power import (
    max_comparisons_for_lone_regression,
    minimum_detectable_effect,
    plan_power,
    repeats_for_lone_regression,
    smallest_p_value,
)
from perfsuite.judge.stats import Direction, benjamini_hochberg

HIGHER, LOWER = Direction.HIGHER_IS_BETTER, Direction.LOWER_IS_BETTER
ALPHAS = st.sampled_from([0.001, 0.01, 0.05, 0.1, 0.2])
# Distinct-enough values: every crossing ratio is at least ~1e-5 from the next, far above float noise.
SAMPLES = st.lists(st.integers(50, 150).map(float), min_size=2, max_size=9)


def worse_p(baseline, current, direction):
    """The raw one-sided p that perfsuite.judge.stats computes for 'current is worse'."""
    alternative = "less" if direction is HIGHER else "greater"
    return mannwhitneyu(current, baseline, alternative=alternative).pvalue


def slowed(baseline, slowdown, direction):
    factor = 1 - slowdown if direction is HIGHER else 1 + slowdown
    return [v * factor for v in baseline]


# -- the smallest p-value and the session size --------------------------------


def test_smallest_p_value_at_seven_repeats_is_one_in_3432():
    assert smallest_p_value(7, 7) == pytest.approx(1 / 3432)


@given(st.integers(1, 8), st.integers(1, 8))
def test_smallest_p_value_is_scipys_exact_p_on_fully_separated_samples(n_baseline, n_current):
    baseline = [100.0 + i for i in range(n_baseline)]
    current = [float(i) for i in range(n_current)]
    exact = mannwhitneyu(current, baseline, alternative="less", method="exact").pvalue
    assert smallest_p_value(n_baseline, n_current) == pytest.approx(exact, rel=1e-12)


def test_smallest_p_value_needs_samples_on_both_sides():
    with pytest.raises(ValueError):
        smallest_p_value(0, 5)


def test_max_comparisons_at_seven_repeats_and_alpha_five_percent_is_171():
    assert max_comparisons_for_lone_regression(7, 7, 0.05) == 171


@given(st.integers(1, 8), st.integers(1, 8), ALPHAS)
def test_benjamini_hochberg_flags_a_lone_regression_up_to_max_comparisons_and_not_beyond(n_baseline, n_current, alpha):
    smallest_p = smallest_p_value(n_baseline, n_current)
    m = max_comparisons_for_lone_regression(n_baseline, n_current, alpha)
    if m > 0:
        assert benjamini_hochberg([smallest_p] + [1.0] * (m - 1))[0] < alpha
    assert not benjamini_hochberg([smallest_p] + [1.0] * m)[0] < alpha


def test_a_session_within_the_limit_needs_no_advice():
    plan = plan_power(171, 7, 7, 0.05)
    assert plan.can_flag_lone_regression
    assert plan.advice() is None
    assert plan.max_comparisons == 171 and plan.smallest_p == pytest.approx(1 / 3432)


def test_a_session_past_the_limit_is_told_the_numbers_and_the_fixes():
    plan = plan_power(16, 5, 5, 0.05)
    assert not plan.can_flag_lone_regression
    advice = plan.advice()
    assert advice is not None and "\n" not in advice
    for part in ("16 comparisons", "0.00397", "at most 12", "--perf-repeats 6", "--perf-engines", "-k"):
        assert part in advice


def test_the_suggested_repeats_grow_with_the_session():
    assert plan_power(172, 7, 7, 0.05).advice().count("--perf-repeats 8") == 1


@given(st.integers(1, 5000), ALPHAS)
def test_the_suggested_repeats_are_the_fewest_that_suffice(num_comparisons, alpha):
    repeats = repeats_for_lone_regression(num_comparisons, alpha)
    assert plan_power(num_comparisons, repeats, repeats, alpha).can_flag_lone_regression
    if repeats > 1:
        assert not plan_power(num_comparisons, repeats - 1, repeats - 1, alpha).can_flag_lone_regression


# -- minimum detectable effect --------------------------------------------------


@pytest.mark.parametrize("direction", [HIGHER, LOWER])
def test_a_tight_baseline_detects_anything_above_the_minimum_effect(direction):
    baseline = [100.0, 100.1, 99.9, 100.05, 99.95, 100.02, 99.98]
    assert minimum_detectable_effect(baseline, direction, alpha=0.05, min_effect=0.10) == 0.10


@pytest.mark.parametrize("direction", [HIGHER, LOWER])
def test_a_wider_spread_needs_a_larger_slowdown(direction):
    tight = [100.0, 101.0, 99.0, 102.0, 98.0, 100.5, 99.5]
    wide = [100.0, 110.0, 90.0, 120.0, 80.0, 105.0, 95.0]
    tight_mde = minimum_detectable_effect(tight, direction, alpha=0.01, min_effect=0.0)
    wide_mde = minimum_detectable_effect(wide, direction, alpha=0.01, min_effect=0.0)
    assert 0 < tight_mde < wide_mde


def test_known_value_for_a_small_baseline():
    # Throughput 1, 2, 3: the current side must be 3 * (1 - d) < 1 to separate fully (p = 1/20 at 3 vs 3).
    assert minimum_detectable_effect([1.0, 2.0, 3.0], HIGHER, alpha=0.051, min_effect=0.0) == pytest.approx(2 / 3)


@pytest.mark.parametrize("direction", [HIGHER, LOWER])
def test_no_effect_is_detectable_below_the_smallest_p_value(direction):
    baseline = [100.0, 101.0, 99.0, 102.0, 98.0, 100.5, 99.5]
    smallest = smallest_p_value(7, 7)
    assert minimum_detectable_effect(baseline, direction, alpha=smallest * 0.99, min_effect=0.1) is None
    assert minimum_detectable_effect(baseline, direction, alpha=smallest * 1.01, min_effect=0.1) is not None


def test_a_constant_baseline_is_not_evidence_at_zero_slowdown():
    assert minimum_detectable_effect([5.0] * 7, HIGHER, alpha=0.05, min_effect=0.1) == 0.1


@given(SAMPLES, st.sampled_from([HIGHER, LOWER]), ALPHAS, ALPHAS)
def test_a_stricter_alpha_never_detects_a_smaller_effect(baseline, direction, alpha_a, alpha_b):
    strict, loose = sorted([alpha_a, alpha_b])
    strict_mde = minimum_detectable_effect(baseline, direction, strict, min_effect=0.0)
    loose_mde = minimum_detectable_effect(baseline, direction, loose, min_effect=0.0)
    if strict_mde is not None:
        assert loose_mde is not None and loose_mde <= strict_mde


@given(SAMPLES, st.sampled_from([HIGHER, LOWER]), ALPHAS, st.sampled_from([0.0, 0.02, 0.1]))
def test_shifting_by_the_mde_is_detected_and_a_bit_less_is_not(baseline, direction, alpha, min_effect):
    mde = minimum_detectable_effect(baseline, direction, alpha, min_effect)
    if mde is None:
        fully_separated = slowed(baseline, 0.9, direction)
        assert worse_p(baseline, fully_separated, direction) >= alpha
        return
    assert mde >= min_effect
    assert worse_p(baseline, slowed(baseline, mde + 1e-7, direction), direction) < alpha
    if mde > min_effect:
        assert worse_p(baseline, slowed(baseline, mde - 1e-7, direction), direction) >= alpha


def linear_scan_mde(baseline, direction, alpha):
    """The model: every slowdown where a scaled sample meets an unscaled one, tried just past it in order."""
    if direction is HIGHER:
        crossings = {1 - x / y for x in baseline for y in baseline if x < y}
        beyond = 0.999
    else:
        crossings = {x / y - 1 for x in baseline for y in baseline if x > y}
        beyond = 2 * max(crossings, default=0.0) + 1
    candidates = sorted({0.0} | crossings)
    just_past = [(low + high) / 2 for low, high in itertools.pairwise(candidates)] + [beyond]
    for candidate, probe in zip(candidates, just_past):
        if worse_p(baseline, slowed(baseline, probe, direction), direction) < alpha:
            return candidate
    return None


@given(SAMPLES, st.sampled_from([HIGHER, LOWER]), ALPHAS)
def test_the_bisection_finds_what_a_linear_scan_of_the_crossings_finds(baseline, direction, alpha):
    expected = linear_scan_mde(baseline, direction, alpha)
    mde = minimum_detectable_effect(baseline, direction, alpha, min_effect=0.0)
    assert mde == (None if expected is None else pytest.approx(expected, abs=1e-12))
