"""Baselines: atomic writes, clear errors, one directory per environment."""

from __future__ import annotations

import dataclasses
import json

import pytest

from perfsuite import storage
from perfsuite.storage import Baseline, BaselineError, BaselineStore, Environment, read_baseline

ENV = Environment("cpu", "2.13.0", "5.23.0", "float32", "smollm2-135m", "Some CPU @ 2GHz", 2)
TEST_ID = "tests/perf/test_throughput.py::test_throughput[static-B8-uniform]"


def make_baseline(**changes) -> Baseline:
    base = Baseline(
        test_id=TEST_ID,
        environment=ENV,
        commit="abc123",
        created_at="2026-11-22T00:00:00+00:00",
        samples={"output_throughput": (40.0, 41.5, 39.8)},
        counters={"num_forward_passes": 32},
        parameters={"model": "smollm2-135m"},
    )
    return dataclasses.replace(base, **changes)


def test_round_trip(tmp_path):
    store = BaselineStore(tmp_path)
    path = store.save(make_baseline())
    assert path.parent.name == ENV.fingerprint()
    assert path.name == "test_throughput.py__test_throughput[static-B8-uniform].json"
    assert store.load(TEST_ID, ENV) == make_baseline()
    assert store.load("tests/other.py::test_x", ENV) is None


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
    with pytest.raises(OSError, match="disk full"):
        store.save(make_baseline(commit="new"))
    assert path.read_text() == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{ not json", ["corrupt", "--perf-save-baseline"]),
        (json.dumps({"schema_version": 0}), ["schema_version 0", "reads 1"]),
        (json.dumps({"schema_version": 1, "test_id": "x"}), ["malformed", "--perf-save-baseline"]),
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
