"""The per-token verdict: each output token against the reference given the engine's own prefix, within ulps.

Pure checks of ``ulp`` and ``check_tokens`` on hand-made scores; then the
teacher-forced scorer and the ready tests on tiny-random, in float64 and
bfloat16, with two of bench/correctness_mutants.py's batching bugs.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings

from bench_modules import load_bench
from generate_only import not_shrunk
from perfsuite.engine import Request, SamplingParams
from perfsuite.models import load_model
from perfsuite.testing import (
    LogitTolerance,
    cached_reference,
    check_tokens,
    equivalence_test,
    long_scenarios,
    runner_equivalence_test,
    ulp,
)
from perfsuite.testing import ready_tests
from perfsuite.testing.verdict import ULPS_BY_DTYPE, TokenScores

BF16 = LogitTolerance("bfloat16", 4)
EOS = 2


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_one_ulp_at_one_is_the_formats_machine_epsilon_and_doubles_with_each_binade(dtype):
    eps = torch.finfo(getattr(torch, dtype)).eps
    assert ulp(1.0, dtype) == eps and ulp(1.999, dtype) == eps and ulp(-1.5, dtype) == eps
    assert ulp(2.0, dtype) == 2 * eps and ulp(0.75, dtype) == eps / 2
    assert ulp(0.0, dtype) == torch.finfo(getattr(torch, dtype)).tiny * eps  # the least normal's


def test_bfloat16_ulps_are_the_steps_between_neighbouring_bfloat16_values():
    for value in (0.3, 1.0, 4.1, 5.0, 100.0, -70.0):
        x = torch.tensor(value, dtype=torch.bfloat16)
        above = torch.tensor(float(x) + ulp(float(x), "bfloat16") * 0.75, dtype=torch.float32).to(torch.bfloat16)
        assert float(above) - float(x) == ulp(float(x), "bfloat16"), value  # rounds up to the next value: one step
    assert ulp(100.0, "bfloat16") == 0.5 and ulp(4.1, "bfloat16") == 1 / 32


def test_a_tolerance_refuses_an_unknown_dtype_a_negative_count_and_infinite_logits():
    with pytest.raises(ValueError, match="no floating-point format 'int8'"):
        LogitTolerance("int8", 1)
    with pytest.raises(ValueError, match="ulps=-1"):
        LogitTolerance("bfloat16", -1)
    with pytest.raises(ValueError, match="must be finite"):
        BF16.allowed(math.inf)
    assert LogitTolerance.for_dtype("float64").ulps == 0 and LogitTolerance.for_dtype("bfloat16", 2).ulps == 2


def _request(n, rid="r0", ignore_eos=True):
    return Request(rid, (5, 6, 7), SamplingParams(n, ignore_eos=ignore_eos))


def _scorer(table):
    """Scores from {position: (argmax token, argmax logit, {token: logit})}; unlisted tokens score 0."""

    def score(request, tokens):
        rows = [table.get(i, (tokens[i], 4.0, {})) for i in range(len(tokens))]
        return TokenScores(
            tuple(best for best, _, _ in rows),
            tuple(top for _, top, _ in rows),
            tuple(top if t == best else logits.get(t, 0.0) for t, (best, top, logits) in zip(tokens, rows)),
        )

    return score


def test_a_flip_within_the_tolerance_passes_and_the_check_goes_on_to_a_later_wrong_token():
    # bfloat16 at 4.0: one ulp is 1/32, four are 0.125. Position 1 flips by 3 ulps, position 3 is 16 ulps off.
    score = _scorer({1: (11, 4.0, {12: 4.0 - 3 / 32}), 3: (13, 4.0, {14: 3.5})})
    check = check_tokens("eng", [_request(5)], {"r0": (1, 12, 3, 14, 5)}, score, BF16, EOS)
    assert (check.num_checked, check.num_exact, check.num_within, check.num_wrong) == (5, 3, 1, 1)
    assert check.max_gap_ulps == 3
    [wrong] = check.wrong
    assert (wrong.request_id, wrong.position, wrong.engine_token, wrong.reference_token) == ("r0", 3, 14, 13)
    message = wrong.describe()
    for fragment in ("'r0'", "position 3", "engine token 14", "logit 3.5", "argmax 13", "logit 4", "16 ulps",
                     "tolerance 0.125"):  # fmt: skip
        assert fragment in message, fragment
    assert "3 exact, 1 within 4 ulps of bfloat16 (largest 3 ulps), 1 wrong" in check.summary()


def test_float64_lets_only_an_exact_tie_through():
    strict = LogitTolerance.for_dtype("float64")
    tie = _scorer({0: (11, 4.0, {12: 4.0})})
    assert check_tokens("eng", [_request(1)], {"r0": (12,)}, tie, strict, EOS).passed
    below = _scorer({0: (11, 4.0, {12: 4.0 - 1e-12})})
    assert not check_tokens("eng", [_request(1)], {"r0": (12,)}, below, strict, EOS).passed


def test_a_token_after_the_end_or_a_missing_one_is_wrong_whatever_the_tolerance():
    loose = LogitTolerance("bfloat16", 1e9)
    score = _scorer({})
    after_eos = check_tokens("eng", [_request(5, ignore_eos=False)], {"r0": (1, EOS, 3)}, score, loose, EOS)
    assert [(w.kind, w.position, w.engine_token) for w in after_eos.wrong] == [("after the end", 2, 3)]
    assert "2 tokens: token 2 stops it" in after_eos.wrong[0].describe()
    too_long = check_tokens("eng", [_request(2)], {"r0": (1, 3, 4)}, score, loose, EOS)
    assert [(w.kind, w.position) for w in too_long.wrong] == [("after the end", 2)]
    short = check_tokens("eng", [_request(4)], {"r0": (1, 3)}, score, loose, EOS)
    assert [(w.kind, w.position) for w in short.wrong] == [("missing", 2)]
    assert "must go on (max_new_tokens=4)" in short.describe()
    ignored = check_tokens("eng", [_request(3)], {"r0": (1, EOS, 3)}, score, loose, EOS)
    assert ignored.passed, "with EOS ignored the output runs to max_new_tokens"


def test_the_ready_tests_refuse_the_near_tie_arguments_they_replaced():
    with pytest.raises(TypeError, match="near_tie_tolerance: the near-tie rule is gone.*ulps="):
        equivalence_test("inflight", near_tie_tolerance=0.5)
    with pytest.raises(TypeError, match="max_near_ties: the near-tie rule is gone"):
        runner_equivalence_test(lambda loaded: None, max_near_ties=1)


@settings(max_examples=20)
@given(scenario=long_scenarios(vocab_size=50))
def test_long_scenarios_hold_more_requests_than_any_pool_of_theirs(scenario):
    assert 16 <= len(scenario.requests) <= 24 and scenario.batch_size <= 3
    blocks = sum(-(-r.max_total_tokens // scenario.kv_block_size) for r in scenario.requests)
    assert blocks > scenario.num_kv_blocks, "the paged pool must wrap too"


# -- on tiny-random --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bf16():
    loaded = load_model("tiny-random", dtype="bfloat16")
    return loaded, cached_reference(loaded)


def test_the_teacher_forced_reference_scores_greedy_decoding_as_exact(bf16):
    loaded, reference = bf16
    float64 = cached_reference(load_model("tiny-random", dtype="float64"))
    request = Request("r0", tuple(range(3, 12)), SamplingParams(10, ignore_eos=True))
    tokens = tuple(float64.generate(request).token_ids)
    scores = float64.score(request, tokens)
    assert scores.argmax_tokens == tokens and scores.token_logits == scores.argmax_logits
    assert reference.scorer.dtype == torch.float32 and reference.scorer.model.dtype == torch.float32
    assert loaded.model.dtype == torch.bfloat16, "the engine's model stays in its dtype"


def test_the_verdict_accepts_a_bfloat16_flip_within_tolerance_and_rejects_a_real_wrong_token(bf16):
    loaded, reference = bf16
    tolerance = LogitTolerance.for_dtype("bfloat16")
    request = Request("r0", tuple(range(3, 12)), SamplingParams(8, ignore_eos=True))
    greedy = reference.score(request, tuple(reference.generate(request).token_ids))
    scorer = reference.scorer.model
    prompt = list(request.prompt_token_ids)
    with torch.inference_mode():
        logits = scorer(input_ids=torch.tensor([prompt])).logits[0, -1].double()
    ranked = logits.argsort(descending=True).tolist()
    allowed = tolerance.allowed(float(logits[ranked[0]]))
    near = next((t for t in ranked[1:] if float(logits[ranked[0]] - logits[t]) <= allowed), None)
    far = ranked[-1]
    assert greedy.argmax_tokens[0] == ranked[0]
    assert near is not None, "this prompt's second-best is within the tolerance: a flip a bfloat16 engine may make"
    flipped = (near, *_greedy_after(reference, request, near))
    check = check_tokens("eng", [request], {"r0": flipped}, reference.score, tolerance, loaded.eos_token_id)
    assert check.passed and check.num_within >= 1 and check.num_checked == 8, check.describe()  # the bfloat16
    # decoding after the flip may flip within the tolerance again
    wrong = (far, *_greedy_after(reference, request, far))
    check = check_tokens("eng", [request], {"r0": wrong}, reference.score, tolerance, loaded.eos_token_id)
    assert [(w.position, w.engine_token, w.reference_token) for w in check.wrong] == [(0, far, ranked[0])]
    assert check.num_exact + check.num_within == 7, "the tokens after the wrong one are judged on its prefix: right"


def _greedy_after(reference, request, first):
    """The reference's greedy continuation of ``request`` once ``first`` is its first output token."""
    follow = Request("f", request.prompt_token_ids + (first,), SamplingParams(7, ignore_eos=True))
    return tuple(reference.generate(follow).token_ids)


