"""A server's greedy decoding is checked through ``openai-http``, with the near-tie report of in-process engines.

By default the server is ``perfsuite serve`` over tiny-random (float64, so no
batch shape can flip a token) on loopback, started here. Pointed at another
server, the same test checks it against the reference of the local model:

    pytest tests/test_server_greedy.py --perf-endpoint http://127.0.0.1:8000 \
        --perf-model smollm2-135m --perf-dtype float32 [--perf-server-model NAME]

(the peers tier does this for vLLM); the model and dtype must be what the
server serves.
"""

from __future__ import annotations

import dataclasses

import pytest

from perfsuite.adapters import Backend, EngineConfig, build_engine
from perfsuite.testing.greedy import check_server_greedy, greedy_check_requests
from perfsuite.plugin.stash import perf_options
from perfsuite.testing import equivalence_test, near_tie_tolerance

MAX_SEQ_LEN = 128
BATCH_SIZE = 4
NEW_TOKENS = 16
WRONG_POSITION = 2  # the output position the faulty server gets wrong


class OneWrongToken:
    """A model runner that gets one token wrong: output position 2 of every request with prompt ``target``.

    A server with a decoding bug. Keyed on the prompt, not on steps, so it does
    not matter when requests reach the server or what else it runs meanwhile.
    ``target=None``: every request's.
    """

    def __init__(self, runner, vocab_size: int, target: tuple[int, ...] | None) -> None:
        self._runner = runner
        self._vocab_size = vocab_size
        self._target = target
        self._target_slots: dict[int, int] = {}  # slot -> its prompt's length, while it serves the target

    def new_kv_cache(self, num_slots: int, max_seq_len: int):
        return self._runner.new_kv_cache(num_slots, max_seq_len)

    def execute(self, scheduler_output, kv_cache) -> list[int]:
        sampled = list(self._runner.execute(scheduler_output, kv_cache))
        sampling = [chunk for chunk in scheduler_output.chunks if chunk.samples]
        for index, chunk in enumerate(sampling):
            if chunk.is_prefill and chunk.start_position == 0:
                self._target_slots.pop(chunk.slot, None)
                if self._target is None or chunk.token_ids == self._target:
                    self._target_slots[chunk.slot] = chunk.num_tokens
            # a decode chunk at position P + k - 1 (P: prompt length) samples output token k
            prompt_length = self._target_slots.get(chunk.slot)
            if prompt_length is not None and chunk.start_position == prompt_length + WRONG_POSITION - 1:
                sampled[index] = (sampled[index] + 1) % self._vocab_size
        return sampled

    def __getattr__(self, name):
        return getattr(self._runner, name)


@pytest.fixture(scope="module")
def tiny():
    from perfsuite.models import load_model

    return load_model("tiny-random", dtype="float64")


def serve(loaded, runner_wrapper=None):
    """``perfsuite serve``'s in-flight engine over ``loaded``, on a loopback port (a context manager)."""
    from perfsuite.serve import CompletionServer, ServerThread

    backend = Backend.from_loaded(loaded)
    if runner_wrapper is not None:
        backend = dataclasses.replace(backend, runner=runner_wrapper(backend.runner))
    engine = build_engine("inflight", backend, EngineConfig(BATCH_SIZE, MAX_SEQ_LEN))
    vocab_size = loaded.model.config.vocab_size
    server = CompletionServer(engine, loaded.tokenizer, model_name="tiny-random", vocab_size=vocab_size)
    return ServerThread(server)


def reference_of(model, eos_token_id):
    from perfsuite.engine.reference import ReferenceDecoder

    return ReferenceDecoder(model, eos_token_id)


def client(loaded_or_backend, endpoint: str | None = None):
    backend = loaded_or_backend
    if not isinstance(backend, Backend):
        backend = Backend.from_loaded(loaded_or_backend, endpoint=endpoint)
    return build_engine("openai-http", backend, EngineConfig(BATCH_SIZE, MAX_SEQ_LEN)), backend


def test_a_server_decodes_greedily_through_openai_http(request):
    options = perf_options(request.config)
    if options.endpoint:  # a server of the user's (the peers tier): checked against --perf-model
        engine, backend = client(request.getfixturevalue("perf_backend"))
        tolerance = near_tie_tolerance(options.dtype)
        check = check_server_greedy(
            engine, greedy_check_requests(backend.tokenize, 24), reference_of(backend.model, backend.eos_token_id),
            tolerance,
        )
        print(check.describe())
        check.assert_passed(max_near_ties=1)
        return
    loaded = request.getfixturevalue("tiny")
    with serve(loaded) as server:
        engine, backend = client(loaded, server.url)
        requests = greedy_check_requests(backend.tokenize, NEW_TOKENS)
        check = check_server_greedy(engine, requests, reference_of(loaded.model, loaded.eos_token_id))
        assert engine.greedy_equal, "perfsuite serve returns exact token ids for token-id prompts"
    assert check.num_requests == len(requests) and check.divergences == (), check.describe()
    assert check.engine_name.startswith(f"openai-http at {server.url}")


def test_a_server_that_returns_a_wrong_token_is_reported_with_the_near_tie_report(tiny):
    vocab_size = tiny.model.config.vocab_size
    requests = greedy_check_requests(lambda text: tiny.tokenizer(text)["input_ids"], NEW_TOKENS)
    target = requests[1]
    with serve(tiny, lambda runner: OneWrongToken(runner, vocab_size, target.prompt_token_ids)) as server:
        engine, _ = client(tiny, server.url)
        check = check_server_greedy(engine, requests, reference_of(tiny.model, tiny.eos_token_id))
    assert not check.passed
    [divergence] = check.real_divergences
    assert (divergence.request_id, divergence.position) == (target.request_id, WRONG_POSITION)
    assert divergence.actual_token == (divergence.expected_token + 1) % vocab_size
    with pytest.raises(AssertionError) as error:
        check.assert_passed()
    message = str(error.value)
    for fragment in (f"openai-http at {server.url}", f"request {target.request_id!r}", "position 2",
                     f"reference token {divergence.expected_token}", "margin there:"):  # fmt: skip
        assert fragment in message


# -- the correctness kit, through openai-http -------------------------------------------------------------


def test_the_correctness_kit_checks_a_server_through_openai_http(tiny):
    """``equivalence_test("openai-http", endpoint=...)``: drawn scenarios, served over HTTP, equal the reference."""
    with serve(tiny) as server:
        equivalence_test("openai-http", endpoint=server.url, max_examples=10)()


def test_the_correctness_kit_finds_a_servers_wrong_token_and_shrinks_it_to_one_request(tiny):
    vocab_size = tiny.model.config.vocab_size
    with serve(tiny, lambda runner: OneWrongToken(runner, vocab_size, target=None)) as server:
        with pytest.raises(AssertionError) as failure:
            equivalence_test("openai-http", endpoint=server.url, max_examples=10)()
    message = str(failure.value)
    assert f"openai-http at {server.url}" in message and f"output position {WRONG_POSITION}: engine token" in message
    assert "scenario: 1 request;" in message, message
