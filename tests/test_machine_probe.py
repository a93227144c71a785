"""The machine probe: seconds per iteration of a fixed memory-bound operation, on CPU and on CUDA."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from perfsuite.measure import CUDA_PROBE_BYTES, machine_probe  # noqa: E402


def test_the_cpu_probe_is_seconds_per_iteration():
    one, five = machine_probe("cpu", iterations=1), machine_probe("cpu", iterations=5)
    assert 0 < one < 1 and 0 < five < 1  # per iteration, not in total: about 15 ms here


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; runs on GPU runners only")
def test_the_cuda_probe_times_a_bandwidth_bound_copy_on_the_device():
    seconds = machine_probe("cuda", iterations=10)
    bandwidth = 2 * CUDA_PROBE_BYTES / seconds  # read + write per copy
    # Between a slow PCIe-class figure and any HBM today: a number near launch latency would mean it timed the host.
    assert 1e10 < bandwidth < 2e13, f"{bandwidth / 1e9:.0f} GB/s"
    assert seconds > 5e-5
