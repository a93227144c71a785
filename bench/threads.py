"""Which torch thread count gives steady decode steps on this CPU?

    python bench/threads.py [--model smollm2-135m] [--steps 40]

Times single decode steps of B=8 running requests, interleaving the thread
settings step by step so drift of the machine hits all of them alike, and
prints the median step time and its spread (coefficient of variation and
p90/p10) for each. perfsuite uses one intra-op thread per core and one
inter-op thread (``perfsuite.measure.timing.configure_threads``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfsuite.engine.model_runner import ModelRunner  # noqa: E402
from perfsuite.engine.types import ScheduledChunk, SchedulerOutput  # noqa: E402
from perfsuite.measure.metrics import percentile  # noqa: E402
from perfsuite.models import DEFAULT_MODEL, load_model  # noqa: E402
from perfsuite.report.table import format_table  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()

    import torch

    torch.set_num_interop_threads(1)
    cores = len(os.sched_getaffinity(0))
    settings = sorted({1, cores, 2 * cores})
    loaded = load_model(args.model)
    runner = ModelRunner(loaded.model)
    kv_cache = runner.new_kv_cache(args.batch_size, 256)
    decode = SchedulerOutput(
        tuple(ScheduledChunk(f"r{i}", i, (100 + i,), 64, True, False) for i in range(args.batch_size)), 0
    )
    times = {threads: [] for threads in settings}
    for threads in settings:  # warm-up per setting
        torch.set_num_threads(threads)
        runner.execute(decode, kv_cache)
    for _ in range(args.steps):
        for threads in settings:
            torch.set_num_threads(threads)
            start = time.perf_counter()
            runner.execute(decode, kv_cache)
            times[threads].append(1e3 * (time.perf_counter() - start))
    rows = []
    for threads, values in times.items():
        cv = statistics.pstdev(values) / statistics.mean(values)
        rows.append([threads, statistics.median(values), f"{100 * cv:.1f}%", percentile(values, 90) / percentile(values, 10)])
    print(f"{cores} cores, B={args.batch_size}, {args.steps} interleaved steps per setting")
    print(format_table(["threads", "median ms/step", "CV", "p90/p10"], rows))


if __name__ == "__main__":
    main()
