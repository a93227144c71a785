"""GPU telemetry's logic on a CPU, through a fake NVML module: disturbed repeats and energy per token."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest

from perfsuite.measure.gpu_telemetry import GpuTelemetry, RepeatTelemetry, open_gpu_telemetry


class FakeNvml:
    """pynvml's functions the telemetry calls, over readings a test sets."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    class NVMLError(Exception):
        pass

    def __init__(self, throttle: int = 0, energy_mj: int | None = 1_000_000, pids: tuple[int, ...] = ()) -> None:
        self.throttle, self.energy_mj, self.pids = throttle, energy_mj, pids

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("gpu", index)

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return 1980 if clock == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetPowerUsage(self, handle):
        return 350_000  # mW

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 61

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return self.throttle

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if self.energy_mj is None:
            raise self.NVMLError("not supported")
        return self.energy_mj

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=pid) for pid in (os.getpid(), *self.pids)]


def around(nvml: FakeNvml, energy_used_mj: int = 0, **during) -> RepeatTelemetry:
    telemetry = GpuTelemetry(nvml)
    before = telemetry.sample()
    nvml.energy_mj = None if nvml.energy_mj is None else nvml.energy_mj + energy_used_mj
    for name, value in during.items():
        setattr(nvml, name, value)
    return RepeatTelemetry(before, telemetry.sample())


def test_a_quiet_repeat_is_not_disturbed_and_its_energy_per_token_is_the_counters_growth():
    repeat = around(FakeNvml(throttle=0x1), energy_used_mj=64_000)  # idle between calls is no slowdown
    assert repeat.disturbed() is None
    assert repeat.energy_joules == 64.0
    assert repeat.energy_per_token(128) == 0.5
    assert repeat.after.power_w == 350.0 and repeat.after.sm_clock_mhz == 1980


def test_a_repeat_whose_clocks_throttled_is_disturbed_with_the_reason():
    assert around(FakeNvml(), throttle=0x4 | 0x40).disturbed() == "software power cap, hardware thermal slowdown"


def test_a_repeat_with_another_process_on_the_gpu_is_disturbed():
    assert around(FakeNvml(), pids=(os.getpid() + 1,)).disturbed() == "1 other process(es) on the GPU"


def test_a_gpu_without_an_energy_counter_gives_no_energy_per_token():
    assert around(FakeNvml(energy_mj=None)).energy_per_token(10) is None


def test_no_telemetry_on_a_cpu_or_without_nvidia_ml_py(monkeypatch):
    assert open_gpu_telemetry("cpu") is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert open_gpu_telemetry("cuda") is None


@pytest.mark.parametrize("failing_init", [True, False])
def test_open_gpu_telemetry_uses_pynvml_and_says_none_when_nvml_fails(monkeypatch, failing_init):
    fake = FakeNvml()

    def init():
        if failing_init:
            raise FakeNvml.NVMLError("driver not loaded")

    fake.nvmlInit = init
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    telemetry = open_gpu_telemetry("cuda:1")
    assert (telemetry is None) is failing_init


def test_the_repeats_disturbed_on_the_gpu_make_the_tests_noise_reason_like_a_busy_cpu():
    from perfsuite.measure.gpu_telemetry import disturbance_reason

    quiet, throttled = around(FakeNvml()), around(FakeNvml(), throttle=0x20)
    assert disturbance_reason([quiet, None, quiet]) is None
    assert disturbance_reason([quiet, throttled, throttled]) == (
        "the GPU was disturbed during 2 of 3 repeats (software thermal slowdown)"
    )


def test_summarise_stores_energy_per_token_per_repeat():
    from perfsuite.engine.types import EngineCounters, RunResult
    from perfsuite.measure.summaries import ENERGY_PER_TOKEN, Repeats, summarise

    run = RunResult("inflight", (), 0.0, 1.0, EngineCounters())
    measured = summarise(Repeats((run, run), energy_per_token=(0.5, 0.25)), ())
    assert measured.samples[ENERGY_PER_TOKEN] == (0.5, 0.25)
