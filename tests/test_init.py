"""``perfsuite init``: the starter files, filled in and usable; never over a file that exists."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml
from scratch_python import copy_perfsuite_source, scratch_env, scratch_venv

from perfsuite.cli import main

pytest_plugins = ["pytester"]

WRITTEN = ("conftest.py", "tests/test_perf.py", "tests/test_equivalence.py", ".github/workflows/perf.yml")
SOURCE = "git+https://github.com/you/perfsuite@0123abc"


def init(directory, *options: str) -> int:
    return main(["init", str(directory), "--perfsuite-source", SOURCE, *options])


def test_init_writes_the_four_files_filled_in_for_the_engine(tmp_path, capsys):
    assert init(tmp_path, "--engine", "fast-engine") == 0
    out = capsys.readouterr().out
    for name in WRITTEN:
        assert f"wrote {tmp_path / name}" in out
        assert "$" not in (tmp_path / name).read_text().replace("${{", "").replace("${PERFSUITE_SOURCE:?", "")
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
    [comment] = [step for step in steps if "gh pr comment" in step.get("run", "")]
    assert comment["run"].endswith("--body-file reports/summary.md") and comment["if"].startswith("always() && ")
    assert comment["env"]["GH_TOKEN"] == "${{ github.token }}" and workflow["permissions"]["pull-requests"] == "write"


def test_init_refuses_to_overwrite_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_perf.py").write_text("# mine\n")
    assert init(tmp_path) == 2
    err = capsys.readouterr().err
    assert f"refusing to overwrite {tmp_path / 'tests' / 'test_perf.py'}" in err and "nothing was written" in err
    assert (tmp_path / "tests" / "test_perf.py").read_text() == "# mine\n"
    assert not (tmp_path / "conftest.py").exists() and not (tmp_path / ".github").exists()


@pytest.mark.parametrize("engine", ["", "my engine", "../x", "1st"])
def test_a_bad_engine_name_is_refused_naming_it(tmp_path, capsys, engine):
    assert init(tmp_path, "--engine", engine) == 2
    assert f"engine name {engine!r}" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_init_into_a_file_is_refused(tmp_path, capsys):
    target = tmp_path / "a-file"
    target.write_text("x")
    assert init(target) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_the_written_project_collects_both_tests_once_its_engine_is_registered(pytester):
    """What a user gets: register the engine as the conftest says, and both test files import and collect.

    Both run end to end in tests/test_outside_project.py (the perf fixtures and the kit's one-liner on a wheel)."""
    assert init(pytester.path, "--engine", "my-engine") == 0
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


def test_init_without_an_install_source_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["init", str(tmp_path)])
    assert exited.value.code == 2 and "--perfsuite-source" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("source", ["perfsuite", "perfsuite==0.1.0", "-e ../perfsuite"])
def test_an_install_source_an_index_would_resolve_is_refused_naming_it(tmp_path, capsys, source):
    assert main(["init", str(tmp_path), "--perfsuite-source", source]) == 2
    assert f"--perfsuite-source {source!r}" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("source", ["/opt/wheels/perfsuite-0.1.0-py3-none-any.whl", "../perf suite", SOURCE])
def test_the_install_source_reaches_the_workflow_as_given(tmp_path, source):
    assert main(["init", str(tmp_path), "--perfsuite-source", source]) == 0
    assert yaml.safe_load((tmp_path / ".github/workflows/perf.yml").read_text())["env"]["PERFSUITE_SOURCE"] == source


