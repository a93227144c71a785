"""``pytest --perf --perf-against REF`` end to end, in throw-away git repositories the tests build.

Each repository holds a copy of perfsuite and the shipped throughput test;
commits and branches in it make the reference slower, broken, dying or hung.
The pytest run is a subprocess (pytester), whose two workers import
perfsuite from the repository's working tree (B) and from a snapshot of REF (A).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from perfsuite.ab.trees import OLDEST_SUPPORTED, extract_commit
from perfsuite.judge.paired import pairs_with_room_for_disagreement
from perfsuite.workload.profiles import PROFILES

pytestmark = pytest.mark.timing  # reads the machine's load or must see a slowdown: run alone (conftest.py)

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1]
SHIPPED_THROUGHPUT_TEST = "perfsuite.suites.test_throughput"  # the repository's own copy: the tree under test
ONE_TEST = "inflight and fixed"  # test_throughput[inflight-B2-fixed] of the smoke profile
ADDED_PERF_AGAINST = OLDEST_SUPPORTED  # 14782f4: the oldest commit the README promises --perf-against works against
FIRST_COMMIT = "32c0ef4"  # perfsuite's first: no --perf-against, no worker module

SLOWER_RUNNER = '''

def _slowed(execute):
    import time

    def slowed_execute(self, output, kv_cache):
        start = time.perf_counter()
        tokens = execute(self, output, kv_cache)
        deadline = time.perf_counter() + 0.5 * (time.perf_counter() - start)
        while time.perf_counter() < deadline:  # busy, as a slower kernel is
            pass
        return tokens

    return slowed_execute


ModelRunner.execute = _slowed(ModelRunner.execute)
'''

DYING_ENGINE = '''

def _die(self, *args, **kwargs):
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


Engine.run = _die
'''

HANGING_ENGINE = '''

def _hang(self, *args, **kwargs):
    import time

    time.sleep(3600)


Engine.run = _hang
'''


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def repo(pytester) -> Path:
    """A git repository with perfsuite (and so its shipped suite), one commit on ``main``."""
    root = pytester.path
    shutil.copytree(REPO / "perfsuite", root / "perfsuite", ignore=shutil.ignore_patterns("__pycache__"))
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "perfsuite@example.invalid")
    git(root, "config", "user.name", "perfsuite tests")
    commit(root, "perfsuite as it is")
    return root


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def append(repo: Path, module: str, code: str) -> None:
    path = repo / module
    path.write_text(path.read_text() + code)


def branch_of_project_commit(repo: Path, name: str, project_commit: str) -> str:
    """A branch ``name`` whose perfsuite/ is this project's at ``project_commit``; the working tree stays on main."""
    snapshot = Path(tempfile.mkdtemp(prefix="perfsuite-test-old-tree-"))
    try:
        extract_commit(REPO, project_commit, snapshot)
        git(repo, "checkout", "-q", "-b", name)
        shutil.rmtree(repo / "perfsuite")
        shutil.copytree(snapshot / "perfsuite", repo / "perfsuite")
        commit(repo, name)
        git(repo, "checkout", "-q", "main")
    finally:
        shutil.rmtree(snapshot, ignore_errors=True)
    return git(repo, "rev-parse", name)


def branch_with(repo: Path, name: str, module: str, code: str) -> str:
    """A branch ``name`` whose ``module`` has ``code`` appended; the working tree stays on main."""
    git(repo, "checkout", "-q", "-b", name)
    append(repo, module, code)
    commit(repo, name)
    git(repo, "checkout", "-q", "main")
    return git(repo, "rev-parse", name)


def run_ab(pytester, ref: str, *extra: str, model: str = "tiny-random"):
    return pytester.runpytest_subprocess(
        "--pyargs", SHIPPED_THROUGHPUT_TEST,
        "--perf", "--perf-profile", "smoke", "--perf-model", model, "--perf-device", "cpu",
        # one argument: pytest would take a path-like value standing alone for where its rootdir is
        "-p", "no:randomly", "-p", "no:cacheprovider", f"--perf-against={ref}", *extra,
    )  # fmt: skip


def results_json(repo: Path) -> dict:
    return json.loads((repo / "reports" / "results.json").read_text())


