"""The machine probe: a memory-bound and a compute-bound part, in seconds per iteration, on CPU and on CUDA."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import perfsuite.measure.probe as measure  # noqa: E402
from perfsuite.measure.probe import CUDA_PROBE_BYTES, compute_probe, machine_probe, memory_probe  # noqa: E402

pytestmark = pytest.mark.timing  # reads the machine's load or must see a slowdown: run alone (conftest.py)


def test_the_cpu_probe_is_seconds_per_iteration():
    one, five = machine_probe("cpu", iterations=1), machine_probe("cpu", iterations=5)
    assert 0 < one < 1 and 0 < five < 1  # per iteration, not in total: about 6 ms here


def test_both_parts_are_seconds_per_iteration():
    for part in (memory_probe, compute_probe):
        assert 0 < part("cpu", iterations=1) < 1 and 0 < part("cpu", iterations=3) < 1, part.__name__


def test_the_probe_follows_a_slower_compute_part_as_well_as_a_slower_memory_part(monkeypatch):
    # A VM's neighbours can slow arithmetic and leave memory bandwidth alone (a prefill then slows,
    # a memory-bound probe does not): the probe must move with either part.
    monkeypatch.setattr(measure, "memory_probe", lambda device, iterations: 0.004)
    monkeypatch.setattr(measure, "compute_probe", lambda device, iterations: 0.001)
    assert machine_probe("cpu") == pytest.approx(0.002)
    monkeypatch.setattr(measure, "compute_probe", lambda device, iterations: 0.004)
    assert machine_probe("cpu") == pytest.approx(0.004), "compute twice as slow: the probe says so"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; runs on GPU runners only")
def test_the_cuda_probe_times_a_bandwidth_bound_copy_on_the_device():
    seconds = machine_probe("cuda", iterations=10)
    bandwidth = 2 * CUDA_PROBE_BYTES / seconds  # read + write per copy
    # Between a slow PCIe-class figure and any HBM today: a number near launch latency would mean it timed the host.
    assert 1e10 < bandwidth < 2e13, f"{bandwidth / 1e9:.0f} GB/s"
    assert seconds > 5e-5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; runs on GPU runners only")
def test_the_cuda_compute_part_times_the_matmul_on_the_device():
    seconds = measure.cuda_matmul_probe("cuda", iterations=10)
    flops = 2 * measure.CUDA_PROBE_MATMUL_SIZE**3 / seconds
    # Between an old consumer GPU and any accelerator today: near launch latency would mean it timed the host.
    assert 1e12 < flops < 1e16, f"{flops / 1e12:.0f} TFLOP/s"
