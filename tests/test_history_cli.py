"""``perfsuite history show``: each series of the run history store, its runs and its change points."""

from __future__ import annotations

import sys

import pytest

from history_builders import TEST_ID, commit_of, session, sessions, step_values
from perfsuite.cli import main
from perfsuite.history.store import HistoryStore
from perfsuite.judge.results import write_results

OTHER_TEST = "tests/perf/test_latency.py::test_latency[inflight]"


@pytest.fixture
def history_store(tmp_path):
    """22 sessions of TEST_ID whose throughput drops 12% at the 21st, and 3 of another test."""
    path = tmp_path / "history.sqlite"
    with HistoryStore.open(path) as store:
        for run in sessions(step_values(20, 2, step=-0.12)):
            store.append(run)
        for index in range(3):
            store.append(session(30 + index, 50.0, test_id=OTHER_TEST))
    return path


def test_show_lists_each_series_with_its_runs_and_change_points(history_store, capsys):
    assert main(["history", "show", "--store", str(history_store), "-k", "throughput"]) == 0
    out = capsys.readouterr().out
    assert OTHER_TEST not in out
    lines = out.splitlines()
    assert lines[0] == f"{TEST_ID}  output_throughput (higher is better)"
    assert lines[1].startswith("fingerprint ") and ", ci static packed x3 (" in lines[1] and "22 runs;" in lines[1]
    assert lines[2].split() == ["commit", "date", "value"]
    assert lines[4].split()[:2] == [commit_of(0)[:7], "2026-01-01T00:00:00+00:00"]
    assert "change points: 1" in lines
    (change,) = [line for line in lines if line.startswith(f"  {commit_of(19)[:7]}..{commit_of(20)[:7]}")]
    assert "regression" in change and "(at the head)" in change and "p=" in change and "-1" in change


def test_show_lists_a_creep_as_a_trend_beside_the_steps(tmp_path, capsys):
    """Throughput 1% lower each run from the 9th on: a trend with its slope per run and the run it starts at."""
    path = tmp_path / "history.sqlite"
    flat = step_values(8, 0, step=0.0, noise=0.01, seed=2)
    creep = [value * (1 - 0.01 * (i + 1)) for i, value in enumerate(step_values(12, 0, step=0.0, noise=0.01, seed=3))]
    with HistoryStore.open(path) as store:
        for run in sessions(flat + creep):
            store.append(run)
    assert main(["history", "show", "--store", str(path), "--metric", "output_throughput"]) == 0
    (trend,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("trend: ")]
    assert "per run" in trend and "(regression) since " in trend and "over the newest 20 runs" in trend


def test_show_without_a_filter_lists_every_series_and_says_which_were_too_short(history_store, capsys):
    assert main(["history", "show", "--store", str(history_store), "--metric", "output_throughput"]) == 0
    out = capsys.readouterr().out
    assert f"{TEST_ID}  output_throughput" in out and f"{OTHER_TEST}  output_throughput" in out
    assert "change points: not searched (3 runs, fewer than the 6 a search needs)" in out
    assert "trend: not tested (3 runs, fewer than the 10 a trend test needs)" in out


def test_a_filter_that_matches_nothing_says_so(history_store, capsys):
    assert main(["history", "show", "--store", str(history_store), "-k", "nonesuch"]) == 2
    assert "no series of tests matching -k 'nonesuch' in the 25 sessions" in capsys.readouterr().err


def test_without_otava_show_names_the_pip_command(history_store, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "otava.analysis", None)
    assert main(["history", "show", "--store", str(history_store), "-k", "throughput"]) == 2
    assert 'pip install --no-deps "apache-otava==0.8.0"' in capsys.readouterr().err


# -- the store: what `pytest --perf` appends each session to, and what `history show` reads by default ------------


def test_show_reads_the_store_that_import_filled_from_a_results_folder(tmp_path, capsys):
    folder = tmp_path / "results"
    for index, run in enumerate(sessions(step_values(20, 2, step=-0.12))):
        write_results(folder / f"{index:02d}.json", run)
    store = tmp_path / "history.sqlite"
    assert main(["history", "import", str(folder), "--store", str(store)]) == 0
    assert "imported 22 session(s)" in capsys.readouterr().out
    assert main(["history", "show", "--store", str(store), "-k", "throughput"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "22 runs;" in lines[1] and "change points: 1" in lines
    assert any(line.startswith(f"  {commit_of(19)[:7]}..{commit_of(20)[:7]}") for line in lines)


def test_show_takes_no_folder_of_results_files_the_store_is_the_one_history(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["history", "show", "--results-dir", str(tmp_path)])
    assert "unrecognized arguments: --results-dir" in capsys.readouterr().err


@pytest.mark.parametrize(("setup", "message"), [("missing", "no history store there"), ("empty", "holds no session")])
def test_a_missing_or_empty_store_is_one_line_and_exit_2(tmp_path, capsys, setup, message):
    store = tmp_path / "history.sqlite"
    if setup == "empty":
        from perfsuite.history.store import HistoryStore

        HistoryStore.open(store).close()
    assert main(["history", "show", "--store", str(store)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perfsuite: error: ") and message in err and len(err.strip().splitlines()) == 1
    assert setup != "missing" or not store.exists(), "showing a history must not create a store"
