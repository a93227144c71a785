"""The projections' packed path (oneDNN's layout, laid out once) computes what ``F.linear`` does, at every row count.

Mutants it kills: the packed product without the bias; a packed weight
handed the wrong matrix (another layer's, or not transposed); the packed
path taken for bfloat16 or on a weight it cannot lay out; row bounds that
send a row count to neither path.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from perfsuite.engine.projection import PACKED_MAX_ROWS, PACKED_MIN_ROWS, Projection, can_pack

needs_onednn = pytest.mark.skipif(
    not can_pack(torch.zeros(2, 2)), reason="this torch has no oneDNN: every projection is F.linear"
)


@needs_onednn
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_packed_products_equal_f_linear_at_every_row_count(with_bias: bool) -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 40, generator=generator)
    bias = torch.randn(96, generator=generator) if with_bias else None
    projection = Projection.of(weight, bias)
    assert projection.packed is not None
    for rows in range(1, PACKED_MAX_ROWS + 33):
        x = torch.randn(rows, 40, generator=generator)
        torch.testing.assert_close(projection(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5, msg=f"{rows} rows")
    strided = torch.randn(PACKED_MIN_ROWS + 4, 80, generator=generator)[:, ::2]  # not contiguous
    torch.testing.assert_close(projection(strided), F.linear(strided, weight, bias), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_the_packed_path_is_taken_between_the_bounds_only(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    packed_product = torch.ops.mkldnn._linear_pointwise

    class Spy:
        def __call__(self, x, *args):
            calls.append(x.shape[0])
            return packed_product(x, *args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", Spy())
    projection = Projection.of(torch.randn(8, 4))
    for rows in (1, PACKED_MIN_ROWS - 1, PACKED_MIN_ROWS, PACKED_MAX_ROWS, PACKED_MAX_ROWS + 1):
        projection(torch.randn(rows, 4))
    assert calls == [PACKED_MIN_ROWS, PACKED_MAX_ROWS]


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_weights_it_cannot_lay_out_stay_plain(dtype: torch.dtype) -> None:
    weight = torch.randn(16, 8, dtype=dtype)
    projection = Projection.of(weight)
    assert projection.packed is None
    x = torch.randn(PACKED_MIN_ROWS + 1, 8, dtype=dtype)
    assert torch.equal(projection(x), F.linear(x, weight))


def test_pack_false_keeps_only_the_plain_weight() -> None:
    projection = Projection.of(torch.randn(16, 8), pack=False)
    assert projection.packed is None


@needs_onednn
def test_the_runner_packs_its_float32_projections_unless_told_not_to() -> None:
    from perfsuite.engine.model_runner import ModelRunner
    from perfsuite.models import load_model

    model = load_model("tiny-random", dtype="float32").model
    packed, plain = ModelRunner(model), ModelRunner(model, pack_weights=False)
    layer = packed.decoder.layers[0]
    assert all(p.packed is not None for p in (layer.qkv, layer.out, layer.gate_up, layer.down, packed.decoder.lm_head))
    assert all(p.packed is None for p in (plain.decoder.layers[0].qkv, plain.decoder.lm_head))
