"""The pytest plugin, driven through pytester in subprocesses.

The perf tests here run on a fake backend whose steps sleep a fixed time, so
a "slower engine" is a longer sleep and nothing depends on this machine's speed.
"""

from __future__ import annotations

import fnmatch
import json

import pytest

from fake_backend import FAKE_BACKEND_CONFTEST
from perfsuite.judge.catalogue import PROBE

pytest_plugins = ["pytester"]

CONFTEST = FAKE_BACKEND_CONFTEST

PERF_TEST = """
import pytest

@pytest.mark.perf
def test_speed(perf, perf_inflight_engine, perf_workload):
    perf.measure(perf_inflight_engine, perf_workload)
    perf.assert_no_regression()

def test_plain():
    assert 1 + 1 == 2
"""

# 6 repeats a side: the smallest one-sided p is 1/924, below alpha after the
# correction for this session's 5 comparisons.
COMPARE_ARGS = ["--perf", "--perf-profile", "smoke", "--perf-repeats", "6", "-p", "no:randomly"]


@pytest.fixture
def project(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_speed=PERF_TEST)
    return pytester


def results_json(pytester) -> dict:
    return json.loads((pytester.path / "reports" / "results.json").read_text())


def test_perf_tests_skip_without_the_flag_and_torch_stays_unimported(project):
    project.makepyfile(
        test_imports="""
        import sys
        def test_torch_not_imported():
            assert "torch" not in sys.modules
        """
    )
    result = project.runpytest_subprocess("-rs", "-p", "no:randomly")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*perf test: run it with `pytest --perf`*"])
    assert not (project.path / "reports").exists()


def test_a_first_perf_run_writes_results_with_vllm_keys_and_skips_its_test_for_judging_nothing(project):
    result = project.runpytest_subprocess("--perf", "--perf-profile", "smoke", "-rs")
    result.assert_outcomes(passed=1, skipped=1)  # no baseline yet: the perf test judged nothing (docs/verdicts.md)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        "*perfsuite*", "*test_speed*output_throughput*no baseline*",
        "perfsuite: judged 0 of 4 planned comparisons (4 without a baseline for this environment): record baselines "
        "with --perf-save-baseline, or compare against a git ref with --perf-against REF",
        "SKIPPED [[]1[]] test_speed.py:*: perfsuite: judged 0 of 4 comparisons: no baseline for this environment (*); "
        "record one with --perf-save-baseline, or compare against a git ref with --perf-against REF",
    ])  # fmt: skip
    perfsuite_lines = [line for line in result.stdout.lines if line.startswith("perfsuite")]
    assert perfsuite_lines[-1].startswith("perfsuite: judged 0 of 4"), "the last line perfsuite writes"
    data = results_json(project)
    [test] = data["tests"]
    for key in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_itl_ms",
                "median_e2el_ms", "request_throughput", "output_throughput"):
        assert key in test and test[key] > 0, key
    low, high = test["p99_ttft_ms_ci"]  # the smoke profile's few requests cannot bound p99 from above
    assert low > 0 and high is None and test["p99_ttft_ms_supported"] is False
    assert set(test["measurement"]["parameters"]) == {
        "model", "precision", "input_length", "output_length", "concurrency", "tensor_parallelism"
    }
    assert len(test["measurement"]["samples"]["output_throughput"]) == 3  # the smoke profile's repeats
    assert PROBE not in test["measurement"]["samples"], "a backend without a probe is compared as measured"
    assert data["environment"]["num_threads"] >= 1
    assert test["judgement"]["baseline_status"] == "no baseline"
    assert not (project.path / "baselines").exists(), "a normal run never writes a baseline"


@pytest.mark.timing  # must see a slowdown: run alone (conftest.py)
def test_save_baseline_round_trip_then_a_50_percent_slower_engine_fails(project, monkeypatch):
    monkeypatch.setenv("FAKE_STEP_SECONDS", "0.004")
    saved = project.runpytest_subprocess(*COMPARE_ARGS, "--perf-save-baseline")
    saved.assert_outcomes(passed=2)
    [baseline_file] = (project.path / "baselines").rglob("*.json")
    stored = json.loads(baseline_file.read_text())
    assert stored["schema_version"] == 2 and len(stored["samples"]["output_throughput"]) == 6
    assert stored["test_id"].endswith("test_speed.py::test_speed")

    unchanged = project.runpytest_subprocess(*COMPARE_ARGS)
    unchanged.assert_outcomes(passed=2)
    unchanged.stdout.fnmatch_lines(["perfsuite: judged 4 of 4 planned comparisons"])
    assert baseline_file.read_text() == json.dumps(stored, indent=2, sort_keys=True) + "\n", "baseline rewritten"

    monkeypatch.setenv("FAKE_STEP_SECONDS", "0.008")
    slower = project.runpytest_subprocess(*COMPARE_ARGS)
    slower.assert_outcomes(passed=1, failed=1)
    slower.stdout.fnmatch_lines(
        [
            "*performance regression in test_speed.py::test_speed:*",
            "*output_throughput: baseline median *, current median * (-*%), ratio CI [[]*], adjusted p=* -> regressed*",
        ]
    )
    verdicts = {c["metric"]: c["verdict"] for c in results_json(project)["tests"][0]["judgement"]["comparisons"]}
    assert verdicts["output_throughput"] == "regressed"

    # Accepting the slower engine: the regression is shown, nothing fails, the baseline is replaced.
    accepted = project.runpytest_subprocess(*COMPARE_ARGS, "--perf-save-baseline")
    accepted.assert_outcomes(passed=2)
    accepted.stdout.fnmatch_lines(["*test_speed*output_throughput*regressed*"])
    assert json.loads(baseline_file.read_text())["samples"] != stored["samples"]
    project.runpytest_subprocess(*COMPARE_ARGS).assert_outcomes(passed=2)


