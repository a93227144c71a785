"""A regression that only the session-end Benjamini-Hochberg adjustment finds fails the session.

While a test runs, it is judged with the session's not-yet-run comparisons
counted as p = 1 (docs/verdicts.md, "How a verdict is reached"). That interim bound can
let a moderate regression pass; once a later test has regressed strongly, the
final adjustment over the whole session flags it, and the session must fail
with the summary line "regression found by the session-wide correction at
session end: ...".

Nothing here depends on this machine's speed: the engine fabricates its
timestamps (no sleeping, no model), so every metric of every repeat is an
exact number chosen below, and so are the p-values:

- 6 repeats a side, 2 perf tests of 4 compared metrics: m = 8 comparisons;
- baseline slowness factors 1.00 ... 1.05 for both tests;
- test 1 (moderate): 1.025, 1.035, 1.045, 1.50, 1.55, 1.60. Six of the 36
  (baseline, current) pairs go the other way, so the one-sided Mann-Whitney
  p is 30/924 = 0.0325 on all four metrics (throughput -16.8%, latencies
  +24.1%). While it runs, the four other comparisons still count as p = 1:
  its interim BH p is 0.0325 * 8/4 = 0.065 > alpha 0.05, so it passes;
- test 2 (strong): 2.0 ... 2.5, every pair worse: p = 1/924 = 0.0011
  (interim and final adjusted 0.0022), it fails;
- at session end test 1's four p-values rank 5..8 of 8: BH gives
  0.0325 * 8/8 = 0.0325 < 0.05, and the change is beyond the 10% minimum
  effect: regressed, found only now;
- control: test 2 unchanged (its p about 0.53) leaves test 1's final p at
  0.065, so the same moderate regression stays unchanged and the session passes.
"""

from __future__ import annotations

import json

import pytest

pytest_plugins = ["pytester"]

CONFTEST = """
import os

import pytest

from perfsuite.adapters import Backend
from perfsuite.engine.types import EngineCounters, FinishReason, RequestRecord, RunResult

BASELINE = (1.00, 1.01, 1.02, 1.03, 1.04, 1.05)
MODERATE = (1.025, 1.035, 1.045, 1.50, 1.55, 1.60)  # Mann-Whitney p = 30/924, -16.8% throughput
STRONG = (2.0, 2.1, 2.2, 2.3, 2.4, 2.5)  # p = 1/924, -54% throughput

# LATE_PHASE -> test name -> the slowness factor of each repeat (1.0: the reference speed)
SLOWNESS = {
    "baseline": {"test_1_moderate_regression": BASELINE, "test_2_strong_regression": BASELINE},
    "control": {"test_1_moderate_regression": MODERATE, "test_2_strong_regression": BASELINE},
    "late": {"test_1_moderate_regression": MODERATE, "test_2_strong_regression": STRONG},
}

FIRST_TOKEN_SECONDS = 0.020
TOKEN_GAP_SECONDS = 0.005


class FabricatedEngine:
    \"\"\"A BatchingEngine whose runs report made-up timestamps, all scaled by one factor per run.

    A run with factor f has every TTFT, TPOT and E2E latency f times the reference and
    its throughput 1/f times it. Runs cycle through the factors, so however many warmup
    runs come first, the timed repeats are the same set of factors.
    \"\"\"

    name = "fabricated"
    greedy_equal = True
    batch_size = 2
    runs_in_process = False  # finishes in microseconds; only the hypervisor's steal could mark it noisy

    def __init__(self, factors):
        self.factors = factors
        self.calls = 0

    def run(self, requests, on_step=None, max_concurrency=None):
        factor = self.factors[self.calls % len(self.factors)]
        self.calls += 1
        records = []
        for request in requests:
            n = request.sampling_params.max_new_tokens
            first = request.arrival_time + factor * FIRST_TOKEN_SECONDS
            times = tuple(first + factor * TOKEN_GAP_SECONDS * k for k in range(n))
            records.append(
                RequestRecord(
                    request_id=request.request_id,
                    num_prompt_tokens=request.num_prompt_tokens,
                    output_token_ids=(7,) * n,
                    arrival_time=request.arrival_time,
                    first_scheduled_time=request.arrival_time,
                    token_times=times,
                    finished_time=times[-1],
                    finish_reason=FinishReason.LENGTH,
                )
            )
        counters = EngineCounters(num_forward_passes=4, num_decode_steps=3, num_prefill_tokens=12, num_decode_tokens=12)
        return RunResult(self.name, tuple(records), 0.0, max(r.finished_time for r in records), counters)


@pytest.fixture(scope="session")
def perf_backend():
    # Fabricated timestamps do not follow the machine's speed: no machine probe.
    return Backend(runner=None, tokenize=lambda text: [3] * len(text), eos_token_id=None, max_context=512,
                   device="cpu", probe=None)


@pytest.fixture
def fabricated_engine(request):
    return FabricatedEngine(SLOWNESS[os.environ["LATE_PHASE"]][request.node.name])
"""

