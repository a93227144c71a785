"""Baselines: atomic writes, clear errors, one directory per environment."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from perfsuite.engine.types import EngineCounters
from perfsuite.judge import baselines as storage
from perfsuite.judge.run_config import RunConfiguration, knobs
from perfsuite.judge.baselines import Baseline, BaselineError, BaselineStore, OutputError, read_baseline
from perfsuite.measure.environment import Environment
from perfsuite.measure.summaries import SizingParameters

ENV = Environment("cpu", "2.13.0", "5.23.0", "float32", "smollm2-135m", "Some CPU @ 2GHz", 2)
TEST_ID = "tests/perf/test_throughput.py::test_throughput[static-B8-uniform]"
ELEVEN_MINUTES = 11 * 60
CONFIGURATION = RunConfiguration(
    profile="ci", workload_digest="0123456789abcdef", num_requests=8, engine="static",
    engine_knobs=knobs({"batch_size": 8, "prefill_batch_size": None, "token_budget": None}),
    decode_mode="packed", max_seq_len=128, repeats=7,
)  # fmt: skip


def make_baseline(**changes) -> Baseline:
    base = Baseline(
        test_id=TEST_ID,
        environment=ENV,
        configuration=CONFIGURATION,
        commit="abc123",
        created_at="2026-11-22T00:00:00+00:00",
        samples={"output_throughput": (40.0, 41.5, 39.8)},
        counters=EngineCounters(num_forward_passes=32),
        parameters=SizingParameters("smollm2-135m", "float32", input_length=9.5, output_length=7.0, concurrency=8),
        slo="ttft=500ms",
    )
    return dataclasses.replace(base, **changes)


def test_round_trip(tmp_path):
    store = BaselineStore(tmp_path)
    path = store.save(make_baseline())
    assert (
        path == tmp_path / ENV.fingerprint() / "tests/perf/test_throughput.py/test_throughput[static-B8-uniform].json"
    )
    assert store.load(TEST_ID, ENV) == make_baseline()
    assert store.load("tests/other.py::test_x", ENV) is None


def test_the_slo_is_stored_among_the_sizing_parameters_as_before(tmp_path):
    path = BaselineStore(tmp_path).save(make_baseline())
    parameters = json.loads(path.read_text())["parameters"]
    assert parameters == {"model": "smollm2-135m", "precision": "float32", "input_length": 9.5,
                          "output_length": 7.0, "concurrency": 8, "tensor_parallelism": 1, "slo": "ttft=500ms"}


SHIPPED = sorted((Path(__file__).parent.parent / "baselines").rglob("*.json"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_baseline_loads_typed_and_writes_back_the_same_json(path):
    baseline = read_baseline(path)
    assert isinstance(baseline.parameters, SizingParameters) and isinstance(baseline.counters, EngineCounters)
    assert baseline.to_json() == json.loads(path.read_text()), "the on-disk shape of a baseline changed"


def test_fingerprint_is_readable_stable_and_sensitive_to_every_field():
    fingerprint = ENV.fingerprint()
    assert fingerprint.startswith("cpu-smollm2-135m-float32-torch2.13.0-t2-")
    assert fingerprint == dataclasses.replace(ENV).fingerprint()
    for change in ({"num_threads": 4}, {"cpu_model": "Other"}, {"transformers_version": "5.0"}, {"dtype": "bfloat16"}):
        assert dataclasses.replace(ENV, **change).fingerprint() != fingerprint


def test_a_failed_write_leaves_the_old_baseline_and_no_temporary_file(tmp_path, monkeypatch):
    store = BaselineStore(tmp_path)
    path = store.save(make_baseline())
    before = path.read_text()

    def explode(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(storage.os, "fsync", explode)  # the temporary file is written, not yet in place
    with pytest.raises(OutputError, match="disk full"):
        store.save(make_baseline(commit="new"))
    assert path.read_text() == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{ not json", ["corrupt", "--perf-save-baseline"]),
        (json.dumps({"schema_version": 0}), ["schema_version 0", f"reads {storage.SCHEMA_VERSION}"]),
        (json.dumps({"schema_version": storage.SCHEMA_VERSION, "test_id": "x"}), ["malformed", "--perf-save-baseline"]),
        (json.dumps([1, 2]), ["schema_version None"]),
    ],
)
def test_unusable_files_name_the_file_and_the_fix(tmp_path, content, words):
    path = tmp_path / "b.json"
    path.write_text(content)
    with pytest.raises(BaselineError) as error:
        read_baseline(path)
    assert str(path) in str(error.value)
    for word in words:
        assert word in str(error.value)


def test_other_fingerprints_are_listed(tmp_path):
    store = BaselineStore(tmp_path)
    store.save(make_baseline(environment=dataclasses.replace(ENV, device_name="NVIDIA H100")))
    assert store.other_fingerprints(TEST_ID, ENV) == [dataclasses.replace(ENV, device_name="NVIDIA H100").fingerprint()]
    assert store.load(TEST_ID, ENV) is None


# --- file modes --------------------------------------------------------------------------------------


@pytest.fixture
def set_umask():
    """Set the process umask for one test and put the old one back."""
    original = os.umask(0o022)
    os.umask(original)
    yield os.umask
    os.umask(original)


@pytest.mark.parametrize("read_from_proc", [True, False], ids=["proc", "umask-call"])
@pytest.mark.parametrize(
    ("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)], ids=["umask022", "umask077", "umask002"]
)
def test_written_files_get_the_mode_open_would_give(tmp_path, monkeypatch, set_umask, umask, mode, read_from_proc):
    if not read_from_proc:
        monkeypatch.setattr(storage, "_umask_from_proc", lambda: None)
    set_umask(umask)
    path = tmp_path / "reports" / "results.json"
    storage.write_text_atomic(path, "{}\n")
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert os.umask(umask) == umask  # reading it left it as it was


# --- durability --------------------------------------------------------------------------------------


def test_the_directory_is_flushed_after_the_rename(tmp_path, monkeypatch):
    flushed = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        flushed.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(storage.os, "fsync", recording_fsync)
    storage.write_text_atomic(tmp_path / "a.txt", "x")
    assert flushed == ["file", "dir"]


def test_a_directory_that_cannot_be_flushed_is_not_an_error(tmp_path, monkeypatch):
    real_fsync = os.fsync

    def fsync_files_only(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(22, "Invalid argument")
        real_fsync(fd)

    monkeypatch.setattr(storage.os, "fsync", fsync_files_only)
    storage.write_text_atomic(tmp_path / "a.txt", "x")
    assert (tmp_path / "a.txt").read_text() == "x"


# --- stale temporary files ---------------------------------------------------------------------------


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()  # reaped, so its pid names no process (until the kernel reuses it)
    return child.pid


def make_leftover(directory, name, age_seconds):
    leftover = directory / name
    leftover.write_text("half a baseline")
    then = time.time() - age_seconds
    os.utime(leftover, (then, then))
    return leftover


def test_the_temporary_file_names_its_writer(tmp_path, monkeypatch):
    names = []
    real_replace = os.replace

    def recording_replace(source, target):
        names.append(os.path.basename(source))
        real_replace(source, target)

    monkeypatch.setattr(storage.os, "replace", recording_replace)
    storage.write_text_atomic(tmp_path / "results.json", "{}")
    assert len(names) == 1
    assert names[0].startswith(f".results.json.pid{os.getpid()}.")
    assert names[0].endswith(".tmp")


@pytest.mark.parametrize(
    ("writer", "age_seconds", "removed"),
    [
        ("dead", ELEVEN_MINUTES, True),
        ("dead", 120, True),
        ("dead", 5, False),  # another pid namespace's writer looks dead: give it a minute
        ("live", ELEVEN_MINUTES, False),  # an xdist worker writing now
        ("none", ELEVEN_MINUTES, True),  # the old format, with no pid
        ("none", 60, False),
    ],
)
def test_leftover_temporary_files_of_dead_writers_are_removed_by_a_save_once_stale(tmp_path, writer, age_seconds, removed):
    store = BaselineStore(tmp_path)
    directory = store.path_for(TEST_ID, ENV).parent
    directory.mkdir(parents=True)
    pid = {"dead": f".pid{dead_pid()}", "live": f".pid{os.getpid()}", "none": ""}[writer]
    leftover = make_leftover(directory, f".test_throughput[static-B8-uniform].json{pid}.k3j_x9a2.tmp", age_seconds)
    unrelated = make_leftover(directory, "notes.tmp", ELEVEN_MINUTES)
    store.save(make_baseline())
    assert leftover.exists() is not removed
    assert unrelated.exists()
    assert store.load(TEST_ID, ENV) == make_baseline()


# --- unwritable directories --------------------------------------------------------------------------


def assert_one_line_naming_the_fix(error: OutputError, path) -> None:
    message = str(error)
    assert "\n" not in message
    assert message.startswith(f"cannot write {path}: ")
    assert "--perf-report-dir / --perf-baseline-dir" in message


def test_a_path_under_a_regular_file_raises_output_error(tmp_path):
    (tmp_path / "reports").write_text("not a directory")
    path = tmp_path / "reports" / "sub" / "results.json"
    with pytest.raises(OutputError) as error:
        storage.write_json_atomic(path, {"a": 1})
    assert_one_line_naming_the_fix(error.value, path)
    assert f"{tmp_path / 'reports'} is not a directory; choose another directory" in str(error.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reports"]


def test_a_read_only_directory_raises_output_error_and_leaves_no_temporary_file(tmp_path):
    directory = tmp_path / "reports"
    directory.mkdir()
    directory.chmod(0o555)
    try:
        if os.access(directory, os.W_OK):
            pytest.skip("chmod does not stop this user (root) from writing")
        with pytest.raises(OutputError) as error:
            storage.write_text_atomic(directory / "results.json", "{}")
        assert_one_line_naming_the_fix(error.value, directory / "results.json")
        assert "Permission denied" in str(error.value)
        assert list(directory.iterdir()) == []
    finally:
        directory.chmod(0o755)


def test_a_failed_rename_raises_output_error_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "results.json"
    (target / "in-the-way").mkdir(parents=True)  # a non-empty directory cannot be replaced by a file, even by root
    with pytest.raises(OutputError) as error:
        storage.write_text_atomic(target, "{}")
    assert_one_line_naming_the_fix(error.value, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


@pytest.mark.parametrize(
    ("code", "why", "fix"),
    [
        (errno.ENOTDIR, "{blocker} is not a directory", "choose another"),
        (errno.EEXIST, "{blocker} is not a directory", "choose another"),
        (errno.EISDIR, "{path} is a directory", "choose another"),
        (errno.EROFS, "{directory} is on a read-only file system", "choose another"),
        (errno.EACCES, "Permission denied", "make {directory} writable or choose another"),
        (errno.EPERM, "Operation not permitted", "make {directory} writable or choose another"),
        (errno.ENOSPC, "No space left on device", "free space on the disk of {directory} or choose another"),
    ],
)
def test_why_a_file_cannot_be_written_is_said_in_words_with_its_fix(tmp_path, code, why, fix):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory should be")
    path = blocker / "sub" / "results.json" if why.startswith("{blocker}") else tmp_path / "reports" / "results.json"
    names = {"blocker": blocker, "path": path, "directory": path.parent}
    error = OSError(code, os.strerror(code), str(path.parent / ".results.json.pid1.x.tmp"))
    message = storage.cannot_write_message(path, error, "choose another directory")
    assert message == f"cannot write {path}: {why.format(**names)}; {fix.format(**names)} directory"


def test_a_full_disk_asks_for_space(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(storage.os, "fsync", full)
    with pytest.raises(OutputError, match="free space on the disk of"):
        storage.write_text_atomic(tmp_path / "a.txt", "x")


# --- baseline validation -----------------------------------------------------------------------------

NAN = float("nan")
INF = float("inf")


@pytest.mark.parametrize(
    ("field_name", "metric", "value", "shown"),
    [
        ("samples", "output_throughput", [40.0, NAN], "nan"),
        ("samples", "output_throughput", [INF], "inf"),
        ("samples", "output_throughput", [-INF], "-inf"),
        ("samples", "output_throughput", [], "empty list"),
        ("samples", "output_throughput", 40.0, "40.0"),
        ("samples", "output_throughput", "40.0", "'40.0'"),
        ("samples", "output_throughput", None, "None"),
        ("samples", "output_throughput", [40.0, "41"], "'41'"),
        ("samples", "output_throughput", [True, 40.0], "True"),
        ("samples", "output_throughput", [None], "None"),
        ("samples", "output_throughput", [10**400], "which is not a finite number"),
        ("samples", "probe_seconds", [0.1, 0.0], "0.0"),
        ("samples", "probe_seconds", [-0.1], "-0.1"),
        ("samples", "probe_seconds", [INF], "inf"),
        ("samples", "output_throughput", [-1, -2, -3], "-1, but output_throughput cannot be negative"),
        ("samples", "output_throughput", [40.0, 0.0], "0.0, but output_throughput must be above 0"),
        ("samples", "median_ttft_ms", [12.0, -0.5], "-0.5"),
        ("samples", "request_goodput", [-1.0], "-1.0"),
        ("samples", "capacity_under_slo", [0], "0, but capacity_under_slo must be above 0"),
        ("request_samples", "ttft_ms", [12.0, NAN], "nan"),
        ("request_samples", "ttft_ms", [], "empty list"),
        ("request_samples", "ttft_ms", ["12"], "'12'"),
        ("request_samples", "ttft_ms", [12.0, -3.0], "-3.0"),
        ("counters", "num_forward_passes", -1, "-1"),
        ("counters", "num_forward_passes", 3.5, "3.5"),
        ("counters", "num_forward_passes", True, "True"),
        ("counters", "num_forward_passes", "32", "'32'"),
        ("counters", "num_forward_passes", None, "None"),
    ],
)
def test_unusable_samples_and_counters_name_the_file_the_metric_and_the_value(
    tmp_path, field_name, metric, value, shown
):
    data = make_baseline().to_json()
    data[field_name] = {**data[field_name], metric: value}
    path = tmp_path / "b.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BaselineError) as error:
        read_baseline(path)
    message = str(error.value)
    for word in (str(path), f"{field_name}[{metric!r}]", shown, "re-create it with --perf-save-baseline"):
        assert word in message


@pytest.mark.parametrize(
    ("environment", "shown"),
    [
        (None, "environment is None, not an object"),
        ("cpu", "environment is 'cpu', not an object"),
        ([], "environment is [], not an object"),
        ({**dataclasses.asdict(ENV), "num_threads": "2"}, "environment['num_threads'] is '2', not int"),
        ({**dataclasses.asdict(ENV), "model": None}, "environment['model'] is None, not str"),
        ({k: v for k, v in dataclasses.asdict(ENV).items() if k != "dtype"}, "environment lacks 'dtype'"),
        ({**dataclasses.asdict(ENV), "colour": "red"}, "environment has 'colour', which this perfsuite does not know"),
        ({"kind": "server", "served_model": 7}, "environment['served_model'] is 7, not str"),
    ],
)
def test_an_unusable_environment_names_the_file_the_field_and_the_fix(tmp_path, environment, shown):
    data = {**make_baseline().to_json(), "environment": environment}
    path = tmp_path / "b.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BaselineError) as error:
        read_baseline(path)
    assert f"baseline {path}: {shown}" in str(error.value)
    assert str(error.value).endswith("; re-create it with --perf-save-baseline")


@pytest.mark.parametrize("field_name", ["samples", "request_samples", "counters"])
def test_a_field_that_is_not_an_object_is_a_baseline_error(tmp_path, field_name):
    data = make_baseline().to_json()
    data[field_name] = [1, 2]
    path = tmp_path / "b.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BaselineError, match=f"{field_name} is \\[1, 2\\]"):
        read_baseline(path)


def test_finite_positive_probes_and_integer_counters_load(tmp_path):
    baseline = make_baseline(
        samples={"output_throughput": (40.0, 41.0, 39.5), "probe_seconds": (0.01, 0.02, 0.015)},
        request_samples={"ttft_ms": (1.0, 2.0)},
        counters=EngineCounters(num_forward_passes=32, num_padding_tokens=0),
    )
    store = BaselineStore(tmp_path)
    store.save(baseline)
    assert store.load(TEST_ID, ENV) == baseline


def test_saving_a_baseline_that_could_not_be_read_back_is_refused(tmp_path):
    store = BaselineStore(tmp_path)
    with pytest.raises(BaselineError, match=r"cannot save baseline .*samples\['median_tpot_ms'\] holds nan"):
        store.save(make_baseline(samples={"median_tpot_ms": (NAN, NAN, NAN)}))
    assert not store.path_for(TEST_ID, ENV).exists()


# --- file names --------------------------------------------------------------------------------------


def test_tests_with_the_same_file_name_in_different_folders_get_different_files(tmp_path):
    store = BaselineStore(tmp_path)
    first, second = "tests/a/test_x.py::t", "tests/b/test_x.py::t"
    assert store.path_for(first, ENV) != store.path_for(second, ENV)
    assert store.path_for(first, ENV) == tmp_path / ENV.fingerprint() / "tests/a/test_x.py/t.json"
    for test_id, commit in ((first, "first"), (second, "second")):
        store.save(make_baseline(test_id=test_id, commit=commit))
    assert store.load(first, ENV).commit == "first"
    assert store.load(second, ENV).commit == "second"


@pytest.mark.parametrize(
    "test_id",
    [
        "tests/x.py::TestClass::test_m[a/b]",
        "tests/x.py::test_m[../../../etc/passwd]",
        "tests/x.py::test_m[a::b c%2F\\d:e]",
        "tests/x.py::test_m[" + "long-" * 100 + "]",
        "a-test-id-without-a-file",
        "../a-test-id-without-a-file",
    ],
)
def test_unusual_ids_stay_inside_the_fingerprint_directory_and_round_trip(tmp_path, test_id):
    store = BaselineStore(tmp_path)
    path = store.save(make_baseline(test_id=test_id))
    assert path.resolve().is_relative_to((tmp_path / ENV.fingerprint()).resolve())
    assert len(path.name) <= 255
    assert store.load(test_id, ENV).test_id == test_id


def test_ids_that_differ_only_in_escaped_characters_get_different_files(tmp_path):
    store = BaselineStore(tmp_path)
    ids = ["t.py::x[a/b]", "t.py::x[a_b]", "t.py::x[a%2Fb]", "t.py::x[a:b]", "t.py::x[a b]", "t.py/x[a]", "t.py::x[a]"]
    assert len({store.path_for(test_id, ENV) for test_id in ids}) == len(ids)


@pytest.mark.parametrize(
    "test_id",
    ["../x.py::t", "tests/../../x.py::t", "/etc/x.py::t", "tests//x.py::t", "./x.py::t", "C:/x.py::t", "", "x.py::"],
)
def test_ids_that_would_leave_the_fingerprint_directory_are_refused(tmp_path, test_id):
    store = BaselineStore(tmp_path)
    with pytest.raises(ValueError):
        store.path_for(test_id, ENV)
    with pytest.raises(ValueError):
        store.save(make_baseline(test_id=test_id))
    assert not any(tmp_path.rglob("*.json"))


def test_counters_a_baseline_predates_read_as_not_recorded_and_stay_out_of_it_when_written(tmp_path):
    path = BaselineStore(tmp_path).save(make_baseline())
    data = json.loads(path.read_text())
    data["counters"] = {"num_forward_passes": 32, "num_padding_tokens": 4}  # a baseline from before the KV counters
    path.write_text(json.dumps(data))
    baseline = read_baseline(path)
    assert baseline.counters.num_preemptions == 0 and baseline.counters.num_padding_tokens == 4
    assert "num_preemptions" in baseline.unrecorded_counters and "peak_kv_blocks_used" in baseline.unrecorded_counters
    assert "num_forward_passes" not in baseline.unrecorded_counters
    assert baseline.to_json()["counters"] == data["counters"]
    assert make_baseline().unrecorded_counters == ()


def test_a_counter_this_perfsuite_does_not_know_is_a_baseline_error(tmp_path):
    path = BaselineStore(tmp_path).save(make_baseline())
    data = json.loads(path.read_text())
    data["counters"]["num_teleports"] = 1
    path.write_text(json.dumps(data))
    with pytest.raises(BaselineError, match="num_teleports.*--perf-save-baseline"):
        read_baseline(path)


# --- strict JSON: every file perfsuite writes is standard JSON ----------------------------------------


@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_a_value_json_cannot_hold_is_refused_naming_the_file_and_where_it_lies(tmp_path, value):
    path = tmp_path / "results.json"
    path.write_text("the previous file\n")
    with pytest.raises(OutputError) as error:
        storage.write_json_atomic(path, {"tests": [{"test_id": "t", "summary": {"median_tpot_ms": value}}]})
    message = str(error.value)
    assert "\n" not in message
    for part in (f"cannot write {path}", "['tests'][0]['summary']['median_tpot_ms']", repr(value), "JSON"):
        assert part in message
    assert path.read_text() == "the previous file\n" and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