def test_a_corrupt_baseline_is_a_clear_error(project):
    project.runpytest_subprocess(*COMPARE_ARGS, "--perf-save-baseline").assert_outcomes(passed=2)
    [baseline_file] = (project.path / "baselines").rglob("*.json")
    baseline_file.write_text("{ not json")
    result = project.runpytest_subprocess(*COMPARE_ARGS)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([f"*baseline {baseline_file}* is corrupt*--perf-save-baseline*"])
    failures = result.stdout.str().split(" FAILURES ")[1].split(" short test summary info ")[0]
    assert failures.count("Expecting") == 1, "the JSON error once, inside the message naming the file and the fix"


def test_another_schema_version_is_a_clear_error(project):
    project.runpytest_subprocess(*COMPARE_ARGS, "--perf-save-baseline").assert_outcomes(passed=2)
    [baseline_file] = (project.path / "baselines").rglob("*.json")
    data = json.loads(baseline_file.read_text())
    baseline_file.write_text(json.dumps({**data, "schema_version": 99}))
    result = project.runpytest_subprocess(*COMPARE_ARGS)
    result.stdout.fnmatch_lines(["*schema_version 99*reads 2*--perf-save-baseline*"])


def test_a_baseline_from_another_environment_is_not_compared(project):
    other = project.path / "baselines" / "some-other-gpu-abc" / "test_speed.py" / "test_speed.json"
    other.parent.mkdir(parents=True)
    other.write_text("{}")
    result = project.runpytest_subprocess("--perf", "--perf-profile", "smoke", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines([
        "*warning: *baselines exist only for other environments (some-other-gpu-abc)*",
        "*judged 0 of 4 comparisons: baselines exist only for other environments, not for this one (*)*",
    ])  # fmt: skip


def test_benchmark_json_carries_the_metrics(project, monkeypatch):
    # Run by a pytest-xdist worker (make test), the session would inherit PYTEST_XDIST_WORKER, and pytest-benchmark
    # disables itself under xdist: this session is not one of the worker's.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    result = project.runpytest_subprocess("--perf", "--perf-profile", "smoke", "--benchmark-json=bench.json")
    result.assert_outcomes(passed=1, skipped=1)  # skipped for judging nothing (no baseline), after it was measured
    [bench] = json.loads((project.path / "bench.json").read_text())["benchmarks"]
    assert bench["stats"]["rounds"] == 3
    assert bench["extra_info"]["output_throughput"] > 0
    assert bench["extra_info"]["parameters"]["concurrency"] == 2
    assert bench["extra_info"]["p99_ttft_ms_supported"] is False and "median_ttft_ms_ci" in bench["extra_info"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--perf-alpha", "2"], "*--perf-alpha*strictly between 0 and 1*"),
        (["--perf-profile", "huge"], "*unknown profile 'huge'*smoke, ci, full*"),
        (["--perf-repeats", "1"], "*at least 2 repeats*"),
        (["--perf-save-baseline"], "*--perf-save-baseline*needs --perf*"),
        (["--perf-engines", "static,turbo"], "*unknown engine 'turbo'*choose from static, inflight*"),
        (["--perf-decode-mode", "warp"], "*unknown decode mode 'warp'*packed, static, cuda-graph*"),
    ],
)
def test_bad_options_are_usage_errors(project, args, message):
    result = project.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_options_can_come_from_the_ini_file(project):
    project.makeini("[pytest]\nperf_profile = smoke\nperf_report_dir = out\n")
    result = project.runpytest_subprocess("--perf")
    result.assert_outcomes(passed=1, skipped=1)  # the perf test has no baseline: skipped for judging nothing
    assert json.loads((project.path / "out" / "results.json").read_text())["profile"] == "smoke"


SWEEP = """
[sweep]
engines = ["static", "inflight"]
batch_sizes = [2]
prompts = [6]
output_lengths = [3]
arrivals = ["offline", {concurrency = 1}]
num_requests = 3
repeats = 2
"""


