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

    [workload]                                # optional: related requests instead of prompts x output_lengths
    kind = "shared_prefix"                    # or "multi_turn", "trace" (docs/workloads.md); [[workload]]
    groups = 8                                # tables, one per entry, make it an axis
    prompts = 8
    prefix = 256

    [capacity]                                # optional: capacity cases too (test_sweep_capacity)
    by = "concurrency"                        # optional: "rate" or "concurrency"; default --perf-capacity-by
    target_share = 0.9                        # optional: share of requests within --perf-slo; default 0.9
    tolerance = 0.1                           # optional: how narrow the final bracket; default 0.1

A ``[workload]`` section (or several ``[[workload]]`` tables) replaces the
``prompts`` x ``output_lengths`` x ``num_requests`` of the grid with
``shaped.ShapedWorkload`` shapes, each crossed with the ``arrivals`` axis;
those three keys are then refused, and so is ``[capacity]``.

The list entries of ``prompts``, ``output_lengths`` and ``arrivals`` take the
values those keys take in ``Workload.from_dict``; rates and concurrencies share
the ``arrivals`` axis because a case has one or the other. Every case uses the
same seed, so engines and batch sizes see identical requests. Pure Python.

A ``[capacity]`` section adds one capacity case per engine x batch size x
prompts x output lengths (``capacity_cases()``): the ``arrivals`` axis is
ignored for them, as the capacity search sets the load itself (a rate or a
concurrency). Its settings are checked here; the search itself
(``perfsuite.measure.capacity``) runs only with ``--perf-slo``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from perfsuite.workload.arrivals import Arrivals, parse_arrivals
from perfsuite.workload.checks import check_int, is_int, is_number, reject_unknown_keys
from perfsuite.workload.lengths import OutputLengths, parse_output_lengths
from perfsuite.workload.prompts import JsonlPrompts, PromptSource, ShippedPrompts, parse_prompts
from perfsuite.workload.shaped import Shape, ShapedWorkload, parse_shape
from perfsuite.workload.trace import Trace
from perfsuite.workload.workload import Workload

AXIS_KEYS = ("engines", "batch_sizes", "prompts", "output_lengths", "arrivals")
SWEEP_KEYS = (*AXIS_KEYS, "num_requests", "seed", "repeats")
REQUIRED_KEYS = ("engines", "batch_sizes", "output_lengths", "num_requests")
SHAPED_REQUIRED_KEYS = ("engines", "batch_sizes")
SHAPED_REPLACES = ("prompts", "output_lengths", "num_requests")  # what a [workload] section stands for
CAPACITY_KEYS = ("by", "target_share", "tolerance")
CAPACITY_KINDS = ("rate", "concurrency")  # measure.capacity.SEARCH_KINDS, which a workload may not import

Entry = TypeVar("Entry")


@dataclass(frozen=True, slots=True)
class SweepCase:
    """One point of the grid: an engine at a batch size serving a workload."""

    engine: str
    batch_size: int
    workload: Workload | ShapedWorkload
    repeats: int | None = None

    @property
    def id(self) -> str:
        """A stable pytest id such as ``inflight-B8-in32-out_uniform4_24-4rps``."""
        return f"{self.engine}-B{self.batch_size}-{self.workload.label}"


@dataclass(frozen=True, slots=True)
class CapacitySettings:
    """A sweep's ``[capacity]`` section; None: the session's option (``by``) or the search's default."""

    by: str | None = None
    target_share: float | None = None
    tolerance: float | None = None


@dataclass(frozen=True, slots=True)
class CapacityCase:
    """One capacity test of the grid: an engine at a batch size searched on a workload's prompts and lengths.

    The workload's arrivals are not used: the search sets the load (rate or concurrency).
    """

    engine: str
    batch_size: int
    workload: Workload
    settings: CapacitySettings
    repeats: int | None = None

    @property
    def id(self) -> str:
        """A stable pytest id such as ``inflight-B8-in32-out_uniform4_24``: no arrivals, the search sets them."""
        return f"{self.engine}-B{self.batch_size}-{self.workload.prompts.label}-{self.workload.lengths.label}"

    def workload_at(self, rate: float, num_requests: int) -> Workload:
        """The case's workload with ``num_requests`` Poisson arrivals at ``rate`` req/s (a probe's requests)."""
        return dataclasses.replace(self.workload, num_requests=num_requests, arrivals=Arrivals(rate=rate))


