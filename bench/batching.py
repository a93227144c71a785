"""In-flight vs static batching on one machine, measured side by side.

    python bench/batching.py [--model smollm2-135m] [--batch-size 8] [--num-requests 128] [--repeats 2]

Both engines share one model runner and run the same seeded mixed workload
(shipped prompts, max_new_tokens uniform 8..128, EOS ignored, all at t0).
Each repeat runs both engines back to back, alternating which goes first, and
the ratio is taken per repeat, so slow drift of a noisy machine cancels.

128 requests by default: a run ends with a drain tail where fewer than B
requests are left, and with few requests that tail dominates (the exact
forward-pass ratio is 1.41 at 32 requests, 1.58 at 128, 1.66 at 256).

Printed figures:
- inflight/static: output tok/s of in-flight over static (median of repeats).
- ideal: what a perfect in-flight engine would gain if a step cost the same
  whatever it holds: static pays B rows x the longest output of each batch,
  in-flight pays only the tokens it produces. ideal = sum(rows x max) / sum(lengths).
- fraction: inflight/static divided by ideal.
- overhead: share of the in-flight run's wall time spent outside the model's
  forward compute (scheduling, building the step's tensors, bookkeeping).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfsuite.engine import build_engine  # noqa: E402
from perfsuite.engine.model_runner import ModelRunner  # noqa: E402
from perfsuite.measure.timing import configure_threads, max_seq_len_for, resolve_device, timed_run, warm_up  # noqa: E402
from perfsuite.measure.metrics import run_metrics  # noqa: E402
from perfsuite.models import DEFAULT_MODEL, load_model  # noqa: E402
from perfsuite.report.table import format_table  # noqa: E402
from perfsuite.workload import mixed_workload  # noqa: E402


class ProfiledRunner(ModelRunner):
    """Splits each step into host preparation and model compute."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.execute_seconds = 0.0
        self.prepare_seconds = 0.0

    def execute(self, output, kv_cache):
        start = time.perf_counter()
        tokens = super().execute(output, kv_cache)
        self.execute_seconds += time.perf_counter() - start
        return tokens

    def _prepare(self, chunks, max_seq_len):
        start = time.perf_counter()
        batch = super()._prepare(chunks, max_seq_len)
        self.prepare_seconds += time.perf_counter() - start
        return batch

    def reset(self) -> None:
        self.execute_seconds = self.prepare_seconds = 0.0

    @property
    def compute_seconds(self) -> float:
        return self.execute_seconds - self.prepare_seconds


def ideal_ratio(lengths: list[int], batch_size: int) -> float:
    static_slot_steps = sum(
        len(batch) * max(batch) for batch in (lengths[i : i + batch_size] for i in range(0, len(lengths), batch_size))
    )
    return static_slot_steps / sum(lengths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-requests", type=int, default=128)
    parser.add_argument("--min-new-tokens", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    device = resolve_device(args.device)
    threads = configure_threads(args.threads) if device == "cpu" else None
    loaded = load_model(args.model, device=device, dtype=args.dtype)
    workload = mixed_workload(args.num_requests, args.min_new_tokens, args.max_new_tokens)
    requests = workload.requests(lambda text: loaded.tokenizer(text)["input_ids"])
    runner = ProfiledRunner(loaded.model)
    max_seq_len = max_seq_len_for(requests, loaded.max_context)
    engines = {
        kind: build_engine(
            kind, runner, batch_size=args.batch_size, max_seq_len=max_seq_len, eos_token_id=loaded.eos_token_id
        )
        for kind in ("static", "inflight")
    }
    for engine in engines.values():
        warm_up(engine, requests)
    print(
        f"model={loaded.spec.name} dtype={args.dtype} device={device} threads={threads} "
        f"B={args.batch_size} requests={len(requests)} repeats={args.repeats}",
        flush=True,
    )

    throughput = {kind: [] for kind in engines}
    step_ms = {kind: [] for kind in engines}
    counters = {}
    overheads, ratios = [], []
    for repeat in range(args.repeats):
        order = list(engines) if repeat % 2 == 0 else list(reversed(engines))
        for kind in order:
            runner.reset()
            result = timed_run(engines[kind], requests, device)
            metrics = run_metrics(result)
            throughput[kind].append(metrics.output_throughput)
            step_ms[kind].append(1e3 * result.duration / result.counters.num_forward_passes)
            counters[kind] = result.counters
            if kind == "inflight":
                overheads.append(1 - runner.compute_seconds / result.duration)
            print(f"  repeat {repeat}: {kind:8s} {metrics.output_throughput:8.1f} tok/s", flush=True)
        ratios.append(throughput["inflight"][-1] / throughput["static"][-1])

    rows = [
        [
            kind,
            statistics.median(throughput[kind]),
            min(throughput[kind]),
            max(throughput[kind]),
            statistics.median(step_ms[kind]),
            counters[kind].num_forward_passes,
            counters[kind].num_padding_tokens,
        ]
        for kind in engines
    ]
    print(format_table(["engine", "tok/s median", "min", "max", "ms/step", "forward passes", "padded slot-tokens"], rows))
    ratio = statistics.median(ratios)
    ideal = ideal_ratio(workload.output_lengths(), args.batch_size)
    overhead = statistics.median(overheads)
    print(f"per-repeat inflight/static: {', '.join(f'{r:.3f}' for r in ratios)}")
    print(f"inflight/static={ratio:.2f} ideal={ideal:.2f} fraction={ratio / ideal:.2f} overhead={overhead * 100:.1f}%")


if __name__ == "__main__":
    main()
