"""Benchmark clients nobody here wrote, with their default settings, against ``perfsuite serve``.

guidellm's defaults are the chat endpoint, streamed; it needs a data source
(synthetic prompts here), a load profile (one request at a time) and a stop
rule (a request count). aiperf's defaults are the chat endpoint (``/v1/chat/completions``), synthetic
prompts of about 550 tokens, one request at a time, no streaming. Given here:
the served model and its tokenizer folder (the ``root`` that ``/v1/models``
names), how many requests, ``--streaming`` or not, and an output length (a chat
request without one runs until the model stops, which on this CPU can take
minutes per request). The check is the client's own: its output files must
show every request asked for completed, with no error.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
from peer_servers import run_logged

NUM_REQUESTS = 6
OUTPUT_TOKENS = 16
CLIENT_TIMEOUT_S = 600.0

_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def served_model(url: str) -> dict:
    with _no_proxy.open(url + "/v1/models", timeout=10) as response:
        (model,) = json.loads(response.read())["data"]
    return model


@pytest.mark.parametrize("streaming", [False, True], ids=["default", "streaming"])
def test_aiperf_completes_every_request(aiperf, perfsuite_server, tmp_path, streaming):
    model = served_model(perfsuite_server)
    artifacts = tmp_path / "artifacts"
    argv = [
        aiperf, "profile",
        "--model", model["id"],
        "--url", perfsuite_server,
        "--tokenizer", model["root"],
        "--request-count", str(NUM_REQUESTS),
        "--output-tokens-mean", str(OUTPUT_TOKENS),
        "--artifact-dir", artifacts,
        "--ui-type", "none",
    ] + (["--streaming"] if streaming else [])  # fmt: skip
    # aiperf 0.13 in HF offline mode takes a tokenizer folder for a hub id (snapshot_download) and fails;
    # online, a local path loads from disk with no request (there is no network here anyway).
    online = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    result = run_logged(argv, tmp_path / "aiperf.log", CLIENT_TIMEOUT_S, unset=online)
    failed = result.returncode != 0
    assert not failed, f"aiperf exited with {result.returncode}:\n{result.stdout[-6000:]}"
    summary = json.loads((artifacts / "profile_export_aiperf.json").read_text())
    records = [json.loads(line) for line in (artifacts / "profile_export.jsonl").read_text().splitlines()]
    print(f"aiperf: {summary['request_count']} {summary['output_sequence_length']}")
    assert summary["error_summary"] == [], summary["error_summary"]
    assert summary["request_count"]["avg"] == NUM_REQUESTS
    assert summary["request_error_rate"]["avg"] == 0
    assert summary["was_cancelled"] is False
    assert len(records) == NUM_REQUESTS
    assert [r.get("error") for r in records] == [None] * NUM_REQUESTS
    # A chat answer may end on EOS before the cap: aiperf sends neither ignore_eos nor min_tokens.
    assert all(1 <= r["metrics"]["output_token_count"]["value"] <= OUTPUT_TOKENS for r in records)
    if streaming:
        assert all("time_to_first_token" in r["metrics"] for r in records)


def test_guidellm_completes_every_request(guidellm, perfsuite_server, tmp_path):
    model = served_model(perfsuite_server)
    report = tmp_path / "benchmarks.json"
    argv = [
        guidellm, "run",
        "--backend", f"kind=openai_http,target={perfsuite_server}",
        "--profile", "kind=synchronous",
        "--constraint", f"kind=max_requests,count={NUM_REQUESTS}",
        "--data", f"kind=synthetic_text,prompt_tokens=64,output_tokens={OUTPUT_TOKENS}",
        "--tokenizer", f"kind=huggingface_auto,model={model['root']}",
        "--output", f"kind=json,path={report}",
        "--disable-console-interactive",
    ]  # fmt: skip
    result = run_logged(argv, tmp_path / "guidellm.log", CLIENT_TIMEOUT_S)
    failed = result.returncode != 0
    assert not failed, f"guidellm exited with {result.returncode}:\n{result.stdout[-6000:]}"
    (benchmark,) = json.loads(report.read_text())["benchmarks"]
    totals = benchmark["metrics"]["request_totals"]
    backend = benchmark["config"].get("backend", {})
    print(f"guidellm: {totals}, {backend.get('request_format')} stream={backend.get('stream')}")
    assert totals == {"successful": NUM_REQUESTS, "errored": 0, "incomplete": 0, "total": NUM_REQUESTS}
    assert benchmark["scheduler_state"]["errored_requests"] == 0
    successful = benchmark["requests"]["successful"]
    assert all(1 <= r["output_tokens"] <= OUTPUT_TOKENS for r in successful)
    assert all(r["time_to_first_token_ms"] is not None for r in successful)  # streamed, as by default

