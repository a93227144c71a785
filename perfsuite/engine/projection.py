"""A linear layer's weight, and on CPU a copy of it laid out once for a faster decode-sized product.

``F.linear`` on CPU calls MKL's ``sgemm`` with the weight transposed. From 4
rows on, MKL then copies the weight into its own blocked layout on every call,
and at the few rows of a decode step that copy costs more than the product:
on the 2-core development VM, SmolLM2's fused QKV took 103 us at 4 rows
against 25 us at 3. Two kernels skip it, each over a copy of the weight made
once at load (``Kernel``):

- ``onednn``: the weight reordered into oneDNN's blocked layout
  (``mkldnn::_reorder_linear_weight``, what inductor's CPU freezing does) and
  multiplied by ``mkldnn::_linear_pointwise``. It streams a large weight
  fastest (SmolLM2's gate-up and lm head), but a call costs about 25 us more
  than a plain one (bench/packed_linear.py).
- ``mkl-transposed``: the weight stored transposed, [in, out] contiguous, and
  ``torch.mm``: MKL's ``sgemm`` with no copy and no oneDNN call overhead.
  Called on one weight again and again it was the faster one for SmolLM2's
  smaller weights (QKV, attention out, down); over a step's 30 cold weights
  only for some (bench/vllm_gemm.py).

Which is faster depends on the weight's shape and the machine, so
``KernelChooser`` times both at load, over a pass through all the model's
weights of a shape (as cold as a step finds them) at decode-sized row counts
(``TUNING_ROWS``), and keeps only the winner's copies: the cost is one copy
of the projections' weights in memory, as before (two of one shape's while
it is timed), and about 14 s of timing for SmolLM2 on a 2-vCPU VM, once per machine.

Which rows take the kernel depends on the machine too. On the Intel
development VM, below 4 rows MKL's plain matrix-vector call was the faster
one, and from a few hundred rows on the two tied. On an AMD EPYC VM, MKL's
plain call was 1.5-10x slower than oneDNN at 1-3 rows (the lm head: 11-36
ms against 4-5) and 1.1-1.3x slower at 256-1024 rows (bench/packed_linear.py).
So the chooser also times the chosen kernel against the plain call at a few
rows (``SMALL_ROWS``) and at a prefill's many (``LARGE_ROWS``), and a
shape's ``Choice`` takes the kernel from 1 row where it wins at few, and
with no upper bound where it wins at many; else only for
``PACKED_MIN_ROWS..PACKED_MAX_ROWS`` rows, decode steps and the lm head over
a step's sampled rows.

A third kernel takes the rows from 1 up to where it stops winning: ``small_gemm``,
perfsuite's own C product over a copy of the weight packed into panels, with
no call overhead to speak of (oneDNN's call through torch rebuilds its
primitive, about 13 us) and its sums blocked in registers. It is timed against
the chosen kernel at ``PANEL_ROWS`` (1 to 256 rows) in turn, and takes the rows
up to the last where it won (``Choice.panel_max_rows``); on the AMD EPYC VM,
1 to 256 on each of SmolLM2's shapes. Only a shape that takes it keeps the
packed copy.

The fast kernels need float32 on a CPU (oneDNN also a torch built with it);
elsewhere (CUDA, bfloat16) every product is ``F.linear``. Every kernel
computes the same product up to float rounding, which the equivalence
properties hold to unbatched greedy decoding like any other path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

from perfsuite.cache_dir import cache_root, write_whole
from perfsuite.engine.small_gemm import SmallGemm, load_small_gemm
from perfsuite.host import cpu_model

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # not POSIX (Windows): choices are written unlocked, and a race may cost a re-timing
    fcntl = None

# bench/packed_linear.py on the development VM: the packed product wins from 4 rows, ties the plain one at 256.
PACKED_MIN_ROWS = 4
PACKED_MAX_ROWS = 128
# The batch size oneDNN is told to expect when it picks the weight's layout: a decode step's.
LAYOUT_HINT_ROWS = 8
# The row counts a weight's kernels are timed at when one is chosen: a small and a large decode batch.
TUNING_ROWS = (8, 32)
# Where the chosen kernel is timed against the plain call, to set the rows it takes: a step with a few rows
# (the tail of a batch draining, the lm head over them), and a prefill's many.
SMALL_ROWS = (1, 3)
LARGE_ROWS = (256,)
TUNING_ROUNDS = 5
# Where the panel kernel (perfsuite.engine.small_gemm) is timed against the chosen one, in turn: it takes the rows up
# to the last of these where it won, and none if it lost at the first. From decode steps' rows to a prompt step's.
PANEL_ROWS = (1, 4, 8, 16, 32, 64, 128, 256)
# A batch-invariant product runs oneDNN at every row count, but never on fewer rows than this: oneDNN gave a lone row
# other bits than the same row among others for SmolLM2's down projection (1536 inputs; bench/row_invariance.py),
# and the same from 2 to 2048 rows, so one row is padded to two.
INVARIANT_MIN_ROWS = 2


class Kernel(StrEnum):
    """How a projection of ``PACKED_MIN_ROWS..PACKED_MAX_ROWS`` rows runs, over its copy of the weight."""

    ONEDNN = "onednn"  # mkldnn::_linear_pointwise over the weight in oneDNN's layout
    MKL_TRANSPOSED = "mkl-transposed"  # torch.mm over the weight stored transposed, [in, out]


def can_pack(weight: torch.Tensor) -> bool:
    """Whether ``weight`` can have a fast kernel: a float32 matrix on the CPU, with a oneDNN build of torch."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.dim() == 2
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


