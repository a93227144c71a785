"""Sweep configs: a TOML grid of engines x batch sizes x workloads, expanded into cases.

    [sweep]
    engines = ["static", "inflight"]          # names; the caller checks them against its engines
    batch_sizes = [4, 8]
    prompts = [32, "shipped"]                 # optional, default ["shipped"]
    output_lengths = [16, {kind = "uniform", low = 4, high = 24}]
    arrivals = ["offline", 4.0, {rate = 4.0, burstiness = 0.5}, {concurrency = 4}]  # optional, default ["offline"]
    num_requests = 8
    seed = 0                                  # optional
    repeats = 3                               # optional; default: the profile's

The list entries of ``prompts``, ``output_lengths`` and ``arrivals`` take the
values those keys take in ``Workload.from_dict``; rates and concurrencies share
the ``arrivals`` axis because a case has one or the other. Every case uses the
same seed, so engines and batch sizes see identical requests. Pure Python.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from perfsuite.workload.arrivals import Arrivals, parse_arrivals
from perfsuite.workload.checks import is_int, reject_unknown_keys
from perfsuite.workload.lengths import OutputLengths, parse_output_lengths
from perfsuite.workload.prompts import JsonlPrompts, PromptSource, ShippedPrompts, parse_prompts
from perfsuite.workload.workload import Workload

AXIS_KEYS = ("engines", "batch_sizes", "prompts", "output_lengths", "arrivals")
SWEEP_KEYS = (*AXIS_KEYS, "num_requests", "seed", "repeats")
REQUIRED_KEYS = ("engines", "batch_sizes", "output_lengths", "num_requests")

Entry = TypeVar("Entry")


@dataclass(frozen=True, slots=True)
class SweepCase:
    """One point of the grid: an engine at a batch size serving a workload."""

    engine: str
    batch_size: int
    workload: Workload
    repeats: int | None = None

    @property
    def id(self) -> str:
        """A stable pytest id such as ``inflight-B8-in32-out_uniform4_24-4rps``."""
        return f"{self.engine}-B{self.batch_size}-{self.workload.label}"


@dataclass(frozen=True, slots=True)
class Sweep:
    """The grid's axes; ``cases()`` is their product, engines outermost."""

    engines: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    output_lengths: tuple[OutputLengths, ...]
    num_requests: int
    prompts: tuple[PromptSource, ...] = (ShippedPrompts(),)
    arrivals: tuple[Arrivals, ...] = (Arrivals(),)
    seed: int = 0
    repeats: int | None = None

    @property
    def num_cases(self) -> int:
        return (
            len(self.engines)
            * len(self.batch_sizes)
            * len(self.prompts)
            * len(self.output_lengths)
            * len(self.arrivals)
        )

    def cases(self) -> list[SweepCase]:
        grid = itertools.product(self.engines, self.batch_sizes, self.prompts, self.output_lengths, self.arrivals)
        return [
            SweepCase(engine, batch_size, self._workload(prompts, lengths, arrivals), self.repeats)
            for engine, batch_size, prompts, lengths, arrivals in grid
        ]

    def _workload(self, prompts: PromptSource, lengths: OutputLengths, arrivals: Arrivals) -> Workload:
        return Workload(self.num_requests, lengths, arrivals, self.seed, prompts)


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep config; anything wrong raises ValueError naming the file and the key.

    JSONL prompt paths are relative to the config's folder, and those files are
    read now so a bad line fails before any model loads.
    """
    path = Path(path)
    sweep = parse_sweep(_read_toml(path), source=str(path), base_dir=path.parent)
    _check_prompt_files(sweep, str(path))
    return sweep


def parse_sweep(data: Mapping[str, object], source: str = "<sweep>", base_dir: Path | None = None) -> Sweep:
    """A ``Sweep`` from a parsed TOML document (``{"sweep": {...}}``); no file is read."""
    table = _sweep_table(data, source)
    try:
        reject_unknown_keys(table, SWEEP_KEYS, "sweep key")
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None
    missing = [key for key in REQUIRED_KEYS if key not in table]
    if missing:
        raise ValueError(f"{source}: [sweep] needs {', '.join(missing)}; see examples/sweep.toml")
    sweep = Sweep(
        engines=_axis(table, "engines", _engine_name, source),
        batch_sizes=_axis(table, "batch_sizes", _batch_size, source),
        output_lengths=_axis(table, "output_lengths", parse_output_lengths, source),
        num_requests=_setting(table, "num_requests", source, minimum=1),
        prompts=_axis(table, "prompts", lambda value: parse_prompts(value, base_dir), source, default=("shipped",)),
        arrivals=_axis(table, "arrivals", parse_arrivals, source, default=("offline",)),
        seed=_setting(table, "seed", source, minimum=None, default=0),
        repeats=_setting(table, "repeats", source, minimum=1, default=None),
    )
    _check_cases(sweep, source)
    return sweep


def _read_toml(path: Path) -> dict[str, object]:
    try:
        import tomllib
    except ModuleNotFoundError:  # pyproject still allows Python 3.10, which lacks tomllib
        raise ValueError(f"reading the sweep config {path} needs Python 3.11 or newer (tomllib)") from None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"cannot read sweep config {path}: {err.strerror}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: not valid TOML: {err}") from None


def _sweep_table(data: Mapping[str, object], source: str) -> Mapping[str, object]:
    for key in data:
        if key != "sweep":
            raise ValueError(f"{source}: unknown top-level key {key!r}; put every setting under [sweep]")
    table = data.get("sweep")
    if not isinstance(table, Mapping):
        raise ValueError(f"{source}: no [sweep] table; start the file with [sweep]")
    return table


def _axis(
    table: Mapping[str, object],
    key: str,
    parse: Callable[[object], Entry],
    source: str,
    default: tuple[object, ...] | None = None,
) -> tuple[Entry, ...]:
    values = table.get(key, default)
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"{source}: sweep.{key} must be a list in brackets, got {values!r}")
    if not values:
        raise ValueError(f"{source}: sweep.{key} is empty; list at least one entry or leave the key out")
    entries = []
    for index, value in enumerate(values):
        try:
            entry = parse(value)
        except ValueError as err:
            raise ValueError(f"{source}: sweep.{key}[{index}]: {err}") from None
        if entry in entries:
            raise ValueError(f"{source}: sweep.{key}[{index}] repeats an earlier entry ({value!r}); remove one")
        entries.append(entry)
    return tuple(entries)


def _engine_name(value: object) -> str:
    if not isinstance(value, str) or not value or any(char.isspace() for char in value):
        raise ValueError(f"an engine is a name such as \"inflight\", without spaces; got {value!r}")
    return value


def _batch_size(value: object) -> int:
    if not is_int(value) or value < 1:
        raise ValueError(f"a batch size is an integer >= 1, got {value!r}")
    return value


def _setting(
    table: Mapping[str, object], key: str, source: str, minimum: int | None, default: int | None = None
) -> int | None:
    value = table.get(key, default)
    if value is None:
        return None
    if not is_int(value) or (minimum is not None and value < minimum):
        at_least = f" >= {minimum}" if minimum is not None else ""
        raise ValueError(f"{source}: sweep.{key} must be an integer{at_least}, got {value!r}")
    return value


def _check_cases(sweep: Sweep, source: str) -> None:
    try:
        cases = sweep.cases()
    except ValueError as err:
        raise ValueError(f"{source}: sweep.prompts x sweep.output_lengths: {err}") from None
    seen: set[str] = set()
    for case in cases:
        if case.id in seen:
            raise ValueError(
                f"{source}: two cases share the id {case.id!r}; their entries differ by less than the id shows "
                "(e.g. two JSONL files with the same name, or rates that round alike); make them distinct"
            )
        seen.add(case.id)


def _check_prompt_files(sweep: Sweep, source: str) -> None:
    for index, prompts in enumerate(sweep.prompts):
        if not isinstance(prompts, JsonlPrompts):
            continue
        try:
            prompts.lines()
            if any(lengths.kind == "from_file" for lengths in sweep.output_lengths):
                prompts.output_lengths()
        except ValueError as err:
            raise ValueError(f"{source}: sweep.prompts[{index}]: {err}") from None