def test_a_sweep_config_expands_into_perf_tests_with_goodput(pytester):
    from smoke_session import run_shipped_smoke_session

    pytester.path.joinpath("sweep.toml").write_text(SWEEP)
    # the sweep's cases only: the shipped tests have their session in test_report.py, capacity its own
    result = run_shipped_smoke_session(pytester, "--perf-config", "sweep.toml", "--perf-slo", "ttft=10s,tpot=5s", "-v",
                                       "-k", "test_sweep")
    result.assert_outcomes(skipped=4)  # measured, then skipped for judging nothing: no baselines here
    result.stdout.fnmatch_lines(["*test_sweep*static-B2-in6-out3-offline*SKIPPED*", "*test_sweep*inflight-B2-in6-out3-c1*"])
    data = results_json(pytester)
    assert data["slo"] == "ttft=10000ms,tpot=5000ms"
    sweep_tests = [t for t in data["tests"] if "test_sweep" in t["test_id"]]
    assert len(sweep_tests) == 4
    for test in sweep_tests:
        parameters = test["measurement"]["parameters"]
        assert parameters["input_length"] == 6 and parameters["output_length"] == 3
        assert len(test["measurement"]["samples"]["request_goodput"]) == 2, "the sweep's own repeats"
        assert test["request_goodput"] == pytest.approx(test["request_throughput"]), "every request meets a loose SLO"
    closed = [t for t in sweep_tests if t["test_id"].endswith("c1]")]
    assert all(t["measurement"]["parameters"]["concurrency"] == 1 for t in closed)


@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        ("[sweep]\nengines = ['turbo']\nbatch_sizes = [2]\noutput_lengths = [3]\nnum_requests = 2\n",
         "*--perf-config*unknown engine 'turbo'*"),
        ("[sweep]\nengines = ['static']\nbatch_sizes = [2]\noutput_lengths = [3]\nnum_request = 2\n",
         "*--perf-config*num_request*"),
    ],
)
def test_a_bad_sweep_config_is_a_usage_error(project, sweep, message):
    project.path.joinpath("sweep.toml").write_text(sweep)
    result = project.runpytest_subprocess("--perf", "--perf-config", "sweep.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


@pytest.mark.parametrize(
    ("slo", "message"),
    [("ttft=fast", "*--perf-slo*ttft='fast'*500ms*"), ("e2el=1e400s", "*--perf-slo*e2el='1e400s'*finite*2s*")],
)
def test_a_bad_slo_is_a_usage_error(project, slo, message):
    result = project.runpytest_subprocess("--perf", "--perf-slo", slo)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


SERVER_TESTS = """
import pytest

@pytest.fixture(scope="session")
def perf_model():
    pytest.fail("a model was loaded, though the options could never work")

@pytest.mark.perf
@pytest.mark.parametrize("batch", [1, 2, 3, 4])
def test_engines(perf_engine_factory, perf_session, batch):
    for name in perf_session.options.engines:
        perf_engine_factory(name, batch_size=batch)
"""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--perf-engines", "openai-http", "--perf-endpoint", "not-a-url"],
         "*--perf-endpoint*'not-a-url' is not a server's base URL; write it as http://HOST:PORT*"),
        (["--perf-engines", "inflight,openai-http"],
         "*--perf-engines openai-http measures a server: pass its base URL with --perf-endpoint http://HOST:PORT*"),
        (["--perf-config", "sweep.toml"],
         "*--perf-engines openai-http measures a server: pass its base URL with --perf-endpoint http://HOST:PORT*"),
        (["--perf-model", "/nonexistent"], "*--perf-model: model path '/nonexistent' does not exist*"),
        (["--perf-model", "nosuchmodel"],
         "*--perf-model: unknown model 'nosuchmodel'; known names: smollm2-135m*local Hugging Face model directory*"),
    ],
    ids=["endpoint-not-a-url", "no-endpoint", "no-endpoint-for-the-sweep", "no-such-model-directory",
         "no-such-model-name"],
)  # fmt: skip
def test_options_that_cannot_work_fail_the_session_once_before_any_model_loads(pytester, args, message):
    pytester.makepyfile(test_engines=SERVER_TESTS)
    pytester.path.joinpath("sweep.toml").write_text(
        "[sweep]\nengines = ['openai-http']\nbatch_sizes = [2]\noutput_lengths = [3]\nnum_requests = 2\n"
    )
    result = pytester.runpytest_inprocess("--perf", "--perf-profile", "smoke", "-p", "no:randomly", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = result.stdout.lines + result.stderr.lines
    assert len(fnmatch.filter(lines, message)) == 1, "\n".join(lines)
    assert "Traceback" not in "\n".join(lines) and not fnmatch.filter(lines, "*a model was loaded*")