@dataclass(frozen=True, slots=True)
class Projection:
    """``y = x @ weight.T + bias`` over x [rows, in]; ``kernel`` runs its decode-sized products over ``fast_weight``,
    the weight's copy made for it (oneDNN's layout, or [in, out]); with no kernel every product is ``F.linear``.

    ``batch_invariant``: every product, whatever its rows, runs oneDNN (padded to ``INVARIANT_MIN_ROWS``), so a
    row's bits do not depend on how many rows are multiplied with it (``batch_invariant_projection``).
    """

    weight: torch.Tensor  # [out, in]
    bias: torch.Tensor | None = None  # [out]
    kernel: Kernel | None = None
    fast_weight: torch.Tensor | None = None
    batch_invariant: bool = False
    min_rows: int = PACKED_MIN_ROWS  # the rows that take the kernel; the others, F.linear
    max_rows: int | None = PACKED_MAX_ROWS  # None: no bound
    # Products of 1..panel_max_rows rows run small_gemm over panels, the weight packed for it; 0: none do.
    small_gemm: SmallGemm | None = None
    panels: torch.Tensor | None = None
    panel_max_rows: int = 0

    @classmethod
    def of(
        cls,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        kernel: Kernel | None = Kernel.ONEDNN,
        min_rows: int = PACKED_MIN_ROWS,
        max_rows: int | None = PACKED_MAX_ROWS,
        panel_max_rows: int = 0,
    ) -> Projection:
        """A projection over ``weight`` with ``kernel``'s copy of it where ``can_pack`` allows, for products of
        ``min_rows..max_rows`` rows; None: plain only. ``panel_max_rows``: products of 1 to that many rows run
        ``small_gemm`` over a packed copy, where it builds (else they keep the rest of the choice)."""
        weight = weight.contiguous()
        if kernel is None or not can_pack(weight):
            return cls(weight, bias)
        if kernel is Kernel.MKL_TRANSPOSED:
            fast_weight = weight.t().contiguous()
        else:
            fast_weight = torch.ops.mkldnn._reorder_linear_weight(weight, LAYOUT_HINT_ROWS)
        projection = cls(weight, bias, kernel, fast_weight, min_rows=min_rows, max_rows=max_rows)
        return projection.with_panels(panel_max_rows) if panel_max_rows else projection

    def with_panels(self, panel_max_rows: int) -> Projection:
        """This projection with products of 1..``panel_max_rows`` rows on ``small_gemm``; itself where the
        kernel does not build or take the weight."""
        gemm = load_small_gemm()
        if not isinstance(gemm, SmallGemm) or not gemm.supports(self.weight):
            return self
        packed = gemm.pack(self.weight)
        return dataclasses.replace(self, small_gemm=gemm, panels=packed, panel_max_rows=panel_max_rows)

    def takes_kernel(self, rows: int) -> bool:
        """Whether a product of ``rows`` rows runs the kernel."""
        return self.kernel is not None and self.min_rows <= rows and (self.max_rows is None or rows <= self.max_rows)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.batch_invariant:
            return self._every_row_alike(x)
        rows = x.shape[0] if x.dim() == 2 else 0  # a product of another rank takes F.linear
        if 0 < rows <= self.panel_max_rows:
            assert self.small_gemm is not None and self.panels is not None, "panels come with their kernel"
            return self.small_gemm(x, self.panels, self.weight.shape[0], self.bias)
        if rows and self.takes_kernel(rows):
            fast_weight = self.fast_weight
            assert fast_weight is not None, "a kernel comes with its copy of the weight (Projection.of)"
            if self.kernel is Kernel.ONEDNN:
                return torch.ops.mkldnn._linear_pointwise(x, fast_weight, self.bias, "none", [], "")  # any strides
            if self.bias is None:
                return torch.mm(x, fast_weight)
            return torch.addmm(self.bias, x, fast_weight)
        return F.linear(x, self.weight, self.bias)

    def _every_row_alike(self, x: torch.Tensor) -> torch.Tensor:
        """oneDNN's product of x [rows, in] at any rows, a lone row padded so that oneDNN takes its many-row path."""
        rows = x.shape[0]
        if rows < INVARIANT_MIN_ROWS:
            padded = x.new_zeros(INVARIANT_MIN_ROWS, x.shape[1])
            padded[:rows] = x
            return self._every_row_alike(padded)[:rows]
        return torch.ops.mkldnn._linear_pointwise(x, self.fast_weight, self.bias, "none", [], "")


