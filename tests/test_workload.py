"""Workloads: prompt sources, output lengths, arrivals, validation and the plain-data parser."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.workload import (
    Arrivals,
    JsonlPrompts,
    OutputLengths,
    PromptLengths,
    ShippedPrompts,
    SyntheticPrompts,
    Vocab,
    Workload,
    mixed_workload,
    shipped_prompts,
)
from own_engines import own_engine


def tokenize(text: str) -> list[int]:
    return [ord(char) % 251 + 1 for char in text]


def write_jsonl(path: Path, *lines: object) -> Path:
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


VOCAB = Vocab(size=97, special_ids=(0, 1, 2))


# --- the shipped prompts, as before ---------------------------------------------------


def test_default_workload_cycles_the_shipped_prompts():
    requests = mixed_workload(num_requests=40, seed=1).requests(tokenize)
    prompts = shipped_prompts()
    assert [r.request_id for r in requests[:2]] == ["req-0", "req-1"]
    assert requests[0].prompt_token_ids == tuple(tokenize(prompts[0]))
    assert requests[len(prompts)].prompt_token_ids == requests[0].prompt_token_ids
    assert all(8 <= r.sampling_params.max_new_tokens <= 128 and r.sampling_params.ignore_eos for r in requests)
    assert {r.arrival_time for r in requests} == {0.0}


def test_text_prompts_need_a_tokenizer():
    with pytest.raises(ValueError, match="the shipped prompt set is text; pass tokenize="):
        Workload(4).requests()


# --- determinism ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "workload",
    [
        Workload(16, OutputLengths("exponential", 1, 64, mean=8), Arrivals(rate=5.0), seed=3),
        Workload(16, OutputLengths("uniform", 2, 9), Arrivals(rate=5.0, burstiness=0.3), seed=3),
        Workload(
            16, OutputLengths("uniform", 2, 9), seed=3, prompts=SyntheticPrompts(PromptLengths("normal", 1, 90, 40, 20))
        ),
    ],
    ids=["exponential-poisson", "gamma", "synthetic-normal"],
)
def test_same_seed_same_requests_other_seed_other_requests(workload):
    again = Workload(workload.num_requests, workload.lengths, workload.arrivals, workload.seed, workload.prompts)
    other = Workload(workload.num_requests, workload.lengths, workload.arrivals, workload.seed + 1, workload.prompts)
    assert workload.requests(tokenize, vocab=VOCAB) == again.requests(tokenize, vocab=VOCAB)
    assert workload.requests(tokenize, vocab=VOCAB) != other.requests(tokenize, vocab=VOCAB)


# --- synthetic prompts ---------------------------------------------------------------

prompt_lengths = st.one_of(
    st.integers(1, 300).map(lambda tokens: PromptLengths("fixed", tokens, tokens)),
    st.tuples(st.integers(1, 200), st.integers(0, 100)).map(lambda b: PromptLengths("uniform", b[0], b[0] + b[1])),
    st.tuples(st.integers(1, 100), st.integers(0, 100), st.floats(-50, 300), st.floats(0, 100)).map(
        lambda b: PromptLengths("normal", b[0], b[0] + b[1], mean=b[2], stddev=b[3])
    ),
)


@st.composite
def vocabs(draw) -> Vocab:
    size = draw(st.integers(2, 400))
    first_id = draw(st.integers(0, size - 1))
    specials = draw(st.lists(st.integers(0, size + 5), max_size=8))
    allowed = set(range(first_id, size)) - set(specials)
    if not allowed:
        specials = specials[:0]
    return Vocab(size, tuple(specials), first_id)


@settings(max_examples=150, deadline=None)
@given(lengths=prompt_lengths, vocab=vocabs(), seed=st.integers(0, 2**32), num_requests=st.integers(1, 12))
def test_synthetic_prompts_have_drawn_lengths_of_allowed_ids(lengths, vocab, seed, num_requests):
    workload = Workload(num_requests, OutputLengths("fixed", 1, 1), seed=seed, prompts=SyntheticPrompts(lengths))
    requests = workload.requests(vocab=vocab)
    assert len(requests) == num_requests
    for request in requests:
        if lengths.kind == "fixed":
            assert request.num_prompt_tokens == lengths.high
        assert lengths.low <= request.num_prompt_tokens <= lengths.high
        assert all(vocab.first_id <= token < vocab.size for token in request.prompt_token_ids)
        assert not set(request.prompt_token_ids) & set(vocab.special_ids)


def test_vocab_draws_reach_every_allowed_id_and_nothing_else():
    vocab = Vocab(size=10, special_ids=(9, 0, 3, 3, 42), first_id=1)
    drawn = set(vocab.draw(random.Random(0), 2000))
    assert drawn == {1, 2, 4, 5, 6, 7, 8}
    assert vocab.num_allowed == 7


def test_uniform_prompt_lengths_cover_the_range():
    workload = Workload(400, seed=2, prompts=SyntheticPrompts(PromptLengths("uniform", 5, 9)))
    assert {len(ids) for ids in workload.prompt_token_ids(vocab=VOCAB)} == {5, 6, 7, 8, 9}


def test_synthetic_prompts_need_a_vocab_and_take_no_texts():
    workload = Workload(4, prompts=SyntheticPrompts(PromptLengths("fixed", 8, 8)))
    with pytest.raises(ValueError, match=r"synthetic prompts need vocab=Vocab"):
        workload.requests(tokenize)
    with pytest.raises(ValueError, match="prompts are synthetic"):
        workload.requests(tokenize, ["hello"], vocab=VOCAB)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Vocab(0), r"vocab.size must be an integer >= 1, got 0"),
        (lambda: Vocab(5, first_id=5), r"vocab.first_id must be below vocab.size=5, got 5"),
        (lambda: Vocab(3, special_ids=(0, 1, 2)), r"vocab leaves no token id to draw"),
        (lambda: Vocab(3, special_ids=(-1,)), r"each of vocab.special_ids must be an integer >= 0, got -1"),
    ],
)
def test_bad_vocab_names_the_field(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# --- JSONL prompt files ----------------------------------------------------------------


def test_jsonl_prompts_and_their_output_lengths(tmp_path):
    path = write_jsonl(
        tmp_path / "prompts.jsonl",
        {"prompt": "Hello there", "output_len": 5},
        "",
        {"prompt": "Second \u2028 prompt", "max_new_tokens": 7},
        {"prompt": "Third", "output_len": 3},
    )
    workload = Workload(5, OutputLengths("from_file"), prompts=JsonlPrompts(path))
    requests = workload.requests(tokenize)
    assert [r.sampling_params.max_new_tokens for r in requests] == [5, 7, 3, 5, 7]
    assert requests[1].prompt_token_ids == tuple(tokenize("Second \u2028 prompt"))
    assert requests[3].prompt_token_ids == requests[0].prompt_token_ids
    assert [line.line_number for line in JsonlPrompts(path).lines()] == [1, 3, 4]


def test_jsonl_prompts_with_drawn_output_lengths_need_no_output_len(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", {"prompt": "a"}, {"prompt": "b"})
    requests = Workload(4, OutputLengths("fixed", 6, 6), prompts=JsonlPrompts(path)).requests(tokenize)
    assert [r.prompt_token_ids for r in requests] == [(tokenize("a")[0],), (tokenize("b")[0],)] * 2
    assert {r.sampling_params.max_new_tokens for r in requests} == {6}


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"prompt": "a"}', "", '{"prompt": "b", "output_len": "ten"}'],
         'prompts.jsonl line 3: "output_len" must be an integer >= 1, got "ten"'),
        (['{"prompt": "a", "output_len": 0}'], 'line 1: "output_len" must be an integer >= 1, got 0'),
        (['{"prompt": "a", "output_len": true}'], 'line 1: "output_len" must be an integer >= 1, got true'),
        (['{"prompt": "a", "max_new_tokens": 2.5}'], 'line 1: "max_new_tokens" must be an integer >= 1, got 2.5'),
        (['{"prompt": "a", "output_len": 2, "max_new_tokens": 2}'], 'line 1: "output_len" and "max_new_tokens"'),
        (['{"prompt": "a"}', '{"prompt": "b",}'], "line 2: not valid JSON"),
        (['["a", 3]'], r'line 1: expected a JSON object like \{"prompt": "..."\}, got \["a", 3\]'),
        (['{"output_len": 3}'], 'line 1: "prompt" is missing'),
        (['{"prompt": ""}'], 'line 1: "prompt" must be a non-empty string, got ""'),
        (['{"prompt": 42}'], 'line 1: "prompt" must be a non-empty string, got 42'),
        (['{"prompt": "a", "outptu_len": 3}'], "line 1: unknown key 'outptu_len' \\(did you mean 'output_len'\\?\\)"),
        ([], "prompts.jsonl has no prompts"),
        (["", "   "], "prompts.jsonl has no prompts"),
    ],
)
def test_bad_jsonl_names_file_line_and_field(tmp_path, lines, message):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines))
    with pytest.raises(ValueError, match=message) as error:
        Workload(2, prompts=JsonlPrompts(path)).requests(tokenize)
    assert str(path) in str(error.value)


def test_from_file_lengths_need_output_len_on_every_line(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", {"prompt": "a", "output_len": 4}, {"prompt": "b"})
    with pytest.raises(ValueError, match=r"p.jsonl line 2: \"output_len\" is missing; .*'from_file'"):
        Workload(2, OutputLengths("from_file"), prompts=JsonlPrompts(path)).output_lengths()


def test_missing_jsonl_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"cannot read prompt file .*nope.jsonl"):
        JsonlPrompts(tmp_path / "nope.jsonl").lines()


def test_from_file_lengths_need_jsonl_prompts():
    with pytest.raises(ValueError, match="'from_file' reads output_len from a JSONL .* are the shipped prompt set"):
        Workload(4, OutputLengths("from_file"))


# --- arrivals ------------------------------------------------------------------------


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gaps_have_mean_one_over_rate_and_spread_set_by_burstiness(burstiness):
    rate, count = 5.0, 40_000
    times = Arrivals(rate=rate, burstiness=burstiness).times(random.Random(11), count)
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / rate, rel=0.03)
    # A gamma with shape k has coefficient of variation 1/sqrt(k): bursty below 1, smooth above.
    assert statistics.stdev(gaps) / mean == pytest.approx(burstiness**-0.5, rel=0.05)


def test_burstiness_one_is_the_poisson_process_draw_for_draw():
    rng = random.Random(7)
    expected, now = [], 0.0
    for _ in range(50):
        expected.append(now)
        now += rng.expovariate(3.0)
    assert Arrivals(rate=3.0, burstiness=1.0).times(random.Random(7), 50) == expected
    assert Arrivals(rate=3.0).times(random.Random(7), 50) == expected


@settings(max_examples=100, deadline=None)
@given(
    rate=st.floats(0.01, 1e4),
    burstiness=st.floats(0.05, 20),
    seed=st.integers(0, 2**32),
    count=st.integers(1, 50),
)
def test_arrival_times_start_at_zero_and_never_go_back(rate, burstiness, seed, count):
    times = Arrivals(rate=rate, burstiness=burstiness).times(random.Random(seed), count)
    assert len(times) == count and times[0] == 0.0
    assert all(earlier <= later for earlier, later in zip(times, times[1:]))


def test_concurrency_is_a_closed_loop_from_t0():
    prompts = SyntheticPrompts(PromptLengths("fixed", 8, 8))
    workload = Workload(6, OutputLengths("fixed", 4, 4), Arrivals(concurrency=2), prompts=prompts)
    assert workload.max_concurrency == 2
    assert Workload(6).max_concurrency is None
    requests = workload.requests(vocab=Vocab(97, special_ids=(0,)))
    assert {r.arrival_time for r in requests} == {0.0}
    engine = own_engine("inflight", FakeRunner(), batch_size=4, max_seq_len=64, eos_token_id=None)
    result = engine.run(requests, max_concurrency=workload.max_concurrency)
    assert all(len(record.output_token_ids) == 4 for record in result.records)
    assert max(len({chunk.request_id for chunk in step.chunks}) for step in result.steps) == 2


# --- validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Arrivals(rate=-1.0), r"arrivals.rate must be > 0, got -1.0"),
        (lambda: Arrivals(rate=float("inf")), r"arrivals.rate must be > 0, got inf"),
        (lambda: Arrivals(rate=2.0, burstiness=-1), r"arrivals.burstiness must be > 0, got -1"),
        (lambda: Arrivals(burstiness=0.5), r"arrivals.burstiness=0.5 needs arrivals.rate"),
        (lambda: Arrivals(concurrency=0), r"arrivals.concurrency must be an integer >= 1, got 0"),
        (lambda: Arrivals(rate=2.0, concurrency=4), r"arrivals.rate and arrivals.concurrency are mutually exclusive"),
        (lambda: OutputLengths("gaussian"), r"output_lengths.kind must be one of fixed, uniform, exponential, from_f"),
        (lambda: OutputLengths("uniform", 0, 4), r"output_lengths.low must be an integer >= 1, got 0"),
        (lambda: OutputLengths("uniform", 9, 4), r"low \(min_new_tokens\)=9, high \(max_new_tokens\)=4"),
        (lambda: OutputLengths("exponential", 1, 9, mean=0), r"output_lengths.mean must be > 0, got 0"),
        (lambda: PromptLengths("exponential", 1, 9), r"prompts.kind must be one of fixed, uniform, normal"),
        (lambda: PromptLengths("uniform", 1, 2.5), r"prompts.high must be an integer >= 1, got 2.5"),
        (lambda: PromptLengths("normal", 1, 9, mean=4, stddev=-1), r"prompts.stddev must be >= 0, got -1"),
        (lambda: Workload(0), r"num_requests must be an integer >= 1, got 0"),
        (lambda: Workload(4, seed="0"), r"seed must be an integer, got '0'"),
    ],
)
def test_bad_fields_are_named(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_labels_read_as_ids():
    assert Workload(prompts=SyntheticPrompts(PromptLengths("fixed", 32, 32)), lengths=OutputLengths("uniform", 4, 24),
                    arrivals=Arrivals(rate=4.0)).label == "in32-out_uniform4_24-4rps"
    assert Workload(lengths=OutputLengths("fixed", 16, 16)).label == "in_shipped-out16-offline"
    assert Arrivals(rate=0.5, burstiness=0.25).label == "0.5rps_burst0.25"
    assert Arrivals(concurrency=4).label == "c4"
    assert OutputLengths("exponential", 1, 32, mean=8).label == "out_exp8_1_32"
    assert SyntheticPrompts(PromptLengths("normal", 1, 128, 64, 16)).label == "in_normal64sd16_1_128"
    assert JsonlPrompts("data/chat.jsonl").label == "in_chat"


# --- plain data ------------------------------------------------------------------------


def test_from_dict_builds_every_part(tmp_path):
    workload = Workload.from_dict(
        {
            "num_requests": 8,
            "seed": 4,
            "prompts": {"kind": "uniform", "low": 16, "high": 64},
            "output_lengths": {"kind": "exponential", "mean": 8, "high": 32},
            "arrivals": {"rate": 4.0, "burstiness": 0.5},
        }
    )
    assert workload == Workload(
        8,
        OutputLengths("exponential", 1, 32, mean=8),
        Arrivals(rate=4.0, burstiness=0.5),
        seed=4,
        prompts=SyntheticPrompts(PromptLengths("uniform", 16, 64)),
    )
    assert Workload.from_dict({}) == Workload()
    shorthand = Workload.from_dict({"prompts": 32, "output_lengths": 16, "arrivals": 2})
    assert shorthand.label == "in32-out16-2rps"
    assert Workload.from_dict({"prompts": "shipped", "arrivals": "offline"}).prompts == ShippedPrompts()
    assert Workload.from_dict({"arrivals": {"concurrency": 3}}).max_concurrency == 3
    jsonl = Workload.from_dict({"prompts": {"kind": "jsonl", "path": "p.jsonl"}}, base_dir=tmp_path)
    assert jsonl.prompts == JsonlPrompts(tmp_path / "p.jsonl")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"arival": "offline"},
         r"unknown workload key 'arival' \(did you mean 'arrivals'\?\); "
         r"known keys: arrivals, num_requests, output_lengths, prompts, seed"),
        ({"arrivals": {"rate": 2, "burstyness": 2}}, r"unknown arrivals key 'burstyness'"),
        ({"arrivals": "fast"}, r'arrivals must be "offline", a rate in requests/s'),
        ({"arrivals": True}, r'arrivals must be "offline"'),
        ({"arrivals": {"rate": 0}}, r"arrivals.rate must be > 0, got 0"),
        ({"output_lengths": {"kind": "uniform", "low": 4}}, r"output_lengths kind 'uniform' needs high"),
        ({"output_lengths": {"kind": "fixed", "tokens": 16, "low": 2}},
         r"unknown output_lengths key for kind 'fixed' 'low'"),
        ({"output_lengths": {"kind": "fixed", "tokens": "16"}}, r"output_lengths.tokens must be an integer >= 1"),
        ({"output_lengths": "uniform"}, r"output_lengths must be a token count or a table"),
        ({"prompts": {"kind": "jsonl"}}, r"prompts.path must be the JSONL file's path, got None"),
        ({"prompts": {"kind": "normal", "mean": 8, "high": 9}}, r"prompts kind 'normal' needs stddev"),
        ({"prompts": 0}, r"prompts.tokens must be an integer >= 1, got 0"),
        ({"prompts": "mine.jsonl"}, r'prompts must be "shipped", a token count'),
        ({"num_requests": "8"}, r"num_requests must be an integer >= 1, got '8'"),
        (["num_requests"], r"a workload spec must be a table"),
    ],
)
def test_from_dict_rejects_bad_data_by_name(spec, message):
    with pytest.raises(ValueError, match=message):
        Workload.from_dict(spec)
