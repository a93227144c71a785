"""The parts of ``perfsuite.ab`` that need no worker process: the ABBA schedule, restarts, REF's tree, the checks."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import perfsuite
from perfsuite.ab import wire
from perfsuite.ab.pair import (
    ABRunner,
    NoRoomForSecondCopy,
    PairedRuns,
    check_room_for_other_copies,
    different_output_lengths,
    pair_order,
    pair_workers,
)
from perfsuite.ab.trees import OLDEST_SUPPORTED, WORKER_MODULE, ReferenceError, Trees, prepare_trees
from perfsuite.ab.workers import Side, SideRunner, Worker, WorkerError
from perfsuite.adapters import EngineConfig
from perfsuite.adapters.registry import EngineSpec
from perfsuite.engine.types import EngineCounters, FinishReason, Request, RequestRecord, RunResult, SamplingParams
from perfsuite.measure.contention import CpuSample, CpuTicks

LOAD = wire.Load("tiny-random", "cpu", "float32", "packed")
LOADED = wire.Loaded("cpu", model_bytes=1000, free_bytes=10_000, max_context=256, eos_token_id=2, vocab_size=320)
SPEC = EngineSpec("inflight", EngineConfig(batch_size=2, max_seq_len=64))
REQUESTS = [Request(f"r{i}", (1, 2, 3), SamplingParams(3, ignore_eos=True)) for i in range(2)]


def run_result(engine: str, tokens: dict[str, int]) -> RunResult:
    records = tuple(
        RequestRecord(request_id, 3, (5,) * n, 0.0, 0.0, tuple(0.1 * (i + 1) for i in range(n)), 0.1 * n,
                      FinishReason.LENGTH)  # fmt: skip
        for request_id, n in tokens.items()
    )
    return RunResult(engine, records, 0.0, 1.0, EngineCounters(num_forward_passes=3))


class FakeWorker:
    """Answers like a worker; every run is logged as (side, engine_id) in ``log``."""

    def __init__(self, side: Side, log: list, tokens: dict[str, int]) -> None:
        self.side, self.log, self.tokens = side, log, tokens
        self.alive, self.closed = True, False
        self.threads: list[int] = []  # every SetThreads, in order
        self.pid = None

    def request(self, message, answer, timeout, what):
        if isinstance(message, wire.Load):
            return LOADED
        if isinstance(message, wire.Build):
            return wire.Built(message.engine_id, message.engine, message.config["batch_size"])
        if isinstance(message, wire.Run):
            self.log.append((self.side.label, message.engine_id, self.side.number))
            return wire.RunDone(wire.encode(run_result(f"{self.side.label}-engine", self.tokens)))
        if isinstance(message, wire.SetThreads):
            self.threads.append(message.num_threads)
            return wire.ThreadsSet(message.num_threads)
        raise AssertionError(f"unexpected {message!r}")

    def close(self) -> None:
        self.alive, self.closed = False, True


def fake_runner(
    log: list,
    tokens: dict[str, int] | None = None,
    starts: list | None = None,
    workers_per_side: int = 1,
    read_cpu=lambda own_seconds: None,  # no /proc/stat: no readings, threads left as loaded
) -> ABRunner:
    tokens = tokens or {"r0": 3, "r1": 3}
    starts = starts if starts is not None else []

    def start(side: Side) -> FakeWorker:
        worker = FakeWorker(side, log, tokens)
        starts.append(worker)
        return worker

    trees = Trees("HEAD", "0" * 40, Path("/current"), Path("/reference"), None, None)
    return ABRunner(trees, LOAD, timeout=5, start=start, workers_per_side=workers_per_side, read_cpu=read_cpu,
                    sleep=lambda seconds: None)  # fmt: skip


@given(st.integers(min_value=0, max_value=40))
def test_pairs_alternate_which_side_runs_first(num_pairs):
    order = pair_order(num_pairs)
    assert len(order) == num_pairs and all(sorted(pair) == ["A", "B"] for pair in order)
    assert all(order[i] != order[i + 1] for i in range(num_pairs - 1)), "ABBA: the first side alternates"
    assert sum(pair == "AB" for pair in order) - sum(pair == "BA" for pair in order) in (0, 1)


def test_warm_ups_then_abba_pairs_run_on_the_right_sides():
    log: list = []
    paired = fake_runner(log).run_pairs(SPEC, REQUESTS, None, num_warmups=1, num_pairs=4)
    sides = "".join(label for label, _, _ in log)
    assert sides == "AB" + "ABBAABBA", "one warm-up a side, then the pairs ABBA"
    assert paired.order == ("AB", "BA", "AB", "BA")
    assert len(paired.reference) == len(paired.current) == 4
    assert all(r.engine_name == "A-engine" for r in paired.reference)
    assert all(r.engine_name == "B-engine" for r in paired.current)


@given(st.integers(min_value=0, max_value=40), st.integers(min_value=1, max_value=4))
def test_pairs_rotate_over_the_workers_and_each_worker_sees_both_orders(num_pairs, workers_per_side):
    workers, order = pair_workers(num_pairs, workers_per_side), pair_order(num_pairs)
    assert len(workers) == num_pairs and set(workers) <= set(range(workers_per_side))
    used = {w: [o for o, ww in zip(order, workers) if ww == w] for w in set(workers)}
    counts = [len(orders) for orders in used.values()]
    assert not counts or max(counts) - min(counts) <= 2, "the pairs spread evenly over the workers"
    for orders in used.values():
        assert orders.count("AB") - orders.count("BA") in (0, 1), "a worker's pairs are balanced AB/BA"
    if num_pairs >= 2 * workers_per_side:
        assert set(workers) == set(range(workers_per_side)), "every worker runs pairs"


def test_pair_workers_refuses_zero_workers():
    with pytest.raises(ValueError, match="workers_per_side must be >= 1"):
        pair_workers(4, 0)
    with pytest.raises(ValueError, match="workers_per_side must be >= 1"):
        fake_runner([], workers_per_side=0)


def test_two_workers_a_side_each_warm_up_then_take_two_pairs_in_turn():
    log, starts = [], []
    runner = fake_runner(log, starts=starts, workers_per_side=2)
    runner.start()
    assert [w.side.label for w in starts] == ["B", "B", "A", "A"], "one current worker first, for the memory check"
    paired = runner.run_pairs(SPEC, REQUESTS, None, num_warmups=1, num_pairs=5)
    ran = [(label, number) for label, _, number in log]
    warmups, timed = ran[:4], ran[4:]
    assert sorted(warmups) == [("A", 1), ("A", 2), ("B", 1), ("B", 2)], "every worker warms up once"
    assert timed == [("A", 1), ("B", 1), ("B", 1), ("A", 1),  # pairs 0-1: AB, BA on workers #1
                     ("A", 2), ("B", 2), ("B", 2), ("A", 2),  # pairs 2-3 on workers #2
                     ("A", 1), ("B", 1)]  # fmt: skip
    assert str(starts[2].side).startswith("A#1, REF HEAD")
    assert paired.workers == (0, 0, 1, 1, 0) and paired.order == ("AB", "BA", "AB", "BA", "AB")
    runner.close()
    assert all(w.closed for w in starts)


def test_the_current_side_starts_first_and_a_dead_side_is_started_again():
    log, starts = [], []
    runner = fake_runner(log, starts=starts)
    runner.start()
    assert [w.side.label for w in starts] == ["B", "A"]
    starts[1].alive = False  # REF's worker died between tests
    runner.run_pairs(SPEC, REQUESTS, None, num_warmups=0, num_pairs=2)
    assert [w.side.label for w in starts] == ["B", "A", "A"] and starts[1].closed
    runner.close()
    assert all(w.closed for w in starts[:1] + starts[2:])


def test_engines_are_built_once_per_worker():
    built = []

    class CountingWorker(FakeWorker):
        def request(self, message, answer, timeout, what):
            if isinstance(message, wire.Build):
                built.append(self.side.label)
            return super().request(message, answer, timeout, what)

    runner = SideRunner(Side("A", "REF", Path("/r")), LOAD, 5, start=lambda side: CountingWorker(side, [], {"r0": 1}))
    for _ in range(3):
        runner.run(SPEC, (), None)
    assert built == ["A"]


def test_a_side_that_made_fewer_tokens_in_any_repeat_is_named():
    same, short = run_result("e", {"r0": 3, "r1": 3}), run_result("e", {"r0": 3, "r1": 2})
    assert different_output_lengths(PairedRuns((same, same), (same, same), ("AB", "BA"))) == []
    [problem] = different_output_lengths(PairedRuns((same, same), (same, short), ("AB", "BA")))
    assert problem == "r1: 2 tokens in B's repeat 2, 3 in A's first"
    missing = run_result("e", {"r0": 3})
    assert "r1: None tokens in A's repeat 2" in different_output_lengths(PairedRuns((same, missing), (same, same),
                                                                                     ("AB", "BA")))[0]


def test_a_device_without_room_for_the_second_copy_is_refused_before_it_starts():
    check_room_for_other_copies(LOADED)  # 10 000 free for 1 000 of weights: fine
    check_room_for_other_copies(wire.Loaded("cpu", 10**9, None, 256, 2, 320))  # unknown: not checked
    tight = wire.Loaded("cuda:0", model_bytes=8 * 2**30, free_bytes=10 * 2**30, max_context=2048, eos_token_id=2,
                        vocab_size=32000)  # fmt: skip
    with pytest.raises(NoRoomForSecondCopy) as error:
        check_room_for_other_copies(tight)
    message = str(error.value)
    for part in ("cuda:0 has 10.00 GiB free", "(8.00 GiB)", "a second copy", "about 12.00 GiB", "--perf-dtype",
                 "drop --perf-against"):
        assert part in message
    assert isinstance(error.value, WorkerError), "a worker error: the plugin turns it into a usage error"


# -- REF's tree ----------------------------------------------------------------------------------------------------


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def two_commit_repo(root: Path, package: str) -> Path:
    """A git repository at ``root`` whose ``package/__init__.py`` says VERSION = 1, then VERSION = 2.

    A perfsuite has the worker's module too, as every commit from ``OLDEST_SUPPORTED`` on has.
    """
    init = root / package / "__init__.py"
    init.parent.mkdir(parents=True)
    init.write_text("VERSION = 1\n")
    if init.parent.name == "perfsuite":
        (init.parent / WORKER_MODULE).parent.mkdir()
        (init.parent / WORKER_MODULE).write_text("")
    git(root.parent, "init", "-q", "-b", "main", str(root))
    git(root, "config", "user.email", "t@example.invalid")
    git(root, "config", "user.name", "t")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "one")
    init.write_text("VERSION = 2\n")
    git(root, "commit", "-q", "-am", "two")
    return root


@pytest.fixture
def repo(tmp_path) -> Path:
    return two_commit_repo(tmp_path / "repo", "project/perfsuite")


def test_a_ref_is_laid_out_as_the_same_folder_of_its_commit(repo, tmp_path):
    trees = prepare_trees("HEAD~1", repo / "project", invocation_dir=tmp_path)
    try:
        assert trees.commit == git(repo, "rev-parse", "HEAD~1") and trees.current_commit == git(repo, "rev-parse", "HEAD")
        assert trees.current == (repo / "project").resolve()
        assert (trees.reference / "perfsuite" / "__init__.py").read_text() == "VERSION = 1\n"
        assert trees.reference_label == f"HEAD~1 ({trees.commit[:12]})"
        assert not git(repo, "worktree", "list").count("\n"), "nothing added to the repository"
    finally:
        trees.remove()
    assert not trees.snapshot.exists()


@pytest.mark.parametrize("ref", ["no-such-branch", "--output=/tmp/x", "HEAD~99"])
def test_a_ref_that_names_no_commit_says_so_and_how_to_fix_it(repo, tmp_path, ref):
    with pytest.raises(ReferenceError) as error:
        prepare_trees(ref, repo, invocation_dir=tmp_path)
    assert f"--perf-against {ref}: not a commit of the repository" in str(error.value)
    assert "git fetch" in str(error.value)


def test_a_checkout_path_is_used_as_it_is_and_never_removed(repo, tmp_path):
    other = tmp_path / "other"
    git(repo, "worktree", "add", "-q", "--detach", str(other), "HEAD~1")
    trees = prepare_trees(str(other / "project"), repo, invocation_dir=tmp_path)
    assert trees.reference == (other / "project").resolve() and trees.snapshot is None
    assert trees.commit == git(repo, "rev-parse", "HEAD~1")
    trees.remove()
    assert other.is_dir()


def test_the_current_tree_as_ref_path_and_a_missing_path_are_refused(repo, tmp_path):
    with pytest.raises(ReferenceError, match="that is the current tree itself"):
        prepare_trees(str(repo), repo, invocation_dir=tmp_path)
    with pytest.raises(ReferenceError, match="no such directory"):
        prepare_trees("./nowhere", repo, invocation_dir=tmp_path)


def test_a_directory_with_no_perfsuite_package_is_not_a_checkout(repo, tmp_path):
    plain = tmp_path / "plain"
    (plain / "src").mkdir(parents=True)
    with pytest.raises(ReferenceError) as error:  # from perfsuite's own tree: REF must be a perfsuite too
        prepare_trees(str(plain), repo / "project", invocation_dir=tmp_path)
    assert f"--perf-against {plain}: {plain} is not a perfsuite checkout (no perfsuite/ package" in str(error.value)
    assert "give a git ref or the path of another perfsuite checkout" in str(error.value)


def test_a_commit_with_no_perfsuite_package_in_the_folder_is_refused(repo, tmp_path):
    git(repo, "mv", "project/perfsuite", "project/renamed")
    git(repo, "commit", "-q", "-m", "three")
    git(repo, "checkout", "-q", "HEAD~1", "--", "project/perfsuite")  # the current tree is perfsuite's, REF is not
    with pytest.raises(ReferenceError, match=r"HEAD: [0-9a-f]{12} has no perfsuite/ package in project/"):
        prepare_trees("HEAD", repo / "project", invocation_dir=tmp_path)
    assert not list(Path(tempfile.gettempdir()).glob(f"perfsuite-ab-{git(repo, 'rev-parse', 'HEAD')[:12]}-*"))


def test_a_commit_older_than_perf_against_is_refused_in_one_line_naming_the_oldest_it_measures(repo, tmp_path):
    """A perfsuite without the worker's module predates --perf-against: refused before a worker starts, not
    after one fails to import what the current worker asks of it (issue 37: 32c0ef4, a 17-line traceback)."""
    git(repo, "rm", "-q", "-r", "project/perfsuite/ab")
    git(repo, "commit", "-q", "-m", "three")
    git(repo, "checkout", "-q", "HEAD~1", "--", "project/perfsuite")  # the current tree can drive a worker, REF not
    old = git(repo, "rev-parse", "HEAD")
    with pytest.raises(ReferenceError) as error:
        prepare_trees("HEAD", repo / "project", invocation_dir=tmp_path)
    assert str(error.value) == (
        f"--perf-against HEAD: {old[:12]} predates --perf-against (its perfsuite/ has no ab/worker_main.py), so this "
        f"perfsuite's worker cannot drive its engines; the oldest commit it can measure is {OLDEST_SUPPORTED}; give "
        f"{OLDEST_SUPPORTED} or newer"
    )
    assert not list(Path(tempfile.gettempdir()).glob(f"perfsuite-ab-{old[:12]}-*"))
    checkout = tmp_path / "old-checkout"
    git(repo, "worktree", "add", "-q", "--detach", str(checkout), "HEAD")
    with pytest.raises(ReferenceError, match=f"predates --perf-against.*check out {OLDEST_SUPPORTED} or newer there$"):
        prepare_trees(str(checkout / "project"), repo / "project", invocation_dir=tmp_path)


def test_the_oldest_commit_named_is_the_one_that_added_the_workers_module():
    """In a clone with perfsuite's history (CI's ``git clone`` has all of it); a shallow one skips."""
    here = Path(__file__).resolve().parents[1]
    module = f"perfsuite/{WORKER_MODULE.as_posix()}"
    if subprocess.run(["git", "-C", str(here), "cat-file", "-e", f"{OLDEST_SUPPORTED}^{{commit}}"]).returncode:
        pytest.skip(f"{OLDEST_SUPPORTED} is not in this clone (a shallow one, or not perfsuite's repository)")
    added = git(here, "log", "--diff-filter=A", "--format=%h", "--abbrev=7", "--", module).split()
    assert added[-1] == OLDEST_SUPPORTED, "the commit that added it first"
    for parent in git(here, "rev-list", "--parents", "-n", "1", OLDEST_SUPPORTED).split()[1:]:
        missing = subprocess.run(["git", "-C", str(here), "cat-file", "-e", f"{parent}:{module}"], capture_output=True)
        assert missing.returncode, f"{parent} has {module} already"


@pytest.fixture
def project_repo(tmp_path) -> Path:
    """A project that installs perfsuite rather than holding it: an engine package of its own, two commits."""
    return two_commit_repo(tmp_path / "outside", "src/my_engine")


def test_a_project_that_installs_perfsuite_compares_its_own_code_and_both_sides_use_the_installed_one(
    project_repo, tmp_path
):
    trees = prepare_trees("HEAD~1", project_repo, invocation_dir=tmp_path)
    try:
        assert not trees.perfsuite_in_trees
        assert (trees.reference / "src" / "my_engine" / "__init__.py").read_text() == "VERSION = 1\n"
        installed = Path(perfsuite.__file__).resolve().parent.parent
        pair = ABRunner(trees, LOAD, timeout=1.0, start=lambda side: side)
        sides = [runner.side for runner in (*pair.references, *pair.currents)]
        assert {side.perfsuite_home for side in sides} == {installed}
        assert {side.tree for side in sides} == {trees.reference, trees.current}
    finally:
        trees.remove()


def hello_from(perfsuite_file: Path) -> wire.Hello:
    return wire.Hello(wire.PROTOCOL_VERSION, str(perfsuite_file.parent), str(perfsuite_file), 1, sys.executable)


def test_a_project_side_must_import_the_installed_perfsuite_not_one_in_its_tree(tmp_path):
    installed = tmp_path / "site-packages"
    side = Side("A", "REF HEAD~1", tmp_path / "tree", perfsuite_from=installed)
    worker = object.__new__(Worker)  # the check alone, without a process
    worker.side = side
    worker.hello = hello_from(installed / "perfsuite" / "__init__.py")
    worker._check_tree()
    worker.hello = hello_from(tmp_path / "tree" / "perfsuite" / "__init__.py")
    with pytest.raises(WorkerError, match="not the installed one the session runs"):
        worker._check_tree()


def test_a_module_the_tree_lacks_is_not_taken_from_another_perfsuite_and_the_worker_names_it(tmp_path):
    """Issue 37: REF's tree had no ``perfsuite/adapters`` and side A ran the current tree's, which an editable
    install's finder supplied. Here the tree's perfsuite itself reaches into the current one, the same fallback."""
    here = Path(perfsuite.__file__).resolve().parent
    package = tmp_path / "tree" / "perfsuite"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"__path__.append({str(here)!r})\n")
    worker = Worker(Side("A", "REF old", tmp_path / "tree"))
    try:
        assert Path(worker.hello.perfsuite_file) == package / "__init__.py"
        build = wire.Build("inflight:2", "inflight", {"batch_size": 2, "max_seq_len": 64})
        with pytest.raises(WorkerError) as error:
            worker.request(build, wire.Built, 30, "build inflight")
        assert str(error.value) == (
            f"worker A, REF old failed to build inflight: ImportError: perfsuite.adapters was imported from "
            f"{here / 'adapters' / '__init__.py'}, not from this side's perfsuite ({package}): the tree lacks that "
            "module and another perfsuite on the path supplied it; give a REF whose tree has it"
        )
        with pytest.raises(WorkerError, match="perfsuite.adapters was imported from"):
            worker.request(wire.Tokenize("hi"), wire.Tokens, 30, "tokenize")  # tainted for good
    finally:
        worker.close()


def test_a_project_checkout_is_a_ref_but_an_empty_directory_is_not(project_repo, tmp_path):
    other = tmp_path / "other-checkout"
    shutil.copytree(project_repo, other)
    trees = prepare_trees(str(other), project_repo, invocation_dir=tmp_path)
    assert trees.reference == other.resolve() and not trees.perfsuite_in_trees
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ReferenceError, match=f"--perf-against {empty}: {empty} is empty"):
        prepare_trees(str(empty), project_repo, invocation_dir=tmp_path)


def test_sigterm_to_a_session_that_laid_out_ref_removes_the_snapshot(repo, tmp_path):
    """``kill -TERM`` unwinds like Ctrl-C, here past every handler, and the snapshot goes all the same."""
    script = tmp_path / "session.py"
    script.write_text(SESSION_WAITING_FOR_SIGTERM)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), *sys.path])}
    process = subprocess.Popen([sys.executable, str(script), str(repo / "project")], stdout=subprocess.PIPE,
                               text=True, env=env)  # fmt: skip
    snapshot = Path(process.stdout.readline().strip())
    assert snapshot.name.startswith("perfsuite-ab-") and snapshot.is_dir()
    process.terminate()
    process.communicate(timeout=60)
    assert not snapshot.exists()


SESSION_WAITING_FOR_SIGTERM = """
import sys
import time
from pathlib import Path

