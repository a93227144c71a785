"""What perfsuite.measure.contention's meter reads around a torch CPU workload, idle and with a busy neighbour.

    python bench/contention_probe.py [--runs 4] [--seconds 5]

Each run times a loop of ``F.linear`` ((8, 512) x (32768, 512)) at 2 threads
for about ``--seconds`` inside a ``CpuMeter``; first on the machine as it is,
then while a second process busy-loops on one core. The figures chose
``DEFAULT_THRESHOLD``; check ``top -bn1`` first, since other work pollutes the
idle rows.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from perfsuite.measure.contention import DEFAULT_THRESHOLD, CpuMeter, CpuUse

BUSY_LOOP = "while True: pass"


def workload(seconds: float) -> float:
    """Steps per second of the linear layer over about ``seconds``."""
    x, weight = torch.randn(8, 512), torch.randn(32768, 512)  # x: [B, H], weight: [V, H]
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        F.linear(x, weight)
        steps += 1
    return steps / (time.perf_counter() - start)


def measured_run(seconds: float) -> tuple[CpuUse | None, float]:
    with CpuMeter() as meter:
        rate = workload(seconds)
    return meter.use, rate


def report(label: str, use: CpuUse | None, rate: float) -> None:
    if use is None:
        print(f"{label}: /proc/stat unreadable")
        return
    print(
        f"{label}: {rate:7.1f} steps/s  wall {use.wall_seconds:.2f}s  foreign {use.foreign_share:.3f}  "
        f"steal {use.steal_share:.3f}  own {use.own_share:.3f}  busy {use.busy_share:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    torch.set_num_threads(2)
    workload(0.5)  # warm-up, discarded
    for run in range(args.runs):
        report(f"idle   #{run}", *measured_run(args.seconds))
    neighbour = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
    try:
        time.sleep(0.5)
        for run in range(args.runs):
            report(f"loaded #{run}", *measured_run(args.seconds))
    finally:
        neighbour.kill()
        neighbour.wait()
    print(f"DEFAULT_THRESHOLD = {DEFAULT_THRESHOLD}")


if __name__ == "__main__":
    main()
