"""A/B on a cluster (``--perf-against`` with ``--perf-ray``) without a cluster: what of the two trees travels to a
node, the typed messages, the A/B pool's answers, and the usage errors that come before any Ray."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from perfsuite.ab.on_ray import paired_runs
from perfsuite.ab.packing import PackingError, pack_tree, tree_files, unpack_tree
from perfsuite.ab.snapshots import OWNER_FILE
from perfsuite.ab.workers import engine_id
from perfsuite.adapters import EngineConfig
from perfsuite.adapters.registry import EngineSpec
from perfsuite.cluster import wire
from perfsuite.engine.types import EngineCounters, FinishReason, Request, RequestRecord, RunResult, SamplingParams
from perfsuite.measure.environment import Environment

pytest_plugins = ["pytester"]

NODE = wire.NodeInfo("a" * 56, "gpu-7", "10.0.0.7")
ENVIRONMENT = Environment("cpu", "2.13.0", "4.57", "float32", "tiny-random", "Some CPU", 2)
SPEC = wire.ActorModel("tiny-random", "cpu", "float32", "packed")
SETUP = wire.PairSetup("origin/main", "c" * 40, "d" * 40, True, SPEC, workers_per_side=2, timeout=600.0)
PAIRS = wire.PairRequest(
    "suites/test_x.py::test_x[static]", EngineSpec("static", EngineConfig(2, 64, num_kv_blocks=9)),
    (Request("r0", (1, 2, 3), SamplingParams(3, ignore_eos=True)),), max_concurrency=None, warmup_runs=1,
    num_pairs=2, threads=1,
)  # fmt: skip
RUN = RunResult("static", (RequestRecord("r0", 3, (5, 6), 0.0, 0.01, (0.1, 0.2), 0.2, FinishReason.LENGTH),),
                0.0, 0.25, EngineCounters(num_forward_passes=3))  # fmt: skip
RESULT = wire.PairResult(PAIRS.test_id, NODE, ENVIRONMENT, (RUN, RUN), (RUN, RUN), ("AB", "BA"), (0, 0),
                         (0.0, 0.1), (0.2, 0.0), num_threads=1)  # fmt: skip


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def work_tree(tmp_path) -> Path:
    """A git work tree with one of each kind of file, and a folder of it the project lies in."""
    repo = tmp_path / "repo"
    project = repo / "project"
    (project / "pkg" / "__pycache__").mkdir(parents=True)
    (project / "pkg" / "__init__.py").write_text("VERSION = 'committed'\n")
    (project / "gone.py").write_text("deleted from the working tree after the commit\n")
    (project / ".gitignore").write_text(".venv/\n*.log\n")
    (repo / "outside.py").write_text("in the repository, not in the project's folder\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "perfsuite@example.invalid")
    git(repo, "config", "user.name", "perfsuite tests")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the project")
    (project / "gone.py").unlink()
    (project / "pkg" / "__init__.py").write_text("VERSION = 'edited'\n")  # not committed: the current tree has it
    (project / "new.py").write_text("untracked, not ignored\n")
    (project / ".venv").mkdir()
    (project / ".venv" / "python").write_text("ignored\n")
    (project / "run.log").write_text("ignored\n")
    (project / "pkg" / "__pycache__" / "x.pyc").write_bytes(b"\0")  # not ignored here, but byte-code never travels
    (project / "link-in.py").symlink_to("new.py")
    (project / "link-out").symlink_to(tmp_path)
    return project


def unpacked(archive: bytes, into: Path) -> dict[str, str]:
    unpack_tree(archive, into)
    return {p.relative_to(into).as_posix(): p.read_text() for p in sorted(into.rglob("*")) if p.is_file()}


def test_a_folder_in_a_git_work_tree_travels_as_git_sees_it_and_comes_back_the_same(work_tree, tmp_path):
    packed = pack_tree(work_tree)

    files = unpacked(packed.archive, tmp_path / "node")
    assert sorted(files) == [".gitignore", "link-in.py", "new.py", "pkg/__init__.py"]
    assert files["pkg/__init__.py"] == "VERSION = 'edited'\n", "the working tree as it is, edits included"
    assert (tmp_path / "node" / "link-in.py").is_symlink(), "a link inside the tree stays a link"
    assert packed.left_out == ("link-out",), "a link out of the tree would point at nothing on the node: named"
    assert packed.num_files == len(files)


def test_a_folder_outside_git_travels_whole_but_for_byte_code_and_the_snapshots_owner(tmp_path):
    snapshot = tmp_path / "perfsuite-ab-1234"
    (snapshot / "pkg" / "__pycache__").mkdir(parents=True)
    (snapshot / "pkg" / "__init__.py").write_text("x = 1\n")
    (snapshot / "pkg" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (snapshot / ".git").mkdir()
    (snapshot / ".git" / "HEAD").write_text("ref\n")
    (snapshot / OWNER_FILE).write_text("{}")
    (snapshot / "pkg" / OWNER_FILE).write_text("a file of the project that has the name")

    assert tree_files(snapshot) == ["pkg/.perfsuite-ab-owner.json", "pkg/__init__.py"]


def test_a_tree_that_is_no_folder_or_an_archive_that_is_no_tree_is_refused_naming_it(tmp_path):
    with pytest.raises(PackingError, match=r"missing is not a folder: give a git ref or a checkout's path"):
        pack_tree(tmp_path / "missing")
    with pytest.raises(PackingError, match=r"cannot unpack a tree into .*node: "):
        unpack_tree(b"not a tarball", tmp_path / "node")
    outside = io.BytesIO()
    with tarfile.open(fileobj=outside, mode="w:gz") as tar:
        member = tarfile.TarInfo("../escaped.py")
        tar.addfile(member, io.BytesIO(b""))
    with pytest.raises(PackingError, match="cannot unpack a tree"):
        unpack_tree(outside.getvalue(), tmp_path / "node")
    assert not (tmp_path / "escaped.py").exists()


def test_ref_and_the_current_tree_are_packed_from_their_own_commits_and_refs_snapshot_is_gone(work_tree, tmp_path):
    from perfsuite.plugin.against_on_ray import package_trees

    trees, reference, current = package_trees("HEAD", work_tree, work_tree)

    assert trees.commit == git(work_tree, "rev-parse", "HEAD") and trees.snapshot is not None
    assert not trees.snapshot.exists(), "REF's snapshot is removed once packed: only the tarball travels"
    ref_files = unpacked(reference.archive, tmp_path / "ref")
    assert ref_files["pkg/__init__.py"] == "VERSION = 'committed'\n" and "gone.py" in ref_files
    assert "outside.py" not in ref_files, "the project's folder of REF, as the local A/B lays it out"
    assert unpacked(current.archive, tmp_path / "current")["pkg/__init__.py"] == "VERSION = 'edited'\n"


def test_a_ref_that_does_not_exist_is_a_usage_error_naming_it_before_any_cluster(work_tree):
    from perfsuite.plugin.against_on_ray import package_trees

    with pytest.raises(pytest.UsageError, match=r"--perf-against no-such-ref: not a commit of the repository at .*"
                                                r"check the name \(git log no-such-ref\)"):  # fmt: skip
        package_trees("no-such-ref", work_tree, work_tree)


# -- the messages ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("message", [SETUP, PAIRS, RESULT, wire.PairFailed(PAIRS.test_id, NODE, "worker A died")],
                         ids=lambda m: type(m).__name__)  # fmt: skip
def test_each_ab_message_travels_as_typed_json_and_comes_back_equal(message):
    text = wire.dumps(message)
    assert json.loads(text)["v"] == wire.PROTOCOL_VERSION
    assert wire.loads(type(message), text) == message


def test_an_answer_is_read_as_whichever_expected_message_it_is_and_nothing_else():
    failed = wire.PairFailed(PAIRS.test_id, NODE, "worker B#1 died")
    either = (wire.PairResult, wire.PairFailed)
    assert wire.loads_one_of(either, wire.dumps(RESULT)) == RESULT
    assert wire.loads_one_of(either, wire.dumps(failed)) == failed
    with pytest.raises(wire.ClusterWireError, match="expected a PairResult or PairFailed message, got 'PairRequest'"):
        wire.loads_one_of(either, wire.dumps(PAIRS))


def test_a_nodes_pairs_become_the_paired_runs_a_local_session_judges():
    paired = paired_runs(RESULT)
    assert (paired.reference, paired.current, paired.order) == (RESULT.reference, RESULT.current, ("AB", "BA"))
    assert (paired.workers, paired.reference_busy, paired.current_busy, paired.num_threads) == (
        (0, 0), (0.0, 0.1), (0.2, 0.0), 1)  # fmt: skip


# -- the A/B pool, its calls to Ray stubbed --------------------------------------------------------------------------


class FakeActor:
    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers

    def __getattr__(self, method):
        answer = self.answers[method]
        return type("Method", (), {"remote": staticmethod(lambda *args: answer)})


@pytest.fixture
def pair_pool(monkeypatch):
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'perfsuite[ray]'")
    from perfsuite.cluster.pairs import PairPool

    pool = PairPool("auto", SETUP, b"ref", b"current", actor_class=object)
    monkeypatch.setattr(pool, "_usable_nodes", lambda must_have_one=True: [NODE])
    monkeypatch.setattr(pool, "_get", lambda ref, node, timeout, what: ref)  # the fake actor answers at once
    return pool


def described(node: wire.NodeInfo) -> str:
    return wire.dumps(wire.Described(node, ENVIRONMENT, "cpu", 64, None, 100))


def test_a_nodes_pairs_come_back_typed_with_the_node(pair_pool):
    pair_pool._actors[NODE.node_id] = FakeActor({"describe": described(NODE), "run_pairs": wire.dumps(RESULT)})
    delivered = pair_pool.measure_pairs(PAIRS)
    assert delivered.result == RESULT and delivered.retried_after is None


@pytest.mark.parametrize(
    ("answers", "message"),
    [
        ({"describe": wire.dumps(wire.PairFailed("", NODE, "worker A#1, REF origin/main failed to start"))},
         r"^on node gpu-7 \(10.0.0.7, node aaaaaaaaaaaa\): worker A#1, REF origin/main failed to start$"),
        ({"describe": described(NODE), "run_pairs": wire.dumps(wire.PairFailed(PAIRS.test_id, NODE, "B#2 died"))},
         r"^on node gpu-7 \(10.0.0.7, node aaaaaaaaaaaa\): B#2 died$"),
        ({"describe": described(NODE),
          "run_pairs": wire.dumps(wire.PairResult(PAIRS.test_id, wire.NodeInfo("b" * 56, "gpu-8", "10.0.0.8"),
                                                  ENVIRONMENT, (RUN,), (RUN,), ("AB",)))},
         r"asked node gpu-7 .*, answered by gpu-8"),
    ],
    ids=["a-side-fails-to-start", "a-side-fails-a-test", "another-node-answers"],
)
def test_what_goes_wrong_on_a_node_fails_the_test_naming_the_node(pair_pool, answers, message):
    from perfsuite.cluster.pool import ClusterError

    pair_pool._actors[NODE.node_id] = FakeActor(answers)
    with pytest.raises(ClusterError, match=message):
        pair_pool.measure_pairs(PAIRS)
    assert NODE.node_id not in pair_pool._dead, "the tree's doing, not the node's: the node takes later tests"


def test_a_whole_test_has_a_run_timeout_per_run_of_each_side_and_a_start(pair_pool):
    from perfsuite.cluster.pool import START_SECONDS

    # 2 pairs of 2 runs, and per side 2 workers that each warm up once and build the engine once: 12 runs
    assert pair_pool._pairs_seconds(PAIRS) == 600.0 * 12 + START_SECONDS


def test_ab_with_a_cluster_is_no_longer_refused_when_the_options_are_read(pytester):
    pytester.makepyfile("def test_nothing(): pass")  # no perf test: nothing is packed, no cluster joined
    result = pytester.runpytest_inprocess("--perf", "-p", "no:cacheprovider", "--perf-ray", "auto",
                                          "--perf-against", "HEAD")  # fmt: skip
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()


def test_the_bundle_of_a_placement_group_holds_no_zero_resource():
    from perfsuite.cluster.pool import Requirement

    assert Requirement.for_device("cpu").bundle() == {"CPU": 1}
    assert Requirement.for_device("cuda").bundle() == {"GPU": 1}


def test_a_node_that_dies_fails_only_its_attempt_and_every_pair_is_run_again_on_another(pair_pool, monkeypatch):
    from perfsuite.cluster.pool import _ActorDied

    other = wire.NodeInfo("b" * 56, "gpu-8", "10.0.0.8")
    monkeypatch.setattr(pair_pool, "_usable_nodes", lambda must_have_one=True: [
        n for n in (NODE, other) if n.node_id not in pair_pool._dead])  # fmt: skip
    on_other = wire.PairResult(PAIRS.test_id, other, ENVIRONMENT, (RUN,), (RUN,), ("AB",))
    pair_pool._actors[NODE.node_id] = FakeActor({"describe": described(NODE), "run_pairs": "its node dies first"})
    pair_pool._actors[other.node_id] = FakeActor({"describe": described(other), "run_pairs": wire.dumps(on_other)})
    removed = []
    monkeypatch.setattr(pair_pool, "_remove_group", removed.append)

    def get(ref, node, timeout, what):
        if node is NODE and what.startswith("measure"):
            pair_pool._dead.add(node.node_id)
            pair_pool._drop(node, kill=False)
            raise _ActorDied(node, f"the actor on node {node} died during `{what}`")
        return ref

    monkeypatch.setattr(pair_pool, "_get", get)
    delivered = pair_pool.measure_pairs(PAIRS)
    assert delivered.result == on_other, "every pair from the other node: samples never mix nodes"
    assert "gpu-7 (10.0.0.7, node aaaaaaaaaaaa) died during `measure" in delivered.retried_after
    assert removed == [NODE.node_id], "the dead node's placement group is removed with its actor"


# -- the node's A/B actor, its runner and Ray stubbed ------------------------------------------------------------------


class FakeRunner:
    """Stands in for ``ABRunner``: records the trees it was given; ``fail`` makes every call a worker's failure."""

    fail: str | None = None

    def __init__(self, trees, load, timeout, workers_per_side):
        self.trees, self.load, self.timeout, self.workers_per_side = trees, load, timeout, workers_per_side
        self.closed = False
        from perfsuite.ab import wire as ab_wire

        self.loaded = ab_wire.Loaded("cpu", 10, None, 64, None, 100)

    def _maybe_fail(self):
        from perfsuite.ab.workers import WorkerError

        if self.fail:
            raise WorkerError(self.fail)

    def start(self):
        self._maybe_fail()

    def build(self, spec):
        from perfsuite.ab import wire as ab_wire

        self._maybe_fail()
        key = engine_id(spec)
        return ab_wire.Built(key, spec.name, spec.config.batch_size), ab_wire.Built(
            key, spec.name, spec.config.batch_size, runs_in_process=False)  # fmt: skip

    def run_pairs(self, spec, requests, max_concurrency, num_warmups, num_pairs, threads):
        from perfsuite.ab.pair import PairedRuns

        self._maybe_fail()
        return PairedRuns((RUN,) * num_pairs, (RUN,) * num_pairs, ("AB", "BA")[:num_pairs], num_threads=threads)

    def close(self):
        self.closed = True


