"""GPU telemetry around a repeat, through NVML (``nvidia-ml-py``, ``import pynvml``; optional, absent on a CPU).

Sampled before and after each repeat: SM and memory clocks, power, temperature,
the clock throttle reasons, the board's energy counter and the processes on the
GPU. A repeat is *disturbed*, as a repeat on a busy CPU is
(``perfsuite.measure.contention``), when its clocks were throttled for a reason
other than idling (power cap, thermal, hardware slowdown...) or when another
process ran on its GPU. Its energy per output token is the energy counter's
growth over the tokens it made.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

# NVML's clocksThrottleReasons bits that say nothing about contention: the GPU idles between calls, and
# application clocks are a setting, not a slowdown.
BENIGN_THROTTLE_REASONS = 0x1 | 0x2  # GpuIdle, ApplicationsClocksSetting
THROTTLE_REASON_NAMES = {
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
    0x100: "display clock setting",
}


@dataclass(frozen=True, slots=True)
class GpuSample:
    sm_clock_mhz: int
    memory_clock_mhz: int
    power_w: float
    temperature_c: int
    throttle_reasons: int  # NVML's bit mask
    energy_mj: int | None  # the board's energy counter since the driver loaded; None: not supported
    other_processes: int  # compute processes on the GPU besides this one


@dataclass(frozen=True, slots=True)
class RepeatTelemetry:
    """The samples before and after one repeat."""

    before: GpuSample
    after: GpuSample

    @property
    def energy_joules(self) -> float | None:
        if self.before.energy_mj is None or self.after.energy_mj is None:
            return None
        return (self.after.energy_mj - self.before.energy_mj) / 1e3

    def energy_per_token(self, num_output_tokens: int) -> float | None:
        """Joules per output token over the repeat; None without an energy counter or tokens."""
        energy = self.energy_joules
        return None if energy is None or not num_output_tokens else energy / num_output_tokens

    def disturbed(self) -> str | None:
        """Why this repeat cannot be trusted (throttled clocks, another process on the GPU); None if it can."""
        reasons = (self.before.throttle_reasons | self.after.throttle_reasons) & ~BENIGN_THROTTLE_REASONS
        why = [name for bit, name in THROTTLE_REASON_NAMES.items() if reasons & bit]
        if reasons and not why:
            why.append(f"throttle reasons 0x{reasons:x}")
        others = max(self.before.other_processes, self.after.other_processes)
        if others:
            why.append(f"{others} other process(es) on the GPU")
        return ", ".join(why) or None


def disturbance_reason(repeats: list[RepeatTelemetry | None]) -> str | None:
    """Why these repeats cannot support a verdict on the GPU's account, in one line; None when none was disturbed."""
    measured = [t for t in repeats if t is not None]
    reasons = [reason for reason in (t.disturbed() for t in measured) if reason]
    if not reasons:
        return None
    return (
        f"the GPU was disturbed during {len(reasons)} of {len(measured)} repeats ({'; '.join(dict.fromkeys(reasons))})"
    )


class GpuTelemetry:
    """Samples one GPU through an NVML module (``pynvml``, or a fake with its functions)."""

    def __init__(self, nvml: Any, index: int = 0) -> None:
        self._nvml = nvml
        self._handle = nvml.nvmlDeviceGetHandleByIndex(index)

    def sample(self) -> GpuSample:
        nvml, handle = self._nvml, self._handle
        try:
            energy = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except nvml.NVMLError:
            energy = None
        processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        return GpuSample(
            sm_clock_mhz=nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            memory_clock_mhz=nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
            power_w=nvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
            temperature_c=nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
            throttle_reasons=nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle),
            energy_mj=energy,
            other_processes=sum(1 for p in processes if p.pid != os.getpid()),
        )


def open_gpu_telemetry(device: str) -> GpuTelemetry | None:
    """Telemetry of ``device`` ("cuda", "cuda:1"); None on a CPU, without ``nvidia-ml-py``, or where NVML fails."""
    if not device.startswith("cuda"):
        return None
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        return GpuTelemetry(pynvml, int(device.partition(":")[2] or 0))
    except pynvml.NVMLError:
        return None
