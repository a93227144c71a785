"""The head change points in the terminal summary, and whether they fail the session (off by default)."""

from __future__ import annotations

import dataclasses

import pytest

from history_builders import sessions, step_values
from perfsuite.history.head import HEAD_WARNING_PREFIX, check_head
from perfsuite.plugin.options import _ini_switch
from perfsuite.plugin.terminal import WrittenFiles, write_summary
from report_fixtures import fake_session


def summary_of(tmp_path, values: list[float], fail_on_change_point: bool) -> tuple[list[tuple[str, dict]], object]:
    perf_session = fake_session(tmp_path)
    perf_session.options = dataclasses.replace(perf_session.options, fail_on_change_point=fail_on_change_point)
    *history, current = sessions(values)
    perf_session.results = list(current.tests)
    perf_session.head_check = check_head(history, current)
    lines = []
    write_summary(lambda line, **markup: lines.append((line, markup)), perf_session, WrittenFiles(None, None), None)
    return lines, perf_session


@pytest.mark.parametrize("fail_on_change_point", [False, True])
def test_a_head_regression_is_shown_and_fails_only_under_the_option(tmp_path, fail_on_change_point):
    lines, perf_session = summary_of(tmp_path, step_values(20, 2, step=-0.12), fail_on_change_point)
    [(line, markup)] = [(text, markup) for text, markup in lines if text.startswith(HEAD_WARNING_PREFIX)]
    if fail_on_change_point:
        assert line.endswith("(fails the session: --perf-fail-on-change-point)") and markup.get("red")
        assert perf_session.failing_change_points == (perf_session.head_check.changes[0].describe(),)
    else:
        assert line.endswith("(fails nothing: --perf-fail-on-change-point is off)") and markup.get("yellow")
        assert perf_session.failing_change_points == ()
    assert any(text.startswith("change points: 1 at the head of 1 series searched") for text, _ in lines)


def test_an_improvement_at_the_head_fails_nothing_even_under_the_option(tmp_path):
    lines, perf_session = summary_of(tmp_path, step_values(20, 3, step=0.12), fail_on_change_point=True)
    (line,) = [text for text, _ in lines if text.startswith(HEAD_WARNING_PREFIX)]
    assert "(improvement)" in line and "fails" not in line
    assert perf_session.failing_change_points == ()


def test_the_summary_line_is_there_when_nothing_was_found(tmp_path):
    lines, _ = summary_of(tmp_path, step_values(20, 1, step=0.0), fail_on_change_point=False)
    assert ("change points: none at the head of 1 series searched (20 earlier sessions in the history)", {}) in lines


class IniConfig:
    def __init__(self, given: bool, ini):
        self.given, self.ini = given, ini

    def getoption(self, name):
        return self.given

    def getini(self, name):
        if isinstance(self.ini, Exception):
            raise self.ini
        return self.ini


@pytest.mark.parametrize(("given", "ini", "expected"), [(False, False, False), (False, True, True), (True, False, True)])
def test_the_switch_is_on_from_the_command_line_or_its_ini_key(given, ini, expected):
    assert _ini_switch(IniConfig(given, ini), "perf_fail_on_change_point") is expected


def test_an_ini_value_that_is_not_a_boolean_is_a_usage_error_naming_the_key():
    config = IniConfig(False, ValueError("invalid truth value 'maybe'"))
    with pytest.raises(pytest.UsageError, match="perf_fail_on_change_point: invalid truth value 'maybe'; write true"):
        _ini_switch(config, "perf_fail_on_change_point")
