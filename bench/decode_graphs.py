"""What does a decode step cost packed, static-shape, and as a CUDA graph?

    python bench/decode_graphs.py [--model random-smollm2-135m --model random-llama-1b]
                                  [--batch-sizes 8,32] [--steps 20] [--rounds 5]

Times decode-only steps of B running requests, each at position --context of
a cache of --max-seq-len tokens, over one model runner, one slot cache and
one paged pool:

- packed: ``ModelRunner.execute``, attention over the keys up to the position;
- static: ``StaticDecodeStep`` run eagerly, attention over all max_seq_len keys;
- graph: the same step captured as a ``torch.cuda.CUDAGraph`` and replayed
  (CUDA only: without it the script says so and times the other modes);
- paged packed / paged static / paged graph: the same three over a paged
  pool of 16-token blocks (``PagedDecodeStep``: rows padded to a bucket,
  keys gathered through the block tables at a fixed width; the graph
  captured per bucket).

Each mode's ratio is against the packed path over its own cache.

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from perfsuite.argtypes import positive_int  # noqa: E402
from perfsuite.engine.model_runner import ModelRunner  # noqa: E402
from perfsuite.engine.paged_decode import PagedDecodeStep  # noqa: E402
from perfsuite.engine.static_decode import StaticDecodeStep  # noqa: E402
from perfsuite.engine.types import ScheduledChunk, SchedulerOutput  # noqa: E402
from perfsuite.measure.timing import configure_threads, resolve_device, synchronize  # noqa: E402
from perfsuite.models import load_model  # noqa: E402
from perfsuite.report.table import format_table  # noqa: E402


BLOCK_SIZE = 16  # the paged modes' KV block, as the paged engine's default


def decode_step(token_ids: list[int], position: int, tables: list[tuple[int, ...]] | None = None) -> SchedulerOutput:
    chunks = tuple(
        ScheduledChunk(f"r{row}", row, (token,), position, samples=True, is_prefill=False,
                       block_table=tables[row] if tables else ())
        for row, token in enumerate(token_ids)
    )  # fmt: skip
    return SchedulerOutput(chunks, num_waiting=0)


@dataclass(frozen=True, slots=True)
class DecodeShape:
    batch_size: int
    max_seq_len: int
    context: int  # position of the first timed step
    num_steps: int


Step = Callable[[list[int], int], list[int]]  # (each row's token, the rows' position) -> each row's next token


def step_functions(runner: ModelRunner, device: str, shape: DecodeShape) -> dict[str, Step]:
    """Each mode as a ``Step`` over the runner's one copy of the weights: slot modes over one slot cache, paged
    modes over one pool whose rows own contiguous blocks (graphs captured here, before any timing)."""
    on_cuda = device.startswith("cuda")
    slot_cache = runner.new_kv_cache(shape.batch_size, shape.max_seq_len)
    slot_steps = {"packed": None, "static": StaticDecodeStep(runner.decoder)}
    if on_cuda:
        slot_steps["graph"] = StaticDecodeStep(runner.decoder, use_cuda_graph=True)
    blocks_per_row = -(-shape.max_seq_len // BLOCK_SIZE)
    pool = runner.new_paged_kv_cache(shape.batch_size * blocks_per_row, BLOCK_SIZE)
    tables = [tuple(range(row * blocks_per_row, (row + 1) * blocks_per_row)) for row in range(shape.batch_size)]
    paged_steps = {"paged packed": None, "paged static": _paged(runner, pool, shape, blocks_per_row, False)}
    if on_cuda:
        paged_steps["paged graph"] = _paged(runner, pool, shape, blocks_per_row, True)
    steps: dict[str, Step] = {}
    for mode, step in slot_steps.items():
        steps[mode] = (
            (lambda tokens, position: runner.execute(decode_step(tokens, position), slot_cache)) if step is None
            else (lambda tokens, position, step=step: step(decode_step(tokens, position).chunks, slot_cache))
        )  # fmt: skip
    for mode, step in paged_steps.items():
        steps[mode] = (
            (lambda tokens, position: runner.execute(decode_step(tokens, position, tables), pool)) if step is None
            else (lambda tokens, position, step=step: step(decode_step(tokens, position, tables).chunks))
        )  # fmt: skip
    return steps


def _paged(runner: ModelRunner, pool, shape: DecodeShape, blocks_per_row: int, graph: bool) -> PagedDecodeStep:
    return PagedDecodeStep(
        runner.decoder, pool, max_num_seqs=shape.batch_size, max_blocks_per_seq=blocks_per_row, use_cuda_graph=graph
    )


def ms_per_step(step: Step, shape: DecodeShape, device: str) -> float:
    token_ids = [1 + row for row in range(shape.batch_size)]
    synchronize(device)
    start = time.perf_counter()
    for offset in range(shape.num_steps):
        token_ids = step(token_ids, shape.context + offset)
    synchronize(device)
    return 1e3 * (time.perf_counter() - start) / shape.num_steps


def interleaved_ms(runner: ModelRunner, shape: DecodeShape, num_rounds: int) -> dict[str, list[float]]:
    """ms/step of each mode per timed round; the first round warms up and is dropped."""
    steps = step_functions(runner, str(runner.device), shape)
    times = {mode: [] for mode in steps}
    order = list(steps)
    for round_index in range(num_rounds + 1):
        for mode in order:
            elapsed = ms_per_step(steps[mode], shape, str(runner.device))
            if round_index:
                times[mode].append(elapsed)
        order = order[1:] + order[:1]
    return times


def table_rows(times: dict[str, list[float]], batch_size: int) -> list[list[object]]:
    # Each mode against its own cache's packed path: slot modes against packed, paged modes against paged packed
    return [
        [mode, batch_size, statistics.median(ms), min(ms), max(ms), 1e3 * batch_size / statistics.median(ms),
         statistics.median(p / m for p, m in zip(times["paged packed" if "paged" in mode else "packed"], ms))]
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
        rows = []
        for batch_size in batch_sizes:
            shape = DecodeShape(batch_size, max_seq_len, context, args.steps)
            rows += table_rows(interleaved_ms(runner, shape, args.rounds), batch_size)
        headers = ["mode", "B", "ms/step median", "min", "max", "tok/s", "its packed/mode (per round)"]
        print(format_table(headers, rows), flush=True)
        del runner
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
