"""The fused layer operators compute what torch's do, row by row, and the decoder on them decodes the same tokens.

Mutants they kill: a norm without eps, over the wrong length, or without its
weight; a residual add that is not kept in place; a rotary embedding that
rotates the wrong half, reads the wrong position or ignores the row stride;
an activation on up instead of gate; a row whose bits depend on the rows
beside it; a bad position read past the tables; a build failure that is not
reported; a runner that builds the operators but never uses them.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from perfsuite.engine import Request, SamplingParams
from perfsuite.engine.c_library import BUILD_FIX, Unavailable
from perfsuite.engine.layer_ops import LayerOps, build, load_layer_ops
from perfsuite.engine.layers import apply_rotary, rms_norm
from perfsuite.engine.model_runner import ModelRunner
from perfsuite.models import load_model
from perfsuite.testing import FLOAT32_NEAR_TIE, Scenario, cached_reference, check_runner

EPS = 1e-5


@pytest.fixture(scope="module")
def ops() -> LayerOps:
    built = load_layer_ops()
    if isinstance(built, Unavailable):
        pytest.skip(f"no fused layer operators here: {built.reason}")
    return built


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal up to float32 rounding: a few ulps of the larger magnitudes."""
    scale = float(expected.abs().max()) if expected.numel() else 1.0
    torch.testing.assert_close(actual, expected, rtol=4e-6, atol=4e-6 * max(scale, 1.0))


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3


@settings(max_examples=30)
@given(rows=st.integers(0, 9), dim=st.integers(1, 70), seed=st.integers(0, 2**16))
def test_the_norms_are_torchs_up_to_rounding(ops, rows, dim, seed):
    x, delta, weight = _randn(rows, dim, seed=seed), _randn(rows, dim, seed=seed + 1), _randn(dim, seed=seed + 2)
    _close(ops.rms_norm(x, weight, EPS), rms_norm(x, weight, EPS))
    hidden = x.clone()
    normed = ops.add_rms_norm(hidden, delta, weight, EPS)
    assert torch.equal(hidden, x + delta), "the residual add is kept, in place"
    _close(normed, rms_norm(x + delta, weight, EPS))


def test_eps_counts(ops):
    x, weight = torch.full((2, 8), 1e-3), torch.ones(8)
    _close(ops.rms_norm(x, weight, 1.0), rms_norm(x, weight, 1.0))  # eps dwarfs the mean square here


