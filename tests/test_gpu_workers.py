"""One pytest-xdist worker per GPU, checked with a fake device list (no GPU here).

The pure part (``perfsuite.plugin.gpu_workers``) takes the environment and a
device counter; the sessions below set ``CUDA_VISIBLE_DEVICES`` to two GPU
names that need not exist, since a worker only carries the name it is given.
"""

from __future__ import annotations

import pytest

from perfsuite.plugin.gpu_workers import (
    WORKER_GPU_KEY,
    GpuAssignment,
    GpuAssignmentError,
    gpus_for_workers,
    pin_worker,
    visible_gpus,
)

pytest_plugins = ["pytester"]


def no_count() -> int:
    raise AssertionError("the device count was asked for although CUDA_VISIBLE_DEVICES is set")


# -- which GPUs are visible ---------------------------------------------------------


@pytest.mark.parametrize(
    ("listed", "expected"),
    [
        ("0,1", ("0", "1")),
        (" 2 , 5 ", ("2", "5")),
        ("GPU-8f1c,GPU-77aa", ("GPU-8f1c", "GPU-77aa")),
        ("", ()),
        ("-1", ()),
        ("1,-1,2", ("1",)),  # CUDA stops at the first entry that names no device
    ],
)
def test_the_visible_gpus_are_read_as_cuda_reads_them(listed, expected):
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": listed}, no_count) == expected


def test_without_the_variable_every_device_counts():
    assert visible_gpus({}, lambda: 3) == ("0", "1", "2")
    assert visible_gpus({}, lambda: 0) == ()


# -- how many workers, on which devices ----------------------------------------------

TWO_GPUS = {"CUDA_VISIBLE_DEVICES": "3,5"}


def test_a_perf_session_on_gpus_pins_its_workers():
    assert gpus_for_workers(True, "auto", 2, TWO_GPUS, no_count) == ("3", "5")
    assert gpus_for_workers(True, "cuda", 1, TWO_GPUS, no_count) == ("3", "5"), "fewer workers than GPUs is fine"


@pytest.mark.parametrize(
    ("enabled", "device", "environ"),
    [(False, "auto", TWO_GPUS), (True, "cpu", TWO_GPUS), (True, "auto", {"CUDA_VISIBLE_DEVICES": ""})],
    ids=["without --perf", "on CPU", "no GPU visible"],
)
def test_workers_are_not_pinned_where_there_is_nothing_to_pin(enabled, device, environ):
    assert gpus_for_workers(enabled, device, 2, environ, no_count) == ()


def test_more_workers_than_gpus_is_an_error():
    expected = r"-n 3 asks for 3 workers but 2 GPUs are visible .*use -n 2 or -n auto"
    with pytest.raises(GpuAssignmentError, match=expected):
        gpus_for_workers(True, "auto", 3, TWO_GPUS, no_count)


def test_one_named_gpu_for_several_workers_is_an_error():
    with pytest.raises(GpuAssignmentError, match="--perf-device cuda:1 puts all 2 workers on one GPU"):
        gpus_for_workers(True, "cuda:1", 2, TWO_GPUS, no_count)
    assert gpus_for_workers(True, "cuda:1", 1, TWO_GPUS, no_count) == (), "one worker: it uses the GPU named"


def test_each_worker_holds_its_own_gpu_and_a_restarted_worker_takes_the_freed_one():
    assignment = GpuAssignment(("3", "5"))
    assert [assignment.assign("gw0"), assignment.assign("gw1"), assignment.assign("gw0")] == ["3", "5", "3"]
    with pytest.raises(GpuAssignmentError, match=r"worker gw2: every GPU is held \(3 by gw0, 5 by gw1\)"):
        assignment.assign("gw2")
    assignment.release("gw1")  # gw1 crashed; xdist starts gw2 in its place
    assert assignment.assign("gw2") == "5"


def test_a_worker_sets_cuda_visible_devices_to_its_gpu():
    environ = {"CUDA_VISIBLE_DEVICES": "3,5"}
    assert pin_worker({"workerid": "gw1", WORKER_GPU_KEY: "5"}, environ, lambda: False) == "5"
    assert environ == {"CUDA_VISIBLE_DEVICES": "5"}
    assert pin_worker({"workerid": "gw0"}, environ, lambda: False) is None, "the controller gave no GPU"
    assert environ == {"CUDA_VISIBLE_DEVICES": "5"}


def test_a_worker_whose_cuda_is_already_initialised_cannot_be_pinned():
    environ = {"CUDA_VISIBLE_DEVICES": "3,5"}
    with pytest.raises(GpuAssignmentError, match="worker gw0: CUDA was initialised before .* to GPU 3"):
        pin_worker({"workerid": "gw0", WORKER_GPU_KEY: "3"}, environ, lambda: True)
    assert environ == {"CUDA_VISIBLE_DEVICES": "3,5"}, "left as it was"


# -- through pytest-xdist ---------------------------------------------------------------

RECORD_WORKER_GPU = """
import os, pytest

@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        (config.rootpath / f"gpu-{worker}.txt").write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
"""


@pytest.fixture
def two_fake_gpus(pytester, monkeypatch):
    pytest.importorskip("xdist")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    pytester.makeconftest(RECORD_WORKER_GPU)
    pytester.makepyfile("def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    return pytester


def worker_gpus(pytester) -> dict[str, str]:
    return {path.stem: path.read_text() for path in sorted(pytester.path.glob("gpu-gw*.txt"))}


@pytest.mark.parametrize("num_workers", ["2", "auto"])
def test_each_xdist_worker_sees_only_its_own_gpu(two_fake_gpus, num_workers):
    result = two_fake_gpus.runpytest_subprocess("--perf", "-n", num_workers, "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    assert worker_gpus(two_fake_gpus) == {"gpu-gw0": "3", "gpu-gw1": "5"}


def test_without_perf_xdist_workers_are_left_alone(two_fake_gpus):
    result = two_fake_gpus.runpytest_subprocess("-n", "2", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    assert worker_gpus(two_fake_gpus) == {"gpu-gw0": "3,5", "gpu-gw1": "3,5"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-n", "3"], "*-n 3 asks for 3 workers but 2 GPUs are visible*use -n 2 or -n auto*"),
        (["-n", "auto", "--perf-against=HEAD"], "*--perf-against HEAD*drop -n/--dist*"),
    ],
)
def test_worker_counts_that_cannot_work_are_usage_errors(two_fake_gpus, args, message):
    result = two_fake_gpus.runpytest_subprocess("--perf", *args, "-p", "no:randomly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert worker_gpus(two_fake_gpus) == {}, "no worker started"
