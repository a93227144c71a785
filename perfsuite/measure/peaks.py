"""This machine's two roofs, measured: peak FLOP/s at the model's dtype and peak memory bandwidth.

MFU and MBU (``perfsuite.measure.utilization``) divide a run's achieved rates
by these. They are measured, not looked up, because a CPU's or a shared VM's
peak is in no datasheet: the best of several timings of one large matmul at
the model's dtype (compute-bound), and of one large copy and one large sum
(memory-bound), the faster of the two giving the bandwidth roof. A decode
step mostly reads; on a CPU a copy's stores also read each target line before
writing it (write-allocate), so a copy alone can under-read the roof. For
known GPUs the datasheet's dense peaks are kept beside them, labelled as such,
never used in their place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Datasheet peaks, dense (no sparsity): bfloat16/float16 tensor-core FLOP/s and memory bytes/s. Matched by
# substring of the device name, longest first (NVIDIA's product pages; the SXM parts, and A100 80GB).
DATASHEET_PEAKS: dict[str, tuple[float, float]] = {
    "H200": (989e12, 4.8e12),
    "H100": (989e12, 3.35e12),
    "A100": (312e12, 2.039e12),
    "L4": (121e12, 300e9),
}
DATASHEET_DTYPES = ("bfloat16", "float16")  # the datasheet's FLOP/s are for these

CPU_MATMUL_SIZE = 1024  # 2.1 GFLOP a product: some 10 ms a core on a recent x86 core at float32
CPU_COPY_BYTES = 128 * 2**20  # far past any last-level cache
CUDA_MATMUL_SIZE = 8192
CUDA_COPY_BYTES = 2 * 2**30


@dataclass(frozen=True, slots=True)
class MachinePeaks:
    """Peak FLOP/s (at ``dtype``) and bytes/s, measured here; the datasheet's for a known GPU (else None)."""

    device: str
    dtype: str
    flops_per_second: float
    bytes_per_second: float
    datasheet_flops_per_second: float | None = None
    datasheet_bytes_per_second: float | None = None

    @property
    def ridge_point(self) -> float:
        """FLOPs per byte where the two roofs meet: a step below it is memory-bound."""
        return self.flops_per_second / self.bytes_per_second


def datasheet_peaks(device_name: str, dtype: str) -> tuple[float | None, float | None]:
    """The datasheet's (FLOP/s, bytes/s) of a known GPU; FLOP/s only for the dtypes it is quoted at."""
    for name in sorted(DATASHEET_PEAKS, key=len, reverse=True):
        if name in device_name.upper():
            flops, bandwidth = DATASHEET_PEAKS[name]
            return (flops if dtype in DATASHEET_DTYPES else None), bandwidth
    return None, None


def peaks_from_timings(
    device: str,
    dtype: str,
    matmul_seconds: float,
    matmul_size: int,
    copy_seconds: float,
    copy_bytes: int,
    device_name: str = "",
    read_seconds: float | None = None,
) -> MachinePeaks:
    """Peaks from the best timings: a square matmul does 2 n^3 FLOPs, a copy reads and writes its bytes, a
    sum over the copy's source reads them once; the bandwidth is the faster of the copy and the sum."""
    datasheet_flops, datasheet_bytes = datasheet_peaks(device_name, dtype)
    return MachinePeaks(
        device=device_name or device,
        dtype=dtype,
        flops_per_second=2 * matmul_size**3 / matmul_seconds,
        bytes_per_second=max(2 * copy_bytes / copy_seconds, copy_bytes / read_seconds if read_seconds else 0.0),
        datasheet_flops_per_second=datasheet_flops,
        datasheet_bytes_per_second=datasheet_bytes,
    )


def best_seconds(
    operation: Callable[[], object], trials: int, iterations: int, timer: Callable[[Callable[[], object], int], float]
) -> float:
    """The fastest of ``trials`` timings: a peak is what the machine can do, not what it usually does."""
    return min(timer(operation, iterations) for _ in range(trials))


def measure_peaks(device: str, dtype: str, trials: int = 5) -> MachinePeaks:
    """Time the two roofs on ``device`` at ``dtype`` (about a second on a 2-core CPU)."""
    import torch

    from perfsuite.measure.probe import _cuda_seconds_per_call, seconds_per_call

    is_cuda = device.startswith("cuda")
    timer = _cuda_seconds_per_call if is_cuda else seconds_per_call
    torch_dtype = getattr(torch, dtype)
    size = CUDA_MATMUL_SIZE if is_cuda else CPU_MATMUL_SIZE
    generator = torch.Generator().manual_seed(0)
    left, right = (torch.randn(size, size, generator=generator).to(device=device, dtype=torch_dtype) for _ in "lr")
    copy_bytes = CUDA_COPY_BYTES if is_cuda else CPU_COPY_BYTES
    source = torch.ones(copy_bytes // 4, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    matmul = best_seconds(lambda: torch.mm(left, right), trials, 3, timer)
    copy = best_seconds(lambda: target.copy_(source), trials, 3, timer)
    read = best_seconds(lambda: source.sum(), trials, 3, timer)
    name = torch.cuda.get_device_name(device) if is_cuda else "cpu"
    return peaks_from_timings(device, dtype, matmul, size, copy, copy_bytes, device_name=name, read_seconds=read)