@settings(max_examples=30)
@given(
    rows=st.integers(0, 7),
    heads=st.integers(1, 5),
    half=st.integers(1, 40),
    spare=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_the_rotary_embedding_is_torchs_in_place_over_strided_rows(ops, rows, heads, half, spare, seed):
    head_dim, positions_in_table = 2 * half, 50
    fused = _randn(rows, (heads + spare) * head_dim, seed=seed)  # rows strided past their heads, as in the QKV
    x = fused[:, : heads * head_dim].view(rows, heads, head_dim)
    cos, sin = _randn(positions_in_table, head_dim, seed=seed + 1), _randn(positions_in_table, head_dim, seed=seed + 2)
    positions = torch.randint(0, positions_in_table, (rows,), generator=torch.Generator().manual_seed(seed))
    expected = apply_rotary(x, cos[positions].unsqueeze(1), sin[positions].unsqueeze(1))
    untouched = fused[:, heads * head_dim :].clone()
    ops.rotary_(x, positions, cos, sin)
    _close(x, expected)
    assert torch.equal(fused[:, heads * head_dim :], untouched), "only the rotated heads change"


@settings(max_examples=30)
@given(rows=st.integers(0, 9), inner=st.integers(1, 90), seed=st.integers(0, 2**16))
def test_silu_and_mul_is_torchs_up_to_rounding(ops, rows, inner, seed):
    gate_up = _randn(rows, 2 * inner, seed=seed)
    gate, up = gate_up.chunk(2, dim=-1)
    _close(ops.silu_and_mul(gate_up), F.silu(gate) * up)


@settings(max_examples=40)
@given(rows=st.integers(2, 40), row=st.data(), dim=st.sampled_from([5, 17, 38, 64, 579]), seed=st.integers(0, 2**16))
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(ops, rows, row, dim, seed):
    """Alone or at any place among others (so at any alignment, on any thread), a row computes the same bits."""
    index = row.draw(st.integers(0, rows - 1))
    x, weight, gate_up = _wide(rows, dim, seed=seed), _randn(dim, seed=seed + 1), _randn(rows, 2 * dim, seed=seed + 2)
    assert torch.equal(ops.rms_norm(x, weight, EPS)[index], ops.rms_norm(x[index : index + 1].clone(), weight, EPS)[0])
    assert torch.equal(ops.silu_and_mul(gate_up)[index], ops.silu_and_mul(gate_up[index : index + 1].clone())[0])
    hidden, alone = x.clone(), x[index : index + 1].clone()
    delta = _randn(rows, dim, seed=seed + 3)
    together = ops.add_rms_norm(hidden, delta, weight, EPS)[index]
    assert torch.equal(together, ops.add_rms_norm(alone, delta[index : index + 1].clone(), weight, EPS)[0])
    if dim % 2 == 0:
        table = _randn(8, dim, seed=seed + 4)
        positions = torch.arange(rows) % 8
        many, one = x.clone().view(rows, 1, dim), x[index : index + 1].clone().view(1, 1, dim)
        ops.rotary_(many, positions, table, table)
        ops.rotary_(one, positions[index : index + 1].clone(), table, table)
        assert torch.equal(many[index], one[0])


def _wide(*shape: int, seed: int) -> torch.Tensor:
    """Values over a few binades, so that a sum's bits depend on its order: a row summed another way shows."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator) * 2.0 ** torch.randint(-3, 4, shape, generator=generator)


def test_bad_input_is_refused_with_what_was_wrong(ops):
    x, weight = torch.randn(3, 8), torch.randn(8)
    with pytest.raises(ValueError, match="rms_norm needs contiguous float32 CPU tensors"):
        ops.rms_norm(x.double(), weight.double(), EPS)
    with pytest.raises(ValueError, match="rms_norm needs contiguous float32"):
        ops.rms_norm(torch.randn(8, 3).t(), torch.randn(8), EPS)  # not contiguous
    with pytest.raises(ValueError, match="a weight \\[dim\\]; got \\(3, 8\\) torch.float32 on cpu, \\(7,\\)"):
        ops.rms_norm(x, torch.randn(7), EPS)
    with pytest.raises(ValueError, match="add_rms_norm needs"):
        ops.add_rms_norm(x, torch.randn(2, 8), weight, EPS)
    with pytest.raises(ValueError, match="silu_and_mul needs contiguous float32 gate_up"):
        ops.silu_and_mul(torch.randn(3, 7))
    table = torch.randn(4, 8)
    with pytest.raises(ValueError, match="an even head_dim"):
        ops.rotary_(torch.randn(2, 1, 7), torch.zeros(2, dtype=torch.int64), torch.randn(4, 7), torch.randn(4, 7))
    with pytest.raises(ValueError, match="int64 positions"):
        ops.rotary_(torch.randn(2, 1, 8), torch.zeros(2, dtype=torch.int32), table, table)


def test_a_position_past_the_tables_is_refused_and_changes_nothing(ops):
    x, table = torch.randn(3, 2, 8), torch.randn(4, 8)
    before = x.clone()
    for bad in (4, -1):
        with pytest.raises(
            ValueError, match=f"positions must be in 0..3 \\(the model's context\\), got \\[0, {bad}, 1\\]"
        ):
            ops.rotary_(x, torch.tensor([0, bad, 1]), table, table)
        assert torch.equal(x, before), "a refused call rotates no row"


def test_a_compiler_that_fails_is_reported_not_raised(tmp_path):
    failing = tmp_path / "cc"
    failing.write_text("#!/bin/sh\necho 'cc: error: no such flag' >&2\nexit 1\n")
    failing.chmod(0o755)
    result = build(str(failing))
    assert isinstance(result, Unavailable) and result.fix == BUILD_FIX
    assert "could not build layer_ops.c" in result.reason and "no such flag" in result.reason


@pytest.fixture(scope="module")
def tiny32():
    loaded = load_model("tiny-random", dtype="float32")
    return loaded, cached_reference(loaded)


def test_a_float32_cpu_runner_fuses_and_says_so_and_others_keep_torch(tiny32, ops):
    loaded, _ = tiny32
    runner = ModelRunner(loaded.model)
    assert runner.layer_ops == "fused" and runner.decoder.layer_ops is ops
    assert ModelRunner(loaded.model, layer_ops=False).layer_ops == "torch: turned off (layer_ops=False)"
    float64 = ModelRunner(load_model("tiny-random", dtype="float64").model)
    assert float64.layer_ops == "torch: the fused operators are for float32 on the CPU, not torch.float64 on cpu"
    assert float64.decoder.layer_ops is None


def test_a_runner_whose_compiler_fails_keeps_torchs_operators_and_says_why(tiny32, monkeypatch):
    loaded, _ = tiny32
    monkeypatch.setenv("CC", "/bin/false")
    load_layer_ops.cache_clear()
    try:
        runner = ModelRunner(loaded.model)
        assert runner.layer_ops.startswith("torch: /bin/false could not build layer_ops.c")
        assert runner.decoder.layer_ops is None
    finally:
        load_layer_ops.cache_clear()  # the next test builds with the real compiler again


def test_the_fused_decoder_computes_torchs_hidden_states_up_to_rounding(tiny32, ops):
    loaded, _ = tiny32
    fused = ModelRunner(loaded.model).decoder
    plain = dataclasses.replace(fused, layer_ops=None)
    calls = []

    class Counting:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(ops, name)

    counted = dataclasses.replace(fused, layer_ops=Counting())
    tokens, positions = torch.tensor([5, 9, 2, 7, 11]), torch.tensor([0, 1, 2, 3, 4])
    heads = fused.heads
    mask = torch.ones(1, 1, 5, 5, dtype=torch.bool).tril()

    def attend(layer_index, q, k, v):  # causal attention over the five tokens, no cache
        group = heads.num_heads // heads.num_kv_heads
        keys, values = k.repeat_interleave(group, 1).transpose(0, 1), v.repeat_interleave(group, 1).transpose(0, 1)
        return F.scaled_dot_product_attention(q.transpose(0, 1), keys, values, attn_mask=mask[0]).transpose(0, 1)

    with torch.inference_mode():
        expected = plain.forward(tokens, positions, attend)
        actual = counted.forward(tokens, positions, attend)
        _close(actual, expected)
        _close(counted.logits(actual), plain.logits(expected))
    layers = len(fused.layers)
    assert calls.count("rotary_") == layers and calls.count("silu_and_mul") == layers
    assert calls.count("add_rms_norm") == 2 * layers - 1 and calls.count("rms_norm") == 2, "one norm each, + final"


def test_engines_on_the_fused_operators_equal_unbatched_greedy_in_float32(tiny32, ops):
    """Static, in-flight and paged, over requests that join and leave (float32: near-ties may flip, nothing else)."""
    loaded, reference = tiny32
    runner = ModelRunner(loaded.model)
    assert runner.layer_ops == "fused"
    requests = tuple(
        Request(f"r{i}", tuple((7 * i + 3 * j) % 250 + 3 for j in range(6 + 2 * i)), SamplingParams(5 + i, ignore_eos=True))
        for i in range(4)
    )  # fmt: skip
    scenario = Scenario(requests, arrival_steps=(0, 0, 1, 3), batch_size=3, prefill_batch_size=2,
                        max_num_batched_tokens=16, num_kv_blocks=12, kv_block_size=4)  # fmt: skip
    check = check_runner(runner, scenario, reference, eos_token_id=None, max_seq_len=48,
                         near_tie_tolerance=FLOAT32_NEAR_TIE)  # fmt: skip
    check.assert_passed()
