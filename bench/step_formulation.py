"""The model runner's step before and after the one-copy index buffer and the folded-GQA attention, side by side.

    python bench/step_formulation.py [--model random-smollm2-135m] [--ref 45f80be] [--repeats 7] [--threads N]
                                     [--clock wall|cpu]

The old runner is read from ``--ref`` (by default the last commit before the
change: ``torch.tensor(list, device=...)`` per index and
``scaled_dot_product_attention(..., attn_mask=mask, enable_gqa=True)``) and
run beside the current one over the same weights, on CPU:

- ``attention``: the attention call alone, old (``enable_gqa`` with a mask)
  against ``layers.grouped_query_attention`` (query heads folded per KV
  head, no ``enable_gqa``), at a decode shape and a prefill shape;
- ``step``: whole in-flight engine runs (prefill and decode steps; packed
  path), old runner and new alternating within each repeat.

Old and new alternate within each repeat (ABBA order) and every ratio is
taken within a repeat, so a machine whose speed drifts (others' work on a
shared VM) cancels; printed are the medians of the times and of the
per-repeat ratios new / old, so below 1 means the new formulation is faster.
On a VM that others load, ``--clock cpu`` (one torch thread, this process's
CPU time) does not count the time the process waited for a core. The GPU motive (a fused SDPA kernel, one
non-blocking copy) cannot be measured here; this checks that CPU did not get
slower.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from perfsuite.engine import Request, SamplingParams, inflight_engine  # noqa: E402
from perfsuite.engine.layers import grouped_query_attention  # noqa: E402
from perfsuite.engine.model_runner import ModelRunner  # noqa: E402
from perfsuite.models import load_model  # noqa: E402

OLD_REF = "45f80be"
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter  # the last commit whose runner copies each index and calls SDPA with enable_gqa and a mask


def old_runner_class(ref: str):
    source = subprocess.run(
        ["git", "show", f"{ref}:perfsuite/engine/model_runner.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    spec = importlib.util.spec_from_loader("perfsuite.engine._old_model_runner", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(source, f"{ref}:model_runner.py", "exec"), module.__dict__)
    return module.ModelRunner


def paired_medians(old, new, repeats: int) -> tuple[float, float, float]:
    """Median old and new seconds and the median of per-repeat new/old ratios, the pair's order alternating."""
    old(), new()  # warm-up
    old_times, new_times = [], []
    for repeat in range(repeats):
        pair = ((old, old_times), (new, new_times))
        for fn, times in pair if repeat % 2 == 0 else pair[::-1]:
            start = clock()
            fn()
            times.append(clock() - start)
    ratios = [n / o for o, n in zip(old_times, new_times)]
    return statistics.median(old_times), statistics.median(new_times), statistics.median(ratios)


def attention_case(heads, rows: int, q_len: int, num_keys: int, repeats: int) -> tuple[float, float, float]:
    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(rows, q_len, heads.num_heads, heads.head_dim, generator=generator)
    keys = torch.randn(rows, heads.num_kv_heads, num_keys, heads.head_dim, generator=generator)
    values = torch.randn(rows, heads.num_kv_heads, num_keys, heads.head_dim, generator=generator)
    starts = torch.arange(rows) * (num_keys - q_len) // max(rows - 1, 1)
    query_pos = starts[:, None] + torch.arange(q_len)[None, :]
    mask = (torch.arange(num_keys)[None, None, :] <= query_pos[:, :, None]).unsqueeze(1)

    def old():
        for _ in range(20):
            F.scaled_dot_product_attention(queries.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=True)

    def new():
        for _ in range(20):
            grouped_query_attention(queries, keys, values, mask)

    with torch.inference_mode():
        expected = F.scaled_dot_product_attention(
            queries.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=True
        ).transpose(1, 2)
        torch.testing.assert_close(grouped_query_attention(queries, keys, values, mask), expected)
        old_seconds, new_seconds, ratio = paired_medians(old, new, repeats)
        return old_seconds / 20, new_seconds / 20, ratio


def workload(num_requests: int) -> list[Request]:
    return [
        Request(f"r{i}", tuple((7 * i + 3 * j) % 4000 + 10 for j in range(24 + (i * 13) % 40)),
                SamplingParams(16 + (i * 7) % 24, ignore_eos=True))
        for i in range(num_requests)
    ]  # fmt: skip


def step_case(old_runner, new_runner, eos, repeats: int, batch_size: int, num_requests: int):
    requests = workload(num_requests)

    def run(runner):
        engine = inflight_engine(runner, decode_batch_size=batch_size, max_seq_len=128, eos_token_id=eos)
        return lambda: engine.run(requests)

    return paired_medians(run(old_runner), run(new_runner), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="random-smollm2-135m")
    parser.add_argument("--ref", default=OLD_REF)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--num-requests", type=int, default=8)
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    if args.clock == "cpu":
        args.threads = 1  # with more threads CPU time adds up the threads' spinning
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model, dtype="float32")
    old_runner, new_runner = old_runner_class(args.ref)(loaded.model), ModelRunner(loaded.model)
    heads = new_runner.decoder.heads
    print(f"model {args.model}: {heads.num_heads} query heads, {heads.num_kv_heads} KV heads, head_dim {heads.head_dim};"
          f" {torch.get_num_threads()} threads; {args.clock} clock; old runner from {args.ref}")  # fmt: skip
    print(f"{'case':<34} {'old ms':>9} {'new ms':>9} {'new/old (median of pairs)':>26}")
    for label, rows, q_len, num_keys in (
        ("attention decode 8 rows x 256 keys", 8, 1, 256),
        ("attention prefill 4 x 64 q x 128 k", 4, 64, 128),
    ):
        old, new, ratio = attention_case(heads, rows, q_len, num_keys, args.repeats)
        print(f"{label:<34} {old * 1e3:>9.3f} {new * 1e3:>9.3f} {ratio:>26.3f}")
    old, new, ratio = step_case(old_runner, new_runner, loaded.eos_token_id, args.repeats, 8, args.num_requests)
    label = f"step: inflight run, {args.num_requests} requests"
    print(f"{label:<34} {old * 1e3:>9.1f} {new * 1e3:>9.1f} {ratio:>26.3f}")


if __name__ == "__main__":
    main()
