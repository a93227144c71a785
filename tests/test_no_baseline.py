"""``--perf-against-if-no-baseline REF`` (what ``make perf`` passes): baselines/ where they hold this environment,
else A/B against REF, so a machine without baselines still gets a verdict (perfsuite.plugin.no_baseline)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from fake_backend import FAKE_BACKEND_CONFTEST
from perfsuite.measure import environment, timing
from perfsuite.measure.environment import environment_from_json
from perfsuite.plugin.no_baseline import SessionPlan, choose_comparison, predicted_fingerprint

pytest_plugins = ["pytester"]

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


def committed(path: Path) -> Path:
    (path / "a.txt").write_text("a\n")
    git(path, "init", "-q")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "base")
    return path


def plan(baseline_dir: Path, **changes) -> SessionPlan:
    return SessionPlan("smollm2-135m", "float32", "cpu", baseline_dir, **{"engines": ("static", "inflight"), **changes})


def store_a_baseline(baseline_dir: Path, fingerprint: str) -> None:
    folder = baseline_dir / fingerprint / "tests" / "test_x.py"
    folder.mkdir(parents=True)
    (folder / "test_x.json").write_text("{}")


@pytest.fixture
def project(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_speed=PERF_TEST)
    return pytester


# -- the choice -----------------------------------------------------------------------------------------------------


def test_without_a_baseline_for_this_environment_the_session_goes_ab_against_ref(tmp_path):
    repo = committed(tmp_path)
    store_a_baseline(repo / "baselines", "cpu-another-machine-0123456789")  # another environment's: not ours
    choice = choose_comparison("HEAD", plan(repo / "baselines"), repo, repo)
    fingerprint = predicted_fingerprint("smollm2-135m", "float32", "cpu")
    assert choice.against == "HEAD"
    assert choice.line == (f"no baseline for this environment ({fingerprint}) in {repo / 'baselines'}: comparing the "
                           "current tree against HEAD side by side (--perf-against HEAD)")  # fmt: skip


def test_with_a_baseline_for_this_environment_the_session_gates_on_baselines(tmp_path):
    repo = committed(tmp_path)
    fingerprint = predicted_fingerprint("smollm2-135m", "float32", "cpu")
    store_a_baseline(repo / "baselines", fingerprint)
    choice = choose_comparison("HEAD", plan(repo / "baselines"), repo, repo)
    assert choice.against is None
    assert choice.line == f"baselines for this environment ({fingerprint}) in {repo / 'baselines'}: gating on them"


def test_outside_git_head_names_nothing_so_baselines_stay_saying_why(tmp_path):
    choice = choose_comparison("HEAD", plan(tmp_path / "baselines"), tmp_path, tmp_path)
    assert choice.against is None
    assert "and 'HEAD' names no commit or checkout here (no git?): comparing with baselines/ as --perf does" in (
        choice.line
    )
    assert choice.line.endswith("record baselines with --perf-save-baseline (make baselines)")


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"save_baseline": True}, "recording baselines (--perf-save-baseline): no A/B"),
        ({"against": "HEAD~1"}, "--perf-against HEAD~1 given: A/B against it"),
        ({"ray": "auto"}, "--perf-ray: comparing with baselines/"),
        ({"engines": ("openai-http",)}, "openai-http measures a server, the same for both sides"),
        ({"xdist": True}, "-n: A/B runs one pair of workers per session"),
    ],
)
def test_nothing_switches_where_ab_cannot_run_or_the_options_chose(tmp_path, changes, why):
    choice = choose_comparison("HEAD", plan(tmp_path / "baselines", **changes), committed(tmp_path), tmp_path)
    assert choice.against is None and choice.line.startswith(f"--perf-against-if-no-baseline HEAD: {why}")


def test_the_shipped_baselines_gate_their_own_machine_class(monkeypatch):
    """On the shipped baselines' machine (its CPU, its thread count), make perf finds them and does not go A/B."""
    [folder] = [path for path in (ROOT / "baselines").iterdir() if path.is_dir()]
    stored = environment_from_json(json.loads(next(folder.rglob("*.json")).read_text())["environment"])
    assert stored.fingerprint() == folder.name
    here = environment.capture_environment(stored.model, stored.dtype, "cpu", stored.num_threads)
    if (here.torch_version, here.transformers_version) != (stored.torch_version, stored.transformers_version):
        pytest.skip(f"this torch/transformers ({here.torch_version}, {here.transformers_version}) is not the pinned one")
    monkeypatch.setattr(environment, "cpu_model", lambda: stored.cpu_model)
    monkeypatch.setattr(timing, "default_num_threads", lambda: stored.num_threads)
    choice = choose_comparison("HEAD", plan(ROOT / "baselines"), ROOT, ROOT)
    assert choice.against is None and choice.line.startswith(f"baselines for this environment ({folder.name})")


# -- in a session ---------------------------------------------------------------------------------------------------


def test_a_session_predicts_the_fingerprint_it_then_captures_and_says_what_it_compares_with(project):
    """Outside git, HEAD names nothing: the session compares with baselines/ (there are none) and says why."""
    result = project.runpytest_subprocess(*FALLBACK, "-rs")
    fingerprint = predicted_fingerprint("smollm2-135m", "float32", "auto")
    result.stdout.fnmatch_lines([
        f"perfsuite: no baseline for this environment ({fingerprint}) in *, and 'HEAD' names no commit or checkout "
        "here (no git?)*",
        "perfsuite: judged 0 of 4 planned comparisons (4 without a baseline for this environment)*",
    ])  # fmt: skip
    results = json.loads((project.path / "reports" / "results.json").read_text())
    assert results["fingerprint"] == fingerprint, "the environment predicted before the session is the one it captured"


def test_in_a_git_checkout_without_baselines_the_session_is_an_ab_session(project):
    committed(project.path)
    result = project.runpytest_subprocess(*FALLBACK, "--co")
    result.stdout.fnmatch_lines(["perfsuite: no baseline for this environment (*) in *: comparing the current tree against "
                                 "HEAD side by side (--perf-against HEAD)"])  # fmt: skip
