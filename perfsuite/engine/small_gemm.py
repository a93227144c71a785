"""A projection over a weight packed into panels, in C, for float32 on the CPU.

oneDNN's call through torch rebuilds its primitive every time (about 13 us;
SmolLM2 makes 121 a step), and at a decode step's few rows a product is bound
by streaming its weight from memory. ``SmallGemm`` (``csrc/small_gemm.c``)
multiplies over a copy of the weight packed once into panels of 16 outputs,
in blocks of up to 8 rows by 3 panels whose sums stay in registers, each
block's weight reused down the rows from cache. On the 2-vCPU AMD EPYC VM, a
SmolLM2 step's four layer projections ran 1.5-1.8x faster than through torch's
oneDNN call at 1 to 8 rows, 1.07-1.18x at 12 to 128, and tied at 256
(``bench/vllm_gemm.py``). ``projection.KernelChooser`` times the two per shape
and machine and gives this kernel only the rows where it won.

Compiled once per CPU kind (``perfsuite.engine.c_library``); where no compiler
works, ``load_small_gemm`` says why and every projection keeps oneDNN or MKL.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from perfsuite.engine.c_library import CSRC, Unavailable, build_kernels, load_kernels

SOURCE = CSRC / "small_gemm.c"
PANEL = 16  # outputs per panel, as csrc/small_gemm.c packs them


class SmallGemm:
    """The compiled kernel: ``pack(weight)`` once, then ``self(x, packed, out_features, bias)`` per product."""

    def __init__(self, library: ctypes.CDLL) -> None:
        pointer, size = ctypes.c_void_p, ctypes.c_int64
        self._pack = library.pack_panels
        self._pack.argtypes = [pointer, pointer, size, size]
        self._pack.restype = None
        self._gemm = library.small_gemm
        self._gemm.argtypes = [pointer, pointer, pointer, pointer, size, size, size, ctypes.c_int]
        self._gemm.restype = ctypes.c_int

    @staticmethod
    def supports(weight: torch.Tensor) -> bool:
        return weight.dtype == torch.float32 and weight.is_cpu and weight.dim() == 2

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        """``weight`` [out, in] packed into panels [ceil(out / 16), in, 16], the last padded with zeros."""
        if not self.supports(weight):
            raise ValueError(f"small_gemm packs a float32 CPU matrix, got {weight.dtype} {tuple(weight.shape)}")
        weight = weight.contiguous()
        out_features, in_features = weight.shape
        packed = weight.new_empty(-(-out_features // PANEL), in_features, PANEL)
        self._pack(weight.data_ptr(), packed.data_ptr(), out_features, in_features)
        return packed

    def __call__(
        self, x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x @ weight.T + bias`` for x [rows, in] of one row or more, over ``pack(weight)``."""
        rows, in_features = x.shape
        if (
            rows < 1
            or x.dtype != torch.float32
            or not x.is_cpu
            or packed.shape != (-(-out_features // PANEL), in_features, PANEL)
            or (bias is not None and (bias.shape != (out_features,) or bias.dtype != torch.float32))
        ):
            raise ValueError(
                f"small_gemm multiplies float32 x [rows >= 1, in] by a weight packed for it, with a bias "
                f"[out] or none; got x {tuple(x.shape)} {x.dtype}, packed {tuple(packed.shape)} for "
                f"{out_features} outputs, bias {None if bias is None else tuple(bias.shape)}"
            )
        x = x.contiguous()
        bias = None if bias is None else bias.contiguous()
        out = x.new_empty(rows, out_features)
        self._gemm(
            x.data_ptr(), packed.data_ptr(), None if bias is None else bias.data_ptr(), out.data_ptr(), rows,
            out_features, in_features, torch.get_num_threads(),
        )  # fmt: skip
        return out


@functools.cache
def load_small_gemm() -> SmallGemm | Unavailable:
    """The kernel, compiled for this process on first use; or why it could not be."""
    return load_kernels(SOURCE, SmallGemm)


def build(compiler: str) -> SmallGemm | Unavailable:
    """``SOURCE`` compiled with ``compiler`` (``c_library.build_library``) and loaded."""
    return build_kernels(compiler, SOURCE, SmallGemm)