@pytest.fixture
def node_actor(monkeypatch, tmp_path, work_tree):
    import tempfile

    from perfsuite.ab import on_ray
    from perfsuite.cluster import actor
    from perfsuite.measure import environment

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "node-tmp"))
    (tmp_path / "node-tmp").mkdir()
    monkeypatch.setattr(on_ray, "ABRunner", FakeRunner)
    monkeypatch.setattr(actor, "this_node", lambda: NODE)
    monkeypatch.setattr(environment, "capture_environment", lambda model, dtype, device: ENVIRONMENT)
    FakeRunner.fail = None
    archive = pack_tree(work_tree).archive
    return on_ray.PairActor(wire.dumps(SETUP), archive, archive), tmp_path / "node-tmp"


def test_the_node_actor_unpacks_both_trees_starts_both_sides_and_answers_typed(node_actor):
    pair_actor, node_tmp = node_actor
    (folder,) = node_tmp.glob("perfsuite-ab-on-ray-*")
    runner = pair_actor._runner
    assert (runner.trees.reference, runner.trees.current) == (folder / "reference", folder / "current")
    assert (folder / "current" / "pkg" / "__init__.py").read_text() == "VERSION = 'edited'\n"
    assert runner.trees.reference_label == f"origin/main ({'c' * 12})" and runner.workers_per_side == 2

    described = wire.loads(wire.Described, pair_actor.describe())
    assert (described.node, described.environment, described.max_context) == (NODE, ENVIRONMENT, 64)
    result = wire.loads(wire.PairResult, pair_actor.run_pairs(wire.dumps(PAIRS)))
    assert (result.node, result.order, result.num_threads) == (NODE, ("AB", "BA"), 1)
    assert result.runs_in_process is False, "either side's engine in another process: the controller refuses it"

    pair_actor.close()
    assert runner.closed and not folder.exists(), "both sides stopped and the trees removed from the node"


def test_a_side_that_fails_on_the_node_is_answered_as_a_failure_and_the_actor_lives_on(node_actor):
    pair_actor, _ = node_actor
    FakeRunner.fail = "worker A#1, REF origin/main failed to start: ImportError"
    failed = wire.loads(wire.PairFailed, pair_actor.describe())
    assert (failed.node, failed.message) == (NODE, FakeRunner.fail)

    FakeRunner.fail = None
    assert wire.loads(wire.Described, pair_actor.describe()).node == NODE, "started at the next try"
    FakeRunner.fail = "worker B#2 died (exit code -9) during run static"
    failed = wire.loads(wire.PairFailed, pair_actor.run_pairs(wire.dumps(PAIRS)))
    assert (failed.test_id, failed.message) == (PAIRS.test_id, FakeRunner.fail)
    pair_actor.close()