@dataclass(frozen=True, slots=True)
class Sweep:
    """The grid's axes; ``cases()`` is their product, engines outermost."""

    engines: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    output_lengths: tuple[OutputLengths, ...] = ()  # unused with workloads
    num_requests: int | None = None  # unused with workloads
    prompts: tuple[PromptSource, ...] = (ShippedPrompts(),)
    arrivals: tuple[Arrivals, ...] = (Arrivals(),)
    seed: int = 0
    repeats: int | None = None
    capacity: CapacitySettings | None = None  # a [capacity] section: capacity cases too
    workloads: tuple[Shape, ...] = ()  # a [workload] section: these instead of prompts x output_lengths

    @property
    def num_cases(self) -> int:
        workloads = len(self.workloads) if self.workloads else len(self.prompts) * len(self.output_lengths)
        return len(self.engines) * len(self.batch_sizes) * workloads * len(self.arrivals)

    def cases(self) -> list[SweepCase]:
        if self.workloads:
            shaped = itertools.product(self.engines, self.batch_sizes, self.workloads, self.arrivals)
            return [
                SweepCase(engine, batch_size, ShapedWorkload(shape, arrivals, self.seed), self.repeats)
                for engine, batch_size, shape, arrivals in shaped
            ]
        grid = itertools.product(self.engines, self.batch_sizes, self.prompts, self.output_lengths, self.arrivals)
        return [
            SweepCase(engine, batch_size, self._workload(prompts, lengths, arrivals), self.repeats)
            for engine, batch_size, prompts, lengths, arrivals in grid
        ]

    def capacity_cases(self) -> list[CapacityCase]:
        """One per engine x batch size x prompts x output lengths, engines outermost; none without [capacity]."""
        if self.capacity is None:
            return []
        grid = itertools.product(self.engines, self.batch_sizes, self.prompts, self.output_lengths)
        return [
            CapacityCase(engine, batch_size, self._workload(prompts, lengths, Arrivals()), self.capacity, self.repeats)
            for engine, batch_size, prompts, lengths in grid
        ]

    def _workload(self, prompts: PromptSource, lengths: OutputLengths, arrivals: Arrivals) -> Workload:
        # Unset only with workloads; check_int raises what Workload itself would for a sweep built without it.
        return Workload(check_int(self.num_requests, "num_requests"), lengths, arrivals, self.seed, prompts)


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
    """A ``Sweep`` from a parsed TOML document (``{"sweep": {...}}``, ``"capacity"`` optional); no file is read."""
    table = _sweep_table(data, source)
    reject_unknown_keys(table, SWEEP_KEYS, "sweep key", source)
    if "workload" in data:
        return _shaped_sweep(data, table, source, base_dir)
    missing = [key for key in REQUIRED_KEYS if key not in table]
    if missing:
        raise ValueError(f"{source}: [sweep] needs {', '.join(missing)}; see examples/sweep.toml")
    sweep = Sweep(
        engines=_axis(table, "engines", _engine_name, source),
        batch_sizes=_axis(table, "batch_sizes", _batch_size, source),
        output_lengths=_axis(table, "output_lengths", parse_output_lengths, source),
        num_requests=_int_setting(table, "num_requests", source, minimum=1),
        prompts=_axis(table, "prompts", lambda value: parse_prompts(value, base_dir), source, default=("shipped",)),
        arrivals=_axis(table, "arrivals", parse_arrivals, source, default=("offline",)),
        seed=_int_setting(table, "seed", source, minimum=None, default=0),
        repeats=_setting(table, "repeats", source, minimum=1, default=None),
        capacity=_capacity(data["capacity"], source) if "capacity" in data else None,
    )
    _check_cases(sweep, source)
    return sweep


def _shaped_sweep(data: Mapping[str, object], table: Mapping[str, object], source: str, base_dir: Path | None) -> Sweep:
    """A sweep whose workloads are a ``[workload]`` table or ``[[workload]]`` tables (``shaped.parse_shape``)."""
    replaced = [key for key in SHAPED_REPLACES if key in table]
    if replaced:
        raise ValueError(
            f"{source}: [workload] sets the requests, so sweep.{', sweep.'.join(replaced)} cannot apply; "
            "remove them (or the [workload] section)"
        )
    if "capacity" in data:
        raise ValueError(
            f"{source}: [capacity] searches the load of prompts x output_lengths workloads, not of a [workload] "
            "section; drop one of the two sections"
        )
    missing = [key for key in SHAPED_REQUIRED_KEYS if key not in table]
    if missing:
        raise ValueError(f"{source}: [sweep] needs {', '.join(missing)}; see docs/workloads.md")
    entries = data["workload"]
    sweep = Sweep(
        engines=_axis(table, "engines", _engine_name, source),
        batch_sizes=_axis(table, "batch_sizes", _batch_size, source),
        arrivals=_axis(table, "arrivals", parse_arrivals, source, default=("offline",)),
        seed=_int_setting(table, "seed", source, minimum=None, default=0),
        repeats=_setting(table, "repeats", source, minimum=1, default=None),
        workloads=_axis(
            {"workload": [entries] if isinstance(entries, Mapping) else entries},
            "workload",
            lambda value: parse_shape(value, base_dir),
            source,
            name="workload",
        ),
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
        if key not in ("sweep", "capacity", "workload"):
            raise ValueError(
                f"{source}: unknown top-level key {key!r}; put every setting under [sweep] (or [workload], [capacity])"
            )
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
    name: str | None = None,
) -> tuple[Entry, ...]:
    name = name or f"sweep.{key}"
    values = table.get(key, default)
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"{source}: {name} must be a list in brackets, got {values!r}")
    if not values:
        raise ValueError(f"{source}: {name} is empty; list at least one entry or leave the key out")
    entries = []
    for index, value in enumerate(values):
        try:
            entry = parse(value)
        except ValueError as err:
            raise ValueError(f"{source}: {name}[{index}]: {err}") from None
        if entry in entries:
            raise ValueError(f"{source}: {name}[{index}] repeats an earlier entry ({value!r}); remove one")
        entries.append(entry)
    return tuple(entries)