from perfsuite.ab import wire
from perfsuite.plugin import against


class IdleRunner:
    def __init__(self, trees, load, timeout, workers_per_side):
        pass

    def start(self):
        pass

    def close(self):
        pass


against.ABRunner = IdleRunner  # no workers, no model: only the snapshot is at stake here
project = Path(sys.argv[1])
session = against.start_against("HEAD~1", project, project, wire.Load("none", "cpu", "float32", "packed"), 1.0, 1)
print(session.trees.snapshot, flush=True)
time.sleep(120)
"""


def test_a_ref_outside_any_repository_asks_for_a_path(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(ReferenceError, match="not in a git repository.*pass a path to another checkout"):
        prepare_trees("main", plain, invocation_dir=tmp_path)


def test_a_ref_without_the_projects_folder_says_which_folder(repo, tmp_path):
    (repo / "newer").mkdir()
    (repo / "newer" / "x.py").write_text("")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "three")
    with pytest.raises(ReferenceError, match="has no newer/ folder"):
        prepare_trees("HEAD~2", repo / "newer", invocation_dir=tmp_path)


def test_three_more_copies_are_counted_and_fewer_workers_suggested():
    check_room_for_other_copies(LOADED, 3)  # 10 000 free for 3 x 1.5 x 1 000: fine
    roomy_for_one = wire.Loaded("cpu", model_bytes=2 * 2**30, free_bytes=4 * 2**30, max_context=256, eos_token_id=2,
                                vocab_size=320)  # fmt: skip
    check_room_for_other_copies(roomy_for_one, 1)
    with pytest.raises(NoRoomForSecondCopy) as error:
        check_room_for_other_copies(roomy_for_one, 3)
    assert "3 more copies (one per worker)" in str(error.value) and "about 9.00 GiB" in str(error.value)
    assert "--perf-against-workers 1" in str(error.value)


def test_a_refused_start_leaves_only_the_first_worker_which_close_stops(monkeypatch):
    starts: list = []
    runner = fake_runner([], starts=starts, workers_per_side=2)
    original = FakeWorker.request

    def tight(self, message, answer, timeout, what):
        if isinstance(message, wire.Load):
            return wire.Loaded("cpu", model_bytes=1000, free_bytes=2000, max_context=256, eos_token_id=2,
                               vocab_size=320)  # fmt: skip
        return original(self, message, answer, timeout, what)

    monkeypatch.setattr(FakeWorker, "request", tight)
    with pytest.raises(NoRoomForSecondCopy):
        runner.start()
    assert len(starts) == 1, "no other worker is started once the memory check fails"
    runner.close()
    assert starts[0].closed


# -- a busy runner: the workers' threads and the CPU readings around each run ---------------------------------------


class ScriptedMachine:
    """/proc/stat of a 2-CPU machine on which other work uses ``foreign_cores`` and the workers ``worker_cores``.

    Each reading advances the clock by ``step`` seconds. The machine counts
    the CPU time really used; the meter says how much of it is the session's
    own (``own_seconds``), which is what the test checks.
    """

    HZ = 100

    def __init__(self, foreign_cores: float, worker_cores: float = 0.0, step: float = 1.0) -> None:
        self.foreign_cores, self.worker_cores, self.step = foreign_cores, worker_cores, step
        self.clock = self.foreign_seconds = self.worker_seconds = 0.0

    def __call__(self, own_seconds):
        self.clock += self.step
        self.foreign_seconds += self.foreign_cores * self.step
        self.worker_seconds += self.worker_cores * self.step
        own = own_seconds()
        used = int((time.process_time() + self.worker_seconds + self.foreign_seconds) * self.HZ)
        total = int(2 * self.clock * self.HZ)
        ticks = CpuTicks(user=used, nice=0, system=0, idle=total - used, iowait=0, irq=0, softirq=0, steal=0,
                         num_cpus=2)  # fmt: skip
        return CpuSample(ticks, process_seconds=own, clock_seconds=self.clock)


@pytest.fixture
def two_cpus(monkeypatch):
    monkeypatch.setattr("perfsuite.ab.pair.os.sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr("perfsuite.measure.contention._ticks_per_second", lambda: ScriptedMachine.HZ)


def test_with_one_core_held_by_other_work_every_worker_of_both_sides_runs_one_thread(two_cpus):
    log, starts = [], []
    runner = fake_runner(log, starts=starts, workers_per_side=2, read_cpu=ScriptedMachine(foreign_cores=1.0))
    runner.start()
    paired = runner.run_pairs(SPEC, REQUESTS, None, num_warmups=1, num_pairs=4)
    assert paired.num_threads == 1
    assert [w.threads for w in starts] == [[1]] * 4, "both sides, every worker, the same count, once"
    assert len(log) == 4 + 8, "set before the warm-ups, then nothing else changes"


def test_on_a_quiet_machine_the_workers_keep_a_thread_per_core(two_cpus):
    starts = []
    paired = fake_runner([], starts=starts, read_cpu=ScriptedMachine(foreign_cores=0.1)).run_pairs(
        SPEC, REQUESTS, None, num_warmups=0, num_pairs=2
    )
    assert paired.num_threads == 2 and [w.threads for w in starts] == [[2], [2]]


def test_threads_given_are_used_as_they_are_and_a_worker_started_again_gets_them_again(two_cpus):
    starts = []
    runner = fake_runner([], starts=starts, read_cpu=ScriptedMachine(foreign_cores=1.0))
    runner.start()
    assert runner.run_pairs(SPEC, REQUESTS, None, num_warmups=0, num_pairs=2, threads=2).num_threads == 2
    starts[1].alive = False  # REF's worker died between tests
    runner.run_pairs(SPEC, REQUESTS, None, num_warmups=0, num_pairs=2, threads=2)
    assert starts[2].side.label == "A" and starts[2].threads == [2, 2], "at its start, then for the test"


def test_off_the_cpu_the_threads_are_left_as_loaded(two_cpus):
    starts = []
    runner = fake_runner([], starts=starts, read_cpu=ScriptedMachine(foreign_cores=1.0))
    runner.start()
    runner.currents[0].loaded = dataclasses.replace(LOADED, device="cuda:0")
    paired = runner.run_pairs(SPEC, REQUESTS, None, num_warmups=0, num_pairs=2)
    assert paired.num_threads is None and all(w.threads == [] for w in starts)


def test_each_run_of_each_side_carries_the_share_of_the_machine_other_work_used(two_cpus, monkeypatch):
    machine = ScriptedMachine(foreign_cores=0.5, worker_cores=1.0)
    starts = []
    runner = fake_runner([], starts=starts, read_cpu=machine)
    runner.start()
    for number, worker in enumerate(starts):
        worker.pid = 1000 + number
    # the two workers share the machine's worker time: the session's own, not other work
    monkeypatch.setattr("perfsuite.ab.pair.process_cpu_seconds", lambda pid: machine.worker_seconds / 2)
    paired = runner.run_pairs(SPEC, REQUESTS, None, num_warmups=0, num_pairs=3)
    assert len(paired.reference_busy) == len(paired.current_busy) == 3
    assert all(share == pytest.approx(0.25, abs=0.02) for share in paired.reference_busy + paired.current_busy), (
        "half a core of two is a quarter of the machine; the workers' own core is not counted as other work"
    )


def test_without_readings_no_run_carries_any():
    paired = fake_runner([]).run_pairs(SPEC, REQUESTS, None, num_warmups=0, num_pairs=2, threads=1)
    assert paired.reference_busy == paired.current_busy == ()


def test_paired_runs_refuse_readings_that_do_not_match_the_pairs():
    same = run_result("e", {"r0": 3})
    with pytest.raises(ValueError, match="one CPU reading per run of each side"):
        PairedRuns((same, same), (same, same), ("AB", "BA"), reference_busy=(0.1, 0.2), current_busy=(0.1,))


@pytest.mark.parametrize(("text", "value"), [("auto", "auto"), ("1", 1), ("16", 16)])
def test_the_worker_threads_option_takes_auto_or_a_count(text, value):
    from perfsuite.plugin.options import worker_threads

    assert worker_threads(text) == value


@pytest.mark.parametrize("text", ["0", "-2", "two", ""])
def test_the_worker_threads_option_refuses_anything_else_saying_what_it_takes(text):
    import argparse

    from perfsuite.plugin.options import worker_threads

    with pytest.raises(argparse.ArgumentTypeError, match="auto or a number of threads"):
        worker_threads(text)
