"""bench/ray_overhead.py's pure parts: the sessions it runs, their order, and the figures it prints (no session run)."""

from __future__ import annotations

import json

import pytest

from bench_modules import load_bench

ray_overhead = load_bench("ray_overhead")
Session = ray_overhead.Session


def test_both_sides_run_the_issues_smoke_session_and_only_b_adds_perf_ray_local():
    a, b = ray_overhead.measure_commands("tests and fixed")
    assert a[a.index("--pyargs") :] == [*ray_overhead.SMOKE_SESSION, "-k", "tests and fixed"]
    assert b == [*a, "--perf-ray", "local"]
    for words in (("--perf-model", "tiny-random"), ("--perf-profile", "smoke"), ("--perf-history", "none")):
        assert " ".join(words) in " ".join(a)


def test_the_sides_alternate_a_b_for_each_round_and_a_round_is_needed():
    assert ray_overhead.alternated(2) == ["A", "B", "A", "B"]
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        ray_overhead.alternated(0)


def test_the_ratio_is_of_the_medians_and_the_table_shows_each_session_and_each_median():
    sessions = [Session("A", 10.0, 0), Session("B", 12.0, 0), Session("A", 30.0, 0), Session("B", 13.0, 0),
                Session("A", 11.0, 0), Session("B", 99.0, 1)]  # fmt: skip
    assert ray_overhead.ratio_of_medians(sessions, "B", "A") == pytest.approx(13.0 / 11.0)
    shown = ray_overhead.table(sessions, {"A": "without Ray", "B": "--perf-ray local"})
    assert "median B (--perf-ray local): 13.0 s over 3 sessions" in shown
    assert shown.splitlines()[6].split()[-3:] == ["99.0", "1", "0"], "round 3's B, its exit code, no nodes"


def test_the_nodes_a_session_measured_on_are_counted_from_its_results(tmp_path):
    results = tmp_path / "results.json"
    assert ray_overhead.nodes_named(results) == 0
    results.write_text(json.dumps({"tests": [{"node": "a (1, node 1)"}, {"node": "b (2, node 2)"},
                                             {"node": "a (1, node 1)"}, {"test_id": "no node"}]}))  # fmt: skip
    assert ray_overhead.nodes_named(results) == 2


def test_bad_rounds_are_refused_naming_the_option(capsys):
    with pytest.raises(SystemExit):
        ray_overhead.parse_args(["--sweep-rounds", "0"])
    assert "--sweep-rounds must be at least 1" in capsys.readouterr().err
