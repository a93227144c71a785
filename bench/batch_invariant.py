"""What batch-invariant mode costs: an engine over the normal runner and over the batch-invariant one, side by side.

    python bench/batch_invariant.py [--model smollm2-135m] [--engines paged] [--batch-sizes 8,32]
                                    [--prompt-tokens 32] [--new-tokens 32] [--repeats 3] [--threads N]

For each engine and batch size B, B requests of --prompt-tokens seeded token
ids each generate --new-tokens tokens (EOS ignored), over
``ModelRunner(model)`` and ``ModelRunner(model, batch_invariant=True)``: one
warm-up run each, thrown away, then --repeats timed runs each, the two modes
alternating and each first in alternate rounds, so both see the same machine.
Prints output tok/s per run, the median per mode, and the ratio normal /
invariant (how many times slower the invariant mode is). The last lines are
``invariant cost <engine> B=<b>: <ratio>x``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import add_model_arguments, comma_list, load_bench_model  # noqa: E402

from perfsuite.adapters import Backend, EngineConfig, build_engine  # noqa: E402
from perfsuite.engine import Request, SamplingParams  # noqa: E402
from perfsuite.engine.model_runner import ModelRunner  # noqa: E402
from perfsuite.measure.environment import cpu_model  # noqa: E402

MODES = ("normal", "invariant")


def workload(batch_size: int, prompt_tokens: int, new_tokens: int, vocab_size: int) -> list[Request]:
    rng = random.Random(batch_size)
    return [
        Request(f"r{i}", tuple(rng.randrange(3, vocab_size) for _ in range(prompt_tokens)),
                SamplingParams(new_tokens, ignore_eos=True))
        for i in range(batch_size)
    ]  # fmt: skip


def tokens_per_second(backend: Backend, engine_name: str, requests: list[Request], max_seq_len: int) -> float:
    config = EngineConfig(len(requests), max_seq_len, batch_invariant=backend.runner.batch_invariant)
    result = build_engine(engine_name, backend, config).run(requests)
    return sum(len(record.output_token_ids) for record in result.records) / result.duration


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--engines", type=comma_list(str), default=("paged",))
    parser.add_argument("--batch-sizes", type=comma_list(int), default=(8, 32))
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    bench = load_bench_model(args)
    loaded = bench.loaded
    backends = {
        mode: Backend(runner=ModelRunner(loaded.model, batch_invariant=mode == "invariant"), tokenize=list,
                      eos_token_id=None, max_context=loaded.max_context, device=bench.device)
        for mode in MODES
    }  # fmt: skip
    print(f"{args.model} {args.dtype} on {bench.device} ({cpu_model()}), {bench.threads} threads; "
          f"{args.prompt_tokens} prompt + {args.new_tokens} new tokens a request; {args.repeats} repeats")  # fmt: skip
    max_seq_len = args.prompt_tokens + args.new_tokens
    vocab_size = loaded.model.config.vocab_size
    lines = []
    for engine_name in args.engines:
        for batch_size in args.batch_sizes:
            requests = workload(batch_size, args.prompt_tokens, args.new_tokens, vocab_size)
            for mode in MODES:  # warm-up, thrown away
                tokens_per_second(backends[mode], engine_name, requests, max_seq_len)
            rates: dict[str, list[float]] = {mode: [] for mode in MODES}
            for round_index in range(args.repeats):
                for mode in MODES if round_index % 2 == 0 else reversed(MODES):
                    rates[mode].append(tokens_per_second(backends[mode], engine_name, requests, max_seq_len))
            medians = {mode: statistics.median(rates[mode]) for mode in MODES}
            for mode in MODES:
                shown = ", ".join(f"{rate:.1f}" for rate in rates[mode])
                print(f"{engine_name} B={batch_size} {mode:9}: median {medians[mode]:.1f} tok/s ({shown})", flush=True)
            lines.append(f"invariant cost {engine_name} B={batch_size}: "
                         f"{medians['normal'] / medians['invariant']:.2f}x")  # fmt: skip
    print("\n".join(lines))


if __name__ == "__main__":
    main()
