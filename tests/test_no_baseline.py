"""``--perf-against-if-no-baseline REF`` (what ``make perf`` passes): baselines/ where they hold this environment,
else A/B against REF, so a machine without baselines still gets a verdict (perfsuite.plugin.no_baseline)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from fake_backend import FAKE_BACKEND_CONFTEST
from perfsuite.judge.stats import PAIRED_MIN_EFFECT
from perfsuite.measure import environment
from perfsuite.measure.environment import environment_from_json
from perfsuite.plugin.no_baseline import SessionPlan, choose_comparison, predicted_fingerprint

pytest_plugins = ["pytester"]
# Imported here, before any in-process pytester run: one that imported torch would unload it after, and torch
# cannot be imported twice in a process.
pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
# The fake backend, with the threads the default perf_model fixture sets: the environment make perf captures.
CONFTEST = FAKE_BACKEND_CONFTEST.replace(
    "    return Backend(", "    from perfsuite.measure.timing import configure_threads\n    configure_threads(None)\n    return Backend("
)
PERF_TEST = """
import pytest

@pytest.mark.perf
def test_speed(perf, perf_inflight_engine, perf_workload):
    perf.measure(perf_inflight_engine, perf_workload)
"""
FALLBACK = ("--perf", "--perf-profile", "smoke", "-p", "no:randomly", "--perf-against-if-no-baseline", "HEAD")


def git(path: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=path, check=True,
                   capture_output=True)  # fmt: skip


@pytest.fixture
def project(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_speed=PERF_TEST)
    return pytester


def test_without_a_baseline_for_this_environment_the_session_goes_ab_against_head(project):
    git(project.path, "init", "-q")
    git(project.path, "add", "-A")
    git(project.path, "commit", "-q", "-m", "base")
    result = project.runpytest_inprocess(*FALLBACK, "--co")
    fingerprint = predicted_fingerprint("smollm2-135m", "float32", "auto")
    result.stdout.fnmatch_lines([
        f"perfsuite: no baseline for this environment ({fingerprint}) in {project.path / 'baselines'}: comparing the "
        "current tree against HEAD side by side (--perf-against HEAD)"
    ])  # fmt: skip
    config = project.parseconfigure(*FALLBACK)
    from perfsuite.plugin.stash import SESSION_KEY

    options = config.stash[SESSION_KEY].options
    assert options.against == "HEAD" and options.policy.min_effect == PAIRED_MIN_EFFECT, "the A/B mode's default"


def test_with_baselines_for_this_environment_the_session_gates_on_them(project):
    """The predicted fingerprint is the one a session captures: baselines it saved are found and compared with."""
    saved = project.runpytest_inprocess("--perf", "--perf-profile", "smoke", "-p", "no:randomly",
                                        "--perf-save-baseline")  # fmt: skip
    saved.assert_outcomes(passed=1)
    result = project.runpytest_inprocess(*FALLBACK, "-rs")
    [folder] = (project.path / "baselines").iterdir()
    result.stdout.fnmatch_lines([f"perfsuite: baselines for this environment ({folder.name}) in *: gating on them"])
    [test] = json.loads((project.path / "reports" / "results.json").read_text())["tests"]
    assert test["judgement"]["baseline_status"] != "no baseline" and test["judgement"]["comparisons"]
    assert "A/B:" not in result.stdout.str()


def test_outside_git_head_names_nothing_so_the_session_compares_with_baselines_saying_why(project):
    result = project.runpytest_inprocess(*FALLBACK, "-rs")
    result.stdout.fnmatch_lines([
        "perfsuite: no baseline for this environment (*) in *, and 'HEAD' names no commit or checkout here (no git?): "
        "comparing with baselines/ as --perf does, which judges nothing; record baselines with --perf-save-baseline "
        "(make baselines)",
        "perfsuite: judged 0 of 4 planned comparisons (4 without a baseline for this environment)*",
    ])  # fmt: skip
    result.assert_outcomes(skipped=1)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (("--perf-save-baseline",), "recording baselines (--perf-save-baseline): no A/B"),
        (("--perf-against", "HEAD~1"), "--perf-against HEAD~1 given: A/B against it"),
    ],
)
def test_nothing_switches_where_the_session_chose_its_comparison_itself(project, args, why):
    result = project.runpytest_inprocess(*FALLBACK, *args, "--co")
    result.stdout.fnmatch_lines([f"perfsuite: --perf-against-if-no-baseline HEAD: {why}"])


def test_the_shipped_baselines_gate_their_own_machine_class(monkeypatch):
    """On the shipped baselines' machine (its CPU, its thread count), make perf finds them and does not go A/B."""
    [folder] = [path for path in (ROOT / "baselines").iterdir() if path.is_dir()]
    stored = environment_from_json(json.loads(next(folder.rglob("*.json")).read_text())["environment"])
    assert stored.fingerprint() == folder.name
    here = environment.capture_environment(stored.model, stored.dtype, "cpu", stored.num_threads)
    if (here.torch_version, here.transformers_version) != (stored.torch_version, stored.transformers_version):
        pytest.skip(f"this torch/transformers ({here.torch_version}, {here.transformers_version}) is not the pinned one")
    monkeypatch.setattr(environment, "cpu_model", lambda: stored.cpu_model)
    import perfsuite.measure.timing as timing

    monkeypatch.setattr(timing, "default_num_threads", lambda: stored.num_threads)
    plan = SessionPlan(stored.model, stored.dtype, "cpu", ROOT / "baselines", engines=("static", "inflight"))
    choice = choose_comparison("HEAD", plan, ROOT, ROOT)
    assert choice.against is None and choice.line.startswith(f"baselines for this environment ({folder.name})")