def worker_processes(repo: Path) -> list[str]:
    """Command lines of A/B workers still running over ``repo`` or a snapshot made from it."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "worker_main.py" in cmdline and (str(repo) in cmdline or "perfsuite-ab-" in cmdline):
            found.append(cmdline)
    return found


def snapshots_of(commit_sha: str) -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"perfsuite-ab-{commit_sha[:12]}-*"))


def test_against_head_measures_both_trees_and_passes(pytester, repo):
    head = git(repo, "rev-parse", "HEAD")
    # 4 pairs: p cannot go below 1/16, so unchanged code cannot fail here by chance (calibrate_ab.py measures that)
    result = run_ab(pytester, "HEAD", "-k", ONE_TEST, "--perf-repeats", "4")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*A: REF*B: current*", f"*A/B: A = REF HEAD ({head[:12]})*ABBA*"])
    document = results_json(repo)
    assert document["against"]["ref"] == "HEAD" and document["against"]["commit"] == head
    (test,) = document["tests"]
    assert test["reference"]["pair_order"] == ["AB", "BA", "AB", "BA"]
    reference, current = test["reference"]["samples"], test["measurement"]["samples"]
    assert len(reference["output_throughput"]) == len(current["output_throughput"]) == 4
    assert len(reference["cpu_busy_share"]) == len(current["cpu_busy_share"]) == 4, "a CPU reading around every run"
    assert 1 <= test["reference"]["num_threads"] <= len(os.sched_getaffinity(0)), "chosen for the cores left free"
    assert f"-t{test['reference']['num_threads']}-" in test["fingerprint"], "its history series is per thread count"
    assert document["policy"]["smallest_p"] == 1 / 16, "the paired floor, 2^-pairs"
    assert test["judgement"]["baseline_status"] == f"A/B against HEAD ({head[:12]})"
    comparisons = test["judgement"]["comparisons"]
    assert comparisons and all(c["verdict"] != "regressed" for c in comparisons)
    assert "Wilcoxon" in document["policy"]["test"]
    assert not (repo / "baselines").exists(), "an A/B session neither reads nor writes baselines"
    assert not worker_processes(repo) and not snapshots_of(head)


def test_unless_given_the_pairs_leave_room_for_disagreement_and_rotate_over_the_workers(pytester, repo):
    result = run_ab(pytester, "HEAD", "-k", ONE_TEST, "--perf-against-workers", "3", "--perf-against-threads", "1")
    document = results_json(repo)
    (test,) = document["tests"]
    assert test["reference"]["num_threads"] == 1, "as given, every worker of both sides"
    policy = document["policy"]
    pairs = pairs_with_room_for_disagreement(policy["num_planned_comparisons"], policy["alpha"])
    assert pairs > PROFILES["smoke"].repeats, "more pairs than the profile's repeats: the floor is what sets them"
    assert len(test["reference"]["pair_order"]) == pairs
    assert "rotate two at a time over 3 worker processes a side" in document["against"]["order"]
    result.stdout.fnmatch_lines([f"*{pairs} pairs per test in ABBA order over 3 worker(s) a side*"])
    assert not worker_processes(repo)


def test_a_current_tree_slower_than_ref_fails_with_the_documented_message(pytester, repo):
    """REF is the commit before one that makes every forward pass 50% slower; the current tree has that commit.

    On SmolLM2's shapes (random weights, built here): tiny-random's runs last milliseconds, where the
    operating system's jitter is as large as the slowdown.
    """
    append(repo, "perfsuite/engine/model_runner.py", SLOWER_RUNNER)
    commit(repo, "a slower runner")
    # one worker a side: this test is about the verdict and its message, not the rotation (tested above)
    result = run_ab(pytester, "HEAD~1", "-k", ONE_TEST, "--perf-repeats", "8", "--perf-against-workers", "1",
                    model="random-smollm2-135m")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*performance regression in *test_throughput[[]inflight-B2-fixed[]] (A/B against HEAD~1 (*)):",
        "*output_throughput: REF (A) median *, current (B) median * -> regressed*",
    ])  # fmt: skip
    (test,) = results_json(repo)["tests"]
    throughput = next(c for c in test["judgement"]["comparisons"] if c["metric"] == "output_throughput")
    assert throughput["verdict"] == "regressed" and throughput["change"] < -0.1


def test_a_ref_that_names_no_commit_is_a_usage_error_naming_it(pytester, repo):
    result = run_ab(pytester, "no-such-branch")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--perf-against no-such-branch: not a commit of the repository at*"])


def test_a_ref_whose_tree_cannot_be_imported_is_a_usage_error_naming_it(pytester, repo):
    sha = branch_with(repo, "broken", "perfsuite/__init__.py", '\nraise ImportError("this tree is broken")\n')
    result = run_ab(pytester, "broken")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--perf-against broken: worker A#1, REF broken ({sha[:12]}) failed to start*"])
    assert "this tree is broken" in result.stderr.str()
    assert not worker_processes(repo) and not snapshots_of(sha)


def test_the_commit_that_added_perf_against_is_a_ref_too(pytester, repo):
    """Its ``EngineConfig`` predates ``num_kv_blocks``: the worker builds it by keyword, sending no unset knob."""
    if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{ADDED_PERF_AGAINST}^{{commit}}"]).returncode:
        pytest.skip(f"{ADDED_PERF_AGAINST} is not in this clone (a shallow one)")
    branch_of_project_commit(repo, "oldest", ADDED_PERF_AGAINST)
    result = run_ab(pytester, "oldest", "-k", ONE_TEST, "--perf-repeats", "2", "--perf-against-workers", "1")
    # both sides ran; 2 pairs are too few for a verdict, so the test judged nothing and is skipped, not failed
    result.assert_outcomes(skipped=1)
    assert len(results_json(repo)["tests"]) == 1


def test_a_commit_older_than_perf_against_is_one_usage_error_line_before_any_worker_starts(pytester, repo):
    """Issue 37: 32c0ef4 (perfsuite's first commit) failed after 20 s with a worker's traceback."""
    if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{FIRST_COMMIT}^{{commit}}"]).returncode:
        pytest.skip(f"{FIRST_COMMIT} is not in this clone (a shallow one)")
    sha = branch_of_project_commit(repo, "first", FIRST_COMMIT)
    result = run_ab(pytester, "first")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.stderr.lines[0] == (
        f"ERROR: --perf-against first: {sha[:12]} predates --perf-against (its perfsuite/ has no ab/worker_main.py), "
        "so this perfsuite's worker cannot drive its engines; the oldest commit it can measure is "
        f"{ADDED_PERF_AGAINST}; give {ADDED_PERF_AGAINST} or newer"
    )
    assert not "".join(result.stderr.lines[1:]).strip(), "one line"
    assert not snapshots_of(sha)


def test_a_directory_that_is_not_a_checkout_is_a_usage_error_before_any_worker_starts(pytester, repo, tmp_path_factory):
    plain = tmp_path_factory.mktemp("not-a-checkout")
    result = run_ab(pytester, str(plain))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--perf-against {plain}: {plain} is not a perfsuite checkout*"])
    assert "worker" not in result.stderr.str(), "refused before a worker (and its model) was started"


@pytest.mark.parametrize(
    ("engine_code", "extra", "what"),
    [
        (DYING_ENGINE, (), "died (exit code -9) during run inflight"),
        (HANGING_ENGINE, ("--perf-worker-timeout", "3"), "did not answer run inflight within 3 s and was killed"),
    ],
    ids=["dies", "hangs"],
)
def test_a_worker_that_dies_or_hangs_fails_its_test_and_the_session_goes_on(pytester, repo, engine_code, extra, what):
    sha = branch_with(repo, "bad", "perfsuite/engine/engine.py", engine_code)
    result = run_ab(pytester, "bad", "-k", "inflight", "--perf-repeats", "2", "--perf-against-workers", "1", *extra)
    result.assert_outcomes(failed=2)  # both inflight tests ran, each failing on its own
    result.stdout.fnmatch_lines([f"*test_throughput[[]inflight-B2-*--perf-against bad: worker A, REF bad*{what}*"])
    assert not worker_processes(repo), "no worker outlives its session"
    assert not snapshots_of(sha)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--perf-save-baseline",), "*--perf-against HEAD compares two trees side by side*drop --perf-save-baseline*"),
        (("--perf-engines", "openai-http"), "*--perf-against HEAD: openai-http measures a server*"),
    ],
)
def test_options_that_contradict_an_ab_session_are_usage_errors(pytester, repo, options, message):
    result = run_ab(pytester, "HEAD", *options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_a_checkout_path_is_a_ref_too(pytester, repo, tmp_path_factory):
    other = tmp_path_factory.mktemp("other-checkout") / "checkout"
    git(repo, "worktree", "add", "-q", "--detach", str(other), "HEAD")
    try:
        result = run_ab(pytester, str(other), "-k", ONE_TEST, "--perf-repeats", "2", "--perf-against-workers", "1")
        result.assert_outcomes(skipped=1)  # measured both sides; 2 pairs judge nothing (inconclusive): skipped
        assert results_json(repo)["against"]["ref"] == str(other)
    finally:
        git(repo, "worktree", "remove", "--force", str(other))
    assert os.path.isdir(repo / "perfsuite")
