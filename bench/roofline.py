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

A second table puts every engine on the same footing, vLLM included where it
is importable (``.venv-peers``, ``make peers``; it counts no work of its
own): a *full decode step* (every one of the B requests decoding) timed from
one step's end to the next, its median over the run, and the FLOPs and bytes
perfsuite counts for such a step of this model at the run's middle context
(``--prompt`` + ``--output`` / 2), so vLLM's decode MBU is perfsuite's count
over vLLM's step time, the same yardstick as perfsuite's engines'.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import add_model_arguments, comma_list, load_bench_model  # noqa: E402
from perfsuite.argtypes import positive_int  # noqa: E402
from perfsuite.engine import Request, SamplingParams  # noqa: E402
from perfsuite.adapters import Backend, EngineConfig, available_engines, build_engine  # noqa: E402
from perfsuite.engine.model_runner import ModelRunner  # noqa: E402
from perfsuite.engine.types import ScheduledChunk  # noqa: E402
from perfsuite.engine.work import ModelShape, StepWork, step_work  # noqa: E402
from perfsuite.measure.peaks import MachinePeaks, measure_peaks  # noqa: E402
from perfsuite.measure.utilization import run_rates  # noqa: E402

COUNTS_NO_WORK = ("vllm",)  # measured by its full decode step alone


def requests(batch_size: int, prompt: int, output: int, vocab: int) -> list[Request]:
    return [
        Request(f"r{i}", tuple((7 * i + 3 * t) % (vocab - 10) + 5 for t in range(prompt)),
                SamplingParams(max_new_tokens=output, ignore_eos=True))
        for i in range(batch_size)
    ]  # fmt: skip


def full_decode_step(batch_size: int, context: int, shape: ModelShape) -> StepWork:
    """The work perfsuite counts for one decode step of ``batch_size`` rows at position ``context``."""
    rows = [ScheduledChunk(f"r{i}", i, (5,), context, True, False) for i in range(batch_size)]
    return step_work(rows, shape)


def full_step_seconds(step_ends: list[tuple[float, int]], batch_size: int) -> float | None:
    """The median gap from one step's end to the next over steps that gave ``batch_size`` outputs."""
    gaps = [t - before for (before, _), (t, outputs) in zip(step_ends, step_ends[1:]) if outputs == batch_size]
    return statistics.median(gaps) if gaps else None


def step_row(kind: str, batch_size: int, seconds: float | None, work: StepWork, peaks: MachinePeaks) -> str:
    if seconds is None:
        return f"| {kind} | {batch_size} | n/a | | | |"
    moved, flops = work.decode.bytes_moved, work.decode.flops
    return (f"| {kind} | {batch_size} | {1e3 * seconds:.1f} | {moved / seconds / 1e9:.2f} | "
            f"{moved / seconds / peaks.bytes_per_second:.1%} | {flops / seconds / 1e9:.2f} |")  # fmt: skip


def default_engines() -> tuple[str, ...]:
    return ("static", "inflight", "paged", *(name for name in COUNTS_NO_WORK if name in available_engines()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(parser)
    parser.add_argument("--engines", type=comma_list(str), default=default_engines())
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
    print(
        "\n| engine | B | prefill GFLOP/s | prefill MFU | decode GB/s | decode MBU | decode GFLOP/s | decode FLOP/byte |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    step_rows = []
    shape = runner.model_shape
    middle = args.prompt + args.output // 2
    for kind in args.engines:
        for batch_size in args.batch_sizes:
            backend = dataclasses.replace(Backend.from_loaded(bench.loaded), runner=runner)  # vllm reads .model
            engine = build_engine(kind, backend, EngineConfig(batch_size, max_seq_len))
            try:
                engine.run(requests(1, 8, 4, vocab))  # warm-up
                step_ends: list[tuple[float, int]] = []
                run = engine.run(
                    requests(batch_size, args.prompt, args.output, vocab),
                    on_step=lambda out, ends=step_ends: ends.append((time.perf_counter(), len(out))),
                )
            finally:
                getattr(engine, "close", lambda: None)()  # vllm: its engine-core process goes with it
            seconds = full_step_seconds(step_ends, batch_size)
            step_rows.append(step_row(kind, batch_size, seconds, full_decode_step(batch_size, middle, shape), peaks))
            rates = run_rates(run)
            if rates is None:
                continue
            prefill, decode = rates["prefill"], rates["decode"]
            print(f"| {kind} | {batch_size} | {prefill.flops_per_second / 1e9:.2f} | "
                  f"{prefill.flops_per_second / peaks.flops_per_second:.1%} | {decode.bytes_per_second / 1e9:.2f} | "
                  f"{decode.bytes_per_second / peaks.bytes_per_second:.1%} | {decode.flops_per_second / 1e9:.2f} | "
                  f"{decode.arithmetic_intensity:.2f} |",
                  flush=True)  # fmt: skip
    print(f"\nA full decode step (B rows at position {middle}), perfsuite's count of its work over each engine's time:")
    print("\n| engine | B | ms a full decode step | decode GB/s | decode MBU | decode GFLOP/s |")
    print("|---|---:|---:|---:|---:|---:|")
    print("\n".join(step_rows))


if __name__ == "__main__":
    main()
