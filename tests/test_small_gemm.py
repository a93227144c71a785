"""The panel kernel computes ``F.linear`` at any rows, and the chooser gives it only the rows it won.

Mutants it kills: a packing that drops or misplaces the last, partial panel;
a product that skips the bias, or an input; a block that drops the rows past
its last full block of 8, or the panels past the last full group of 3, or sums
one row's inputs with another's; no rows let through; a chooser that keeps
panels it timed slower, stops timing after a loss too late, or keeps the
packed copies of a shape that does not take them; a projection that has
panels and never runs them.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from perfsuite.engine import projection as projection_module
from perfsuite.engine.c_library import Unavailable
from perfsuite.engine.projection import PANEL_ROWS, Choice, Kernel, KernelChooser, Projection, can_pack
from perfsuite.engine.small_gemm import PANEL, SmallGemm, load_small_gemm

BLOCK_ROWS, BLOCK_PANELS = 8, 3  # as csrc/small_gemm.c blocks a product
TOP = max(PANEL_ROWS)


@pytest.fixture(scope="module")
def gemm() -> SmallGemm:
    built = load_small_gemm()
    if isinstance(built, Unavailable):
        pytest.skip(f"no panel kernel here: {built.reason}")
    return built


@settings(max_examples=40)
@given(
    rows=st.integers(1, 3 * BLOCK_ROWS + 3),
    out_features=st.integers(1, 2 * BLOCK_PANELS * PANEL + 2 * PANEL + 5),
    in_features=st.integers(1, 40),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_the_product_is_f_linears_up_to_rounding(gemm, rows, out_features, in_features, with_bias, seed):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator) if with_bias else None
    x = torch.randn(rows, in_features, generator=generator)
    packed = gemm.pack(weight)
    assert packed.shape == (-(-out_features // PANEL), in_features, PANEL)
    torch.testing.assert_close(gemm(x, packed, out_features, bias), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


@settings(max_examples=20)
@given(rows=st.integers(2, 3 * BLOCK_ROWS + 3), out_features=st.integers(1, 2 * BLOCK_PANELS * PANEL + 5))
def test_a_rows_result_has_the_same_bits_whatever_rows_are_multiplied_with_it(gemm, rows, out_features):
    generator = torch.Generator().manual_seed(rows * 1000 + out_features)
    weight = torch.randn(out_features, 37, generator=generator)
    packed = gemm.pack(weight)
    x = torch.randn(rows, 37, generator=generator)
    together = gemm(x, packed, out_features)
    for first in range(rows):
        assert torch.equal(gemm(x[first:].contiguous(), packed, out_features), together[first:]), first
        assert torch.equal(gemm(x[first : first + 1].contiguous(), packed, out_features)[0], together[first]), first


def test_bad_input_is_refused_with_what_was_wrong(gemm):
    weight = torch.randn(20, 6)
    packed = gemm.pack(weight)
    for x in (torch.randn(0, 6), torch.randn(2, 6).double()):
        with pytest.raises(ValueError, match="small_gemm multiplies float32 x \\[rows >= 1, in\\]"):
            gemm(x, packed, 20)
    with pytest.raises(ValueError, match="packed \\(2, 6, 16\\) for 40 outputs"):
        gemm(torch.randn(2, 6), packed, 40)
    with pytest.raises(ValueError, match="bias \\(19,\\)"):
        gemm(torch.randn(2, 6), packed, 20, torch.randn(19))
    with pytest.raises(ValueError, match="packs a float32 CPU matrix"):
        gemm.pack(weight.double())


needs_onednn = pytest.mark.skipif(not can_pack(torch.randn(2, 2)), reason="needs a torch built with oneDNN")


def _slow_panels(monkeypatch, rows_from: int) -> None:
    """Panels of ``rows_from`` rows and more three times slower than any slowed other product."""
    real = SmallGemm.__call__
    monkeypatch.setattr(
        SmallGemm, "__call__", lambda self, x, *a: (x.shape[0] >= rows_from and time.sleep(0.03)) or real(self, x, *a)
    )


def _slow_the_others(monkeypatch) -> None:
    """Every product but the panels' (plain, oneDNN, MKL with and without a bias) slowed far past its own time."""
    for module, name in ((F, "linear"), (torch.ops.mkldnn, "_linear_pointwise"), (torch, "mm"), (torch, "addmm")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real: time.sleep(0.01) or _real(*a))


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a product on two threads under a parallel test run can lose a core for milliseconds
    yield
    torch.set_num_threads(threads)


@needs_onednn
@pytest.mark.parametrize(
    ("slowed", "expected"), [("panels", 0), ("others", TOP), ("panels from 4 rows", 1)]
)  # fmt: skip
def test_the_panels_take_the_rows_up_to_the_last_where_they_won(gemm, slowed, expected, monkeypatch, one_thread):
    if slowed != "panels":
        _slow_the_others(monkeypatch)
    if slowed != "others":
        _slow_panels(monkeypatch, rows_from=4 if slowed == "panels from 4 rows" else 1)
    chooser = KernelChooser(rounds=3, small_rows=(1,), large_rows=(16,))
    generator = torch.Generator().manual_seed(3)
    weights = [(torch.randn(24, 16, generator=generator), torch.randn(24, generator=generator)) for _ in range(2)]
    projections = chooser.projections(weights)
    (choice,) = chooser.chosen.values()
    assert choice.panel_max_rows == expected
    assert all(p.panel_max_rows == expected for p in projections)
    assert all((p.panels is None) is (expected == 0) for p in projections), "packed copies only where they run"
    monkeypatch.undo()
    calls = []
    real = SmallGemm.__call__
    monkeypatch.setattr(SmallGemm, "__call__", lambda self, x, *a: calls.append(x.shape[0]) or real(self, x, *a))
    for rows in (1, 3, TOP, TOP + 1):
        x = torch.randn(rows, 16, generator=generator)
        torch.testing.assert_close(projections[0](x), F.linear(x, *weights[0]), rtol=1e-5, atol=1e-5)
    assert calls == [rows for rows in (1, 3, TOP) if rows <= expected], "panels run exactly their rows"


def test_a_choice_with_panels_makes_projections_that_run_them(gemm):
    weight = torch.randn(40, 12)
    projection = Choice(Kernel.ONEDNN, 1, None, 4).projection(weight, None)
    assert projection.panel_max_rows == 4 and projection.panels is not None
    none = Choice(Kernel.ONEDNN, 1, None, 0).projection(weight, None)
    assert none.panel_max_rows == 0 and none.panels is None


def test_where_the_panel_kernel_does_not_build_a_projection_keeps_its_other_kernel(monkeypatch):
    monkeypatch.setattr(projection_module, "load_small_gemm", lambda: Unavailable("no compiler"))
    weight = torch.randn(40, 12)
    projection = Projection.of(weight, kernel=Kernel.ONEDNN, min_rows=1, max_rows=None, panel_max_rows=8)
    assert projection.panel_max_rows == 0 and projection.panels is None
    x = torch.randn(3, 12)
    torch.testing.assert_close(projection(x), F.linear(x, weight), rtol=1e-5, atol=1e-5)
    chooser = KernelChooser(rounds=1)
    chooser.projections([(weight, None)])
    assert next(iter(chooser.chosen.values())).panel_max_rows == 0
