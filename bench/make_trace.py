"""Write the small synthetic trace shipped as perfsuite/data/synthetic-trace.jsonl (Mooncake's format).

    python bench/make_trace.py                  # rewrites the shipped file
    python bench/make_trace.py -o my.jsonl --num-requests 200 --seed 3

Seeded, no download. Each line is a request: ``timestamp`` (ms, Poisson
arrivals), ``input_length``, ``output_length`` and ``hash_ids``, one id per
512-token block. Most requests start with one of a few shared prefixes (a
system prompt of one or two blocks); some continue an earlier request
(its blocks plus one more, as a conversation's next turn would); the rest of
each prompt is blocks of its own. tests/test_trace.py checks that this script
reproduces the shipped file.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SHIPPED = Path(__file__).resolve().parents[1] / "perfsuite" / "data" / "synthetic-trace.jsonl"
BLOCK_SIZE = 512


def trace_lines(num_requests: int = 40, seed: int = 0, rate: float = 2.0, num_prefixes: int = 4) -> list[str]:
    """The trace's lines, JSON objects in timestamp order."""
    rng = random.Random(seed)
    next_id = 0

    def fresh(count: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + count))
        next_id += count
        return ids

    prefixes = [fresh(rng.randint(1, 2)) for _ in range(num_prefixes)]
    earlier: list[list[int]] = []
    lines, now_ms = [], 0.0
    for _ in range(num_requests):
        roll = rng.random()
        if earlier and roll < 0.2:
            hash_ids = rng.choice(earlier) + fresh(1)  # the next turn of an earlier conversation
        elif roll < 0.8:
            hash_ids = rng.choice(prefixes) + fresh(rng.randint(0, 2))
        else:
            hash_ids = fresh(rng.randint(1, 3))
        earlier.append(hash_ids)
        input_length = (len(hash_ids) - 1) * BLOCK_SIZE + rng.randint(1, BLOCK_SIZE)
        line = {"timestamp": int(now_ms), "input_length": input_length, "output_length": rng.randint(16, 256),
                "hash_ids": hash_ids}  # fmt: skip
        lines.append(json.dumps(line))
        now_ms += rng.expovariate(rate) * 1000
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=SHIPPED, help="where to write (the shipped file)")
    parser.add_argument("--num-requests", type=int, default=40, help="lines (40)")
    parser.add_argument("--seed", type=int, default=0, help="seed (0)")
    parser.add_argument("--rate", type=float, default=2.0, help="mean arrivals per second (2.0)")
    args = parser.parse_args(argv)
    args.output.write_text("\n".join(trace_lines(args.num_requests, args.seed, args.rate)) + "\n", encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
