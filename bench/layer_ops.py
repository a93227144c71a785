"""Steps with each layer's norms, rotary embedding and activation fused in C, against torch's operators.

    python bench/layer_ops.py [--model smollm2-135m] [--rows 1,8,32] [--context 128] [--prompt 64] [--steps 12]

For each row count: a paged decode step of every row at ``--context`` keys,
the same over the slot cache (the in-flight engine's), and a prefill of a
``--prompt``-token prompt per row; each with the decoder's layer operators
fused (``perfsuite.engine.layer_ops``) and with torch's (``layer_ops=False``'s
path), over one runner's weights. The two take turns step by step, first in
alternate rounds, so drift on a noisy machine hits them alike; it prints the
median ms per step and the fused step's speed over torch's, and whether the
two chose the same greedy tokens.
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

import torch  # noqa: E402

from bench_common import add_model_arguments, comma_list, load_bench_model  # noqa: E402
from perfsuite.argtypes import positive_int  # noqa: E402
from perfsuite.engine.model_runner import ModelRunner  # noqa: E402
from perfsuite.engine.types import ScheduledChunk, SchedulerOutput  # noqa: E402

BLOCK_SIZE = 16


def step_cases(runner: ModelRunner, rows: int, context: int, prompt: int) -> dict[str, object]:
    """Each case's one step, as a callable returning its greedy tokens."""
    length = max(context, prompt) + 1
    blocks_per_row = -(-length // BLOCK_SIZE)
    pool = runner.new_paged_kv_cache(rows * blocks_per_row, BLOCK_SIZE)
    slot_cache = runner.new_kv_cache(rows, length)
    tables = [tuple(range(r * blocks_per_row, (r + 1) * blocks_per_row)) for r in range(rows)]

    def output(prefill: bool, paged: bool) -> SchedulerOutput:
        return SchedulerOutput(tuple(
            ScheduledChunk(f"r{r}", r, tuple(3 + (r + j) % 200 for j in range(prompt)) if prefill else (5 + r,),
                           0 if prefill else context, samples=True, is_prefill=prefill,
                           block_table=tables[r] if paged else ())
            for r in range(rows)
        ), num_waiting=0)  # fmt: skip

    return {
        "paged decode": lambda: runner.execute(output(False, True), pool),
        "slot decode": lambda: runner.execute(output(False, False), slot_cache),
        "prefill": lambda: runner.execute(output(True, True), pool),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--rows", type=comma_list(positive_int), default=(1, 8, 32))
    parser.add_argument("--context", type=positive_int, default=128, help="every decode row's keys before the step")
    parser.add_argument("--prompt", type=positive_int, default=64, help="every prefill row's prompt tokens")
    parser.add_argument("--steps", type=positive_int, default=12, help="timed steps per case and operators")
    args = parser.parse_args()
    bench = load_bench_model(args)
    runner = ModelRunner(bench.loaded.model)
    print(f"model={bench.loaded.spec.name} dtype={args.dtype} threads={bench.threads} context={args.context} "
          f"prompt={args.prompt} steps={args.steps} torch={torch.__version__}; layer ops: {runner.layer_ops}; "
          f"paged decode attention: {runner.paged_attention}", flush=True)  # fmt: skip
    if runner.layer_ops != "fused":
        sys.exit("the fused layer operators are not available here, so there is nothing to compare")
    decoders = {"fused": runner.decoder, "torch": dataclasses.replace(runner.decoder, layer_ops=None)}
    with torch.inference_mode():
        for rows in args.rows:
            for case, run in step_cases(runner, rows, args.context, args.prompt).items():
                times: dict[str, list[float]] = {name: [] for name in decoders}
                tokens = {}
                for name, decoder in decoders.items():  # warm-up, and each one's tokens
                    runner.decoder = decoder
                    tokens[name] = run()
                for step in range(args.steps):
                    for name in list(decoders) if step % 2 == 0 else reversed(list(decoders)):
                        runner.decoder = decoders[name]
                        started = time.perf_counter()
                        run()
                        times[name].append(1e3 * (time.perf_counter() - started))
                runner.decoder = decoders["fused"]
                ms = {name: statistics.median(values) for name, values in times.items()}
                print(f"rows={rows:3d} {case:12s}: fused {ms['fused']:8.1f} ms, torch {ms['torch']:8.1f} ms; "
                      f"fused over torch {ms['torch'] / ms['fused']:.3f}x; same tokens: "
                      f"{tokens['fused'] == tokens['torch']}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
