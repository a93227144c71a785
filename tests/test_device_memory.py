"""The CUDA peak memory around a run: reset before, read after, None off CUDA; through a fake torch (no GPU here)."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest

from perfsuite.measure.summaries import DEVICE_MEMORY, Repeats, summarise
from perfsuite.measure.timing import DevicePeakMemory


class FakeCuda:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.allocated = 0

    def synchronize(self, device):
        self.calls.append(("synchronize", device))

    def reset_peak_memory_stats(self, device):
        self.calls.append(("reset", device))
        self.allocated = 0

    def max_memory_allocated(self, device):
        self.calls.append(("max", device))
        return self.allocated


@pytest.fixture
def cuda(monkeypatch) -> FakeCuda:
    fake = FakeCuda()
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=fake))
    return fake


def test_on_cuda_the_peak_is_reset_before_the_run_and_read_after_it(cuda):
    cuda.allocated = 99  # an earlier run's peak: reset away
    with DevicePeakMemory("cuda:1") as memory:
        assert cuda.calls == [("synchronize", "cuda:1"), ("reset", "cuda:1")]
        cuda.allocated = 7 * 2**20
    assert memory.peak_bytes == 7 * 2**20
    assert cuda.calls[2:] == [("synchronize", "cuda:1"), ("max", "cuda:1")]


def test_off_cuda_there_is_no_peak_and_torch_is_not_asked(cuda):
    with DevicePeakMemory("cpu") as memory:
        pass
    assert memory.peak_bytes is None and cuda.calls == []


def test_a_run_that_raises_leaves_no_peak_and_the_error_goes_on(cuda):
    with pytest.raises(RuntimeError, match="out of blocks"), DevicePeakMemory("cuda") as memory:
        raise RuntimeError("out of blocks")
    assert memory.peak_bytes is None and ("max", "cuda") not in cuda.calls


def test_the_peaks_of_the_repeats_are_stored_as_samples_and_the_most_of_them_as_memory():
    from test_summaries import runs  # a fake engine's two repeats

    measured = summarise(Repeats(runs(), device_memory=(5, 11, 9)), ("output_throughput",))
    assert measured.samples[DEVICE_MEMORY] == (5, 11, 9)
    assert DEVICE_MEMORY not in summarise(Repeats(runs()), ("output_throughput",)).samples


class CountingCuda(FakeCuda):
    """Each run's peak is 1 MiB more than the last one's."""

    def max_memory_allocated(self, device):
        super().max_memory_allocated(device)
        return 2**20 * sum(1 for call in self.calls if call[0] == "max")


def backend_on(device: str):
    from perfsuite.adapters import Backend
    from test_server_identity import CountingProbe

    return Backend(runner=None, tokenize=list, eos_token_id=None, max_context=64, device=device, probe=CountingProbe())


def recorded(tmp_path, engine, device: str):
    from perfsuite.plugin.recorder import PerfRecorder
    from test_server_identity import Benchmark, requests, session

    recorder = PerfRecorder(session(tmp_path), "tests/perf/t.py::test_memory", Benchmark(), backend_on(device))
    result = recorder.measure(engine, requests())  # pytest-benchmark's JSON carries the memory figures too
    assert recorder.benchmark.extra_info["memory"] == (dataclasses.asdict(result.memory) if result.memory else None)
    return result


def test_the_recorder_keeps_each_repeats_cuda_peak_and_the_result_its_most(tmp_path, monkeypatch):
    from test_server_identity import REPEATS, in_process_engine

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=CountingCuda()))
    result = recorded(tmp_path, in_process_engine(), "cuda:0")
    assert result.measurement.samples[DEVICE_MEMORY] == tuple(2**20 * (i + 1) for i in range(REPEATS))
    assert result.memory.max_memory_allocated_bytes == 2**20 * REPEATS
    assert result.memory.num_kv_blocks == 2 and result.memory.peak_num_running == 2


def test_no_device_peak_on_cpu_nor_for_a_server_in_another_process(tmp_path, monkeypatch):
    from test_server_identity import RemoteEngine, in_process_engine

    cuda = CountingCuda()
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    on_cpu = recorded(tmp_path / "cpu", in_process_engine(), "cpu")
    assert DEVICE_MEMORY not in on_cpu.measurement.samples and on_cpu.memory.max_memory_allocated_bytes is None
    served = recorded(tmp_path / "server", RemoteEngine(), "cuda:0")
    assert DEVICE_MEMORY not in served.measurement.samples
    assert not any(call[0] in ("reset", "max") for call in cuda.calls)
