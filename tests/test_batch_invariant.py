"""Batch-invariant mode: a request's tokens and log-probabilities are the same bits whatever else is in its batch.

A needle request is served alone, then among batches of other requests whose
sizes straddle the projection kernels' thresholds (``PACKED_MIN_ROWS``), with
the needle's rows in the middle of the packed batch, with its prompt split by
chunked prefill, and after a prefix cache hit. In invariant mode every one of
them must equal the needle alone bit for bit (``==`` on tokens and on floats);
in the normal mode at least one must differ, or the tests would not show that
the mode is what makes them equal.
"""

from __future__ import annotations

import pytest
import torch

from perfsuite.engine import Request, SamplingParams, inflight_engine, paged_engine, static_engine
from perfsuite.engine.model_runner import ModelRunner, check_batch_invariance
from perfsuite.engine.projection import Projection, batch_invariant_projection
from perfsuite.models import load_model
from smollm2 import load_smollm2_or_skip

pytest_plugins = ["pytester"]

COMPOSITIONS = (1, 2, 3, 4, 5, 8, 9, 16, 17, 33)  # other requests beside the needle
MAX_SEQ_LEN = 64
NEEDLE_PROMPT = tuple(range(5, 17))  # 12 tokens: three blocks of 4


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-random", dtype="float32")


@pytest.fixture(scope="module")
def runners(tiny):
    """The normal and the batch-invariant runner over one float32 model, both keeping log-probabilities."""
    return {
        invariant: ModelRunner(tiny.model, batch_invariant=invariant, logprobs=True) for invariant in (False, True)
    }


def needle(max_new_tokens: int = 4, prompt: tuple[int, ...] = NEEDLE_PROMPT) -> Request:
    return Request("needle", prompt, SamplingParams(max_new_tokens, ignore_eos=True))


def others(count: int, prefix: tuple[int, ...] = ()) -> list[Request]:
    """Other requests of varied prompt and output lengths, so that they join and leave around the needle."""
    return [
        Request(f"o{i}", prefix + tuple((7 * i + 3 * j) % 300 + 3 for j in range(2 + i % 11)),
                SamplingParams(2 + i % 4, ignore_eos=True))
        for i in range(count)
    ]  # fmt: skip


def build(kind: str, runner, batch_size: int, **knobs):
    if kind == "static":
        return static_engine(runner, batch_size=batch_size, max_seq_len=MAX_SEQ_LEN, eos_token_id=None)
    if kind == "inflight":
        return inflight_engine(runner, decode_batch_size=batch_size, max_seq_len=MAX_SEQ_LEN, eos_token_id=None,
                               **knobs)  # fmt: skip
    return paged_engine(runner, decode_batch_size=batch_size, max_seq_len=MAX_SEQ_LEN, eos_token_id=None,
                        kv_block_size=4, **knobs)  # fmt: skip


def served(engine, requests: list[Request], needle_id: str = "needle"):
    """The needle's tokens and log-probabilities from one run of ``requests``."""
    record = next(r for r in engine.run(requests).records if r.request_id == needle_id)
    assert record.output_logprobs is not None and len(record.output_logprobs) == len(record.output_token_ids)
    return record.output_token_ids, record.output_logprobs


