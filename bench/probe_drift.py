"""Which machine probe follows the model's speed: the memory part, the compute part, or both.

    python bench/probe_drift.py [--seconds 720] [--model smollm2-135m] [--save rows.json]

For ``--seconds`` it loops: the memory-bound probe part, the compute-bound
part, a prefill of 8 x 10 tokens, a decode-shaped forward of 8 x 1 tokens
(all timed back to back, on this machine as it is). Then it prints, for
prefill and decode, the spread of log time left after dividing by each
probe (lower is better) and the fitted slope (1 means the probe moves one
for one with the model), and whether a probe taken after the step as well
as before helps. ``perfsuite.measure.probe.machine_probe`` cites its figures.
Run it on a quiet machine: other work is exactly what it measures.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from perfsuite.measure.probe import compute_probe, memory_probe, seconds_per_call
from perfsuite.measure.timing import configure_threads
from perfsuite.models import load_model


def collect(model_name: str, seconds: float) -> list[tuple[float, float, float, float]]:
    model = load_model(model_name).model
    vocab = model.config.vocab_size
    prefill = torch.randint(0, vocab, (8, 10), generator=torch.Generator().manual_seed(0))
    decode = prefill[:, :1]
    rows, deadline = [], time.monotonic() + seconds
    with torch.inference_mode():
        while time.monotonic() < deadline:
            rows.append(
                (
                    memory_probe("cpu"),
                    compute_probe("cpu"),
                    seconds_per_call(lambda: model(prefill), 2),
                    seconds_per_call(lambda: model(decode), 4),
                )
            )
    return rows


def report(rows: list[tuple[float, float, float, float]]) -> None:
    memory, compute, prefill, decode = (np.log(np.array(column)) for column in zip(*rows))
    probes = {"memory": memory, "compute": compute, "geometric mean": (memory + compute) / 2}
    print(f"{len(rows)} rows; raw spread of log time: prefill {prefill.std():.3f}, decode {decode.std():.3f}")
    print(f"{'normalised by':>16}  {'prefill':>8} {'slope':>6}  {'decode':>8} {'slope':>6}")
    for name, probe in probes.items():
        cells = [f"{(y - probe).std():8.3f} {np.polyfit(probe, y, 1)[0]:6.2f}" for y in (prefill, decode)]
        print(f"{name:>16}  " + "  ".join(cells))
    both = probes["geometric mean"]
    for name, y in (("prefill", prefill), ("decode", decode)):
        before = (y[:-1] - both[:-1]).std()
        bracketed = (y[:-1] - (both[:-1] + both[1:]) / 2).std()
        print(f"{name}: probe before only {before:.3f}, before and after {bracketed:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=720.0)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--save", help="also write the raw rows (seconds) to this JSON file")
    args = parser.parse_args()
    configure_threads(None)
    rows = collect(args.model, args.seconds)
    if args.save:
        with open(args.save, "w") as file:
            json.dump(rows, file)
    report(rows)


if __name__ == "__main__":
    main()
