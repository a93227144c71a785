"""Do the projections' fast kernels pay, which is faster for which weight, and for how many rows?

    python bench/packed_linear.py [--model smollm2-135m] [--rows 1,2,3,4,8,16,32,64,128,256,512]
                                  [--batch-sizes 1,8,32] [--rounds 5] [--parts gemm,steps,engines]

Three parts, each measured side by side in this one run:

1. Every projection shape of the model (fused QKV, attention out, fused
   gate-up, down, lm head) at each of --rows rows: ``F.linear`` against
   each kernel of ``perfsuite.engine.projection``, ``mkldnn::_linear_pointwise``
   over a weight laid out once for oneDNN and ``torch.mm`` over the weight
   stored transposed, interleaved round by round; the ratios are plain /
   kernel (above 1: the kernel pays). This is where ``PACKED_MIN_ROWS`` and
   ``PACKED_MAX_ROWS`` come from, and what ``KernelChooser`` decides at load.
2. The model runner's decode step (``ModelRunner.execute``, B rows at
   position --context, over a slot cache and over a paged pool) and one
   prefill step of --prompt tokens, three ways: plain weights
   (``pack_weights=False``), every projection on oneDNN (as before the
   chooser), and the kernels chosen at load ("packed"); the ratios plain /
   packed and onednn / packed.
3. Whole engine runs (``--engines``, default in-flight and paged) of the
   mixed workload (``--num-requests`` shipped prompts, 8..128 new tokens,
   as ``bench/peers.py``'s) at each of --engine-batch-sizes, packed and not,
   in alternating order: output tok/s, the ratio packed / plain.

The last line is ``packed/plain engine <name> B=<b>: <x> ...``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from bench_common import comma_list  # noqa: E402
from decode_graphs import BLOCK_SIZE, DecodeShape, decode_step, ms_per_step  # noqa: E402

from perfsuite.adapters import Backend, EngineConfig, build_engine  # noqa: E402
from perfsuite.argtypes import positive_int  # noqa: E402
from perfsuite.engine.model_runner import ModelRunner  # noqa: E402
from perfsuite.engine.projection import (  # noqa: E402
    LAYOUT_HINT_ROWS,
    PACKED_MAX_ROWS,
    PACKED_MIN_ROWS,
    Kernel,
    Projection,
    can_pack,
)
from perfsuite.engine.types import ScheduledChunk, SchedulerOutput  # noqa: E402
from perfsuite.measure.environment import cpu_model  # noqa: E402
from perfsuite.measure.metrics import run_metrics  # noqa: E402
from perfsuite.measure.timing import configure_threads, max_seq_len_for, timed_run, warm_up  # noqa: E402
from perfsuite.models import load_model  # noqa: E402
from perfsuite.report.table import format_table  # noqa: E402
from perfsuite.workload import mixed_workload  # noqa: E402


def us_per_call(function: Callable[[], object], min_seconds: float = 0.05) -> float:
    function()
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < min_seconds or calls < 3:
        function()
        calls += 1
    return 1e6 * elapsed / calls


def projection_shapes(runner: ModelRunner) -> dict[str, torch.Tensor]:
    layer = runner.decoder.layers[0]
    return {"qkv": layer.qkv.weight, "out": layer.out.weight, "gate_up": layer.gate_up.weight,
            "down": layer.down.weight, "lm_head": runner.decoder.lm_head.weight}  # fmt: skip


def gemm_ratios(weights: dict[str, torch.Tensor], rows: list[int], num_rounds: int) -> list[list[object]]:
    """Each kernel's time per (shape, rows), medians over rounds that interleave them, and plain / each."""
    table = []
    for name, weight in weights.items():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, LAYOUT_HINT_ROWS)
        transposed = weight.t().contiguous()
        for count in rows:
            x = torch.randn(count, weight.shape[1])
            kernels = {
                "plain": lambda: F.linear(x, weight),
                Kernel.ONEDNN: lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
                Kernel.MKL_TRANSPOSED: lambda: torch.mm(x, transposed),
            }
            us: dict[str, list[float]] = {kernel: [] for kernel in kernels}
            for round_index in range(num_rounds):
                for kernel in kernels if round_index % 2 == 0 else reversed(kernels):
                    us[kernel].append(us_per_call(kernels[kernel]))
            ratios = {
                kernel: statistics.median(a / b for a, b in zip(us["plain"], us[kernel], strict=True))
                for kernel in (Kernel.ONEDNN, Kernel.MKL_TRANSPOSED)
            }
            table.append([name, f"{weight.shape[0]}x{weight.shape[1]}", count,
                          *(f"{statistics.median(us[kernel]):.0f}" for kernel in kernels),
                          *(f"{ratio:.2f}" for ratio in ratios.values())])  # fmt: skip
    return table


