"""``perfsuite init``: the starter files, filled in and usable; never over a file that exists."""

from __future__ import annotations

import ast
import textwrap

import pytest
import yaml

from perfsuite.cli import main

pytest_plugins = ["pytester"]

WRITTEN = ("conftest.py", "tests/test_perf.py", "tests/test_equivalence.py", ".github/workflows/perf.yml")


def test_init_writes_the_four_files_filled_in_for_the_engine(tmp_path, capsys):
    assert main(["init", str(tmp_path), "--engine", "fast-engine"]) == 0
    out = capsys.readouterr().out
    for name in WRITTEN:
        assert f"wrote {tmp_path / name}" in out
        assert "$" not in (tmp_path / name).read_text().replace("${{", "").replace("${PERFSUITE", "")
    for name in WRITTEN[:3]:
        ast.parse((tmp_path / name).read_text())  # Python that parses
    assert 'equivalence_test("fast-engine")' in (tmp_path / "tests/test_equivalence.py").read_text()
    assert "def test_fast_engine_throughput(" in (tmp_path / "tests/test_perf.py").read_text()
    workflow = yaml.safe_load((tmp_path / ".github/workflows/perf.yml").read_text())
    steps = workflow["jobs"]["perf"]["steps"]
    run = " ".join(step.get("run", "") for step in steps)
    assert "--perf-against=origin/${{ github.base_ref }}" in run and "--perf-engines fast-engine" in run
    assert steps[0]["with"]["fetch-depth"] == 0
    assert [step for step in steps if step.get("uses", "").startswith("actions/upload-artifact")][0]["with"]["path"] == (
        "reports/"
    )


def test_init_refuses_to_overwrite_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_perf.py").write_text("# mine\n")
    assert main(["init", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"refusing to overwrite {tmp_path / 'tests' / 'test_perf.py'}" in err and "nothing was written" in err
    assert (tmp_path / "tests" / "test_perf.py").read_text() == "# mine\n"
    assert not (tmp_path / "conftest.py").exists() and not (tmp_path / ".github").exists()


@pytest.mark.parametrize("engine", ["", "my engine", "../x", "1st"])
def test_a_bad_engine_name_is_refused_naming_it(tmp_path, capsys, engine):
    assert main(["init", str(tmp_path), "--engine", engine]) == 2
    assert f"engine name {engine!r}" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_init_into_a_file_is_refused(tmp_path, capsys):
    target = tmp_path / "a-file"
    target.write_text("x")
    assert main(["init", str(target)]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_the_written_project_collects_both_tests_once_its_engine_is_registered(pytester):
    """What a user gets: register the engine as the conftest says, and both test files import and collect.

    Both run end to end in tests/test_outside_project.py (the perf fixtures and the kit's one-liner on a wheel)."""
    assert main(["init", str(pytester.path), "--engine", "my-engine"]) == 0
    conftest = pytester.path / "conftest.py"
    conftest.write_text(conftest.read_text() + textwrap.dedent("""
        from perfsuite.adapters import register_engine
        from perfsuite.adapters.builtin import build_inflight
        register_engine("my-engine", build_inflight)
    """))
    collected = pytester.runpytest_subprocess("--co", "-q", "--perf", "--perf-engines", "my-engine")
    collected.stdout.fnmatch_lines([
        "tests/test_equivalence.py::test_my_engine_matches_unbatched_greedy",
        "tests/test_perf.py::test_my_engine_throughput",
    ])
    assert collected.ret == 0