def test_perfsuites_inflight_engine_passes_the_ready_test_in_bfloat16_with_defaults():
    equivalence_test("inflight", dtype="bfloat16")()


@pytest.fixture
def mutants():
    return load_bench("correctness_mutants")


def test_the_ready_test_catches_a_slot_handed_out_while_held_after_the_pool_wraps_in_bfloat16(mutants):
    with not_shrunk():
        test = equivalence_test("inflight", dtype="bfloat16")
    with mutants.round_robin_slots(), pytest.raises(AssertionError, match=r"inflight: request 'r\d+', output position"):
        test()


def test_the_ready_runner_test_catches_swapped_outputs_in_bfloat16(mutants):
    with not_shrunk():
        test = runner_equivalence_test(lambda loaded: mutants.SwappedOutputs(loaded.model), dtype="bfloat16")
    with pytest.raises(AssertionError, match=r"outputs differ from the unbatched reference:\n.* \d+ wrong"):
        test()


def test_the_ready_test_serves_long_scenarios_after_the_small_ones(monkeypatch):
    sizes = []
    original = ready_tests._check_within

    def counted(check_one, scenario, max_seconds, label):
        sizes.append(len(scenario.requests))
        return original(check_one, scenario, max_seconds, label)

    monkeypatch.setattr(ready_tests, "_check_within", counted)
    equivalence_test("inflight", dtype="bfloat16", max_examples=3)()
    assert max(sizes[:3]) <= ready_tests.SMALL["max_requests"] and len(sizes) == 3 + ready_tests.NUM_LONG_EXAMPLES
    assert min(sizes[3:]) >= 16
    assert ULPS_BY_DTYPE["float64"] == 0
