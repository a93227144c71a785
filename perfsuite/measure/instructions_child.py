"""The process the instruction lane runs under Valgrind: build, warm up, then serve the workload N times.

``python -m perfsuite.measure.instructions_child '<workload JSON>' N`` prints
one JSON line, ``{"steps_per_run": [...]}``: the engine steps (runner
``execute`` calls) each of the N measured runs took. Everything before the
measured runs (the interpreter's start, imports, the engine's build, one
warm-up run that lets Python's adaptive interpreter specialise the hot
code) is the same whatever N is, so the parent's two counts, at N = 0 and
N = k, differ by the k runs alone.
"""

from __future__ import annotations

import gc
import json
import sys

from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.measure.instruction_workload import InstructionWorkload, engine_of, requests_of


def serve(workload: InstructionWorkload, num_runs: int) -> list[int]:
    """Steps per measured run, after one warm-up run."""
    runner = FakeRunner(workload.vocab_size)
    engine = engine_of(workload, runner)
    requests = requests_of(workload)
    engine.run(requests)
    gc.collect()
    steps = []
    for _ in range(num_runs):
        before = runner.num_forward_passes
        engine.run(requests)
        steps.append(runner.num_forward_passes - before)
    return steps


def main(argv: list[str]) -> int:
    workload = InstructionWorkload.from_json(json.loads(argv[0]))
    print(json.dumps({"steps_per_run": serve(workload, int(argv[1]))}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
