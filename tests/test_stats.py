"""The regression verdict: significant (Benjamini-Hochberg-adjusted MWU) and large enough."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfsuite.judge.stats import (
    Comparison,
    Direction,
    Policy,
    Verdict,
    adjust,
    adjust_interim,
    benjamini_hochberg,
    compare,
    compare_counters,
    holm,
)

HIGHER, LOWER = Direction.HIGHER_IS_BETTER, Direction.LOWER_IS_BETTER
BASE = [100.0, 102.0, 98.0, 101.0, 99.0, 100.5, 99.5, 101.5]


def test_a_large_significant_slowdown_regresses_and_says_so():
    slower = [v * 0.5 for v in BASE]
    result = compare("output_throughput", BASE, slower, HIGHER)
    assert result.verdict is Verdict.REGRESSED
    assert result.change == pytest.approx(-0.5, abs=0.01)
    assert result.ci_high < 1.0
    text = result.describe()
    for fragment in ("output_throughput", "baseline median 100", "current median 50", "-50.0%", "adjusted p="):
        assert fragment in text


def test_latency_regresses_upwards():
    assert compare("ttft", BASE, [v * 1.5 for v in BASE], LOWER).verdict is Verdict.REGRESSED
    assert compare("ttft", BASE, [v * 0.5 for v in BASE], LOWER).verdict is Verdict.IMPROVED


def test_significant_but_small_changes_are_unchanged():
    result = compare("tok/s", BASE, [v * 0.97 for v in BASE], HIGHER, Policy(min_effect=0.10))
    assert result.p_worse < 0.05
    assert result.verdict is Verdict.UNCHANGED


def test_too_few_samples_is_inconclusive():
    assert compare("tok/s", [100.0, 101.0], [10.0, 11.0], HIGHER).verdict is Verdict.INCONCLUSIVE


def test_holm_adjusts_known_values():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([]) == []


def test_benjamini_hochberg_matches_known_values():
    # R: p.adjust(c(0.01, 0.04, 0.03, 0.005), method = "BH")
    assert benjamini_hochberg([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert benjamini_hochberg([0.5, 0.9]) == pytest.approx([0.9, 0.9])
    assert benjamini_hochberg([]) == []


def test_many_regressed_comparisons_support_each_other_where_holm_would_not():
    p_values = [0.004] * 10 + [0.6] * 10
    assert max(benjamini_hochberg(p_values)[:10]) < 0.05
    assert min(holm(p_values)[:10]) > 0.05


def test_adjusting_many_comparisons_can_clear_a_marginal_regression():
    marginal = compare("tok/s", BASE[:4], [v * 0.8 for v in BASE[:4]], HIGHER)  # p = 1/70 before adjustment
    assert marginal.verdict is Verdict.REGRESSED
    others = [compare(f"m{i}", BASE, BASE, HIGHER) for i in range(5)]
    [adjusted, *_] = adjust([marginal, *others])
    assert adjusted.p_adjusted == pytest.approx(6 * marginal.p_worse)
    assert adjusted.verdict is Verdict.UNCHANGED


@given(
    samples=st.lists(st.floats(0.001, 1e6, allow_nan=False), min_size=1, max_size=12),
    direction=st.sampled_from(list(Direction)),
)
def test_identical_samples_never_regress(samples, direction):
    result = compare("m", samples, list(samples), direction)
    assert result.verdict is not Verdict.REGRESSED
    assert adjust([result])[0].verdict is not Verdict.REGRESSED
    assert result.change == 0


@given(st.lists(st.floats(0, 1), min_size=1, max_size=20))
def test_corrections_never_lower_a_p_value(p_values):
    for correction in (holm, benjamini_hochberg):
        adjusted = correction(p_values)
        assert all(raw <= adj <= 1.0 for raw, adj in zip(p_values, adjusted)), correction.__name__


def _comparison(p_worse: float) -> Comparison:
    return Comparison("m", HIGHER, 7, 7, 100.0, 50.0, -0.5, 0.4, 0.6, p_worse, 1.0, p_worse, Verdict.INCONCLUSIVE)


@given(
    p_values=st.lists(st.floats(1e-6, 1), min_size=1, max_size=30),
    data=st.data(),
)
def test_a_test_judged_mid_session_never_regresses_when_the_whole_session_would_not(p_values, data):
    """The interim bound counts unmeasured comparisons as p = 1: it can only be more cautious."""
    planned = data.draw(st.integers(len(p_values), len(p_values) + 10), label="planned")
    split = data.draw(st.integers(0, len(p_values) - 1), label="split")
    comparisons = [_comparison(p) for p in p_values]
    earlier, current = comparisons[:split], comparisons[split:]
    interim = adjust_interim(current, earlier, planned)
    final = adjust(comparisons + [_comparison(1.0)] * (planned - len(p_values)))[split : len(p_values)]
    for during, after in zip(interim, final):
        assert during.p_adjusted >= after.p_adjusted - 1e-12
        assert during.verdict is not Verdict.REGRESSED or after.verdict is Verdict.REGRESSED


def test_the_interim_bound_needs_room_for_every_comparison():
    with pytest.raises(ValueError, match="num_comparisons 1 is below the 2"):
        adjust_interim([_comparison(0.01)], [_comparison(0.01)], 1)


def test_counters_report_every_change():
    changes = compare_counters({"forward_passes": 10, "padding": 4}, {"forward_passes": 10, "padding": 6})
    assert [(c.name, c.baseline, c.current) for c in changes] == [("padding", 4, 6)]


def test_bad_policy_is_rejected():
    with pytest.raises(ValueError, match="alpha"):
        Policy(alpha=1.5)
    assert isinstance(compare("m", [1.0], [1.0], HIGHER), Comparison)
