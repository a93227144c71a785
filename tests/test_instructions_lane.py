"""The instruction lane end to end, under Valgrind (``make test-instructions``; minutes, so out of ``make test``).

A count repeats to the instruction; a ``pytest --perf --perf-instructions`` session saves the figure, passes
against it, and fails a user's engine whose scheduler does 1% more host work.
"""

from __future__ import annotations

import json

import pytest

from fake_backend import FAKE_BACKEND_CONFTEST
from perfsuite.measure.instruction_workload import InstructionWorkload
from perfsuite.measure.instructions import count_instructions, valgrind_unavailable

pytest_plugins = ["pytester"]
pytestmark = [
    pytest.mark.instructions,
    pytest.mark.skipif(valgrind_unavailable() is not None, reason=valgrind_unavailable() or ""),
]

SMALL = InstructionWorkload(num_requests=4, prompt_len=8, max_new_tokens=8, batch_size=4, max_seq_len=32)

# A user's engine: perfsuite's in-flight engine whose scheduler loops PERFSUITE_EXTRA_ITERATIONS more times a step.
USER_ENGINE = """
import os
from perfsuite.engine import inflight_engine

def extra(iterations):
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return total

def build(runner, workload):
    engine = inflight_engine(runner, decode_batch_size=workload.batch_size, max_seq_len=workload.max_seq_len,
                             eos_token_id=None)
    base = type(engine.scheduler)
    iterations = int(os.environ.get("PERFSUITE_EXTRA_ITERATIONS", "0"))

    def schedule(self):
        extra(iterations)
        return base.schedule(self)

    engine.scheduler.__class__ = type("Slowed", (base,), {"__slots__": (), "schedule": schedule})
    return engine
"""

PERF_TEST = """
import pytest
from perfsuite.measure.instruction_workload import InstructionWorkload

@pytest.mark.perf
def test_steps(perf):
    perf.measure_instructions(InstructionWorkload(engine="my_engine:build", num_requests=4, prompt_len=8,
                                                  max_new_tokens=8, batch_size=4, max_seq_len=32))
    perf.assert_no_regression()
"""


def test_repeated_counts_of_each_own_engine_agree_to_a_thousandth_of_a_percent():
    for engine in ("inflight", "paged"):
        counts = [count_instructions(InstructionWorkload(**{**SMALL.to_json(), "engine": engine})) for _ in range(3)]
        figures = [c.instructions_per_step for c in counts]
        assert (max(figures) - min(figures)) / min(figures) < 1e-5, figures


def test_a_session_saves_the_figure_passes_against_it_and_fails_a_one_percent_slower_scheduler(pytester, monkeypatch):
    pytester.makeconftest(FAKE_BACKEND_CONFTEST)
    pytester.makepyfile(my_engine=USER_ENGINE, test_lane=PERF_TEST)
    args = ("--perf", "--perf-instructions", "--perf-profile", "smoke", "-p", "no:randomly", "-rs")
    pytester.runpytest_subprocess(*args, "--perf-save-baseline").assert_outcomes(passed=1)
    stored = list((pytester.path / "baselines" / "instructions").rglob("*.json"))
    assert len(stored) == 1
    per_step = json.loads(stored[0].read_text())["instructions_per_step"]

    same = pytester.runpytest_subprocess(*args)
    same.assert_outcomes(passed=1)
    same.stdout.fnmatch_lines(["*instructions: test_lane.py::test_steps: * instructions/step * stored: * ok*"])
    # Another session is another memory layout (its rootdir holds reports/ now): measured 0.012% and 0.36% apart,
    # within the threshold.
    again = json.loads((pytester.path / "reports" / "results.json").read_text())["instructions"][0]
    assert abs(again["change_percent"]) < again["threshold_percent"]

    monkeypatch.setenv("PERFSUITE_EXTRA_ITERATIONS", str(round(0.01 * per_step / 600)))  # ~600 instructions an iteration
    slower = pytester.runpytest_subprocess(*args)
    slower.assert_outcomes(failed=1)
    slower.stdout.fnmatch_lines(["*instruction count regression in test_lane.py::test_steps*REGRESSION*"])
    results = json.loads((pytester.path / "reports" / "results.json").read_text())
    assert results["instructions"][0]["regressed"] is True
    assert results["instructions"][0]["change_percent"] > 0.5
