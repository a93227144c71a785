"""Which CPU product kernels give a row the same bits whatever the number of rows multiplied with it?

    python bench/row_invariance.py [--max-rows 160] [--shapes smollm2] [--threads N]

For each projection shape of SmolLM2 (float32: fused QKV 960x576, attention
out 576x576, fused gate-up 3072x576, down 576x1536, lm head 49152x576) and
each candidate kernel, multiplies ``x[:m]`` for every m in 1..--max-rows and
checks, bit for bit, that the result is ``kernel(x)[:m]`` (the batch size
does not matter) and that row i alone, ``kernel(x[i:i+1])``, is row i of
``kernel(x)`` (neither do the other rows). It prints, per kernel and shape,
the row counts that differ; a kernel with none is batch invariant here, on
this machine and thread count. This decides the batch-invariant mode's
kernel (``perfsuite.engine.projection``); it measures no time.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from perfsuite.engine.projection import LAYOUT_HINT_ROWS, Projection, Kernel  # noqa: E402

SMOLLM2_SHAPES = {"qkv": (960, 576), "out": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
                  "lm_head": (49152, 576)}  # fmt: skip
TINY_SHAPES = {"qkv": (64, 16), "out": (16, 16), "gate_up": (128, 16), "down": (16, 64), "lm_head": (1000, 16)}

Product = Callable[[torch.Tensor], torch.Tensor]


def candidates(weight: torch.Tensor) -> dict[str, Product]:
    """The kernels a float32 CPU projection could run on, each over its own copy of ``weight`` [out, in]."""
    transposed = weight.t().contiguous()
    onednn = torch.ops.mkldnn._reorder_linear_weight(weight, LAYOUT_HINT_ROWS)
    chosen = Projection.of(weight, kernel=Kernel.MKL_TRANSPOSED)
    return {
        "F.linear": lambda x: F.linear(x, weight),
        "mm-transposed": lambda x: torch.mm(x, transposed),
        "onednn": lambda x: torch.ops.mkldnn._linear_pointwise(x, onednn, None, "none", [], ""),
        "projection(mkl-transposed)": chosen,
        "matmul-3d-rows": lambda x: torch.matmul(x.unsqueeze(1), transposed).squeeze(1),  # one gemv per row
    }


def differing_rows(product: Product, x: torch.Tensor) -> tuple[list[int], list[int]]:
    """Row counts m whose product is not ``product(x)[:m]``, and rows i whose product alone is not row i's."""
    full = product(x)
    by_count = [m for m in range(1, x.shape[0]) if not torch.equal(product(x[:m]), full[:m])]
    alone = [i for i in range(x.shape[0]) if not torch.equal(product(x[i : i + 1]), full[i : i + 1])]
    return by_count, alone


def shown(values: list[int]) -> str:
    if not values:
        return "none"
    return f"{len(values)}: {values[:12]}{' ...' if len(values) > 12 else ''}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-rows", type=int, default=160)
    parser.add_argument("--shapes", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--kernels", default=None, help="comma-separated subset of the candidates")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, rows 1..{args.max_rows}")
    generator = torch.Generator().manual_seed(0)
    shapes = SMOLLM2_SHAPES if args.shapes == "smollm2" else TINY_SHAPES
    with torch.inference_mode():
        for name, (out_features, in_features) in shapes.items():
            weight = torch.randn(out_features, in_features, generator=generator) / in_features**0.5
            x = torch.randn(args.max_rows, in_features, generator=generator)
            for kernel, product in candidates(weight).items():
                if args.kernels and kernel not in args.kernels.split(","):
                    continue
                by_count, alone = differing_rows(product, x)
                print(f"{name:8} {kernel:27} m differing: {shown(by_count):40} rows alone differing: {shown(alone)}",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
