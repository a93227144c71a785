"""What does a decode step cost packed, static-shape, and as a CUDA graph?

    python bench/decode_graphs.py [--model random-smollm2-135m --model random-llama-1b]
                                  [--batch-sizes 8,32] [--steps 20] [--rounds 5]

Times decode-only steps of B running requests, each at position --context of
a cache of --max-seq-len tokens, three ways over one model runner and one
cache:

- packed: ``ModelRunner.execute``, attention over the keys up to the position;
- static: ``StaticDecodeStep`` run eagerly, attention over all max_seq_len keys;
- graph: the same step captured as a ``torch.cuda.CUDAGraph`` and replayed
  (CUDA only: without it the script says so and times the other two).

Each step feeds back the tokens the previous one chose, so the host work of
building the step and reading its tokens is timed too. A round times --steps
steps of every mode, in an order that rotates round by round, and the ratios
are taken within each round, so drift of the machine cancels. The first round
(graph capture included) is thrown away. The cache holds zeros below the
position: the values do not change the cost, the positions do.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from perfsuite.argtypes import positive_int  # noqa: E402
from perfsuite.engine.model_runner import ModelRunner  # noqa: E402
from perfsuite.engine.static_decode import StaticDecodeStep  # noqa: E402
from perfsuite.engine.types import ScheduledChunk, SchedulerOutput  # noqa: E402
from perfsuite.measure.timing import configure_threads, resolve_device, synchronize  # noqa: E402
from perfsuite.models import load_model  # noqa: E402
from perfsuite.report.table import format_table  # noqa: E402


def decode_step(token_ids: list[int], position: int) -> SchedulerOutput:
    chunks = tuple(
        ScheduledChunk(f"r{slot}", slot, (token,), position, samples=True, is_prefill=False)
        for slot, token in enumerate(token_ids)
    )
    return SchedulerOutput(chunks, num_waiting=0)


def step_functions(runner: ModelRunner, device: str) -> dict:
    """Each mode as ``step(output, kv_cache) -> tokens``, all over the runner's one copy of the weights."""
    steps = {"packed": runner.execute, "static": _taking_output(StaticDecodeStep(runner.decoder))}
    if device.startswith("cuda"):
        steps["graph"] = _taking_output(StaticDecodeStep(runner.decoder, use_cuda_graph=True))
    return steps


def _taking_output(step: StaticDecodeStep):
    return lambda output, kv_cache: step(output.chunks, kv_cache)


@dataclass(frozen=True, slots=True)
class DecodeShape:
    batch_size: int
    max_seq_len: int
    context: int  # position of the first timed step
    num_steps: int


def ms_per_step(step, kv_cache, shape: DecodeShape, device: str) -> float:
    token_ids = [1 + slot for slot in range(shape.batch_size)]
    synchronize(device)
    start = time.perf_counter()
    for offset in range(shape.num_steps):
        token_ids = step(decode_step(token_ids, shape.context + offset), kv_cache)
    synchronize(device)
    return 1e3 * (time.perf_counter() - start) / shape.num_steps


def interleaved_ms(runner: ModelRunner, steps: dict, shape: DecodeShape, num_rounds: int) -> dict[str, list[float]]:
    """ms/step of each mode per timed round; the first round warms up (and captures) and is dropped."""
    kv_cache = runner.new_kv_cache(shape.batch_size, shape.max_seq_len)
    times = {mode: [] for mode in steps}
    order = list(steps)
    for round_index in range(num_rounds + 1):
        for mode in order:
            elapsed = ms_per_step(steps[mode], kv_cache, shape, str(runner.device))
            if round_index:
                times[mode].append(elapsed)
        order = order[1:] + order[:1]
    return times


def table_rows(times: dict[str, list[float]], batch_size: int) -> list[list[object]]:
    packed = times["packed"]
    return [
        [mode, batch_size, statistics.median(ms), min(ms), max(ms), 1e3 * batch_size / statistics.median(ms),
         statistics.median(p / m for p, m in zip(packed, ms))]
        for mode, ms in times.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", help="repeatable; default random-smollm2-135m")
    parser.add_argument("--dtype", default=None, help="default bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch-sizes", default="8,32", help="comma-separated B values")
    parser.add_argument("--max-seq-len", type=positive_int, default=512, help="cache length per slot")
    parser.add_argument("--context", type=positive_int, default=256, help="position of the first timed step")
    parser.add_argument("--steps", type=positive_int, default=20, help="decode steps per mode per round")
    parser.add_argument("--rounds", type=positive_int, default=5, help="timed rounds, after one warm-up round")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    device = resolve_device(args.device)
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    threads = configure_threads(args.threads) if device == "cpu" else None
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if not device.startswith("cuda"):
        print("the graph path needs CUDA; timing packed and static eagerly")
    for model_name in args.model or ["random-smollm2-135m"]:
        runner = ModelRunner(load_model(model_name, device=device, dtype=dtype).model)
        max_seq_len = min(args.max_seq_len, runner.max_context)
        context = min(args.context, max_seq_len - args.steps)
        print(
            f"\nmodel={model_name} dtype={dtype} device={device} threads={threads} max_seq_len={max_seq_len} "
            f"context={context} steps={args.steps} rounds={args.rounds}",
            flush=True,
        )
        steps = step_functions(runner, device)
        rows = []
        for batch_size in batch_sizes:
            shape = DecodeShape(batch_size, max_seq_len, context, args.steps)
            rows += table_rows(interleaved_ms(runner, steps, shape, args.rounds), batch_size)
        headers = ["mode", "B", "ms/step median", "min", "max", "tok/s", "packed/mode (per round)"]
        print(format_table(headers, rows), flush=True)
        del runner, steps
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
