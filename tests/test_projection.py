"""The projections' fast kernels (oneDNN's layout, MKL over the transposed weight) compute what ``F.linear`` does.

Mutants it kills: a fast product without the bias; a copy of the wrong
matrix (another layer's, or not transposed); a fast path taken for bfloat16
or on a weight it cannot lay out; row bounds that send a row count to
neither path; a chooser that ignores its timings, keeps both copies, or
times each shape more than once.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from perfsuite.engine.projection import (
    PACKED_MAX_ROWS,
    PACKED_MIN_ROWS,
    Choice,
    Kernel,
    KernelChoiceFile,
    KernelChooser,
    Projection,
    can_pack,
)

needs_onednn = pytest.mark.skipif(
    not can_pack(torch.zeros(2, 2)), reason="this torch has no oneDNN: every projection is F.linear"
)


@needs_onednn
@pytest.mark.parametrize("kernel", list(Kernel))
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_fast_products_equal_f_linear_at_every_row_count(kernel: Kernel, with_bias: bool) -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 40, generator=generator)
    bias = torch.randn(96, generator=generator) if with_bias else None
    projection = Projection.of(weight, bias, kernel=kernel)
    assert projection.kernel is kernel
    assert projection.fast_weight is not None and projection.fast_weight is not weight, "a copy for the kernel"
    for rows in range(1, PACKED_MAX_ROWS + 33):
        x = torch.randn(rows, 40, generator=generator)
        torch.testing.assert_close(projection(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5, msg=f"{rows} rows")
    strided = torch.randn(PACKED_MIN_ROWS + 4, 80, generator=generator)[:, ::2]  # not contiguous
    torch.testing.assert_close(projection(strided), F.linear(strided, weight, bias), rtol=1e-5, atol=1e-5)


@needs_onednn
@pytest.mark.parametrize(("kernel", "module", "name"), [(Kernel.ONEDNN, torch.ops.mkldnn, "_linear_pointwise"),
                                                        (Kernel.MKL_TRANSPOSED, torch, "mm")])  # fmt: skip
def test_the_fast_path_is_taken_between_the_bounds_only(kernel, module, name, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    product = getattr(module, name)

    def spy(x, *args):
        calls.append(x.shape[0])
        return product(x, *args)

    projection = Projection.of(torch.randn(8, 4), kernel=kernel)
    monkeypatch.setattr(module, name, spy)
    for rows in (1, PACKED_MIN_ROWS - 1, PACKED_MIN_ROWS, PACKED_MAX_ROWS, PACKED_MAX_ROWS + 1):
        projection(torch.randn(rows, 4))
    assert calls == [PACKED_MIN_ROWS, PACKED_MAX_ROWS]


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("kernel", list(Kernel))
def test_weights_it_cannot_lay_out_stay_plain(dtype: torch.dtype, kernel: Kernel) -> None:
    weight = torch.randn(16, 8, dtype=dtype)
    for projection in (Projection.of(weight, kernel=kernel), *KernelChooser().projections([(weight, None)])):
        assert projection.kernel is None and projection.fast_weight is None
        x = torch.randn(PACKED_MIN_ROWS + 1, 8, dtype=dtype)
        assert torch.equal(projection(x), F.linear(x, weight))


def test_no_kernel_keeps_only_the_plain_weight() -> None:
    projection = Projection.of(torch.randn(16, 8), kernel=None)
    assert projection.kernel is None and projection.fast_weight is None


@needs_onednn
@pytest.mark.parametrize("slower", list(Kernel))
def test_the_chooser_keeps_the_faster_kernel_once_per_shape(slower: Kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    # The slower kernel is made slower by a sleep in its product, whichever it is: the chooser must read its timings.
    import time

    product_of = {Kernel.ONEDNN: (torch.ops.mkldnn, "_linear_pointwise"), Kernel.MKL_TRANSPOSED: (torch, "mm")}
    module, name = product_of[slower]
    product = getattr(module, name)

    def slow(*args):
        time.sleep(0.002)
        return product(*args)

    monkeypatch.setattr(module, name, slow)
    chooser = KernelChooser(rounds=3)
    timed: list[Kernel] = []
    fastest = chooser._fastest

    def spy(candidates, *args):
        winner = fastest(candidates, *args)
        if all(isinstance(key, Kernel) for key in candidates):  # between the kernels, not against plain or panels
            timed.append(winner)
        return winner

    monkeypatch.setattr(chooser, "_fastest", spy)
    generator = torch.Generator().manual_seed(1)
    weights = [(torch.randn(24, 16, generator=generator), None) for _ in range(5)]
    projections = chooser.projections(weights[:3]) + chooser.projections(weights[3:])  # two groups, one shape
    (other,) = set(Kernel) - {slower}
    assert timed == [other], "each shape timed once"
    assert all(p.kernel is other and p.fast_weight is not None for p in projections)
    assert list(chooser.chosen) == [((24, 16), False, torch.get_num_threads())]
    assert next(iter(chooser.chosen.values())).kernel is other
    monkeypatch.undo()
    x = torch.randn(PACKED_MIN_ROWS + 2, 16, generator=generator)
    for (weight, _), projection in zip(weights, projections, strict=True):
        torch.testing.assert_close(projection(x), F.linear(x, weight), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_the_chooser_refuses_a_group_of_mixed_shapes() -> None:
    with pytest.raises(ValueError, match="must share one shape"):
        KernelChooser().projections([(torch.randn(4, 3), None), (torch.randn(4, 5), None)])
    assert KernelChooser().projections([]) == []


@needs_onednn
def test_the_runner_packs_its_float32_projections_unless_told_not_to() -> None:
    from perfsuite.engine.model_runner import ModelRunner
    from perfsuite.models import load_model

    model = load_model("tiny-random", dtype="float32").model
    packed, plain = ModelRunner(model), ModelRunner(model, pack_weights=False)
    assert set(packed.decoder.projection_kernels) == {"qkv", "out", "gate_up", "down", "lm_head"}
    assert set(packed.decoder.projection_kernels.values()) <= {str(kernel) for kernel in Kernel}
    assert set(plain.decoder.projection_kernels.values()) == {"plain"}
    assert set(plain.decoder.projection_rows.values()) == {""}
    for rows in packed.decoder.projection_rows.values():
        low, high = rows.split("..")
        assert low in {"1", str(PACKED_MIN_ROWS)} and high in {"", str(PACKED_MAX_ROWS)}
    for layer in packed.decoder.layers:  # one shape, one choice
        assert [p.kernel for p in (layer.qkv, layer.out, layer.gate_up, layer.down)] == [
            Kernel(packed.decoder.projection_kernels[name]) for name in ("qkv", "out", "gate_up", "down")
        ]


@needs_onednn
def test_choosers_sharing_a_dict_time_each_shape_once_per_thread_count(monkeypatch) -> None:
    timed: list[int] = []

    def fastest(self, candidates, in_features, rows):
        if all(isinstance(key, Kernel) for key in candidates):  # between the kernels, not against plain or panels
            timed.append(in_features)
        return next(iter(candidates)) if True in candidates else Kernel.MKL_TRANSPOSED  # panels win where timed

    monkeypatch.setattr(KernelChooser, "_fastest", fastest)
    shared: dict = {}
    weights = [(torch.randn(12, 8), None) for _ in range(2)]
    KernelChooser(chosen=shared).projections(weights)
    again = KernelChooser(chosen=shared).projections(weights)
    assert timed == [8] and all(p.kernel is Kernel.MKL_TRANSPOSED for p in again), "the second chooser reads it"
    KernelChooser().projections(weights)
    assert timed == [8, 8], "a chooser of its own times afresh"
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        KernelChooser(chosen=shared).projections(weights)
    finally:
        torch.set_num_threads(threads)
    assert len(timed) == 3 and len(shared) == 2, "another thread count is another choice"


@needs_onednn
def test_a_machine_times_a_models_shapes_once_and_keeps_the_choice_on_disk(monkeypatch, tmp_path) -> None:
    from perfsuite.engine.layers import PROJECTIONS, Decoder
    from perfsuite.models import load_model

    monkeypatch.setenv("PERFSUITE_CACHE_DIR", str(tmp_path))  # SHARED_CHOICES reads its path from it
    timed: list[int] = []
    real = KernelChooser._fastest

    def fastest(self, candidates, *args):
        if all(isinstance(key, Kernel) for key in candidates):  # between the kernels, not against plain or panels
            timed.append(1)
        return real(self, candidates, *args)

    monkeypatch.setattr(KernelChooser, "_fastest", fastest)
    model = load_model("tiny-random", dtype="float32").model
    first = Decoder.from_hf(model, torch.device("cpu"), torch.float32)
    projections = [getattr(first.layers[0], name) for name in PROJECTIONS] + [first.lm_head]
    shapes = {(tuple(p.weight.shape), p.bias is not None) for p in projections}
    assert len(timed) == len(shapes), "each shape timed once"
    shapes_timed = len(timed)
    saved = json.loads((tmp_path / KernelChoiceFile.FILE_NAME).read_text())
    assert len(saved) == shapes_timed and all(str(torch.__version__) in name for name in saved)
    second = Decoder.from_hf(model, torch.device("cpu"), torch.float32)
    assert len(timed) == shapes_timed, "a second load, as another process would, reads the file"
    assert second.projection_kernels == first.projection_kernels


@needs_onednn
def test_a_choice_file_that_is_corrupt_or_unwritable_costs_a_timing_not_an_error(tmp_path) -> None:
    key = ((12, 8), False, 2)
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{ not json")
    store = KernelChoiceFile(corrupt)
    assert store.get(key) is None
    store[key] = Choice(Kernel.ONEDNN, 1, None)
    assert KernelChoiceFile(corrupt).get(key) == Choice(Kernel.ONEDNN, 1, None), "rewritten whole, readable next"
    blocked = tmp_path / "a-file-not-a-directory"
    blocked.write_text("")
    unwritable = KernelChoiceFile(blocked / "kernel-choices.json")
    unwritable[key] = Choice(Kernel.MKL_TRANSPOSED)  # cannot be kept: no error
    assert unwritable.get(key) is None
    (tmp_path / "unknown.json").write_text(json.dumps({KernelChoiceFile(tmp_path / "x")._name(key): "no-such-kernel"}))
    assert KernelChoiceFile(tmp_path / "unknown.json").get(key) is None, "a kernel this version lacks is re-timed"
    assert not list(tmp_path.glob(".kernel-choices-*")), "no temporary file left behind"


def test_a_choice_file_nested_past_the_json_parsers_depth_counts_as_empty(tmp_path, monkeypatch) -> None:
    """json.loads raises RecursionError, not ValueError, on "[" * 100000: it failed the perf session's setup."""
    monkeypatch.setenv("PERFSUITE_CACHE_DIR", str(tmp_path))
    (tmp_path / KernelChoiceFile.FILE_NAME).write_text("[" * 100_000 + "]" * 100_000)
    store, key = KernelChoiceFile(), ((12, 8), False, 2)
    assert store.get(key) is None
    store[key] = Choice(Kernel.MKL_TRANSPOSED)
    assert KernelChoiceFile().get(key) == Choice(Kernel.MKL_TRANSPOSED), "replaced by a readable file"