def in_the_middle(count: int) -> list[Request]:
    """``count`` other requests with the needle among them, at the middle of the list (and of the packed batch)."""
    rest = others(count)
    return rest[: count // 2] + [needle()] + rest[count // 2 :]


def compositions_differing(runner, kind: str):
    """Each batch size of ``COMPOSITIONS`` whose needle is not the needle alone, bit for bit, as it is found."""
    alone = served(build(kind, runner, 1), [needle()])
    return (count for count in COMPOSITIONS if served(build(kind, runner, count + 1), in_the_middle(count)) != alone)


@pytest.mark.parametrize("kind", ["static", "inflight", "paged"])
def test_in_invariant_mode_a_needle_is_the_same_bits_alone_and_in_batches_of_every_size(runners, kind):
    assert list(compositions_differing(runners[True], kind)) == []


@pytest.mark.parametrize("kind", ["static", "inflight", "paged"])
def test_in_normal_mode_some_batch_changes_the_needles_bits(runners, kind):
    """The inverse: without the mode the kernels change with the row count, and the needle's bits with them."""
    assert next(compositions_differing(runners[False], kind), None) is not None


def chunked_outputs(runner, kind: str) -> list[tuple]:
    """The needle alone, unchunked; then in batches of 3 and 9 whose token budget of 5 splits its 12-token prompt."""
    outputs = [served(build(kind, runner, 1), [needle()])]
    for count in (3, 9):
        engine = build(kind, runner, count + 1, max_num_batched_tokens=5)
        outputs.append(served(engine, [*others(count), needle()]))
        assert max(c.num_tokens for s in engine.result(0, 1).steps for c in s.chunks if c.request_id == "needle") < 12
    return outputs


@pytest.mark.parametrize("kind", ["inflight", "paged"])
def test_in_invariant_mode_chunked_prefill_leaves_the_needles_bits_as_they_were(runners, kind):
    alone, *chunked = chunked_outputs(runners[True], kind)
    assert all(outputs == alone for outputs in chunked)


def test_in_normal_mode_chunked_prefill_changes_the_needles_bits(runners):
    alone, *chunked = chunked_outputs(runners[False], "paged")
    assert any(outputs != alone for outputs in chunked)


def prefix_hit_outputs(runner) -> tuple[tuple, tuple, int]:
    """The needle alone, and after others that share its first 8 tokens (two blocks of 4), with its hit tokens."""
    alone = served(paged_engine(runner, decode_batch_size=1, max_seq_len=MAX_SEQ_LEN, eos_token_id=None,
                                kv_block_size=4, enable_prefix_caching=True), [needle()])  # fmt: skip
    engine = paged_engine(runner, decode_batch_size=5, max_seq_len=MAX_SEQ_LEN, eos_token_id=None, kv_block_size=4,
                          enable_prefix_caching=True, max_num_batched_tokens=16)  # fmt: skip
    requests = [*others(4, prefix=NEEDLE_PROMPT[:8]), needle()]
    result = engine.run(requests)
    record = next(r for r in result.records if r.request_id == "needle")
    return alone, (record.output_token_ids, record.output_logprobs), record.num_cached_tokens


def test_in_invariant_mode_a_prefix_cache_hit_leaves_the_needles_bits_as_they_were(runners):
    alone, after_hit, num_cached = prefix_hit_outputs(runners[True])
    assert num_cached >= 4, "the needle must reuse another request's blocks for the test to mean anything"
    assert after_hit == alone


def test_log_probabilities_are_each_tokens_log_softmax_and_absent_unless_asked(tiny, runners):
    tokens, logprobs = served(build("inflight", runners[True], 1), [needle(4)])
    with torch.inference_mode():
        logits = tiny.model(torch.tensor([NEEDLE_PROMPT + tokens[:-1]])).logits[0, len(NEEDLE_PROMPT) - 1 :]
    expected = logits.log_softmax(-1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(logprobs), expected, atol=1e-4)
    plain = ModelRunner(tiny.model)
    record = inflight_engine(plain, decode_batch_size=1, max_seq_len=MAX_SEQ_LEN, eos_token_id=None).run(
        [needle(4)]
    ).records[0]  # fmt: skip
    assert record.output_logprobs is None and plain.last_logprobs is None


def test_an_engine_says_whether_its_runner_is_batch_invariant(runners):
    assert build("paged", runners[True], 2).batch_invariant
    assert not build("paged", runners[False], 2).batch_invariant


def test_where_the_mode_cannot_hold_the_runner_says_why(tiny):
    cuda = check_batch_invariance(torch.device("cuda"), torch.float32)
    assert cuda is not None and "CUDA" in cuda and "no batch-invariant eager operators" in cuda
    assert "float32" in check_batch_invariance(torch.device("cpu"), torch.float64)
    assert "paged_attention=False" in check_batch_invariance(torch.device("cpu"), torch.float32, paged_attention=False)
    assert check_batch_invariance(torch.device("cpu"), torch.float32) is None
    with pytest.raises(ValueError, match="batch-invariant mode is not available here: it needs float32"):
        ModelRunner(tiny.model, dtype=torch.float64, batch_invariant=True)
    with pytest.raises(ValueError, match="runs the packed decode path, not decode_mode 'static'"):
        ModelRunner(tiny.model, decode_mode="static", batch_invariant=True)


def test_the_invariant_projection_gives_a_row_the_same_bits_at_every_row_count_where_the_plain_one_does_not():
    """SmolLM2's down projection's shape (576 x 1536), where oneDNN itself changes a lone row's bits."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(576, 1536, generator=generator) / 1536**0.5
    x = torch.randn(40, 1536, generator=generator)
    with torch.inference_mode():
        for projection, invariant in ((batch_invariant_projection(weight), True), (Projection.of(weight), False)):
            full = projection(x)
            differing = [m for m in range(1, 40) if not torch.equal(projection(x[:m]), full[:m])]
            assert (differing == []) == invariant, differing


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["inflight", "paged"])
def test_smollm2_float32_in_invariant_mode_a_needle_is_the_same_bits_in_batches(kind):
    loaded = load_smollm2_or_skip()
    runner = ModelRunner(loaded.model, batch_invariant=True, logprobs=True)
    prompt = tuple(loaded.tokenizer("The capital of France is")["input_ids"])
    alone = served(build(kind, runner, 1), [needle(4, prompt)])
    for count in (3, 4, 9):
        rest = others(count)
        batched = served(build(kind, runner, count + 1), [*rest[:2], needle(4, prompt), *rest[2:]])
        assert batched == alone, f"{count} others changed the needle: {batched} != {alone}"


# -- the knob: EngineConfig, the builders, --perf-batch-invariant ---------------

FAKE_CONFTEST = """
import pytest
from perfsuite.adapters import Backend
from perfsuite.engine.fake_runner import FakeRunner


class InvariantFake(FakeRunner):
    batch_invariant = True


@pytest.fixture(scope="session")
def perf_backend(perf_session):
    runner = (InvariantFake if perf_session.options.batch_invariant else FakeRunner)(vocab_size=97)
    return Backend(runner=runner, tokenize=lambda text: [3] * len(text), eos_token_id=None, max_context=512,
                   device="cpu", probe=None)
"""

FAKE_TESTS = """
import pytest


@pytest.mark.perf
def test_knobs(perf_engine_factory, perf_built_engines):
    engine = perf_engine_factory("paged", batch_size=2)
    print("KNOBS", perf_built_engines[0].config.identity(), "ENGINE", engine.batch_invariant)
"""


def test_the_config_records_the_knob_only_when_asked_and_a_builder_refuses_a_runner_that_differs(runners):
    from perfsuite.adapters import Backend, EngineConfig, build_engine

    assert "batch_invariant" not in EngineConfig(2, 64).identity()  # so stored baselines keep their identity
    assert EngineConfig(2, 64, batch_invariant=True).identity()["batch_invariant"] is True
    backend = Backend(runner=runners[False], tokenize=list, eos_token_id=None, max_context=64, device="cpu")
    with pytest.raises(ValueError, match="asks for batch_invariant=True but the backend's runner was built with"):
        build_engine("inflight", backend, EngineConfig(2, 64, batch_invariant=True))
    assert build_engine("inflight", backend, EngineConfig(2, 64)).batch_invariant is False


def test_the_option_reaches_the_runner_and_the_engine_knobs(pytester):
    pytester.makeconftest(FAKE_CONFTEST)
    pytester.makepyfile(FAKE_TESTS)
    result = pytester.runpytest_subprocess("--perf", "--perf-batch-invariant", "-s", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*KNOBS {*'batch_invariant': True*} ENGINE True*"])
    result = pytester.runpytest_subprocess("--perf", "-s", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*KNOBS {*} ENGINE False*"])
    assert "batch_invariant" not in result.stdout.str()


def test_the_option_is_refused_where_it_would_not_hold(pytester):
    pytester.makepyfile(FAKE_TESTS)
    result = pytester.runpytest_subprocess("--perf", "--perf-batch-invariant", "--perf-dtype", "float64")
    result.stderr.fnmatch_lines(["*--perf-batch-invariant needs float32 on a CPU*not float64 on auto*"])
    result = pytester.runpytest_subprocess("--perf", "--perf-batch-invariant", "--perf-engines", "inflight,hf-static")
    result.stderr.fnmatch_lines(["*--perf-batch-invariant is a mode of perfsuite's engines*hf-static would run*"])
