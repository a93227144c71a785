"""A decoder layer's norms, rotary embedding and activation, fused in C, for float32 on the CPU.

Written with torch's operators (``perfsuite.engine.layers``), a layer's two
RMS norms, two residual adds, rotary embedding and SiLU-and-multiply are
about twenty operator calls, each a dispatch, an allocation and a pass over
memory: on the 2-vCPU AMD EPYC VM, fused they made a SmolLM2 decode step of
8 rows 4-7% faster and a prefill 17-24% (``bench/layer_ops.py``).
``LayerOps`` does them in four calls of a C library
(``csrc/layer_ops.c``), compiled once per CPU kind (``perfsuite.engine.c_library``),
one pass each; vLLM's CPU backend fuses the same operators (its custom ops,
or inductor).

Each computes what the torch operators do up to float rounding (the norm's
order of summation, glibc's exp), and a row's bits never depend on the other
rows, so the batch-invariant mode keeps them. Where no compiler works,
``load_layer_ops`` says why and the decoder keeps torch's operators
(``ModelRunner.layer_ops`` reports which).
"""

from __future__ import annotations

import ctypes
import functools

import torch

from perfsuite.engine.c_library import CSRC, Unavailable, build_kernels, load_kernels

SOURCE = CSRC / "layer_ops.c"


class LayerOps:
    """The compiled operators, over float32 CPU tensors; each checks its inputs and raises ``ValueError``."""

    def __init__(self, library: ctypes.CDLL) -> None:
        pointer, size, num_threads = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        self._rms_norm = library.rms_norm_f32
        self._rms_norm.argtypes = [pointer, pointer, pointer, size, size, ctypes.c_float, num_threads]
        self._add_rms_norm = library.add_rms_norm_f32
        self._add_rms_norm.argtypes = [pointer, pointer, pointer, pointer, size, size, ctypes.c_float, num_threads]
        self._rotary = library.rotary_f32
        self._rotary.argtypes = [pointer, size, pointer, pointer, pointer, size, size, size, size, num_threads]
        self._silu_and_mul = library.silu_and_mul_f32
        self._silu_and_mul.argtypes = [pointer, pointer, size, size, num_threads]
        for function in (self._rms_norm, self._add_rms_norm, self._silu_and_mul):
            function.restype = None
        self._rotary.restype = ctypes.c_int

    @staticmethod
    def supports(tensor: torch.Tensor) -> bool:
        return tensor.dtype == torch.float32 and tensor.is_cpu

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """``layers.rms_norm(x, weight, eps)`` of x [rows, dim]: a new tensor."""
        _check_rows("rms_norm", x, weight)
        out = torch.empty_like(x)
        self._rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), *x.shape, eps, torch.get_num_threads())
        return out

    def add_rms_norm(self, hidden: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """``hidden += delta`` in place (the residual add), and the norm of the sum, a new tensor."""
        _check_rows("add_rms_norm", hidden, weight, delta)
        out = torch.empty_like(hidden)
        self._add_rms_norm(
            hidden.data_ptr(), delta.data_ptr(), weight.data_ptr(), out.data_ptr(), *hidden.shape, eps,
            torch.get_num_threads(),
        )  # fmt: skip
        return out

    def rotary_(
        self, x: torch.Tensor, positions: torch.Tensor, cos_table: torch.Tensor, signed_sin_table: torch.Tensor
    ) -> None:
        """``layers.apply_rotary`` of x [rows, heads, head_dim] at ``positions`` [rows], in place.

        x's rows may be strided (a view of the fused query-key-value projection); within a row its heads are
        contiguous. The tables are ``Decoder``'s [max_context, head_dim], the sine's first half negated.
        """
        rows, heads, head_dim = x.shape
        if (
            not (self.supports(x) and self.supports(cos_table) and self.supports(signed_sin_table))
            or x.stride(2) != 1
            or x.stride(1) != head_dim
            or head_dim % 2
            or cos_table.shape[1:] != (head_dim,)
            or signed_sin_table.shape != cos_table.shape
            or not (cos_table.is_contiguous() and signed_sin_table.is_contiguous())
            or positions.dtype != torch.int64
            or positions.shape != (rows,)
            or not positions.is_contiguous()
        ):
            raise ValueError(
                "rotary_ needs float32 x [rows, heads, head_dim] with contiguous heads and an even head_dim, "
                "contiguous float32 tables [positions, head_dim] and contiguous int64 positions [rows]; got x "
                f"{tuple(x.shape)} {x.dtype} strides {x.stride()}, tables {tuple(cos_table.shape)}, positions "
                f"{tuple(positions.shape)} {positions.dtype}"
            )
        status = self._rotary(
            x.data_ptr(), x.stride(0), cos_table.data_ptr(), signed_sin_table.data_ptr(), positions.data_ptr(),
            cos_table.shape[0], rows, heads, head_dim, torch.get_num_threads(),
        )  # fmt: skip
        if status:
            raise ValueError(
                f"rotary_ positions must be in 0..{cos_table.shape[0] - 1} (the model's context), got "
                f"{positions.tolist()}; x is unchanged"
            )

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of gate_up [rows, 2 * inner], each row gate then up: a new tensor [rows, inner]."""
        rows, width = gate_up.shape
        if not _contiguous_float32(gate_up) or width % 2:
            raise ValueError(
                f"silu_and_mul needs contiguous float32 gate_up [rows, 2 * inner]; got {tuple(gate_up.shape)} "
                f"{gate_up.dtype} strides {gate_up.stride()}"
            )
        out = gate_up.new_empty(rows, width // 2)
        self._silu_and_mul(gate_up.data_ptr(), out.data_ptr(), rows, width // 2, torch.get_num_threads())
        return out


def _check_rows(name: str, x: torch.Tensor, weight: torch.Tensor, other: torch.Tensor | None = None) -> None:
    """Raise unless x (and other) are contiguous float32 [rows, dim] on the CPU and weight [dim].

    Called by every operator of every layer, so it asks torch as little as it can (a dispatch-free check).
    """
    if (
        x.dim() == 2
        and weight.shape == x.shape[1:]
        and _contiguous_float32(x)
        and _contiguous_float32(weight)
        and (other is None or (other.shape == x.shape and _contiguous_float32(other)))
    ):
        return
    tensors = (x, weight) if other is None else (x, weight, other)
    shapes = ", ".join(f"{tuple(t.shape)} {t.dtype} on {t.device.type}" for t in tensors)
    raise ValueError(f"{name} needs contiguous float32 CPU tensors [rows, dim] and a weight [dim]; got {shapes}")


def _contiguous_float32(tensor: torch.Tensor) -> bool:
    return tensor.dtype == torch.float32 and tensor.is_cpu and tensor.is_contiguous()


@functools.cache
def load_layer_ops() -> LayerOps | Unavailable:
    """The operators, compiled for this process on first use; or why they could not be."""
    return load_kernels(SOURCE, LayerOps)


def build(compiler: str) -> LayerOps | Unavailable:
    """``SOURCE`` compiled with ``compiler`` (``c_library.build_library``) and loaded."""
    return build_kernels(compiler, SOURCE, LayerOps)