@needs_onednn
def test_processes_that_choose_at_once_keep_every_choice(tmp_path) -> None:
    """pytest-xdist workers load at once: each one's read-add-replace must not drop another's choice."""
    import multiprocessing

    path = tmp_path / "kernel-choices.json"
    keys = [((8 * (i + 1), 8), False, 1) for i in range(24)]
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_store_choices, args=(path, keys[i::4])) for i in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    store = KernelChoiceFile(path)
    assert [store.get(key) for key in keys] == [Choice(Kernel.ONEDNN)] * len(keys), "no choice lost"


def _store_choices(path, keys) -> None:
    store = KernelChoiceFile(path)
    for key in keys:
        store[key] = Choice(Kernel.ONEDNN)


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@needs_onednn
@pytest.mark.parametrize("plain_is_slow", [True, False], ids=["plain-slow", "plain-fast"])
def test_the_rows_that_take_the_kernel_are_where_it_beat_the_plain_call(plain_is_slow, monkeypatch, one_thread) -> None:
    """On an AMD EPYC VM MKL's plain call lost at 1-3 rows and at hundreds; on the Intel one it won there. The
    chooser times both and gives the kernel those rows only where it won: a slept plain call loses them."""
    import time

    linear, product = F.linear, torch.ops.mkldnn._linear_pointwise
    # A sleep far above a product of these sizes, on one thread (one_thread): under a parallel test run, a
    # two-thread product whose second thread had lost its core took milliseconds, and plain "won" at 200 rows.
    if plain_is_slow:
        monkeypatch.setattr(F, "linear", lambda *args: time.sleep(0.01) or linear(*args))
    else:  # the kernels slow at every row count: between them, either wins; against plain, plain does
        monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda *a: time.sleep(0.01) or product(*a))
        monkeypatch.setattr(torch, "mm", lambda *a, _mm=torch.mm: time.sleep(0.01) or _mm(*a))
    chooser = KernelChooser(rounds=3, small_rows=(1, 3), large_rows=(200,))
    generator = torch.Generator().manual_seed(2)
    weights = [(torch.randn(24, 16, generator=generator), None) for _ in range(2)]
    projections = chooser.projections(weights)
    (choice,) = chooser.chosen.values()
    expected = (1, None) if plain_is_slow else (PACKED_MIN_ROWS, PACKED_MAX_ROWS)
    assert (choice.min_rows, choice.max_rows) == expected
    assert all((p.min_rows, p.max_rows) == expected for p in projections)
    monkeypatch.undo()
    for rows in (1, 3, PACKED_MIN_ROWS, 200):
        assert projections[0].takes_kernel(rows) is (plain_is_slow or PACKED_MIN_ROWS <= rows <= PACKED_MAX_ROWS)
        x = torch.randn(rows, 16, generator=generator)
        torch.testing.assert_close(projections[0](x), F.linear(x, weights[0][0]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("choice", "text"),
    [(Choice(Kernel.ONEDNN, 1, None), "onednn rows 1.. panel ..0"),
     (Choice(Kernel.MKL_TRANSPOSED), "mkl-transposed rows 4..128 panel ..0"),
     (Choice(Kernel.ONEDNN, 4, None, 8), "onednn rows 4.. panel ..8")],
)  # fmt: skip
def test_a_choice_is_written_and_read_back_as_the_same_choice(choice, text) -> None:
    assert str(choice) == text and Choice.parse(text) == choice


def test_a_choice_written_before_rows_were_chosen_is_timed_again_and_nonsense_is_refused(tmp_path) -> None:
    key = ((12, 8), False, 2)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({KernelChoiceFile(old)._name(key): "onednn"}))
    assert KernelChoiceFile(old).get(key) is None, "a bare kernel: its rows were never timed on this machine"
    for text in ("onednn", "onednn rows", "onednn rows 1", "onednn rows x..4", "onednn rows 1..y", "cublas rows 1.. panel ..0",
                 "onednn rows 1..", "onednn rows 1.. panel ..", "onednn rows 1.. panel ..x"):
        with pytest.raises(ValueError):
            Choice.parse(text)


def test_a_choice_timed_on_an_older_version_of_the_kernels_is_timed_again(tmp_path, monkeypatch) -> None:
    key = ((12, 8), False, 2)
    path = tmp_path / "kernel-choices.json"
    KernelChoiceFile(path)[key] = Choice(Kernel.ONEDNN, 1, None, 8)
    assert KernelChoiceFile(path).get(key) == Choice(Kernel.ONEDNN, 1, None, 8)
    monkeypatch.setattr(KernelChoiceFile, "CHOICES_VERSION", KernelChoiceFile.CHOICES_VERSION + 1)
    assert KernelChoiceFile(path).get(key) is None, "the panel kernel changed what it wins: its rows are timed again"
