"""The mismatch report lets a reader tell a real bug from a near-tie."""

from __future__ import annotations

import pytest

from perfsuite.testing.greedy import assert_outputs_equal, find_divergences


def test_report_names_request_position_tokens_and_margin():
    expected = {"a": (1, 2, 3, 4), "b": (5, 6)}
    actual = {"a": (1, 2, 9, 4), "b": (5, 6)}
    margins = {"a": (3.0, 2.0, 0.75, 1.0), "b": (1.0, 1.0)}
    with pytest.raises(AssertionError) as error:
        assert_outputs_equal("inflight", expected, actual, margins)
    message = str(error.value)
    for fragment in ("inflight", "'a'", "position 2", "reference token 3", "engine token 9", "margin there: 0.75"):
        assert fragment in message
    assert "'b'" not in message


def test_near_tie_is_tolerated_only_below_the_tolerance():
    expected, actual = {"a": (1, 2, 3)}, {"a": (1, 7, 7)}
    margins = {"a": (5.0, 1e-4, 2.0)}
    near_ties = assert_outputs_equal("x", expected, actual, margins, near_tie_tolerance=1e-3)
    assert [d.position for d in near_ties] == [1]
    with pytest.raises(AssertionError, match="margin there: 0.0001"):
        assert_outputs_equal("x", expected, actual, margins, near_tie_tolerance=1e-5)


def test_length_difference_is_a_divergence_not_a_near_tie():
    [divergence] = find_divergences("x", {"a": (1, 2)}, {"a": (1, 2, 3)}, {"a": (0.0, 0.0)})
    assert (divergence.position, divergence.expected_token, divergence.actual_token) == (2, None, 3)
    assert not divergence.is_near_tie(1.0)


def test_a_lost_request_is_reported():
    with pytest.raises(AssertionError, match="lost"):
        find_divergences("x", {"a": (1,), "b": (2,)}, {"a": (1,)}, {})
