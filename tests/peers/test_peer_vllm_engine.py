"""The in-process ``vllm`` engine (perfsuite/adapters/vllm_engine.py) on SmolLM2, in ``.venv-peers``."""

from __future__ import annotations

import json

import pytest
from peer_servers import incomplete_tests, run_logged

from perfsuite.adapters import EngineConfig, available_engines
from perfsuite.testing.greedy import check_greedy_equal, greedy_check_requests

pytest.importorskip("vllm", reason="vLLM is not installed in this interpreter: run the peers tier in .venv-peers")

PERF_TESTS_TIMEOUT_S = 1800.0
PERF_SELECTION = "test_throughput and fixed"
PERF_REPEATS = 3
CI_NUM_REQUESTS = 8  # requests per run in the ci profile (perfsuite.workload.profiles)
NEAR_TIE_TOLERANCE = 1e-3  # float32 both sides; see test_peer_vllm_server.py


@pytest.fixture(scope="module")
def smollm2():
    from perfsuite.models import load_model

    return load_model("smollm2-135m", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def vllm_engine(smollm2):
    import torch

    from perfsuite.adapters import Backend, build_engine

    threads = torch.get_num_threads()
    engine = build_engine("vllm", Backend.from_loaded(smollm2), EngineConfig(batch_size=8, max_seq_len=256))
    engine.torch_threads_before_build = threads
    yield engine
    engine.close()


def test_building_vllm_leaves_torch_threads_as_they_were(vllm_engine):
    """vLLM's CPU worker asks for one thread and disables set_num_threads; perfsuite's engines need both back."""
    import torch

    assert torch.get_num_threads() == vllm_engine.torch_threads_before_build
    torch.set_num_threads(1)
    assert torch.get_num_threads() == 1
    torch.set_num_threads(vllm_engine.torch_threads_before_build)


def test_vllm_is_registered_where_it_is_installed():
    assert available_engines()["vllm"] == "perfsuite.adapters.vllm_engine:build"


def test_vllm_engine_decodes_greedily(vllm_engine, smollm2):
    """Its outputs equal perfsuite's unbatched float32 reference, token for token (near-ties reported apart)."""
    from perfsuite.engine.reference import ReferenceDecoder

    requests = greedy_check_requests(smollm2.tokenizer.encode, max_new_tokens=24)
    check = check_greedy_equal(vllm_engine, requests, ReferenceDecoder(smollm2.model, smollm2.eos_token_id),
                               NEAR_TIE_TOLERANCE)
    print(check.describe())
    check.assert_passed(max_near_ties=1)


def test_vllm_engine_records_vllm_timestamps(vllm_engine, smollm2):
    """Every request in full, timestamps ordered and inside the run, arrivals honoured."""
    from perfsuite.engine.types import Request, SamplingParams

    prompt = tuple(smollm2.tokenizer.encode("Fun fact of the day: "))
    requests = [
        Request(f"r{i}", prompt, SamplingParams(8 + 4 * i, ignore_eos=True), arrival_time=0.5 * i) for i in range(4)
    ]
    result = vllm_engine.run(requests)
    for request, record in zip(requests, result.records, strict=True):
        assert record.request_id == request.request_id
        assert len(record.output_token_ids) == request.sampling_params.max_new_tokens
        assert len(record.token_times) == len(record.output_token_ids)
        assert record.arrival_time == pytest.approx(result.start_time + request.arrival_time)
        assert record.arrival_time <= record.first_scheduled_time <= record.token_times[0]
        assert list(record.token_times) == sorted(record.token_times)
        assert record.token_times[-1] <= result.end_time


def test_perf_tests_compare_inflight_and_vllm(peers_python, smollm2_dir, tmp_path):
    """`--perf-engines inflight,vllm`: both engines measured in one pytest process on the same workloads."""
    reports = tmp_path / "reports"
    argv = [
        peers_python, "-m", "pytest", "--pyargs", "perfsuite.suites", "--perf",
        "--perf-engines", "inflight,vllm",
        "--perf-repeats", str(PERF_REPEATS),
        "--perf-baseline-dir", str(tmp_path / "baselines"),
        "--perf-report-dir", str(reports),
        "-k", PERF_SELECTION,
        "-p", "no:randomly", "-p", "no:cacheprovider", "-q",
    ]  # fmt: skip
    result = run_logged(argv, tmp_path / "perf-tests.log", PERF_TESTS_TIMEOUT_S)
    print(result.stdout[-3000:])
    assert result.returncode == 0, f"the perf tests failed on inflight,vllm:\n{result.stdout[-6000:]}"
    document = json.loads((reports / "results.json").read_text())
    engines = {t["measurement"]["engine_name"] for t in document["tests"]}
    assert engines == {"inflight", "vllm"}, [t["test_id"] for t in document["tests"]]
    assert incomplete_tests(document, CI_NUM_REQUESTS) == []