# What GitHub fills in for a pull request from branch pr into main; any other expression is a KeyError here.
PULL_REQUEST_CONTEXT = {"github.base_ref": "main", "github.head_ref": "pr"}
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
# The user's part: an engine registered by entry point, and perf options in the ini file (tiny-random in the
# smoke profile, 2 pairs a side: too few for a verdict, so the session skips its test rather than judge noise).
SCRATCH_PROJECT = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "scratch-engine"
        version = "0"

        [project.entry-points."perfsuite.engines"]
        my-engine = "scratch_engine:build_engine"

        [tool.setuptools]
        py-modules = ["scratch_engine"]

        [tool.pytest.ini_options]
        perf_model = "tiny-random"
        perf_profile = "smoke"
        perf_device = "cpu"
        perf_repeats = "2"
        perf_against_workers = "1"
    """,
    "scratch_engine.py": "from perfsuite.adapters.builtin import build_inflight as build_engine\n",
}


def with_context(text: str) -> str:
    return EXPRESSION.sub(lambda match: PULL_REQUEST_CONTEXT[match.group(1)], text)


def git(project: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=project,
                   check=True, capture_output=True)  # fmt: skip


def pull_request_checkout(project: Path, origin: Path) -> None:
    """The project committed on main, pushed to a bare origin, and a branch pr that changes the engine."""
    for name, text in SCRATCH_PROJECT.items():
        (project / name).write_text(textwrap.dedent(text).lstrip())
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "base")
    git(origin.parent, "init", "-q", "--bare", origin.name)
    git(project, "remote", "add", "origin", str(origin))
    git(project, "push", "-q", "origin", "main")  # origin/main: what --perf-against=origin/<base> needs
    git(project, "checkout", "-q", "-b", "pr")
    (project / "scratch_engine.py").write_text(SCRATCH_PROJECT["scratch_engine.py"] + "# the change\n")
    git(project, "commit", "-q", "-am", "change")


def run_step(script: str, project: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    # how a runner runs a step's script on Linux
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=project, env=env,
                          capture_output=True, text=True)  # fmt: skip


def where_perfsuite_is(python: Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-c", "import perfsuite; print(perfsuite.__file__)"], cwd=cwd, env=env,
                          capture_output=True, text=True)  # fmt: skip


def test_the_written_workflow_passes_on_a_pull_request_in_a_fresh_python(tmp_path):
    """Its steps as written, in order: the `uses:` ones are this test's setup (a checkout of a pull request with
    origin/main, a Python with no perfsuite on PATH), pip may only use what is on this machine."""
    project, env = tmp_path / "project", scratch_env()
    project.mkdir()
    assert init(project, "--engine", "my-engine") == 0
    workflow_file = project / ".github/workflows/perf.yml"
    workflow_file.write_text(workflow_file.read_text().replace(SOURCE, str(copy_perfsuite_source(tmp_path))))
    pull_request_checkout(project, tmp_path / "origin.git")
    python = scratch_venv(tmp_path, env)
    # Offline: no index, no pip.conf (its find-links), no isolated build (it would fetch setuptools; pip reads
    # PIP_NO_BUILD_ISOLATION=0 as build_isolation=0).
    env.update(PATH=f"{python.parent}:{env['PATH']}", PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1",
               PIP_NO_BUILD_ISOLATION="0", PIP_DISABLE_PIP_VERSION_CHECK="1")  # fmt: skip
    workflow = yaml.safe_load(workflow_file.read_text())
    job = workflow["jobs"]["perf"]
    steps = job["steps"]
    assert [step["uses"].split("@")[0] for step in steps if "uses" in step] == [
        "actions/checkout", "actions/setup-python", "actions/upload-artifact"
    ]  # fmt: skip
    # The comment step needs GitHub (its API, the pull request's number): test_init_writes_the_four_files checks it.
    scripts = [step for step in steps if "run" in step and "gh pr comment" not in step["run"]]
    assert where_perfsuite_is(python, tmp_path, env).returncode != 0, "the fresh Python has no perfsuite yet"
    env.update({name: with_context(str(value)) for name, value in {**workflow["env"], **job.get("env", {})}.items()})

    unset = run_step(with_context(scripts[0]["run"]), project, {**env, "PERFSUITE_SOURCE": ""})
    assert unset.returncode != 0 and "PERFSUITE_SOURCE: set it at the top of this workflow" in unset.stderr

    env["GITHUB_STEP_SUMMARY"] = str(tmp_path / "step_summary.md")
    for step in scripts:
        step_env = {**env, **{name: with_context(str(value)) for name, value in step.get("env", {}).items()}}
        ran = run_step(with_context(step["run"]), project, step_env)
        assert ran.returncode == 0, f"{step.get('name', step['run'])}:\n{ran.stdout}\n{ran.stderr}"
    output = ran.stdout + ran.stderr
    assert "A/B: A = REF origin/main" in output and "1 skipped" in output, output
    installed = where_perfsuite_is(python, tmp_path, env)
    assert installed.returncode == 0 and Path(installed.stdout.strip()).is_relative_to(python.parents[1]), installed
    assert (project / "reports").is_dir(), "what the last step uploads"
    summary = (project / "reports" / "summary.md").read_text()  # what the comment step posts
    assert summary.startswith("### perfsuite: ") and "REF origin/main" in summary
    assert (tmp_path / "step_summary.md").read_text() == summary, "the job summary"
