"""Does a linear layer cost less with fewer rows? Not always on CPU.

    python bench/gemm_rows.py [--model smollm2-135m] [--rounds 30]

Times one decoder layer's projections (SmolLM2's shapes: fused qkv, out,
fused gate/up, down) at M = 1..16 packed token rows, with and without padding
the rows up to 8, interleaved round by round so machine drift hits every
setting alike. An earlier sweep suggested padding 2..7 rows to 8; measured
quietly (30 rounds) it gained 2% on average, winning at 3 and 7 rows and
losing at 4..6, so the runner computes exactly the rows there are.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from perfsuite.measure.timing import configure_threads  # noqa: E402
from perfsuite.models import model_config  # noqa: E402


def layer_weights(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int):
    generator = torch.Generator().manual_seed(0)
    shapes = [((heads + 2 * kv_heads) * head_dim, hidden), (hidden, heads * head_dim), (2 * intermediate, hidden),
              (hidden, intermediate)]
    return [torch.randn(shape, generator=generator) * 0.02 for shape in shapes]


def layer_seconds(weights, rows: int, pad_to: int | None, repeats: int = 20) -> float:
    computed = max(rows, pad_to or 0)
    inputs = [torch.randn(computed, w.shape[1]) for w in weights]
    start = time.perf_counter()
    for _ in range(repeats):
        for x, w in zip(inputs, weights):
            F.linear(x, w)
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="random-smollm2-135m", help="SmolLM2 shapes; weights do not matter here")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--max-rows", type=int, default=16)
    args = parser.parse_args()
    threads = configure_threads(None)
    config = model_config(args.model)
    weights = layer_weights(config.hidden_size, config.intermediate_size, config.num_attention_heads,
                            config.num_key_value_heads, config.hidden_size // config.num_attention_heads)
    settings = [(m, None) for m in range(1, args.max_rows + 1)] + [(m, 8) for m in range(2, 8)]
    times = {s: [] for s in settings}
    for _ in range(args.rounds):
        for setting in settings:
            times[setting].append(layer_seconds(weights, *setting))
    print(f"{args.model} layer projections, {threads} threads, median of {args.rounds} rounds (ms per layer)")
    print(" rows  unpadded  padded-to-8")
    for m in range(1, args.max_rows + 1):
        plain = 1e3 * statistics.median(times[(m, None)])
        padded = f"{1e3 * statistics.median(times[(m, 8)]):9.2f}" if (m, 8) in times else ""
        print(f"{m:5d}  {plain:8.2f}  {padded}")
    small = [statistics.median(times[(m, None)]) / statistics.median(times[(m, 8)]) for m in range(2, 8)]
    print(f"rows 2..7: unpadded/padded = {statistics.geometric_mean(small):.2f} (geometric mean)")


if __name__ == "__main__":
    main()
