"""A session's change-point verdict: its runs against the history before them."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from history_builders import TEST_ID, session, sessions, step_values
from perfsuite.history.head import HEAD_WARNING_PREFIX, TREND_WARNING_PREFIX, check_head
from perfsuite.judge.results import AgainstDescription


def test_a_session_that_steps_down_from_its_history_is_a_head_regression():
    values = step_values(20, 2, step=-0.12)
    *history, current = sessions(values)
    check = check_head(history, current)
    (change,) = check.changes
    assert change.key.test_id == TEST_ID and change.key.metric == "output_throughput"
    assert change.num_runs == 22 and change.change_point.index == 20
    assert check.regressions == (change,)
    (warning,) = check.warnings
    assert warning.startswith(HEAD_WARNING_PREFIX + TEST_ID + " output_throughput (fingerprint ")
    assert change.change_point.commit_range in warning and "(regression)" in warning
    assert check.summary() == "change points: 1 at the head of 1 series searched (21 earlier sessions in the history)"


def test_a_steady_session_has_none_and_says_what_was_searched():
    *history, current = sessions(step_values(20, 1, step=0.0))
    check = check_head(history, current)
    assert check.changes == () and check.warnings == ()
    summary = "change points: none at the head of 1 series searched (20 earlier sessions in the history)"
    assert check.summary() == summary


def test_a_creep_no_split_shows_yet_is_a_trend_at_the_head_among_the_warnings():
    """1% slower each session from the 9th, 3% noise, 14 sessions: no split yet, the trend test has it."""
    noise = step_values(14, 0, step=0.0, noise=0.03, seed=1)
    *history, current = sessions([value * (1 - 0.01 * max(0, i - 7)) for i, value in enumerate(noise)])
    check = check_head(history, current)
    (trend,) = check.trends
    assert check.changes == () and trend.is_new and trend.trend.is_regression
    assert check.warnings == (TREND_WARNING_PREFIX + trend.describe(),)
    assert "per run" in check.warnings[0] and "since " in check.warnings[0]
    assert check.summary().endswith("; trends: 1 at the head (1 new)")


def test_a_short_history_is_counted_as_too_short():
    *history, current = sessions([100.0, 80.0])
    check = check_head(history, current)
    assert (check.num_series, check.num_too_short, check.changes) == (1, 1, ())
    assert "0 series searched; 1 with too few runs to search" in check.summary()


def test_a_stored_copy_of_the_session_itself_is_not_counted_twice():
    *history, current = sessions(step_values(20, 2, step=-0.12))
    assert check_head(history, current).changes
    check = check_head([*history, current], current)
    assert check.num_earlier_sessions == 21 and check.changes[0].num_runs == 22


def test_an_ab_session_is_not_checked():
    *history, current = sessions(step_values(20, 1, step=-0.12))
    against = AgainstDescription(ref="origin/main", commit=None, current_commit=None, order="ABBA")
    check = check_head(history, dataclasses.replace(current, against=against))
    assert check.changes == () and check.warnings == ()
    assert check.summary().startswith("change points: not checked: an A/B session")


def test_without_otava_the_check_says_so_among_the_warnings(monkeypatch):
    monkeypatch.setitem(sys.modules, "otava.analysis", None)
    *history, current = sessions(step_values(20, 1, step=-0.12))
    check = check_head(history, current)
    assert check.changes == ()
    (warning,) = check.warnings
    assert warning.startswith("change points not checked: change points need Apache Otava")
    assert 'pip install --no-deps "apache-otava==0.8.0"' in warning


@pytest.mark.parametrize("noisy", [True, False])
def test_only_series_with_a_point_of_this_session_are_checked(noisy):
    """A noisy session test is no point of its series: the history's step is not this session's verdict."""
    *history, current = sessions(step_values(20, 2, step=-0.12))
    if noisy:
        current = session(21, 88.0, noisy="another process held the CPU")
    check = check_head(history, current)
    assert bool(check.changes) is not noisy
    assert check.num_series == (0 if noisy else 1)


def test_one_slow_session_is_an_outlier_not_a_change_point():
    """The same 12% drop as above, in the newest session only: it needs a second run after it to be a step."""
    values = step_values(20, 2, step=-0.12)
    *history, current = sessions(values[:21])
    assert check_head(history, current).changes == ()
    *history, current = sessions(values)
    assert check_head(history, current).changes, "one run later it is a step"


def test_a_step_is_a_new_verdict_once_and_then_still_shown_with_the_session_that_reported_it():
    values = step_values(20, 4, step=-0.12)
    runs = sessions(values)
    *history, found = runs[:22]
    first = check_head(history, found)
    (change,) = first.changes
    assert change.is_new and first.new_regressions == (change,)
    assert "still at the head" not in change.describe()
    *history, later = runs[:23]
    again = check_head(history, later)
    (same,) = again.changes
    assert same.change_point.index == change.change_point.index == 20
    assert not same.is_new and same.first_reported.commit == found.commit
    assert again.regressions == (same,) and again.new_regressions == ()
    reported = f"; still at the head, first reported at session {found.commit[:7]} ({found.created_at})"
    assert same.describe().endswith(reported)
    assert again.summary().startswith("change points: 1 at the head (0 new, 1 reported by an earlier session) of 1 ")
    assert any(w.endswith(same.describe()) for w in again.warnings), "still listed among the warnings"
