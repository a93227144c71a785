"""The report's history section: each test's trend per series, its change points marked and listed."""

from __future__ import annotations

import dataclasses
import re
import sys

from history_builders import TEST_ID, commit_of, session, sessions, step_values
from perfsuite.judge.results import AgainstDescription
from perfsuite.report.render import render_report
from results_builders import ENVIRONMENT, changed


def history_section(html: str) -> str:
    return html.split('<section id="history">')[1].split("</section>")[0]


def test_a_change_point_is_a_dashed_line_on_the_trend_and_a_row_with_its_commit_range():
    *history, current = sessions(step_values(14, 3, step=-0.12))
    section = history_section(render_report(current, history))
    assert "17 runs on this machine" in section
    assert section.count("<svg") == 1 and 'id="change-point-0-0"' in section
    rows = re.findall(r'<tr class="change-(\w+)">(.*?)</tr>', section, re.S)
    assert len(rows) == 1 and rows[0][0] == "regression"
    cells = re.findall(r"<td[^>]*>(.*?)</td>", rows[0][1], re.S)
    name = TEST_ID.rpartition("::")[2]
    assert cells[:3] == [name, "output_throughput", f"<code>{commit_of(13)[:7]}..{commit_of(14)[:7]}</code>"]
    assert cells[4].startswith("-1") and cells[6] == "regression"
    assert "<a " not in section, "no repository URL is known: the range is text, not a link"


def test_a_creep_is_drawn_as_a_trend_line_with_its_band_and_listed_with_its_slope():
    """1% slower each session from the 9th, 3% noise, 14 sessions: no split yet, a trend (as in test_history_head)."""
    noise = step_values(14, 0, step=0.0, noise=0.03, seed=1)
    *history, current = sessions([value * (1 - 0.01 * max(0, i - 7)) for i, value in enumerate(noise)])
    section = history_section(render_report(current, history))
    assert 'id="trend-line-0"' in section and 'id="trend-band-0"' in section
    rows = re.findall(r'<tr class="change-(\w+)">(.*?)</tr>', section, re.S)
    (trend,) = [(kind, row) for kind, row in rows if "trend " in row]
    assert trend[0] == "regression"
    cells = re.findall(r"<td[^>]*>(.*?)</td>", trend[1], re.S)
    assert cells[4].startswith("trend -0.") and "per run (95% CI " in cells[4]
    assert cells[2] == f"<code>{commit_of(0)[:7]}..{commit_of(13)[:7]}</code>", "from where the slope starts"


def test_a_step_is_drawn_without_a_trend_band():
    *history, current = sessions(step_values(14, 3, step=-0.12))
    assert "trend-band-" not in history_section(render_report(current, history))


def test_a_steady_history_is_drawn_without_change_points():
    *history, current = sessions(step_values(10, 1, step=0.0))
    section = history_section(render_report(current, history))
    assert "11 runs on this machine" in section and "No change points in these series." in section
    assert "change-point-" not in section and 'id="change-points"' not in section


def test_only_runs_of_this_tests_fingerprint_and_configuration_make_its_trend():
    elsewhere = dataclasses.replace(ENVIRONMENT, cpu_model="Another CPU")
    *history, current = sessions(step_values(6, 1, step=0.0))
    other = [session(20 + i, 30.0, environment=elsewhere) for i in range(5)]
    section = history_section(render_report(current, [*history, *other]))
    assert "7 runs on this machine" in section


def test_an_ab_session_draws_the_stored_series_without_claiming_a_point_of_them():
    *history, current = sessions(step_values(8, 1, step=0.0))
    paired = changed(current.tests[0], pair_order=("AB", "BA", "AB"))
    against = AgainstDescription(ref="origin/main", commit=None, current_commit=None, order="ABBA")
    section = history_section(render_report(dataclasses.replace(current, tests=(paired,), against=against), history))
    assert "8 runs on this machine" in section and "This A/B session is not a point of them" in section


def test_without_otava_the_trend_is_drawn_and_a_note_says_how_to_mark_change_points(monkeypatch):
    monkeypatch.setitem(sys.modules, "otava.analysis", None)
    *history, current = sessions(step_values(14, 3, step=-0.12))
    section = history_section(render_report(current, history))
    assert section.count("<svg") == 1 and "change-point-" not in section
    note = section.split('id="change-points-note">')[1].split("</p>")[0]
    assert "Change points not marked" in note and "pip install --no-deps" in note
