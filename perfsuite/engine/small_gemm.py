"""A projection of 1 to 8 rows over a weight packed into panels, in C, for float32 on the CPU.

At a decode step's few rows a product is bound by streaming its weight
from memory, and oneDNN's call through torch rebuilds its primitive every
time (about 15 us; SmolLM2 makes 121 a step). ``SmallGemm``
(``csrc/small_gemm.c``) multiplies over a copy of the weight packed once into
panels of 16 outputs, each read once while every row's sums stay in
registers: on the 2-vCPU AMD EPYC VM a SmolLM2 step's projections took 14%
less time than torch's oneDNN at 8 rows and 27% less at 1 (``bench/vllm_gemm.py``,
"perfsuite chosen" beside "torch oneDNN" and vLLM's own oneDNN handle, which
they beat by 8% and 23%). From about 9 rows the product is bound by
arithmetic, and oneDNN's blocking wins; ``projection.KernelChooser`` times the
two per shape and machine and gives this kernel only the rows where it won.

Compiled once per process (``perfsuite.engine.c_library``); where no compiler
works, ``load_small_gemm`` says why and every projection keeps oneDNN or MKL.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from perfsuite.engine.c_library import CSRC, Unavailable, build_kernels, load_kernels

SOURCE = CSRC / "small_gemm.c"
PANEL = 16  # outputs per panel, as csrc/small_gemm.c packs them
MAX_ROWS = 8  # the most rows a product takes here


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
        """``x @ weight.T + bias`` for x [rows, in] of 1 to ``MAX_ROWS`` rows, over ``pack(weight)``."""
        rows, in_features = x.shape
        if (
            not 1 <= rows <= MAX_ROWS
            or x.dtype != torch.float32
            or not x.is_cpu
            or packed.shape != (-(-out_features // PANEL), in_features, PANEL)
            or (bias is not None and (bias.shape != (out_features,) or bias.dtype != torch.float32))
        ):
            raise ValueError(
                f"small_gemm multiplies float32 x [1..{MAX_ROWS} rows, in] by a weight packed for it, with a bias "
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
