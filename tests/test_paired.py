"""perfsuite.judge.paired: the exact Wilcoxon signed-rank judge of interleaved (reference, current) pairs."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfsuite.judge.paired import (
    compare_paired,
    hodges_lehmann,
    max_comparisons_for_lone_paired_regression,
    paired_minimum_detectable_effect,
    paired_p_value_with_disagreement,
    pairs_for_lone_regression,
    pairs_with_room_for_disagreement,
    plan_paired_power,
    room_for_disagreement,
    smallest_paired_p_value,
    walsh_averages,
    walsh_confidence_interval,
    walsh_interval_coverage,
    wilcoxon_signed_rank_upper_p,
)
from perfsuite.judge.power import PowerPlan
from perfsuite.judge.stats import Comparison, Direction, Policy, Verdict, adjust, benjamini_hochberg

HIGHER, LOWER = Direction.HIGHER_IS_BETTER, Direction.LOWER_IS_BETTER
ALPHAS = st.sampled_from([0.001, 0.01, 0.05, 0.1, 0.2, 1 / 16, 3 / 64])
CONFIDENCES = st.sampled_from([0.5, 0.8, 0.9, 0.95, 0.99])
# Small integers give many ties and zeros; floats give the untied case.
DIFFERENCES = st.lists(st.one_of(st.integers(-4, 4).map(float), st.floats(-100, 100)), max_size=10)
UNTIED_NONZERO = st.lists(st.floats(-100, 100).filter(lambda d: d != 0), min_size=1, max_size=20, unique_by=abs)

REFERENCE = [100.0, 103.0, 98.0, 101.0, 99.5, 102.0, 100.5]
NOISE = [1.004, 0.997, 1.001, 0.995, 1.003, 0.999, 1.002]  # median 1.001


def times(samples, factors):
    return [s * f for s, f in zip(samples, factors)]


def slowed(samples, slowdown, direction):
    """As perfsuite.judge.power means a slowdown: throughput times 1 - s, latency times 1 + s."""
    return [v * (1 - slowdown if direction is HIGHER else 1 + slowdown) for v in samples]


# -- the exact p-value ------------------------------------------------------------------------------------------------


def brute_force_upper_p(differences):
    """The model: mid-ranks by counting, then every one of the 2^n sign assignments of the non-zero |d|."""
    nonzero = [d for d in differences if d != 0]
    if not nonzero:
        return 1.0
    sizes = [abs(d) for d in nonzero]
    ranks = [sum(y < x for y in sizes) + Fraction(sum(y == x for y in sizes) + 1, 2) for x in sizes]
    observed = sum(rank for rank, d in zip(ranks, nonzero) if d > 0)
    signs = itertools.product([False, True], repeat=len(ranks))
    hits = sum(1 for positive in signs if sum(r for r, p in zip(ranks, positive) if p) >= observed)
    return hits / 2 ** len(ranks)


@given(DIFFERENCES)
def test_the_exact_p_is_the_share_of_sign_assignments_at_least_as_extreme(differences):
    assert wilcoxon_signed_rank_upper_p(differences) == brute_force_upper_p(differences)


@given(UNTIED_NONZERO)
def test_the_exact_p_is_scipys_on_untied_nonzero_differences(differences):
    from scipy.stats import wilcoxon

    expected = wilcoxon(differences, alternative="greater", method="exact").pvalue
    assert wilcoxon_signed_rank_upper_p(differences) == pytest.approx(expected, rel=1e-9)


def test_all_zero_or_no_differences_are_no_evidence():
    assert wilcoxon_signed_rank_upper_p([0.0, -0.0, 0.0]) == 1.0
    assert wilcoxon_signed_rank_upper_p([]) == 1.0


def test_sizes_count_where_the_sign_test_sees_only_signs():
    # 6 of 7 worse, the one better pair the smallest: T+ = 28 - 1 = 27, reached by the all-positive
    # assignment (28) and the one with only rank 1 negative (27): 2 of 128. The sign test counts
    # assignments with at least 6 positive signs: C(7, 6) + C(7, 7) = 8 of 128.
    differences = [-0.01, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    sign_test_p = sum(math.comb(7, k) for k in (6, 7)) / 128
    assert wilcoxon_signed_rank_upper_p(differences) == 2 / 128
    assert sign_test_p == 8 / 128


def test_exact_for_sixty_pairs_with_ties():
    # 60 differences, all positive and all tied: only the all-positive assignment reaches the maximum.
    assert wilcoxon_signed_rank_upper_p([0.5] * 60) == 2.0**-60
    # Half of them negative, ties everywhere: T+ is exactly the null's centre, so p > 1/2 by symmetry.
    assert 0.5 < wilcoxon_signed_rank_upper_p([0.5, -0.5] * 30) < 0.6


def test_an_order_effect_under_the_abba_order_does_not_raise_false_alarms():
    # ABBA: in pair (A, B) the current side runs second, in pair (B, A) the reference does; a second run
    # 3% faster adds +0.03 to half the log ratios and -0.03 to the other half. Under no change the
    # one-sided test must flag at most alpha of such sessions.
    rng = random.Random(7)
    alpha, num_sessions = 0.05, 2000
    flagged = 0
    for _ in range(num_sessions):
        order_effect = [0.03 if pair % 2 == 0 else -0.03 for pair in range(10)]
        differences = [effect + rng.gauss(0, 0.01) for effect in order_effect]
        flagged += wilcoxon_signed_rank_upper_p(differences) < alpha
    assert flagged / num_sessions <= alpha


# -- Walsh averages and the confidence interval of the centre --------------------------------------------------


def untied_null_cdf(n):
    """P(T+ <= s) for s = 0 .. n(n+1)/2, by enumerating every subset of the ranks 1..n."""
    sums = [sum(subset) for size in range(n + 1) for subset in itertools.combinations(range(1, n + 1), size)]
    return [sum(total <= s for total in sums) / 2**n for s in range(n * (n + 1) // 2 + 1)]


def brute_force_k(n, confidence):
    tail = (1 - confidence) / 2
    cdf = untied_null_cdf(n)
    return max((k for k in range(1, len(cdf) + 1) if cdf[k - 1] <= tail), default=0)


def test_walsh_averages_are_every_pairwise_mean_including_each_value_with_itself():
    assert walsh_averages([3.0, 1.0]) == [1.0, 2.0, 3.0]
    assert hodges_lehmann([3.0, 1.0]) == 2.0


@given(st.lists(st.floats(-100, 100), min_size=1, max_size=12), CONFIDENCES)
def test_the_interval_contains_the_hodges_lehmann_estimate(differences, confidence):
    low, high = walsh_confidence_interval(differences, confidence)
    assert low <= hodges_lehmann(differences) <= high


@given(st.lists(st.floats(-100, 100), min_size=1, max_size=10), CONFIDENCES)
def test_the_interval_is_the_k_th_walsh_average_from_each_end(differences, confidence):
    averages = sorted((a + b) / 2 for a, b in itertools.combinations_with_replacement(differences, 2))
    k = max(1, brute_force_k(len(differences), confidence))
    assert walsh_confidence_interval(differences, confidence) == (averages[k - 1], averages[-k])


def test_coverage_of_the_centre_of_a_symmetric_distribution():
    # n = 9 at 95%: P(T+ <= 5) = 10/512 <= 0.025 < P(T+ <= 6) = 14/512, so k = 6, coverage 1 - 20/512.
    n, confidence, centre = 9, 0.95, 0.3
    exact = 1 - 2 * untied_null_cdf(n)[brute_force_k(n, confidence) - 1]
    assert walsh_interval_coverage(n, confidence) == exact == 1 - 20 / 512
    rng = random.Random(2024)
    draws = 2000
    covered = 0
    for _ in range(draws):
        low, high = walsh_confidence_interval([rng.gauss(centre, 1.0) for _ in range(n)], confidence)
        covered += low <= centre <= high
    assert covered / draws >= confidence - 0.02
    assert abs(covered / draws - exact) < 0.015  # about 3.5 standard errors of 2000 draws


def test_too_few_differences_get_the_widest_interval_and_say_its_coverage():
    # n = 5: 2^-5 > 0.025, so no k >= 1: the whole range, covering 1 - 2 * 2^-5 < 95%.
    assert walsh_confidence_interval([0.3, -0.1, 0.2, 0.5, 0.0], 0.95) == (-0.1, 0.5)
    assert walsh_interval_coverage(5, 0.95) == 1 - 2 / 32


def test_the_interval_needs_a_confidence_between_zero_and_one():
    with pytest.raises(ValueError, match="confidence"):
        walsh_confidence_interval([1.0, 2.0], 1.0)


# -- compare_paired ---------------------------------------------------------------------------------------------


def test_a_twenty_percent_slowdown_on_every_pair_regresses():
    # All 7 oriented log ratios positive: only the all-positive sign assignment reaches T+, p = 1/128.
    result = compare_paired("output_throughput", REFERENCE, times(REFERENCE, [0.8 * f for f in NOISE]), HIGHER,
                            Policy(min_effect=0.05))
    assert isinstance(result, Comparison)
    assert result.p_worse == 1 / 128 and result.p_better == 1.0
    assert result.verdict is Verdict.REGRESSED and result.p_adjusted == 1 / 128
    assert result.change == pytest.approx(0.8 * 1.001 - 1)  # the median pair ratio, minus one
    assert result.ci_low <= 1 + result.change <= result.ci_high < 1
    assert result.n_baseline == result.n_current == 7
    assert result.baseline_median == 100.5


def test_the_same_pairs_the_other_way_round_improve():
    current = times(REFERENCE, [0.8 * f for f in NOISE])
    result = compare_paired("output_throughput", current, REFERENCE, HIGHER, Policy(min_effect=0.05))
    assert result.p_better == 1 / 128 and result.p_worse == 1.0
    assert result.verdict is Verdict.IMPROVED
    assert result.ci_low > 1


def test_latency_is_worse_upwards():
    slower = times(REFERENCE, [1.25 * f for f in NOISE])
    faster = times(REFERENCE, [0.8 * f for f in NOISE])
    assert compare_paired("ttft_ms", REFERENCE, slower, LOWER).verdict is Verdict.REGRESSED
    assert compare_paired("ttft_ms", REFERENCE, faster, LOWER).verdict is Verdict.IMPROVED


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("direction", [HIGHER, LOWER])
def test_two_runs_of_the_same_code_are_unchanged(seed, direction):
    rng = random.Random(seed)
    reference = [100 * rng.gauss(1, 0.01) for _ in range(9)]
    current = [100 * rng.gauss(1, 0.01) for _ in range(9)]
    assert compare_paired("tok/s", reference, current, direction).verdict is Verdict.UNCHANGED


def test_too_few_pairs_are_inconclusive():
    assert compare_paired("tok/s", [100.0, 101.0], [50.0, 51.0], HIGHER).verdict is Verdict.INCONCLUSIVE


@pytest.mark.parametrize(
    ("reference", "current", "complaint"),
    [
        ([1.0, 2.0], [1.0], "not pairs"),
        ([], [], "no pairs"),
        ([1.0, 0.0], [1.0, 2.0], "reference sample 1 is 0.0"),
        ([1.0, 2.0], [-1.0, 2.0], "current sample 0 is -1.0"),
        ([1.0, math.nan], [1.0, 2.0], "reference sample 1 is nan"),
        ([1.0, 2.0], [1.0, math.inf], "current sample 1 is inf"),
    ],
)
def test_bad_pairs_are_refused_naming_the_metric_and_the_value(reference, current, complaint):
    with pytest.raises(ValueError, match="ttft_ms") as refused:
        compare_paired("ttft_ms", reference, current, LOWER)
    assert complaint in str(refused.value)


def test_paired_comparisons_are_adjusted_across_the_session_like_any_other():
    # A lone p = 1/128 among m comparisons adjusts to m/128: below 0.05 for m = 6, above for m = 7.
    regressed = compare_paired("tok/s", REFERENCE, times(REFERENCE, [0.8 * f for f in NOISE]), HIGHER)
    same = compare_paired("tok/s", REFERENCE, REFERENCE, HIGHER)  # every log ratio 0: p = 1 both ways
    assert adjust([regressed] + [same] * 5)[0].verdict is Verdict.REGRESSED
    assert adjust([regressed] + [same] * 6)[0].verdict is Verdict.UNCHANGED


# -- minimum detectable effect -------------------------------------------------------------------------------------

# Distinct per-mille log ratios: no two pairs tie, and every Walsh average is a multiple of 0.0005.
LOG_RATIOS_PER_MILLE = st.lists(st.integers(-300, 300), min_size=1, max_size=10, unique=True)


@given(LOG_RATIOS_PER_MILLE, st.sampled_from([HIGHER, LOWER]), ALPHAS, st.sampled_from([0.0, 0.02, 0.1]))
def test_slowing_every_pair_by_the_mde_is_detected_and_a_bit_less_is_not(per_mille, direction, alpha, min_effect):
    reference = [50.0 + 7 * i for i in range(len(per_mille))]
    current = [r * math.exp(k / 1000) for r, k in zip(reference, per_mille)]
    policy = Policy(alpha=alpha, min_effect=min_effect)
    mde = compare_paired("m", reference, current, direction, policy).min_detectable_effect
    if mde is None:
        assert 2.0 ** -len(per_mille) >= alpha
        return
    assert mde >= min_effect
    # The MDE is of the pairs' spread, centred on no change: the same pairs moved to their Hodges-Lehmann centre.
    centre = hodges_lehmann([k / 1000 for k in per_mille])
    unchanged = [r * math.exp(k / 1000 - centre) for r, k in zip(reference, per_mille)]
    just_above = mde * 1.0001 + 1e-9  # the nudge makes a zero MDE a (tiny) slowdown too
    assert compare_paired("m", reference, slowed(unchanged, just_above, direction), direction, policy).p_worse < alpha
    if mde > min_effect:
        just_below = slowed(unchanged, mde * 0.9999, direction)
        assert compare_paired("m", reference, just_below, direction, policy).p_worse >= alpha


def test_the_mde_does_not_depend_on_the_change_measured():
    """A run that regressed or improved has the same MDE as one that did not: it is the spread's, not the shift's."""
    reference = [100.0, 104.0, 98.0, 101.0, 99.0, 103.0, 97.0, 102.0, 100.5, 99.5, 101.5]
    noise = [1.00, 1.02, 0.99, 1.01, 0.98, 1.015, 0.995, 1.005, 0.985, 1.025, 0.975]
    policy = Policy(alpha=0.05, min_effect=0.0)
    mdes = {
        shift: compare_paired("m", reference, [r * n * shift for r, n in zip(reference, noise)], LOWER,
                              policy).min_detectable_effect  # fmt: skip
        for shift in (0.8, 1.0, 1.3)
    }
    assert mdes[0.8] == pytest.approx(mdes[1.0]) == pytest.approx(mdes[1.3])
    assert mdes[1.0] > 0


@pytest.mark.parametrize("n", [1, 4, 7])
def test_no_slowdown_is_detectable_when_every_pair_worse_is_not_enough(n):
    differences = [0.01 * i for i in range(n)]
    assert paired_minimum_detectable_effect(differences, LOWER, alpha=2.0**-n, min_effect=0.1) is None
    assert paired_minimum_detectable_effect(differences, LOWER, alpha=2.0**-n * 1.01, min_effect=0.1) is not None


def test_the_session_size_enters_through_alpha():
    differences = [0.002 * i - 0.009 for i in range(10)]  # 10 pairs: 2^-10 < 0.05 / 40, not < 0.05 / 60
    one = paired_minimum_detectable_effect(differences, LOWER, alpha=0.05, min_effect=0.0)
    forty = paired_minimum_detectable_effect(differences, LOWER, alpha=0.05 / 40, min_effect=0.0)
    assert 0 < one < forty
    reference = [100.0] * 10
    current = [100.0 * math.exp(d) for d in differences]
    assert compare_paired("m", reference, current, LOWER, Policy(min_effect=0.0), num_comparisons=40)\
        .min_detectable_effect == pytest.approx(forty)
    assert compare_paired("m", reference, current, LOWER, num_comparisons=60).min_detectable_effect is None


@pytest.mark.parametrize("direction", [HIGHER, LOWER])
def test_a_slowdown_at_the_floor_is_also_one_the_verdict_flags(direction):
    # The MDE is a slowdown in the unit of min_effect (throughput times 1 - s), so the floor itself,
    # applied to pairs whose median ratio is exactly 1, passes the verdict's size gate too.
    ratios = [1.0, 1.001, 0.999, 1.002, 0.998, 1.0015, 0.9985, 1.0005, 0.9995]
    reference = [100.0 + i for i in range(9)]
    current = [r * q for r, q in zip(reference, ratios)]
    policy = Policy(min_effect=0.1)
    mde = compare_paired("m", reference, current, direction, policy).min_detectable_effect
    assert mde == 0.1
    flagged = compare_paired("m", reference, slowed(current, mde * 1.0001, direction), direction, policy)
    assert flagged.verdict is Verdict.REGRESSED


# -- can a session of pairs flag a lone regression ------------------------------------------------------------------


@given(st.integers(1, 20))
def test_the_smallest_p_is_the_p_of_every_pair_worse(num_pairs):
    every_pair_worse = [0.01 * (i + 1) for i in range(num_pairs)]
    assert smallest_paired_p_value(num_pairs) == wilcoxon_signed_rank_upper_p(every_pair_worse)


def test_the_smallest_p_needs_a_pair():
    with pytest.raises(ValueError):
        smallest_paired_p_value(0)


def test_seven_pairs_flag_a_lone_regression_in_at_most_six_comparisons():
    assert max_comparisons_for_lone_paired_regression(7, 0.05) == 6  # 0.05 * 128 = 6.4


@given(st.integers(1, 25), ALPHAS)
def test_benjamini_hochberg_flags_a_lone_paired_regression_up_to_the_limit_and_not_beyond(num_pairs, alpha):
    smallest_p = smallest_paired_p_value(num_pairs)
    m = max_comparisons_for_lone_paired_regression(num_pairs, alpha)
    if m > 0:
        assert benjamini_hochberg([smallest_p] + [1.0] * (m - 1))[0] < alpha
    assert not benjamini_hochberg([smallest_p] + [1.0] * m)[0] < alpha


@given(st.integers(1, 5000), ALPHAS)
def test_the_suggested_pairs_are_the_fewest_that_suffice(num_comparisons, alpha):
    pairs = pairs_for_lone_regression(num_comparisons, alpha)
    assert max_comparisons_for_lone_paired_regression(pairs, alpha) >= num_comparisons
    if pairs > 1:
        assert max_comparisons_for_lone_paired_regression(pairs - 1, alpha) < num_comparisons


@given(st.integers(2, 20))
def test_one_disagreeing_pair_doubles_the_smallest_p(num_pairs):
    worse_but_the_smallest = [-0.001] + [0.01 * (i + 1) for i in range(num_pairs - 1)]
    assert paired_p_value_with_disagreement(num_pairs, 1) == wilcoxon_signed_rank_upper_p(worse_but_the_smallest)
    assert paired_p_value_with_disagreement(num_pairs, 0) == 2.0**-num_pairs


@given(st.integers(1, 16), st.data())
def test_the_p_with_disagreement_is_the_wilcoxon_p_of_those_pairs_going_the_other_way(num_pairs, data):
    against = data.draw(st.sets(st.integers(1, num_pairs)), label="ranks against")
    log_ratios = [(-1 if rank in against else 1) * 0.01 * rank for rank in range(1, num_pairs + 1)]
    assert paired_p_value_with_disagreement(num_pairs, sum(against)) == pytest.approx(
        wilcoxon_signed_rank_upper_p(log_ratios), rel=1e-12
    )


@given(st.integers(1, 5000), ALPHAS)
def test_the_default_pairs_are_the_fewest_that_survive_half_the_pairs_rank_sum_against(num_comparisons, alpha):
    pairs = pairs_with_room_for_disagreement(num_comparisons, alpha)
    p = paired_p_value_with_disagreement(pairs, room_for_disagreement(pairs))
    assert benjamini_hochberg([p] + [1.0] * (num_comparisons - 1))[0] < alpha
    for fewer in range(2, pairs):
        p_fewer = paired_p_value_with_disagreement(fewer, room_for_disagreement(fewer))
        assert not benjamini_hochberg([p_fewer] + [1.0] * (num_comparisons - 1))[0] < alpha
    assert pairs > pairs_for_lone_regression(num_comparisons, alpha), "more than a unanimous regression needs"


def test_twelve_comparisons_take_twelve_pairs_and_seventy_two_take_fifteen():
    # 12 pairs, ranks summing to <= 6 against: 14 of 4096 sign patterns; 12 * 14/4096 = 0.041 (11 pairs: 0.059)
    assert pairs_with_room_for_disagreement(12, 0.05) == 12
    # 15 pairs, <= 7 against: 19 of 32768; 72 * 19/32768 = 0.042 (14 pairs: 0.083)
    assert pairs_with_room_for_disagreement(72, 0.05) == 15
    with pytest.raises(ValueError):
        paired_p_value_with_disagreement(0, 0)


def test_a_paired_plan_within_the_limit_needs_no_advice():
    plan = plan_paired_power(6, 7, 0.05)
    assert isinstance(plan, PowerPlan)
    assert plan.can_flag_lone_regression and plan.advice() is None
    assert plan.smallest_p == 1 / 128 and plan.max_comparisons == 6


def test_a_paired_plan_past_the_limit_suggests_enough_pairs():
    # 16 comparisons: 16 / 2^8 = 0.0625 is not below 0.05, 16 / 2^9 = 0.03125 is: 9 pairs, i.e. 9 repeats per side.
    plan = plan_paired_power(16, 7, 0.05)
    advice = plan.advice()
    assert advice is not None and "\n" not in advice
    for part in ("16 comparisons", "7 A/B pairs", "0.00781", "at most 6", "--perf-repeats 9"):
        assert part in advice
