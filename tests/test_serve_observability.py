"""What ``perfsuite serve`` tells an operator: ``/metrics``' histograms, the per-request log, its routing errors.

Over the fake runner (each step sleeps a little, so a stream outlives a client
that leaves it); the histograms are checked against the engine's own records
of the requests, exactly, through a Prometheus text parser.
"""

from __future__ import annotations

import http.client
import itertools
import json
import logging
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from perfsuite.cli import build_parser
from perfsuite.engine import inflight_engine
from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.measure.metrics import request_metrics
from perfsuite.models import build_byte_tokenizer
from perfsuite.serve import CompletionServer, ServerThread
from perfsuite.serve.app import ROUTES
from perfsuite.serve.histograms import E2E_BUCKETS, INTER_TOKEN_BUCKETS, TTFT_BUCKETS, build_1_2_5_buckets
from perfsuite.serve.request_log import REQUEST_LOGGER
from test_serve import call  # one HTTP helper for the server's tests

VOCAB = 320
MAX_SEQ_LEN = 128
MODEL = "fake-model"
HTTP_TIMEOUT_S = 10.0
# Names a client scrapes during a run (docs/serving-and-peers.md lists them): they must stay as they are.
SCRAPED_NAMES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:num_preemptions": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
}
HISTOGRAM_BUCKETS = {
    "vllm:time_to_first_token_seconds": TTFT_BUCKETS,
    "vllm:inter_token_latency_seconds": INTER_TOKEN_BUCKETS,
    "vllm:time_per_output_token_seconds": INTER_TOKEN_BUCKETS,
    "vllm:request_time_per_output_token_seconds": INTER_TOKEN_BUCKETS,
    "vllm:e2e_request_latency_seconds": E2E_BUCKETS,
    "vllm:request_prompt_tokens": build_1_2_5_buckets(MAX_SEQ_LEN),
    "vllm:request_generation_tokens": build_1_2_5_buckets(MAX_SEQ_LEN),
}



def wait_until(condition, what: str, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"{what} did not happen within {timeout_s} s")


def start_fake_server(**kwargs) -> ServerThread:
    runner = FakeRunner(vocab_size=VOCAB, on_execute=lambda _: time.sleep(0.005))
    engine = inflight_engine(runner, decode_batch_size=2, max_seq_len=MAX_SEQ_LEN, eos_token_id=None)
    server = CompletionServer(engine, build_byte_tokenizer(VOCAB), model_name=MODEL, vocab_size=VOCAB, **kwargs)
    return ServerThread(server)


@pytest.fixture
def served():
    """A fresh server per test: its histograms and log hold that test's requests only."""
    with start_fake_server() as thread:
        yield thread


def scrape(server: ServerThread) -> dict:
    status, raw = call(server.url + "/metrics")
    assert status == 200
    return {family.name: family for family in text_string_to_metric_families(raw.decode())}


# --------------------------------------------------------------------------- /metrics


def test_the_metric_names_clients_scrape_are_there_under_vllms_names(served):
    families = scrape(served)
    for name, kind in {**SCRAPED_NAMES, **dict.fromkeys(HISTOGRAM_BUCKETS, "histogram")}.items():
        assert families[name].type == kind, name
        assert {s.labels["model_name"] for s in families[name].samples} == {MODEL}, name
        if kind == "counter":
            assert {s.name for s in families[name].samples} == {name + "_total"}, f"{name}_total, as vLLM writes it"


def histogram(families: dict, name: str) -> tuple[list[tuple[float, float]], float, float]:
    """(le, cumulative count) of each bucket, the sum and the count, checked to be a well-formed histogram."""
    samples = families[name].samples
    buckets = [(float(s.labels["le"]), s.value) for s in samples if s.name == name + "_bucket"]
    (total,) = [s.value for s in samples if s.name == name + "_sum"]
    (count,) = [s.value for s in samples if s.name == name + "_count"]
    assert [le for le, _ in buckets] == [*HISTOGRAM_BUCKETS[name], float("inf")], f"{name}: vLLM's buckets"
    assert all(a <= b for (_, a), (_, b) in itertools.pairwise(buckets)), f"{name}: cumulative"
    assert buckets[-1][1] == count
    return buckets, total, count


def expected(values: list[float], bounds) -> list[tuple[float, float]]:
    return [(le, sum(1 for v in values if v <= le)) for le in (*bounds, float("inf"))]