PERF_TESTS = """
import os

import pytest

from perfsuite.engine.types import Request, SamplingParams

REQUESTS = [Request(f"r{i}", (1, 2, 3), SamplingParams(max_new_tokens=4)) for i in range(4)]


@pytest.mark.perf
def test_1_moderate_regression(perf, fabricated_engine):
    perf.measure(fabricated_engine, REQUESTS)
    perf.assert_no_regression()


@pytest.mark.perf
def test_2_strong_regression(perf, fabricated_engine):
    perf.measure(fabricated_engine, REQUESTS)
    if os.environ.get("LATE_ASSERT_2", "1") == "1":
        perf.assert_no_regression()
"""

# Alpha and the minimum effect are spelled out because the numbers above are worked out for them.
# The busy threshold is as high as it goes: a fabricated run has no timing for other work to disturb.
ARGS = [
    "--perf", "--perf-profile", "smoke", "--perf-repeats", "6", "--perf-alpha", "0.05",
    "--perf-min-effect", "0.10", "--perf-busy-threshold", "0.99", "-p", "no:randomly", "-v",
]
LATE_LINE = "*regression found by the session-wide correction at session end: *"
TEST_1 = "test_late.py::test_1_moderate_regression"
TEST_2 = "test_late.py::test_2_strong_regression"


@pytest.fixture
def project(pytester, monkeypatch):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_late=PERF_TESTS)
    monkeypatch.setenv("LATE_PHASE", "baseline")
    saved = pytester.runpytest_subprocess(*ARGS, "--perf-save-baseline")
    saved.assert_outcomes(passed=2)
    assert saved.ret == pytest.ExitCode.OK
    return pytester


def run_phase(pytester, monkeypatch, phase: str) -> pytest.RunResult:
    monkeypatch.setenv("LATE_PHASE", phase)
    return pytester.runpytest_subprocess(*ARGS)


def verdicts(pytester) -> dict[str, dict[str, str]]:
    """test id -> metric -> verdict, from reports/results.json."""
    data = json.loads((pytester.path / "reports" / "results.json").read_text())
    return {t["test_id"]: {c["metric"]: c["verdict"] for c in t["judgement"]["comparisons"]} for t in data["tests"]}


def test_control_a_moderate_regression_alone_passes_the_session(project, monkeypatch):
    """Without the later strong regression, test 1's final p (0.065) is above alpha: nothing fails."""
    result = run_phase(project, monkeypatch, "control")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.no_fnmatch_line(LATE_LINE)
    found = verdicts(project)
    assert found[TEST_1]["output_throughput"] == "unchanged"
    assert found[TEST_2]["output_throughput"] == "unchanged"


def test_a_regression_only_the_session_end_correction_finds_fails_the_session(project, monkeypatch):
    result = run_phase(project, monkeypatch, "late")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([f"*{TEST_1} PASSED*", f"*{TEST_2} FAILED*"])
    result.stdout.no_fnmatch_line(f"*performance regression in {TEST_1}*")  # the interim bound let it pass
    result.stdout.fnmatch_lines([f"*performance regression in {TEST_2}*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"{LATE_LINE}{TEST_1}*output_throughput*regressed*"])
    result.stdout.no_fnmatch_line(f"{LATE_LINE}{TEST_2}*")  # already failed while it ran: not a late finding
    found = verdicts(project)
    assert found[TEST_1] == dict.fromkeys(
        ["output_throughput", "median_ttft_ms", "median_tpot_ms", "median_e2el_ms"], "regressed"
    )
    assert found[TEST_2]["output_throughput"] == "regressed"


def test_the_late_regression_alone_sets_the_exit_status(project, monkeypatch):
    """Every test passes (test 2 measures without asserting), so only the session-end finding can fail it."""
    monkeypatch.setenv("LATE_ASSERT_2", "0")
    result = run_phase(project, monkeypatch, "late")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([f"{LATE_LINE}{TEST_1}*output_throughput*regressed*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert verdicts(project)[TEST_1]["output_throughput"] == "regressed"