def _engine_name(value: object) -> str:
    if not isinstance(value, str) or not value or any(char.isspace() for char in value):
        raise ValueError(f'an engine is a name such as "inflight", without spaces; got {value!r}')
    return value


def _batch_size(value: object) -> int:
    if not is_int(value) or value < 1:
        raise ValueError(f"a batch size is an integer >= 1, got {value!r}")
    return value


def _setting(
    table: Mapping[str, object], key: str, source: str, minimum: int | None, default: int | None = None
) -> int | None:
    """``sweep.<key>``, or ``default``; None when neither is set."""
    value = table.get(key, default)
    if value is None:
        return None
    return _int_setting(table, key, source, minimum, default)


def _int_setting(
    table: Mapping[str, object], key: str, source: str, minimum: int | None, default: int | None = None
) -> int:
    """``sweep.<key>``, or ``default``: an integer of at least ``minimum``, whichever it is."""
    value = table.get(key, default)
    if not is_int(value) or (minimum is not None and value < minimum):
        at_least = f" >= {minimum}" if minimum is not None else ""
        raise ValueError(f"{source}: sweep.{key} must be an integer{at_least}, got {value!r}")
    return value


def _capacity(table: object, source: str) -> CapacitySettings:
    if not isinstance(table, Mapping):
        raise ValueError(f"{source}: capacity must be a table: a [capacity] section, got {table!r}")
    reject_unknown_keys(table, CAPACITY_KEYS, "capacity key", source)
    by = table.get("by")
    if by is not None and by not in CAPACITY_KINDS:
        raise ValueError(f"{source}: capacity.by must be {' or '.join(map(repr, CAPACITY_KINDS))}, got {by!r}")
    target_share = table.get("target_share")
    if target_share is not None and not (is_number(target_share) and 0 < target_share <= 1):
        raise ValueError(
            f"{source}: capacity.target_share is the share of requests that must meet the SLO, in (0, 1] "
            f"(0.9 for 90%), got {target_share!r}"
        )
    tolerance = table.get("tolerance")
    if tolerance is not None and not (is_number(tolerance) and tolerance > 0):
        raise ValueError(f"{source}: capacity.tolerance must be a number > 0 (0.1 for 10%), got {tolerance!r}")
    return CapacitySettings(
        by,
        None if target_share is None else float(target_share),
        None if tolerance is None else float(tolerance),
    )


def _check_cases(sweep: Sweep, source: str) -> None:
    try:
        cases = sweep.cases()
    except ValueError as err:
        axes = "workload x sweep.arrivals" if sweep.workloads else "sweep.prompts x sweep.output_lengths"
        raise ValueError(f"{source}: {axes}: {err}") from None
    seen: set[str] = set()
    for case in cases:
        if case.id in seen:
            raise ValueError(
                f"{source}: two cases share the id {case.id!r}; their entries differ by less than the id shows "
                "(e.g. two JSONL files with the same name, or rates that round alike); make them distinct"
            )
        seen.add(case.id)


def _check_prompt_files(sweep: Sweep, source: str) -> None:
    for index, shape in enumerate(sweep.workloads):
        if isinstance(shape, Trace):
            try:
                shape.lines()
            except ValueError as err:
                raise ValueError(f"{source}: workload[{index}]: {err}") from None
    for index, prompts in enumerate(sweep.prompts):
        if not isinstance(prompts, JsonlPrompts):
            continue
        try:
            prompts.lines()
            if any(lengths.kind == "from_file" for lengths in sweep.output_lengths):
                prompts.output_lengths()
        except ValueError as err:
            raise ValueError(f"{source}: sweep.prompts[{index}]: {err}") from None
