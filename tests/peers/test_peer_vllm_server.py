"""perfsuite's client against vLLM's OpenAI server: the shipped perf tests, and greedy correctness."""

from __future__ import annotations

import json

import pytest
from peer_servers import ROOT, incomplete_tests, run_logged

from perfsuite.adapters import Backend, EngineConfig, build_engine
from perfsuite.adapters.http_options import HttpClientOptions
from perfsuite.testing.greedy import check_server_greedy, greedy_check_requests
from perfsuite.engine.reference import ReferenceDecoder
from perfsuite.models import load_model
from perfsuite.judge.catalogue import RAW_SERVER_FIGURES
from perfsuite.testing import FLOAT32_NEAR_TIE

PERF_TESTS_TIMEOUT_S = 1800.0
# A reduced selection of the shipped perf tests: offline throughput at both ci batch sizes,
# fixed and uniform output lengths, and one Poisson latency test.
PERF_SELECTION = "test_throughput and (fixed or uniform) or test_latency_poisson and 4rps"
PERF_REPEATS = 3
CI_NUM_REQUESTS = 8  # requests per run in the ci profile (perfsuite.workload.profiles)
GREEDY_NEW_TOKENS = 24
# float32 on both sides; vLLM's CPU kernels add in another order than torch's, so a
# top-1/top-2 margin this small can flip (perfsuite.testing.FLOAT32_NEAR_TIE).
NEAR_TIE_TOLERANCE = FLOAT32_NEAR_TIE


def test_shipped_perf_tests_pass_against_vllm(vllm_server, main_python, tmp_path):
    """`pytest --pyargs perfsuite.suites --perf --perf-engines openai-http` against vLLM: all pass, every request in full."""
    reports = tmp_path / "reports"
    argv = [
        main_python, "-m", "pytest", "--pyargs", "perfsuite.suites", "--perf",
        "--perf-engines", "openai-http",
        "--perf-endpoint", vllm_server,
        "--perf-model", "smollm2-135m",
        "--perf-server-label", "vllm-0.32-cpu",
        "--perf-repeats", str(PERF_REPEATS),
        "--perf-baseline-dir", str(tmp_path / "baselines"),
        "--perf-report-dir", str(reports),
        "-k", PERF_SELECTION,
        "-p", "no:randomly", "-p", "no:cacheprovider", "-q",
    ]  # fmt: skip
    result = run_logged(argv, tmp_path / "perf-tests.log", PERF_TESTS_TIMEOUT_S)
    print(result.stdout[-3000:])
    assert result.returncode == 0, f"the perf tests failed against vLLM:\n{result.stdout[-6000:]}"
    document = json.loads((reports / "results.json").read_text())
    tests = document["tests"]
    assert incomplete_tests(document, CI_NUM_REQUESTS) == []
    assert len(tests) >= 5, f"expected the selected perf tests in results.json, got {[t['test_id'] for t in tests]}"
    for test in tests:
        assert test["measurement"]["engine_name"] == "openai-http"
        assert test["normalization"] == RAW_SERVER_FIGURES, test["test_id"]  # not rescaled by this machine's probe
    servers = json.dumps(document["servers"])
    assert "smollm2-135m" in servers and "vllm-0.32-cpu" in servers, document["servers"]


def test_vllm_decodes_greedily(vllm_server):
    """vLLM's outputs through openai-http equal perfsuite's unbatched float32 reference, token for token."""
    loaded = load_model("smollm2-135m", device="cpu", dtype="float32")
    backend = Backend.from_loaded(loaded, endpoint=vllm_server, http_options=HttpClientOptions(prompt_format="token_ids"))
    requests = greedy_check_requests(backend.tokenize, max_new_tokens=GREEDY_NEW_TOKENS)
    engine = build_engine("openai-http", backend, EngineConfig(len(requests), 256))
    check = check_server_greedy(engine, requests, ReferenceDecoder(loaded.model, loaded.eos_token_id), NEAR_TIE_TOLERANCE)
    print(check.describe())
    check.assert_passed(max_near_ties=1)
    assert check.num_requests == len(requests)


def test_the_client_reads_vllms_own_metrics_beside_its_timings(vllm_server):
    """openai-http scrapes vLLM's /metrics around a run: its TTFT histogram counts every request, and its KV usage
    and queue were read while the run was in flight (issue 41)."""
    from perfsuite.engine import Request, SamplingParams

    loaded = load_model("smollm2-135m", device="cpu", dtype="float32")
    backend = Backend.from_loaded(loaded, endpoint=vllm_server, http_options=HttpClientOptions(prompt_format="token_ids"))
    prompt = tuple(backend.tokenize("The server's own view of a run"))
    requests = [Request(f"scrape-{i}", prompt, SamplingParams(24, ignore_eos=True), arrival_time=0.4 * i) for i in range(5)]
    run = build_engine("openai-http", backend, EngineConfig(2, 256)).run(requests)
    server = run.server_metrics
    assert server is not None, "vLLM exposes /metrics"
    print(server)
    assert server.ttft is not None and server.ttft.count == len(requests)
    assert server.e2e is not None and server.e2e.count == len(requests)
    assert server.num_scrapes_during >= 1 and server.kv_cache_usage is not None and server.num_waiting is not None
    assert server.generation_tokens is not None and server.generation_tokens.total == 24 * len(requests)


@pytest.fixture(autouse=True)
def _run_from_the_root(monkeypatch):
    monkeypatch.chdir(ROOT)
