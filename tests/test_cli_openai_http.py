"""`perfsuite run --engines openai-http`: the server is named on the command line and asked before a model loads."""

from __future__ import annotations

import socket

import pytest

import perfsuite.models
from perfsuite.cli import main


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading a model takes tens of seconds with SmolLM2: an argument error must come before it."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(perfsuite.models, "load_model", refuse)


def usage_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_openai_http_without_an_endpoint_fails_while_parsing_naming_endpoint(no_model_load, capsys):
    err = usage_error(["run", "--engines", "inflight,openai-http", "--model", "tiny-random"], capsys)
    assert "usage: perfsuite run" in err
    assert "--endpoint http://HOST:PORT" in err and "--perf-endpoint" not in err


def test_an_endpoint_without_openai_http_is_refused(no_model_load, capsys):
    err = usage_error(["run", "--endpoint", "http://127.0.0.1:8000"], capsys)
    assert "--endpoint is used only by --engines openai-http" in err


def test_an_endpoint_that_is_not_a_url_is_refused(no_model_load, capsys):
    err = usage_error(["run", "--engines", "openai-http", "--endpoint", "localhost:8000"], capsys)
    assert "argument --endpoint" in err and "http://127.0.0.1:8000" in err


def test_a_server_that_does_not_answer_is_reported_before_the_model_loads(no_model_load, capsys):
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code = main(["run", "--engines", "openai-http", "--endpoint", f"http://127.0.0.1:{port}", "--model", "tiny-random"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"127.0.0.1:{port}/v1/models" in err and "--endpoint" in err and "--perf-endpoint" not in err


@pytest.fixture(scope="module")
def tiny():
    return perfsuite.models.load_model("tiny-random")


@pytest.fixture(scope="module")
def served(tiny):
    from perfsuite.adapters import Backend, EngineConfig, build_engine
    from perfsuite.serve import CompletionServer, ServerThread

    loaded = tiny
    engine = build_engine("inflight", Backend.from_loaded(loaded), EngineConfig(4, 256))
    server = CompletionServer(engine, loaded.tokenizer, model_name="tiny-random",
                              vocab_size=loaded.model.config.vocab_size)  # fmt: skip
    with ServerThread(server) as thread:
        yield thread


def test_run_measures_a_server_beside_an_in_process_engine(served, capsys):
    code = main(["run", "--model", "tiny-random", "--engines", "inflight,openai-http", "--endpoint", served.url,
                 "--num-requests", "4", "--max-new-tokens", "8", "--batch-size", "2", "--no-progress"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.strip().splitlines()
    cache_lines = [line for line in lines if line.startswith("prefix cache")]
    server_lines = [line for line in lines if line.startswith("server metrics")]
    rows = {line.split()[0]: line.split() for line in lines[2:] if line not in cache_lines + server_lines}
    assert set(rows) == {"inflight", "openai-http"}
    assert [line.partition(":")[0] for line in cache_lines] == ["prefix cache (openai-http)"], (
        "the server says how many prompt tokens it found cached (none: its engine is inflight)")
    assert float(rows["openai-http"][1].replace(",", "")) > 0, "the server's tokens per second"
    [server_line] = server_lines
    assert server_line.startswith("server metrics (openai-http): ") and "0 preemptions" in server_line, (
        "perfsuite serve exposes its counters: the client reads them around the run")


def test_a_closed_loop_of_synthetic_prompts_reaches_every_engine(tiny, served, monkeypatch, capsys):
    import perfsuite.measure.timing

    monkeypatch.setattr(perfsuite.models, "load_model", lambda *args, **kwargs: tiny)
    seen = []
    real_timed_run = perfsuite.measure.timing.timed_run

    def spy(engine, requests, device, on_step=None, max_concurrency=None):
        seen.append((engine.name, [r.num_prompt_tokens for r in requests], max_concurrency))
        return real_timed_run(engine, requests, device, on_step, max_concurrency)

    monkeypatch.setattr(perfsuite.measure.timing, "timed_run", spy)
    code = main(["run", "--model", "tiny-random", "--engines", "inflight,openai-http", "--endpoint", served.url,
                 "--num-requests", "4", "--min-new-tokens", "2", "--max-new-tokens", "4", "--prompt-len", "8:12",
                 "--concurrency", "2", "--batch-size", "2", "--no-progress"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert [(name, concurrency) for name, _, concurrency in seen] == [("inflight", 2), ("openai-http", 2)]
    assert all(8 <= n <= 12 for _, lengths, _ in seen for n in lengths) and len(seen[0][1]) == 4
    assert "arrivals c2" in err and "prompts in_uniform8_12" in err


def test_a_model_the_server_does_not_serve_is_named(served, no_model_load, capsys):
    code = main(["run", "--model", "tiny-random", "--engines", "openai-http", "--endpoint", served.url,
                 "--server-model", "smollm2-135m"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert "'smollm2-135m'" in err and "--server-model" in err and "--perf-server-model" not in err