def test_the_histograms_count_exactly_what_the_requests_took_and_made(served):
    bodies = [
        {"prompt": [5, 6, 7], "max_tokens": 9},
        {"prompt": "Hello there", "max_tokens": 4, "stream": True},
        {"prompt": [9], "max_tokens": 1},
        {"prompt": [[11, 12], [13, 14, 15, 16]], "max_tokens": 3},  # two engine requests
    ]
    for body in bodies:
        assert call(served.url + "/v1/completions", body)[0] == 200
    records = served.server.recent_records()
    assert len(records) == 5
    metrics = [request_metrics(record) for record in records]
    observed = {
        "vllm:time_to_first_token_seconds": [m.ttft for m in metrics],
        "vllm:inter_token_latency_seconds": [itl for m in metrics for itl in m.itls],
        "vllm:time_per_output_token_seconds": [itl for m in metrics for itl in m.itls],
        "vllm:request_time_per_output_token_seconds": [m.tpot or 0.0 for m in metrics],
        "vllm:e2e_request_latency_seconds": [m.e2e for m in metrics],
        "vllm:request_prompt_tokens": [m.num_prompt_tokens for m in metrics],
        "vllm:request_generation_tokens": [m.num_output_tokens for m in metrics],
    }
    assert sorted(observed["vllm:request_generation_tokens"]) == [1, 3, 3, 4, 9]
    families = scrape(served)
    for name, values in observed.items():
        buckets, total, count = histogram(families, name)
        assert count == len(values), name
        assert total == pytest.approx(sum(values), rel=1e-12, abs=1e-12), name
        assert buckets == expected(values, HISTOGRAM_BUCKETS[name]), name


def test_vllms_token_buckets_are_1_2_5_up_to_the_model_length():
    assert build_1_2_5_buckets(100) == (1, 2, 5, 10, 20, 50, 100)
    assert build_1_2_5_buckets(2048) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


# --------------------------------------------------------------------------- the request log


def request_lines(caplog) -> list:
    return [r for r in caplog.records if r.name == REQUEST_LOGGER]


def test_each_request_gets_one_log_line_with_its_ids_tokens_and_times(served, caplog):
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)
    body = {"prompt": [5, 6, 7], "max_tokens": 4}
    assert call(served.url + "/v1/completions", body, headers={"X-Request-Id": "client-7"})[0] == 200
    assert call(served.url + "/v1/completions", {"prompt": [5], "max_tokens": 0})[0] == 400
    ok, bad = wait_until(lambda: request_lines(caplog) if len(request_lines(caplog)) == 2 else None, "two lines")
    assert ok.levelno == logging.INFO
    line = ok.getMessage()
    for field in ("method=POST", "path=/v1/completions", "status=200", "request_id=cmpl-0", "client_request_id=client-7",
                  "prompt_tokens=3", "output_tokens=4", "finish_reason=length"):  # fmt: skip
        assert field in line.split(), (field, line)
    served_request = ok.served_request
    assert 0 < served_request.ttft_s <= served_request.duration_s
    assert "status=400" in bad.getMessage().split() and "finish_reason=-" in bad.getMessage().split()


def test_a_404_is_logged_with_its_path(served, caplog):
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)
    assert call(served.url + "/v2/completions", {"prompt": "hi"})[0] == 404
    (line,) = wait_until(lambda: request_lines(caplog), "the 404's line")
    assert {"method=POST", "path=/v2/completions", "status=404", "request_id=-"} <= set(line.getMessage().split())


def test_a_client_that_leaves_a_stream_is_logged_as_an_abort(served, caplog):
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)
    connection = http.client.HTTPConnection(served.host, served.port, timeout=HTTP_TIMEOUT_S)
    body = {"prompt": [5, 6, 7], "max_tokens": MAX_SEQ_LEN - 3, "stream": True}
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    assert connection.getresponse().readline().startswith(b"data: {")
    connection.close()
    (line,) = wait_until(lambda: request_lines(caplog), "the aborted stream's line")
    fields = dict(field.split("=", 1) for field in line.getMessage().split())
    assert fields["finish_reason"] == "abort" and fields["status"] in {"200", "499"}
    assert 1 <= int(fields["output_tokens"]) < MAX_SEQ_LEN - 3


def test_no_request_log_silences_it(caplog):
    assert build_parser().parse_args(["serve", "--no-request-log"]).request_log is False
    assert build_parser().parse_args(["serve"]).request_log is True
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)
    with start_fake_server(request_log=False) as thread:
        assert call(thread.url + "/v1/completions", {"prompt": [5], "max_tokens": 2})[0] == 200
        assert call(thread.url + "/nothing")[0] == 404
    assert request_lines(caplog) == []


# --------------------------------------------------------------------------- routes


def test_a_404_names_the_path_and_the_endpoints_served(served):
    status, raw = call(served.url + "/completions", {"prompt": "hi"})
    error = json.loads(raw)["error"]
    assert status == 404 and error["type"] == "invalid_request_error"
    assert "POST /completions" in error["message"]
    assert all(f"{method} {path}" in error["message"] for method, path, _ in ROUTES)
    status, raw = call(served.url + "/v1/completions")  # GET
    error = json.loads(raw)["error"]
    assert status == 405 and "/v1/completions takes POST, not GET" in error["message"]


def test_serve_help_lists_every_endpoint_served(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert [path for _, path, _ in ROUTES if path not in help_text] == []
    assert "/metrics" in help_text and "--no-request-log" in help_text
