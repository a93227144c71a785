"""Prompt steps with their attention read in place by the kernel, token by token, against SDPA over the padded group.

    python bench/prefill_attention.py [--model smollm2-135m] [--rows 1,8,32] [--prompts 8,16,32,64,128]
                                      [--decode-rows 0] [--steps 8]

``ModelRunner`` sends a prompt group to perfsuite's in-place kernel while its
tokens read at most ``in_place_prefill_max_keys`` keys in all (the sum over
its tokens of position + 1), and to SDPA past that. This times one step of
``rows`` prompts of ``prompt`` tokens each (``--decode-rows`` decode rows at
the prompt's length beside them, as in a mixed step) both ways over one
runner's weights and one paged pool: the two take turns step by step, first
in alternate rounds, so drift on a noisy machine hits them alike. It prints,
per shape, the keys the prompts read, the median ms per step of each, the
kernel's speed over SDPA's, and whether they chose the same greedy tokens;
the last line names the largest keys read at which the kernel was still the
faster, and the smallest at which it was not, which is what the budget
(``perfsuite.engine.model_runner.IN_PLACE_PREFILL_MAX_KEYS``) should sit
between on this machine.
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

from bench_common import add_model_arguments, comma_list, load_bench_model  # noqa: E402
from perfsuite.argtypes import integer_at_least, positive_int  # noqa: E402
from perfsuite.engine.model_runner import IN_PLACE_PREFILL_MAX_KEYS, ModelRunner  # noqa: E402
from perfsuite.engine.types import ScheduledChunk, SchedulerOutput  # noqa: E402

BLOCK_SIZE = 16
PATHS = {"in place": 10**12, "sdpa": 0}  # in_place_prefill_max_keys of each


def step(rows: int, prompt: int, decode_rows: int, blocks_per_row: int) -> SchedulerOutput:
    prompts = [ScheduledChunk(f"p{r}", r, tuple(3 + (r + j) % 200 for j in range(prompt)), 0, samples=True,
                              is_prefill=True, block_table=tuple(range(r * blocks_per_row, (r + 1) * blocks_per_row)))
               for r in range(rows)]  # fmt: skip
    decodes = [ScheduledChunk(f"d{r}", r, (5 + r,), prompt, samples=True, is_prefill=False,
                              block_table=tuple(range(r * blocks_per_row, (r + 1) * blocks_per_row)))
               for r in range(rows, rows + decode_rows)]  # fmt: skip
    return SchedulerOutput(tuple(prompts + decodes), num_waiting=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--rows", type=comma_list(positive_int), default=(1, 8, 32), help="prompts in a step")
    parser.add_argument("--prompts", type=comma_list(positive_int), default=(8, 16, 32, 64, 128),
                        help="each prompt's tokens")  # fmt: skip
    parser.add_argument("--decode-rows", type=integer_at_least(0, "a count"), default=0, help="decode rows beside the prompts")
    parser.add_argument("--steps", type=positive_int, default=8, help="timed steps per shape and path")
    args = parser.parse_args()
    bench = load_bench_model(args)
    runners = {name: ModelRunner(bench.loaded.model, in_place_prefill_max_keys=budget)
               for name, budget in PATHS.items()}  # fmt: skip
    print(f"model={bench.loaded.spec.name} dtype={args.dtype} threads={bench.threads} steps={args.steps} "
          f"decode_rows={args.decode_rows} torch={torch.__version__}; attention in place: "
          f"{runners['in place'].paged_attention}; the budget now: {IN_PLACE_PREFILL_MAX_KEYS} keys", flush=True)  # fmt: skip
    if runners["in place"].paged_attention != "in place":
        sys.exit("the in-place kernel is not available here, so there is nothing to compare")
    faster, slower = [], []
    with torch.inference_mode():
        for rows in args.rows:
            for prompt in args.prompts:
                blocks_per_row = -(-(prompt + 1) // BLOCK_SIZE)
                output = step(rows, prompt, args.decode_rows, blocks_per_row)
                keys_read = rows * prompt * (prompt + 1) // 2
                pool = runners["sdpa"].new_paged_kv_cache((rows + args.decode_rows) * blocks_per_row, BLOCK_SIZE)
                times: dict[str, list[float]] = {name: [] for name in runners}
                tokens = {name: runner.execute(output, pool) for name, runner in runners.items()}  # and warm-up
                for index in range(args.steps):
                    for name in list(runners) if index % 2 == 0 else reversed(list(runners)):
                        started = time.perf_counter()
                        runners[name].execute(output, pool)
                        times[name].append(1e3 * (time.perf_counter() - started))
                ms = {name: statistics.median(values) for name, values in times.items()}
                speed = ms["sdpa"] / ms["in place"]
                (faster if speed > 1 else slower).append(keys_read)
                print(f"rows={rows:3d} prompt={prompt:4d} keys read={keys_read:7d}: in place {ms['in place']:8.1f} ms, "
                      f"sdpa {ms['sdpa']:8.1f} ms; in place over sdpa {speed:.3f}x; same tokens: "
                      f"{tokens['in place'] == tokens['sdpa']}", flush=True)  # fmt: skip
    print(f"in place faster up to {max(faster, default=0)} keys read; slower from "
          f"{min(slower, default='none')} keys read")  # fmt: skip


if __name__ == "__main__":
    main()
