"""Does the instruction lane flag a 1% host-side slowdown every time, and an A/A never? (issue 42)

    PYTHONPATH=. python bench/instructions_ab.py --trials 10 --json bench/results/instructions_ab.json

Counts the instructions per engine step of an engine over the fake runner
(``perfsuite.measure.instructions``) and judges each count against the
first A count with the lane's threshold (``perfsuite.judge.instructions``):

1. A: the engine as it is, once for the stored figure, then ``--trials``
   times (A/A: every one should pass).
2. Calibration: B with a known number of extra loop iterations in the
   scheduler's ``schedule()``, so one iteration's instructions are measured,
   then the iterations that cost ``--slowdown`` of a step are chosen.
3. B: that slowdown, ``--trials`` times (every one should be flagged).

Each count pads the counted process's environment with 0 to 511 characters
(``PERFSUITE_LAYOUT_PAD``, seeded by ``--seed``): the environment's size moves
where objects lie in memory and so how dicts and sets keyed by objects
collide, as another session, checkout or runner would. The A/A spread is
then the spread between sessions, not within one.

The injection is a pure-Python loop run at the start of every
``schedule()`` call (one per engine step), in a subclass of the engine's
scheduler: host work the engine really does, in the scheduler, as a slower
admission policy would add it. It is read in the counted process from
``PERFSUITE_INJECTED_ITERATIONS`` through this file's ``engine_with_injection``
(the lane's user-engine path, ``"module:function"``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from perfsuite.engine.fake_runner import FakeRunner  # noqa: E402
from perfsuite.measure.instruction_workload import InstructionWorkload, engine_of  # noqa: E402

ITERATIONS_VARIABLE = "PERFSUITE_INJECTED_ITERATIONS"
BASE_ENGINE_VARIABLE = "PERFSUITE_INJECTED_BASE_ENGINE"
FACTORY = "instructions_ab:engine_with_injection"
PAD_VARIABLE = "PERFSUITE_LAYOUT_PAD"


def extra_host_work(iterations: int) -> int:
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return total


def engine_with_injection(runner: FakeRunner, workload: InstructionWorkload) -> Any:
    """The base engine (``PERFSUITE_INJECTED_BASE_ENGINE``); its scheduler loops ``PERFSUITE_INJECTED_ITERATIONS``
    extra times per ``schedule()``.

    A and B both run through the subclass (A with 0 iterations): swapping the
    scheduler's class costs instructions of its own (Python's specialised
    attribute loads see a new type), and that cost is the same on both sides.
    """
    base = InstructionWorkload(**{**workload.to_json(), "engine": os.environ.get(BASE_ENGINE_VARIABLE, "inflight")})
    engine = engine_of(base, runner)
    iterations = int(os.environ.get(ITERATIONS_VARIABLE, "0"))
    scheduler_class = type(engine.scheduler)

    def schedule(self):
        extra_host_work(iterations)
        return scheduler_class.schedule(self)

    injected = type(f"Injected{scheduler_class.__name__}", (scheduler_class,), {"__slots__": (), "schedule": schedule})
    engine.scheduler.__class__ = injected
    return engine


def count(workload: InstructionWorkload, iterations: int, rng: random.Random):
    """One count; ``rng`` pads the counted process's environment to a new length each time (below)."""
    from perfsuite.measure.instructions import count_instructions

    os.environ[ITERATIONS_VARIABLE] = str(iterations)
    os.environ[PAD_VARIABLE] = "x" * rng.randrange(0, 512)
    return count_instructions(workload, cwd=BENCH)


def flagged(label: str, counts: list, baseline, threshold: float) -> dict[str, Any]:
    from perfsuite.judge.instructions import judge_instructions

    results = [judge_instructions(label, c, baseline, threshold) for c in counts]
    per_step = [c.instructions_per_step for c in counts]
    return {
        "label": label,
        "runs": len(counts),
        "flagged": sum(r.regressed for r in results),
        "changes_percent": [round(r.change_percent, 4) for r in results],
        "per_step_min": min(per_step),
        "per_step_max": max(per_step),
        "spread_percent": 100.0 * (max(per_step) - min(per_step)) / min(per_step),
        "seconds_per_count": statistics.mean(c.seconds for c in counts),
    }


def main() -> int:
    from perfsuite.judge.instructions import DEFAULT_THRESHOLD_PERCENT, InstructionBaseline

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="inflight", help="perfsuite engine the scheduler loop is injected into")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--slowdown", type=float, default=0.01, help="fraction of a step's instructions to add")
    parser.add_argument("--calibration-iterations", type=int, default=200)
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD_PERCENT, help="percent")
    parser.add_argument("--seed", type=int, default=0, help="of the environment's padding")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    os.environ[BASE_ENGINE_VARIABLE] = args.engine
    workload = InstructionWorkload(engine=FACTORY)
    load_before = os.getloadavg()
    rng = random.Random(args.seed)
    stored = count(workload, 0, rng)
    baseline = InstructionBaseline("ab", workload, stored.instructions_per_step, stored.steps_per_run, "", "")
    a_counts = [count(workload, 0, rng) for _ in range(args.trials)]
    probe = count(workload, args.calibration_iterations, rng)
    per_iteration = (probe.instructions_per_step - stored.instructions_per_step) / args.calibration_iterations
    iterations = round(args.slowdown * stored.instructions_per_step / per_iteration)
    b_counts = [count(workload, iterations, rng) for _ in range(args.trials)]
    injected = statistics.mean(c.instructions_per_step for c in b_counts) / stored.instructions_per_step - 1
    summary = {
        "engine": args.engine,
        "workload": workload.label,
        "stored_per_step": stored.instructions_per_step,
        "steps_per_run": stored.steps_per_run,
        "instructions_per_loop_iteration": per_iteration,
        "injected_iterations_per_step": iterations,
        "injected_fraction_percent": 100 * injected,
        "threshold_percent": args.threshold,
        "load_average_before_after": [load_before[0], os.getloadavg()[0]],
        "valgrind": stored.valgrind,
        "rows": [
            flagged("A/A", a_counts, baseline, args.threshold),
            flagged("B (injected)", b_counts, baseline, args.threshold),
        ],
    }
    print_table(summary)
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


def print_table(summary: dict[str, Any]) -> None:
    print(
        f"{summary['engine']} over the fake runner: {summary['stored_per_step']:,.1f} instructions/step stored, "
        f"{summary['steps_per_run']} steps/run; injected {summary['injected_iterations_per_step']} loop iterations "
        f"per step ({summary['instructions_per_loop_iteration']:.1f} instructions each) = "
        f"{summary['injected_fraction_percent']:.3f}% of a step; threshold +{summary['threshold_percent']:g}%"
    )
    print(f"load average (1 min) before/after: {summary['load_average_before_after']}")
    print("| runs | flagged | change vs stored (min..max) | per-step spread | seconds per count |")
    print("|---|---|---|---|---|")
    for row in summary["rows"]:
        changes = row["changes_percent"]
        print(
            f"| {row['label']} x{row['runs']} | {row['flagged']} of {row['runs']} | "
            f"{min(changes):+.4f}% .. {max(changes):+.4f}% | {row['spread_percent']:.4f}% | "
            f"{row['seconds_per_count']:.1f} |"
        )


if __name__ == "__main__":
    sys.exit(main())
