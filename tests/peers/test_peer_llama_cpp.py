"""perfsuite's client against llama.cpp's OpenAI server (``make peers LLAMA_CPP=1``).

llama.cpp serves one request at a time, takes prompts as text only, streams
text without token ids or usage, and ignores ``ignore_eos`` (``min_tokens``
works): ``openai-http`` is run with text prompts and ``min_tokens``, and its
short-output check must still see every request in full.
"""

from __future__ import annotations

import json

from peer_servers import incomplete_tests, run_logged

PERF_TESTS_TIMEOUT_S = 1800.0
PERF_SELECTION = "test_throughput and fixed and B4"
PERF_REPEATS = 3
CI_NUM_REQUESTS = 8  # requests per run in the ci profile (perfsuite.workload.profiles)


def test_shipped_perf_tests_pass_against_llama_cpp(llama_cpp_server, main_python, tmp_path):
    reports = tmp_path / "reports"
    argv = [
        main_python, "-m", "pytest", "--pyargs", "perfsuite.suites", "--perf",
        "--perf-engines", "openai-http",
        "--perf-endpoint", llama_cpp_server,
        "--perf-model", "smollm2-135m",
        "--perf-prompt-format", "text",
        "--perf-eos-control", "min_tokens",
        "--perf-server-label", "llama-cpp-python-0.3.36",
        "--perf-repeats", str(PERF_REPEATS),
        "--perf-baseline-dir", str(tmp_path / "baselines"),
        "--perf-report-dir", str(reports),
        "-k", PERF_SELECTION,
        "-p", "no:randomly", "-p", "no:cacheprovider", "-q",
    ]  # fmt: skip
    result = run_logged(argv, tmp_path / "perf-tests.log", PERF_TESTS_TIMEOUT_S)
    print(result.stdout[-3000:])
    failed = result.returncode != 0
    assert not failed, f"the perf tests failed against llama.cpp:\n{result.stdout[-6000:]}"
    document = json.loads((reports / "results.json").read_text())
    assert document["tests"] and all(t["measurement"]["engine_name"] == "openai-http" for t in document["tests"])
    assert incomplete_tests(document, CI_NUM_REQUESTS) == []  # "faster because it did less" must not pass
