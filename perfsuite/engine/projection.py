"""A linear layer's weight, and on CPU the same weight laid out once for oneDNN's GEMM.

``F.linear`` on CPU calls MKL's ``sgemm``. From 4 rows on, MKL copies the
weight into its own blocked layout on every call, and at the few rows of a
decode step that copy costs more than the product: on the 2-core
development VM, SmolLM2's fused QKV took 103 us at 4 rows against 25 us
at 3. A weight reordered once into oneDNN's blocked layout
(``mkldnn::_reorder_linear_weight``, what inductor's CPU freezing does) and
multiplied by ``mkldnn::_linear_pointwise`` skips the copy: from 4 to 32
rows it was faster than the plain call for every SmolLM2 shape, up to 2.7x
(the lm head at 8 rows), except the down projection at 4 and 8 rows (0.83,
0.99) (``bench/packed_linear.py``, bench/results/packed_linear_2026-11-26.log;
one thread gave the same picture). Below 4 rows MKL's plain call is the faster
one (0.3-0.8x), and from a few hundred rows on the two tie or the plain call
wins by a few percent; so a product takes the packed path only for rows in
``PACKED_MIN_ROWS..PACKED_MAX_ROWS``: decode steps and the lm head over a
step's sampled rows, while a long prefill keeps the plain call.

Packing needs float32 on a CPU and a torch built with oneDNN (mkldnn);
elsewhere (CUDA, bfloat16, no oneDNN) ``packed`` is None and every product
is ``F.linear``. The packed copy is held beside the weight, which the plain
path and the other engines' code keep reading: it costs one more copy of the
projections' weights in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# bench/packed_linear.py on the development VM: the packed product wins from 4 rows, ties the plain one at 256.
PACKED_MIN_ROWS = 4
PACKED_MAX_ROWS = 128
# The batch size oneDNN is told to expect when it picks the weight's layout: a decode step's.
LAYOUT_HINT_ROWS = 8


def can_pack(weight: torch.Tensor) -> bool:
    """Whether ``weight`` can be laid out for oneDNN: a float32 matrix on the CPU, with a oneDNN build of torch."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.dim() == 2
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


@dataclass(frozen=True, slots=True)
class Projection:
    """``y = x @ weight.T + bias`` over x [rows, in]; ``packed`` is the weight in oneDNN's layout, or None."""

    weight: torch.Tensor  # [out, in]
    bias: torch.Tensor | None = None  # [out]
    packed: torch.Tensor | None = None

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, *, pack: bool = True) -> Projection:
        """A projection over ``weight``, packed where ``pack`` and ``can_pack`` allow."""
        weight = weight.contiguous()
        if not (pack and can_pack(weight)):
            return cls(weight, bias)
        return cls(weight, bias, torch.ops.mkldnn._reorder_linear_weight(weight, LAYOUT_HINT_ROWS))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and x.dim() == 2 and PACKED_MIN_ROWS <= x.shape[0] <= PACKED_MAX_ROWS:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")  # any strides
        return F.linear(x, self.weight, self.bias)
