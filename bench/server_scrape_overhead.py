"""Whether reading the server's /metrics during a run slows the openai-http client's timings (issue 41).

    .venv/bin/python bench/server_scrape_overhead.py [--model tiny-random] [--rounds 5] [--interval 0.5]

``perfsuite serve`` runs in a subprocess (so its own work does not share the client's interpreter); the same
open-loop workload (Poisson arrivals, so a run spans several scrape intervals) is sent by two clients that
differ only in ``scrape_interval_s``: A never reads /metrics, B reads it every ``--interval`` s. They alternate
A B A B ... for ``--rounds`` rounds, so drift of the machine hits both alike. Printed per round and as medians:
the client's mean TTFT, median ITL and output tokens/s, the scrapes B made, and B/A. Also, for a page as large
as a vLLM server's: the time to parse it (done before and after a run) and to keep its gauges' lines (the
client's work per scrape while a run is in flight).

Run it on a quiet machine; progress to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfsuite.adapters.openai_http import OpenAIHttpEngine  # noqa: E402
from perfsuite.adapters.prometheus_text import GAUGE_NAMES, Scrape, read_lines  # noqa: E402
from perfsuite.measure.metrics import run_metrics  # noqa: E402
from perfsuite.workload import Arrivals, OutputLengths, PromptLengths, SyntheticPrompts, Vocab, Workload  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "perfsuite", "serve", "--model", model, "--port", str(port), "--device", "cpu"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1).read()
            return server
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise SystemExit("perfsuite serve did not answer within 300 s")


def vllm_sized_page() -> str:
    """A page of a vLLM server's size: its histograms (about 20 buckets each) and gauges under vLLM's names, for
    4 engines, among metrics the client does not read (queue and prefill times, the process's own)."""
    read = ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
            "request_prompt_tokens", "request_generation_tokens", "time_per_output_token_seconds")  # fmt: skip
    unread = ("request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
              "request_inference_time_seconds", "request_params_max_tokens", "iteration_tokens_total")  # fmt: skip
    lines = []
    for engine in range(4):
        labels = f'engine="{engine}",model_name="m"'
        for name in read + unread:
            lines.append(f"# TYPE vllm:{name} histogram")
            for i, bound in enumerate([0.001 * 2**k for k in range(20)]):
                lines.append(f'vllm:{name}_bucket{{{labels},le="{bound}"}} {i * 3}')
            lines += [f'vllm:{name}_bucket{{{labels},le="+Inf"}} 60', f"vllm:{name}_count{{{labels}}} 60"]
            lines.append(f"vllm:{name}_sum{{{labels}}} 1.5")
        lines.append(f"vllm:kv_cache_usage_perc{{{labels}}} 0.5")
        lines.append(f"vllm:num_preemptions_total{{{labels}}} 3")
    return "\n".join(lines) + "\n"


def figures(result) -> tuple[float, float, float]:
    metrics = run_metrics(result)
    return 1e3 * metrics.ttft.mean, 1e3 * metrics.itl.median, metrics.output_throughput


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--interval", type=float, default=0.5, help="B's scrape interval in seconds (0.5)")
    parser.add_argument("--num-requests", type=int, default=24)
    parser.add_argument("--rate", type=float, default=8.0, help="Poisson arrivals, requests/s (8)")
    args = parser.parse_args()
    page = vllm_sized_page()
    started = time.perf_counter()
    for _ in range(20):
        Scrape.parse(page)
    parse_ms = 1e3 * (time.perf_counter() - started) / 20
    started = time.perf_counter()
    for _ in range(20):
        read_lines(page, GAUGE_NAMES)
    filter_ms = 1e3 * (time.perf_counter() - started) / 20
    print(f"a vLLM-sized page ({page.count(chr(10))} lines): parsed (before and after a run) {parse_ms:.2f} ms; "
          f"its gauges' lines kept (each scrape in flight) {filter_ms:.3f} ms")  # fmt: skip
    port = free_port()
    server = start_server(args.model, port)
    try:
        url = f"http://127.0.0.1:{port}"
        workload = Workload(
            args.num_requests,
            OutputLengths("uniform", 16, 32),
            Arrivals(rate=args.rate),
            prompts=SyntheticPrompts(PromptLengths("uniform", 16, 64)),
        )
        requests = workload.requests(vocab=Vocab(256, (0, 1, 2)))
        clients = {
            "A (no scrape)": OpenAIHttpEngine(url, 8, lambda text: [0], scrape_interval_s=None),
            f"B (every {args.interval:g} s)": OpenAIHttpEngine(url, 8, lambda text: [0], scrape_interval_s=args.interval),
        }
        for client in clients.values():
            client.run(requests[:2])  # warm-up: the probe, connections
        rows: dict[str, list[tuple[float, float, float]]] = {label: [] for label in clients}
        scrapes = []
        for round_number in range(args.rounds):
            for label, client in clients.items():
                result = client.run(requests)
                rows[label].append(figures(result))
                if result.server_metrics is not None:
                    scrapes.append(result.server_metrics.num_scrapes_during)
                print(f"round {round_number + 1} {label}: {rows[label][-1]}", file=sys.stderr)
        print(f"{'client':<20} {'TTFT mean ms':>13} {'ITL p50 ms':>11} {'out tok/s':>10}")
        medians = {}
        for label, values in rows.items():
            medians[label] = [statistics.median(v[i] for v in values) for i in range(3)]
            print(f"{label:<20} {medians[label][0]:>13.2f} {medians[label][1]:>11.3f} {medians[label][2]:>10.1f}")
        a, b = medians.values()
        print(f"{'B/A':<20} {b[0] / a[0]:>13.3f} {b[1] / a[1]:>11.3f} {b[2] / a[2]:>10.3f}")
        print(f"scrapes while in flight per B run: {scrapes}")
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