def batch_invariant_projection(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Projection:
    """A projection whose every product runs oneDNN, the one CPU kernel found to give a row the same bits at every
    row count (bench/row_invariance.py: MKL's ``sgemm``, plain or over the weight transposed, changes its bits
    below 12 rows). ``ValueError`` where oneDNN cannot run it (not float32 on a CPU, or no oneDNN in torch)."""
    weight = weight.contiguous()
    if not can_pack(weight):
        raise ValueError(
            f"a batch-invariant projection runs oneDNN, which needs a float32 matrix on a CPU and a torch built with "
            f"oneDNN; got {weight.dtype} on {weight.device.type}"
        )
    fast_weight = torch.ops.mkldnn._reorder_linear_weight(weight, LAYOUT_HINT_ROWS)
    return Projection(weight, bias, Kernel.ONEDNN, fast_weight, batch_invariant=True)


ChoiceKey = tuple[tuple[int, ...], bool, int]  # (weight shape, has a bias, torch's thread count)


@dataclass(frozen=True, slots=True)
class Choice:
    """A shape's kernel and the rows that take it: ``min_rows`` to ``max_rows`` (None: no bound); and the rows
    up to ``panel_max_rows`` that take ``small_gemm`` before it (0: none)."""

    kernel: Kernel
    min_rows: int = PACKED_MIN_ROWS
    max_rows: int | None = PACKED_MAX_ROWS
    panel_max_rows: int = 0

    def __str__(self) -> str:
        rows = f"{self.min_rows}..{'' if self.max_rows is None else self.max_rows}"
        return f"{self.kernel} rows {rows} panel ..{self.panel_max_rows}"

    @classmethod
    def parse(cls, text: str) -> Choice:
        """What ``str`` wrote; ``ValueError`` for anything else, a choice written before the rows or the panels
        were chosen included (that shape is timed again, once)."""
        kernel, _, rest = text.partition(" rows ")
        rows, _, panel = rest.partition(" panel ..")
        low, separator, high = rows.partition("..")
        if not separator or not low.isdigit() or not (high.isdigit() or high == "") or not panel.isdigit():
            raise ValueError(f"not a kernel choice: {text!r}")
        return cls(Kernel(kernel), int(low), int(high) if high else None, int(panel))

    def projection(self, weight: torch.Tensor, bias: torch.Tensor | None) -> Projection:
        return Projection.of(
            weight, bias, kernel=self.kernel, min_rows=self.min_rows, max_rows=self.max_rows,
            panel_max_rows=self.panel_max_rows,
        )  # fmt: skip


class KernelChoiceFile:
    """Kernel choices kept on disk, so that every process on a machine uses the kernels chosen once.

    Timing the kernels costs about 14 s a SmolLM2 load, and a choice made
    afresh by each process may differ from the last under load: a baseline
    and a later run could then measure different kernels. So
    ``Decoder.from_hf``'s choosers share this file,
    ``<cache root>/kernel-choices.json`` (``perfsuite.cache_dir``), whose keys
    name the CPU model, torch's version and ``CHOICES_VERSION`` (perfsuite's
    kernels as timed) beside the shape, bias and thread count. Delete it to time the kernels again. A file that cannot be read
    counts as empty, and one that cannot be written leaves the choice to this
    process; a write re-reads, adds and replaces the file whole (a rename)
    under a lock, so a reader never sees half of one and processes that
    choose at once keep each other's choices.
    """

    FILE_NAME = "kernel-choices.json"
    # Raised when a kernel changes what it would win: choices timed on the old one are then timed again.
    CHOICES_VERSION = 2  # 2: the panel kernel blocks rows and is timed up to 256 of them

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._machine = f"{cpu_model()} | torch {torch.__version__} | kernels v{self.CHOICES_VERSION}"

    @property
    def path(self) -> Path:
        return self._path if self._path is not None else cache_root() / self.FILE_NAME

    def _name(self, key: ChoiceKey) -> str:
        shape, has_bias, threads = key
        return f"{self._machine} | {'x'.join(map(str, shape))} | bias={has_bias} | threads={threads}"

    def _read(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested past the parser's depth
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: ChoiceKey) -> Choice | None:
        try:
            return Choice.parse(str(self._read()[self._name(key)]))
        except (KeyError, ValueError):  # not chosen yet, or a kernel this version does not know
            return None

    def __setitem__(self, key: ChoiceKey, choice: Choice) -> None:
        path = self.path
        with contextlib.suppress(OSError):  # unwritable: the choice stays this process's
            path.parent.mkdir(parents=True, exist_ok=True)
            # Read, add and replace under a lock: processes that load at once (pytest-xdist workers) would
            # otherwise each write what they read before the others' choices, and drop them.
            with open(path.parent / f".{path.name}.lock", "w") as lock:
                if fcntl is not None:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                choices = {**self._read(), self._name(key): str(choice)}
                write_whole(path, json.dumps(choices, indent=1, sort_keys=True).encode())


SHARED_CHOICES = KernelChoiceFile()  # what Decoder.from_hf's choosers share


class KernelChooser:
    """Picks the faster kernel for a group of weights of one shape, by timing a pass over all of them.

    A decode step multiplies by each layer's weight of a shape in turn, so a
    weight is cold when its product runs: SmolLM2's 30 QKV weights are 66 MB,
    more than this machine's caches hold for one process. So each kernel is
    timed over a pass through every weight of the group at each of ``TUNING_ROWS``
    rows, not over one weight called again and again (which stays in cache and
    favoured MKL: bench/vllm_gemm.py). The kernels take turns, each first in
    alternate rounds; the smaller sum over the row counts of the median pass
    times wins. The winner is then timed against the plain call the same way
    at ``SMALL_ROWS`` and at ``LARGE_ROWS``, which sets the rows it takes
    (``Choice``, module docstring). Groups of a shape already chosen take that choice untimed;
    ``chosen`` keeps what was picked, by (weight shape, has a bias, torch's
    thread count): a dict of the chooser's own, or a store shared with other
    choosers: ``Decoder.from_hf`` passes ``SHARED_CHOICES``, so a machine times
    each shape once (``KernelChoiceFile``).
    """

    def __init__(
        self,
        rows: tuple[int, ...] = TUNING_ROWS,
        rounds: int = TUNING_ROUNDS,
        chosen: dict[ChoiceKey, Choice] | KernelChoiceFile | None = None,
        small_rows: tuple[int, ...] = SMALL_ROWS,
        large_rows: tuple[int, ...] = LARGE_ROWS,
        panel_rows: tuple[int, ...] = PANEL_ROWS,
    ) -> None:
        self.rows = rows
        self.rounds = rounds
        self.small_rows = small_rows
        self.large_rows = large_rows
        self.panel_rows = panel_rows
        self.chosen = {} if chosen is None else chosen

    def projections(self, weights: Sequence[tuple[torch.Tensor, torch.Tensor | None]]) -> list[Projection]:
        """Projections over ``weights`` (weight, bias) of one shape, all on the kernel chosen for it."""
        if not weights or not can_pack(weights[0][0]):
            return [Projection.of(weight, bias, kernel=None) for weight, bias in weights]
        first, first_bias = weights[0]
        shape = (tuple(first.shape), first_bias is not None)
        if any((tuple(weight.shape), bias is not None) != shape for weight, bias in weights):
            raise ValueError(f"a group's weights must share one shape and all have a bias or none; the first: {shape}")
        key = (*shape, torch.get_num_threads())
        known = self.chosen.get(key)
        if known is not None:
            return [known.projection(weight, bias) for weight, bias in weights]
        candidates = {  # while timed, each kernel takes every product
            kernel: [Projection.of(w, b, kernel=kernel, min_rows=1, max_rows=None) for w, b in weights]
            for kernel in Kernel
        }
        fastest = self._fastest(candidates, first.shape[1], self.rows)
        kept = {fastest: candidates.pop(fastest), None: [Projection.of(w, b, kernel=None) for w, b in weights]}
        candidates.clear()  # the other kernel's copies go
        choice = Choice(
            fastest,
            min_rows=1 if self._fastest(kept, first.shape[1], self.small_rows) is fastest else PACKED_MIN_ROWS,
            max_rows=None if self._fastest(kept, first.shape[1], self.large_rows) is fastest else PACKED_MAX_ROWS,
        )
        chosen = [dataclasses.replace(p, min_rows=choice.min_rows, max_rows=choice.max_rows) for p in kept[fastest]]
        kept.clear()
        chosen, panel_max_rows = self._panels(chosen, first.shape[1])
        choice = dataclasses.replace(choice, panel_max_rows=panel_max_rows)
        self.chosen[key] = choice
        return chosen

    def _panels(self, chosen: list[Projection], in_features: int) -> tuple[list[Projection], int]:
        """``chosen`` with ``small_gemm`` for the rows of ``panel_rows`` up to the last where it was the faster,
        timed in turn (none if it lost at the first); and those rows' bound (0: none)."""
        if not self.panel_rows:
            return chosen, 0
        candidates = [p.with_panels(max(self.panel_rows)) for p in chosen]
        if any(p.panel_max_rows == 0 for p in candidates):  # no kernel here
            return chosen, 0
        panel_max_rows = 0
        for rows in sorted(self.panel_rows):
            if self._fastest({True: candidates, False: chosen}, in_features, (rows,)) is not True:
                break
            panel_max_rows = rows
        if panel_max_rows == 0:
            return chosen, 0
        return [dataclasses.replace(p, panel_max_rows=panel_max_rows) for p in candidates], panel_max_rows

    def _fastest(self, candidates: dict[Any, list[Projection]], in_features: int, row_counts: tuple[int, ...]) -> Any:
        """The key of ``candidates`` whose pass over its projections took least, summed over ``row_counts``."""
        generator = torch.Generator().manual_seed(0)
        inputs = [torch.randn(rows, in_features, generator=generator) for rows in row_counts]
        seconds: dict[tuple[Any, int], list[float]] = {(k, rows): [] for k in candidates for rows in row_counts}
        order = list(candidates)

        def one_pass(kernel: Any, x: torch.Tensor) -> None:
            for projection in candidates[kernel]:
                projection(x)

        with torch.inference_mode():
            for kernel in order:  # warm-up: oneDNN makes its primitive on the first call
                for x in inputs:
                    candidates[kernel][0](x)
            for round_index in range(self.rounds):
                for kernel in order if round_index % 2 == 0 else reversed(order):
                    for x in inputs:
                        started = time.perf_counter()
                        one_pass(kernel, x)
                        seconds[kernel, x.shape[0]].append(time.perf_counter() - started)
        return min(order, key=lambda kernel: sum(statistics.median(seconds[kernel, rows]) for rows in row_counts))