def with_kernel(runner: ModelRunner, kernel: Kernel) -> ModelRunner:
    """``runner`` with every projection on ``kernel``, whatever the chooser picked: what it is measured against."""

    def rebuilt(projection: Projection) -> Projection:
        return Projection.of(projection.weight, projection.bias, kernel=kernel)

    decoder = runner.decoder
    layers = tuple(
        replace(layer, qkv=rebuilt(layer.qkv), out=rebuilt(layer.out), gate_up=rebuilt(layer.gate_up),
                down=rebuilt(layer.down))
        for layer in decoder.layers
    )  # fmt: skip
    runner.decoder = replace(decoder, layers=layers, lm_head=rebuilt(decoder.lm_head))
    return runner


def prefill_step(prompt_len: int, tables: tuple[int, ...] = ()) -> SchedulerOutput:
    chunk = ScheduledChunk("p", 0, tuple(range(1, prompt_len + 1)), 0, samples=True, is_prefill=True,
                           block_table=tables)  # fmt: skip
    return SchedulerOutput((chunk,), num_waiting=0)


def step_ratios(runners: dict[str, ModelRunner], batch_sizes: list[int], args) -> tuple[list[list[object]], list[str]]:
    rows, last = [], []
    blocks_per_row = -(-args.max_seq_len // BLOCK_SIZE)
    caches = {
        label: (runner.new_kv_cache(max(batch_sizes), args.max_seq_len),
                runner.new_paged_kv_cache(max(batch_sizes) * blocks_per_row, BLOCK_SIZE))
        for label, runner in runners.items()
    }  # fmt: skip
    tables = [tuple(range(r * blocks_per_row, (r + 1) * blocks_per_row)) for r in range(max(batch_sizes))]
    cases: list[tuple[str, int, Callable[[str], float]]] = []
    for batch_size in batch_sizes:
        shape = DecodeShape(batch_size, args.max_seq_len, args.context, args.steps)
        for cache_index, kind in ((0, "slot"), (1, "paged")):

            def timed(label: str, shape=shape, cache_index=cache_index, kind=kind) -> float:
                runner, cache = runners[label], caches[label][cache_index]
                step_tables = tables if kind == "paged" else None
                return ms_per_step(
                    lambda tokens, position: runner.execute(decode_step(tokens, position, step_tables), cache),
                    shape, "cpu",
                )  # fmt: skip

            cases.append((f"decode {kind}", batch_size, timed))

    def timed_prefill(label: str) -> float:
        runner, cache = runners[label], caches[label][1]
        start = time.perf_counter()
        runner.execute(prefill_step(args.prompt, tables[0]), cache)
        return 1e3 * (time.perf_counter() - start)

    cases.append((f"prefill {args.prompt} tokens", 1, timed_prefill))
    for name, batch_size, timed in cases:
        times = {label: [] for label in runners}
        order = list(runners)
        for round_index in range(args.rounds + 1):
            for label in order:
                elapsed = timed(label)
                if round_index:
                    times[label].append(elapsed)
            order.reverse()
        ratios = [p / q for p, q in zip(times["plain"], times["packed"], strict=True)]
        ratio = statistics.median(ratios)
        onednn = statistics.median(p / q for p, q in zip(times["onednn"], times["packed"], strict=True))
        rows.append([name, batch_size, *(f"{statistics.median(times[label]):.2f}" for label in runners),
                     f"{ratio:.2f}", f"{onednn:.2f}", " ".join(f"{r:.2f}" for r in ratios)])  # fmt: skip
        if name == "decode paged":
            last.append(f"B={batch_size}: {ratio:.2f}")
    return rows, last


def engine_ratios(loaded, runners: dict[str, ModelRunner], args) -> tuple[list[list[object]], list[str]]:
    """Output tok/s of each engine over the mixed workload, packed and plain, in alternating order."""
    backends = {label: replace(Backend.from_loaded(loaded), runner=runner) for label, runner in runners.items()}
    requests = mixed_workload(args.num_requests).requests(backends["plain"].tokenize)
    rows, last = [], []
    for name in args.engines:
        for batch_size in args.engine_batch_sizes:
            config = EngineConfig(batch_size, max_seq_len_for(requests, loaded.max_context))
            engines = {label: build_engine(name, backend, config) for label, backend in backends.items()}
            for engine in engines.values():
                warm_up(engine, requests)
            throughput = {label: [] for label in engines}
            for repeat in range(args.engine_repeats):
                for label in engines if repeat % 2 == 0 else reversed(engines):
                    result = timed_run(engines[label], requests, "cpu")
                    throughput[label].append(run_metrics(result).output_throughput)
            ratios = [a / b for a, b in zip(throughput["packed"], throughput["plain"], strict=True)]
            ratio = statistics.median(ratios)
            rows.append([name, batch_size, f"{statistics.median(throughput['plain']):.1f}",
                         f"{statistics.median(throughput['packed']):.1f}", f"{ratio:.2f}",
                         " ".join(f"{r:.2f}" for r in ratios)])  # fmt: skip
            last.append(f"{name} B={batch_size}: {ratio:.2f}")
            print(f"  {name} B={batch_size}: packed/plain {ratio:.2f}", flush=True)
    return rows, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", type=comma_list(positive_int), default=(1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512))
    parser.add_argument("--batch-sizes", type=comma_list(positive_int), default=(1, 4, 8, 16, 32))
    parser.add_argument("--max-seq-len", type=positive_int, default=512)
    parser.add_argument("--context", type=positive_int, default=256, help="decode rows' position")
    parser.add_argument("--prompt", type=positive_int, default=256, help="the prefill step's tokens")
    parser.add_argument("--steps", type=positive_int, default=10, help="decode steps per case per round")
    parser.add_argument("--rounds", type=positive_int, default=5, help="timed rounds, after one warm-up round")
    parser.add_argument("--engines", type=comma_list(str), default=("inflight", "paged"))
    parser.add_argument("--engine-batch-sizes", type=comma_list(positive_int), default=(8, 32))
    parser.add_argument("--num-requests", type=positive_int, default=32, help="requests of each engine run")
    parser.add_argument("--engine-repeats", type=positive_int, default=2, help="runs of each engine, packed and not")
    parser.add_argument("--parts", type=comma_list(str), default=("gemm", "steps", "engines"))
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    threads = configure_threads(args.threads)
    loaded = load_model(args.model, device="cpu", dtype="float32")
    model = loaded.model
    runners = {
        "plain": ModelRunner(model, pack_weights=False),
        "onednn": with_kernel(ModelRunner(model, pack_weights=False), Kernel.ONEDNN),
        "packed": ModelRunner(model, pack_weights=True),
    }
    weights = projection_shapes(runners["plain"])
    if not can_pack(weights["qkv"]):
        sys.exit("this torch has no oneDNN (or the weights are not float32 on the CPU): nothing to compare")
    print(f"{time.strftime('%Y-%m-%d')} {cpu_model()}, {threads} threads, torch {torch.__version__}, "
          f"model {args.model} float32; packed rows {PACKED_MIN_ROWS}..{PACKED_MAX_ROWS}", flush=True)  # fmt: skip
    print(f"kernels chosen at load: {runners['packed'].decoder.projection_kernels}, rows "
          f"{runners['packed'].decoder.projection_rows}", flush=True)
    if "gemm" in args.parts:
        print("\nGEMM: F.linear against each kernel's copy of the weight (median us a call; plain/kernel > 1: it pays)")
        gemm = gemm_ratios(weights, list(args.rows), args.rounds)
        headers = ["weight", "shape", "rows", "plain us", "onednn us", "mkl-transposed us", "plain/onednn",
                   "plain/mkl-transposed"]  # fmt: skip
        print(format_table(headers, gemm), flush=True)
    if "steps" in args.parts:
        print("\nModel runner steps: plain weights, every projection on oneDNN, and the kernels chosen at load"
              " ('packed'; ms a step, median over rounds)")  # fmt: skip
        rows, last = step_ratios(runners, list(args.batch_sizes), args)
        print(format_table(["step", "B", "plain ms", "onednn ms", "packed ms", "plain/packed", "onednn/packed",
                            "plain/packed per round"], rows))  # fmt: skip
        print(f"packed/plain decode (paged) {' '.join(last)}", flush=True)
    if "engines" in args.parts:
        print(f"\nEngine runs, mixed workload of {args.num_requests} requests (output tok/s, median over repeats)")
        rows, last = engine_ratios(loaded, {label: runners[label] for label in ("plain", "packed")}, args)
        print(format_table(["engine", "B", "plain tok/s", "packed tok/s", "packed/plain", "per repeat"], rows))
        print(f"packed/plain engine {' '.join(last)}")


if __name__ == "__main__":
    main()
