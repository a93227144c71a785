"""--perf-history: a --perf session appends its results to the run history; `perfsuite history import` fills it.

One real session (pytester, on a fake backend whose steps sleep, as tests/test_plugin.py's do) shows
the wiring; the rest drive the hook and the summary on a hand-built session, which costs nothing.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from perfsuite.cli import main
from perfsuite.history.store import HistoryStore
from perfsuite.judge.results import read_results, write_results
from perfsuite.plugin.hooks import _append_to_history
from perfsuite.plugin.options import _history_store, option_default
from perfsuite.plugin.session import PerfSession
from perfsuite.plugin.stash import HISTORY_ERROR_KEY, HISTORY_KEY
from perfsuite.plugin.terminal import WrittenFiles, write_summary
from fake_backend import FAKE_BACKEND_CONFTEST
from report_fixtures import fake_session
from results_builders import make_result, make_results

pytest_plugins = ["pytester"]

CONFTEST = FAKE_BACKEND_CONFTEST

PERF_TEST = """
import pytest

@pytest.mark.perf
def test_speed(perf, perf_inflight_engine, perf_workload):
    perf.measure(perf_inflight_engine, perf_workload)
"""

# Another job on this machine must not hold up the repeats: the plumbing is tested, not the machine.
ARGS = ["--perf", "--perf-profile", "smoke", "--perf-repeats", "2", "-p", "no:randomly", "--perf-busy-threshold", "0.99"]


@pytest.fixture
def project(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_speed=PERF_TEST)
    return pytester


def test_a_perf_session_appends_what_it_wrote_to_results_json_to_the_default_store(project):
    result = project.runpytest_subprocess(*ARGS)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*history: session 1 in reports/history.sqlite"])
    with HistoryStore.open(project.path / "reports" / "history.sqlite") as store:
        assert store.sessions() == [read_results(project.path / "reports" / "results.json")]


def test_a_session_under_history_none_writes_no_history_anywhere(project):
    result = project.runpytest_subprocess(*ARGS, "--perf-history", "none")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["change points: not checked: no run history is kept (--perf-history none)"])
    assert sorted(path.name for path in (project.path / "reports").iterdir()) == ["report.html", "results.json", "summary.md"]
    assert "history:" not in result.stdout.str()


def finished_session(root: Path, history_store: Path) -> PerfSession:
    """A session with one recorded test, finished: results.json written, nothing appended yet."""
    session = fake_session(root)
    session.options = dataclasses.replace(session.options, history_store=history_store)
    session.results = [make_result("tests/perf/t.py::test_a")]
    assert session.finish() == root / "reports" / "results.json"
    return session


def test_a_store_that_cannot_be_written_fails_the_session_in_one_line_and_results_json_is_kept(tmp_path):
    (tmp_path / "blocker").write_text("a file where the history's directory should be")
    perf_session = finished_session(tmp_path, tmp_path / "blocker" / "history.sqlite")
    pytest_session = SimpleNamespace(config=SimpleNamespace(stash=pytest.Stash()), exitstatus=pytest.ExitCode.OK)
    _append_to_history(pytest_session, perf_session)
    assert pytest_session.exitstatus == pytest.ExitCode.TESTS_FAILED
    lines = []
    written = WrittenFiles(perf_session.results_path, None, pytest_session.config.stash.get(HISTORY_KEY, None))
    error = pytest_session.config.stash[HISTORY_ERROR_KEY]
    write_summary(lambda text, **markup: lines.append(text), perf_session, written, None, error)
    assert (
        f"perfsuite error: cannot write {tmp_path / 'blocker' / 'history.sqlite'}: {tmp_path / 'blocker'} is not a "
        "directory; choose another location (a writable file path, or a database URL) (this session is not in the "
        "history; --perf-history none keeps no history)"
    ) in lines
    assert not any(line.startswith("history:") for line in lines)
    assert read_results(perf_session.results_path) == perf_session.finished, "results.json is kept whole"


def test_a_store_that_cannot_be_read_says_so_on_the_change_point_line_not_none(tmp_path):
    store = tmp_path / "history.sqlite"
    store.write_text("not a database")
    perf_session = finished_session(tmp_path, store)
    summary = perf_session.head_check.summary()
    assert summary.startswith(f"change points: not checked: the run history could not be read: {store} is not a "
                              "SQLite database, so not a perfsuite history store; move it away")  # fmt: skip
    assert "none at the head" not in summary and "earlier sessions" not in summary
    assert f"change points not checked: the run history could not be read: {store}" in perf_session.finished.warnings[-1]


def test_a_session_that_keeps_no_history_opens_no_store(tmp_path):
    perf_session = finished_session(tmp_path, None)
    pytest_session = SimpleNamespace(config=SimpleNamespace(stash=pytest.Stash()), exitstatus=pytest.ExitCode.OK)
    _append_to_history(pytest_session, perf_session)
    assert pytest_session.exitstatus == pytest.ExitCode.OK and HISTORY_KEY not in pytest_session.config.stash
    assert sorted(path.name for path in (tmp_path / "reports").iterdir()) == ["results.json"]


def test_the_history_option_is_a_path_under_the_rootdir_a_url_or_none(tmp_path):
    assert option_default("perf_history") == "reports/history.sqlite"
    assert _history_store("reports/history.sqlite", tmp_path) == tmp_path / "reports" / "history.sqlite"
    assert _history_store("/elsewhere/h.sqlite", tmp_path) == Path("/elsewhere/h.sqlite")
    url = "postgresql+psycopg://ci@db.example/perf"
    assert _history_store(url, tmp_path) == url
    assert _history_store("none", tmp_path) is None and _history_store("None", tmp_path) is None


# -- perfsuite history import ----------------------------------------------------------------------------------------


def test_history_import_fills_the_store_and_names_the_file_it_could_not_read(tmp_path, capsys):
    history = tmp_path / "reports" / "history"
    history.mkdir(parents=True)
    first = make_results(make_result("t.py::a"), created_at="2026-03-01T10:00:00+00:00")
    second = make_results(make_result("t.py::a"), created_at="2026-03-02T10:00:00+00:00")
    write_results(history / "one.json", first)
    write_results(history / "two.json", second)
    (history / "broken.json").write_text("{")
    store = tmp_path / "h.sqlite"
    assert main(["history", "import", str(history), "--store", str(store)]) == 2
    out, err = capsys.readouterr()
    assert f"imported 2 session(s) into {store} (0 already there)" in out
    assert f"perfsuite: error: {history / 'broken.json'} is not a readable JSON file" in err
    (history / "broken.json").unlink()
    assert main(["history", "import", str(history / "one.json"), str(history / "two.json"), "--store", str(store)]) == 0
    assert f"imported 0 session(s) into {store} (2 already there)" in capsys.readouterr().out
    with HistoryStore.open(store) as opened:
        assert opened.sessions() == [first, second]


def test_history_import_into_a_store_that_cannot_be_opened_is_one_line_and_exit_2(tmp_path, capsys):
    results = tmp_path / "results.json"
    write_results(results, make_results(make_result("t.py::a")))
    garbage = tmp_path / "notes.txt"
    garbage.write_text("not a database")
    assert main(["history", "import", str(results), "--store", str(garbage)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"perfsuite: error: {garbage} is not a SQLite database") and err.count("\n") == 1
    assert json.loads(results.read_text())["commit"] == "abc123"


def test_history_import_into_an_in_memory_database_is_refused_not_reported_as_imported(tmp_path, capsys):
    results = tmp_path / "results.json"
    write_results(results, make_results(make_result("t.py::a")))
    assert main(["history", "import", str(results), "--store", "sqlite://"]) == 2
    out, err = capsys.readouterr()
    assert "imported" not in out
    assert err == ("perfsuite: error: sqlite:// is an in-memory SQLite database, gone when perfsuite exits, so it "
                   "would keep no history; give a file path (reports/history.sqlite) or a URL naming a file "
                   "(sqlite:///reports/history.sqlite)\n")  # fmt: skip
