"""Prefill MFU and decode MBU of perfsuite's engines, against this machine's measured peaks.

    python bench/roofline.py [--model smollm2-135m] [--dtype float32] [--engines static,inflight,paged]
                             [--batch-sizes 1,8,32] [--prompt 32] [--output 32] [--decode-mode packed]

For each engine and batch size B: B requests of ``--prompt`` tokens and
``--output`` new tokens (EOS ignored), all there at t0, served once after a
small warm-up run; the engine counts every step's FLOPs and bytes
(``perfsuite.engine.work``) and ``perfsuite.measure.utilization`` turns them
and the steps' times into achieved rates, prefill MFU and decode MBU. The
peaks are measured once, first (``perfsuite.measure.peaks``). Prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import add_model_arguments, comma_list, load_bench_model  # noqa: E402
from perfsuite.argtypes import positive_int  # noqa: E402
from perfsuite.engine import Request, SamplingParams  # noqa: E402
from perfsuite.adapters import Backend, EngineConfig, build_engine  # noqa: E402
from perfsuite.engine.model_runner import ModelRunner  # noqa: E402
from perfsuite.measure.peaks import measure_peaks  # noqa: E402
from perfsuite.measure.utilization import run_rates  # noqa: E402


def requests(batch_size: int, prompt: int, output: int, vocab: int) -> list[Request]:
    return [
        Request(f"r{i}", tuple((7 * i + 3 * t) % (vocab - 10) + 5 for t in range(prompt)),
                SamplingParams(max_new_tokens=output, ignore_eos=True))
        for i in range(batch_size)
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(parser)
    parser.add_argument("--engines", type=comma_list(str), default=("static", "inflight", "paged"))
    parser.add_argument("--batch-sizes", type=comma_list(positive_int), default=(1, 8, 32))
    parser.add_argument("--prompt", type=positive_int, default=32)
    parser.add_argument("--output", type=positive_int, default=32)
    parser.add_argument("--decode-mode", default="packed")
    args = parser.parse_args()
    bench = load_bench_model(args)
    runner = ModelRunner(bench.loaded.model, device=bench.device, decode_mode=args.decode_mode)
    peaks = measure_peaks(bench.device, args.dtype)
    print(f"peaks ({peaks.device}, {args.dtype}, measured): {peaks.flops_per_second / 1e9:.1f} GFLOP/s, "
          f"{peaks.bytes_per_second / 1e9:.1f} GB/s; ridge {peaks.ridge_point:.1f} FLOP/byte")  # fmt: skip
    if peaks.datasheet_bytes_per_second:
        flops = peaks.datasheet_flops_per_second
        print(f"datasheet: {flops / 1e12 if flops else float('nan'):.0f} TFLOP/s, "
              f"{peaks.datasheet_bytes_per_second / 1e9:.0f} GB/s")  # fmt: skip
    vocab = runner.model_shape.vocab_size
    max_seq_len = args.prompt + args.output
    print("\n| engine | B | prefill GFLOP/s | prefill MFU | decode GB/s | decode MBU | decode GFLOP/s | decode FLOP/byte |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for kind in args.engines:
        for batch_size in args.batch_sizes:
            backend = Backend(runner, list, None, max_seq_len, str(runner.device))
            engine = build_engine(kind, backend, EngineConfig(batch_size, max_seq_len))
            engine.run(requests(1, 8, 4, vocab))  # warm-up
            rates = run_rates(engine.run(requests(batch_size, args.prompt, args.output, vocab)))
            prefill, decode = rates["prefill"], rates["decode"]
            print(f"| {kind} | {batch_size} | {prefill.flops_per_second / 1e9:.2f} | "
                  f"{prefill.flops_per_second / peaks.flops_per_second:.1%} | {decode.bytes_per_second / 1e9:.2f} | "
                  f"{decode.bytes_per_second / peaks.bytes_per_second:.1%} | {decode.flops_per_second / 1e9:.2f} | "
                  f"{decode.arithmetic_intensity:.2f} |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
