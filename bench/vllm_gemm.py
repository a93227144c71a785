"""A decode step's matrix products through torch's oneDNN op and through vLLM's own, side by side.

    .venv-peers/bin/python bench/vllm_gemm.py [--model smollm2-135m] [--rows 8,32] [--rounds 12]

vLLM's CPU backend multiplies by a oneDNN handle it makes once per weight
(``vllm._custom_ops.create_onednn_mm`` / ``onednn_mm``); perfsuite's
projections use torch's ``mkldnn::_linear_pointwise`` over a weight reordered
once, or MKL over the weight stored transposed (``perfsuite.engine.projection``).
This times every projection of a decode step (the model's layers' QKV, out,
gate-up and down, and the lm head) at --rows rows three ways: torch's oneDNN
op, vLLM's handle, and the kernels perfsuite's ``KernelChooser`` picks, in
turn within each round (each first in alternate rounds), and prints the median
ms of each per shape and in all, and each way's speed over torch's oneDNN (its
time over theirs, measured side by side). Needs vLLM (the peers environment).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from bench_common import comma_list  # noqa: E402
from perfsuite.argtypes import positive_int  # noqa: E402
from perfsuite.engine.model_runner import ModelRunner  # noqa: E402
from perfsuite.engine.projection import LAYOUT_HINT_ROWS  # noqa: E402
from perfsuite.models import load_model  # noqa: E402

SHAPES = ("qkv", "out", "gate_up", "down", "lm_head")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", type=comma_list(positive_int), default=(8, 32))
    parser.add_argument("--rounds", type=positive_int, default=12)
    args = parser.parse_args()
    try:
        from vllm import _custom_ops as vllm_ops
    except ImportError:
        sys.exit("vLLM is not importable: run this in the peers environment (make peers; .venv-peers/bin/python)")
    decoder = ModelRunner(load_model(args.model, dtype="float32").model).decoder
    weights = {name: [getattr(layer, name) for layer in decoder.layers] for name in SHAPES[:-1]}
    weights["lm_head"] = [decoder.lm_head]
    torch_onednn = {name: [torch.ops.mkldnn._reorder_linear_weight(p.weight, LAYOUT_HINT_ROWS) for p in ps]
                    for name, ps in weights.items()}  # fmt: skip
    vllm_handles = {name: [vllm_ops.create_onednn_mm(p.weight.t(), 32) for p in ps] for name, ps in weights.items()}
    ways = {
        "torch oneDNN": lambda name, x: [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
                                         for w in torch_onednn[name]],
        "vLLM onednn_mm": lambda name, x: [vllm_ops.onednn_mm(h, x, None) for h in vllm_handles[name]],
        "perfsuite chosen": lambda name, x: [p(x) for p in weights[name]],
    }  # fmt: skip
    print(f"{args.model}, {torch.get_num_threads()} threads, kernels chosen: {decoder.projection_kernels}, "
          f"panel kernel up to rows: {decoder.projection_panel_rows}")  # fmt: skip
    with torch.inference_mode():
        for rows in args.rows:
            inputs = {name: torch.randn(rows, ps[0].weight.shape[1]) for name, ps in weights.items()}
            for name, x in inputs.items():
                expected = weights[name][0].weight @ x.T
                for way, run in ways.items():
                    torch.testing.assert_close(run(name, x)[0].T, expected, rtol=1e-4, atol=1e-4, msg=f"{way} {name}")
            seconds = {(way, name): [] for way in ways for name in SHAPES}
            for round_index in range(args.rounds):
                for way in ways if round_index % 2 == 0 else reversed(ways):
                    for name in SHAPES:
                        started = time.perf_counter()
                        ways[way](name, inputs[name])
                        seconds[way, name].append(time.perf_counter() - started)
            print(f"\n{rows} rows (ms, median of {args.rounds} rounds)")
            print(f"{'':18s}" + "".join(f"{name:>10s}" for name in SHAPES) + f"{'all':>10s}{'speed':>8s}")
            medians = {way: [1e3 * statistics.median(seconds[way, name]) for name in SHAPES] for way in ways}
            for way, ms in medians.items():
                speed = sum(medians["torch oneDNN"]) / sum(ms)  # over torch's oneDNN, side by side
                print(f"{way:18s}" + "".join(f"{t:10.2f}" for t in ms) + f"{sum(ms):10.2f}{speed:7.2f}x")


if __name__ == "__main__":
    main()
