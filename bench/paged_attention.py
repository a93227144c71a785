"""The paged engine's decode step with its blocks read in place, against gathering them, side by side.

    python bench/paged_attention.py [--model smollm2-135m] [--rows 1,8,32] [--context 256] [--steps 16]
                                    [--against-generic]

For each row count, one decode step of every row at ``--context`` keys,
three ways over the same runner and weights: the paged pool read in place by
perfsuite's kernel (``perfsuite.engine.paged_attention``), the same pool
gathered block by block first (``paged_attention=False``'s path), and the slot
cache (the in-flight engine's). The cases take turns step by step, first in
alternate rounds, so drift on a noisy machine hits them alike; it prints the
median ms per step and the in-place step's speed over each other's.

With ``--against-generic`` a fourth case runs the kernel built for any
head_dim (``-DPERFSUITE_GENERIC_HEAD_DIM``), where the default build has one
whose dot products' length the compiler knows, for head_dim 64 and 128.

Each row's blocks are scattered through a pool twice the rows' need (a
seeded shuffle), as a pool is after requests come and go.
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
from perfsuite.argtypes import positive_int  # noqa: E402
from perfsuite.engine.c_library import build_library, system_compiler  # noqa: E402
from perfsuite.engine.model_runner import ModelRunner  # noqa: E402
from perfsuite.engine.paged_attention import SOURCE, PagedAttention, Unavailable  # noqa: E402
from perfsuite.engine.types import ScheduledChunk, SchedulerOutput  # noqa: E402

BLOCK_SIZE = 16


def decode_output(rows: int, context: int, tables: list[tuple[int, ...]]) -> SchedulerOutput:
    chunks = tuple(
        ScheduledChunk(f"r{r}", r, (5 + r,), context, samples=True, is_prefill=False, block_table=tables[r])
        for r in range(rows)
    )
    return SchedulerOutput(chunks, num_waiting=0)


def generic_kernel() -> PagedAttention:
    """The kernel built for any head_dim, as it was before the fixed-head_dim ones."""
    compiler = system_compiler()
    library = compiler if isinstance(compiler, Unavailable) else build_library(compiler, SOURCE, ("PERFSUITE_GENERIC_HEAD_DIM",))
    if isinstance(library, Unavailable):
        sys.exit(f"the generic kernel could not be built: {library.reason}")
    return PagedAttention(library)


def step_cases(runner: ModelRunner, rows: int, context: int, generic: PagedAttention | None) -> dict[str, object]:
    """Each case's one decode step, as a callable."""
    blocks_per_row = -(-(context + 1) // BLOCK_SIZE)
    pool = runner.new_paged_kv_cache(2 * rows * blocks_per_row, BLOCK_SIZE)
    shuffled = torch.randperm(pool.num_blocks, generator=torch.Generator().manual_seed(rows)).tolist()
    tables = [tuple(shuffled[r * blocks_per_row : (r + 1) * blocks_per_row]) for r in range(rows)]
    paged = decode_output(rows, context, tables)
    slots = decode_output(rows, context, [()] * rows)
    slot_cache = runner.new_kv_cache(rows, context + 1)
    in_place = runner._paged_attention  # a cached property: swapped for the gathered case, then put back

    def with_kernel(kernel: PagedAttention | Unavailable) -> None:
        runner.__dict__["_paged_attention"] = kernel
        try:
            runner.execute(paged, pool)
        finally:
            runner.__dict__["_paged_attention"] = in_place

    cases = {
        "paged, in place": lambda: runner.execute(paged, pool),
        "paged, gathered": lambda: with_kernel(Unavailable("benchmark: the gather path")),
        "slot": lambda: runner.execute(slots, slot_cache),
    }
    if generic is not None:
        cases["paged, generic head_dim"] = lambda: with_kernel(generic)
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--rows", type=comma_list(positive_int), default=(1, 8, 32))
    parser.add_argument("--context", type=positive_int, default=256, help="every row's keys before the step")
    parser.add_argument("--steps", type=positive_int, default=16, help="timed steps per case")
    parser.add_argument("--against-generic", action="store_true", help="also time the kernel for any head_dim")
    args = parser.parse_args()
    bench = load_bench_model(args)
    runner = ModelRunner(bench.loaded.model)
    print(f"model={bench.loaded.spec.name} threads={bench.threads} context={args.context} steps={args.steps} "
          f"torch={torch.__version__}; paged decode attention: {runner.paged_attention}", flush=True)  # fmt: skip
    if runner.paged_attention != "in place":
        sys.exit("the in-place kernel is not available here, so there is nothing to compare")
    with torch.inference_mode():
        for rows in args.rows:
            cases = step_cases(runner, rows, args.context, generic_kernel() if args.against_generic else None)
            for run in cases.values():
                run()  # warm-up
            times: dict[str, list[float]] = {name: [] for name in cases}
            for step in range(args.steps):
                for name in list(cases) if step % 2 == 0 else reversed(list(cases)):
                    started = time.perf_counter()
                    cases[name]()
                    times[name].append(1e3 * (time.perf_counter() - started))
            ms = {name: statistics.median(values) for name, values in times.items()}
            print(f"rows={rows}: " + ", ".join(f"{name} {value:.1f} ms" for name, value in ms.items())
                  + f"; in place over gathered {ms['paged, gathered'] / ms['paged, in place']:.2f}x, "
                  f"over slot {ms['slot'] / ms['paged, in place']:.2f}x"
                  + (f", over generic head_dim {ms['paged, generic head_dim'] / ms['paged, in place']:.2f}x"
                     if args.against_generic else ""), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
