"""Workloads whose requests relate to each other: shared-prefix groups, multi-turn chat, a replayed trace.

A ``ShapedWorkload`` joins one of these shapes with arrivals and a seed and
serves the same callers as ``Workload`` (``requests``, ``label``,
``max_concurrency``). Its prompts are token ids drawn from a ``Vocab``, so
the sharing structure is exact whatever a tokenizer would merge. Built from a
sweep config's ``[workload]`` table (``parse_shape``) or from ``perfsuite run
--workload kind:key=value,...`` (``parse_workload_option``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perfsuite.engine.types import Request
from perfsuite.workload.arrivals import Arrivals
from perfsuite.workload.checks import is_int, reject_unknown_keys
from perfsuite.workload.limits import check_arrival_times
from perfsuite.workload.multi_turn import MULTI_TURN_KEYS, MultiTurn
from perfsuite.workload.prompts import Vocab
from perfsuite.workload.shared_prefix import SHARED_PREFIX_KEYS, SharedPrefix
from perfsuite.workload.trace import TRACE_KEYS, Trace

Shape = SharedPrefix | MultiTurn | Trace

# kind -> (its class, required keys, every key)
SHAPE_KINDS: dict[str, tuple[type, tuple[str, ...], tuple[str, ...]]] = {
    "shared_prefix": (SharedPrefix, ("groups", "prompts", "prefix"), SHARED_PREFIX_KEYS),
    "multi_turn": (MultiTurn, ("sessions", "turns"), MULTI_TURN_KEYS),
    "trace": (Trace, ("path",), TRACE_KEYS),
}


@dataclass(frozen=True, slots=True)
class ShapedWorkload:
    """A shape's requests under one seed; arrivals place shared-prefix requests and multi-turn sessions' first
    turns (later turns follow their answers). A trace's arrivals are its own timestamps."""

    shape: Shape
    arrivals: Arrivals = field(default_factory=Arrivals)
    seed: int = 0

    def __post_init__(self) -> None:
        if not is_int(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if isinstance(self.shape, Trace) and not self.arrivals.is_offline:
            raise ValueError(
                f"a trace's timestamps are its arrivals, so arrivals {self.arrivals.label!r} cannot apply; "
                "leave arrivals out (scale the trace's time with time_scale)"
            )
        if self.arrivals.rate is not None:
            self._check_arrival_horizon()

    def _check_arrival_horizon(self) -> None:
        """Each shared-prefix request, or each session's last turn (at the least), arrives within the horizon."""
        if isinstance(self.shape, MultiTurn):
            delay, turn = self.shape.last_turn_delay, self.shape.turns - 1
            times = [start + delay for start in self._first_arrivals()]
            names = [f"s{session}-t{turn}" for session in range(self.shape.sessions)]
            fix = f"raise arrivals.rate above {self.arrivals.rate:g} req/s, or lower sessions, turns or think_time"
        else:
            times = self._first_arrivals()
            names = [f"{index + 1} of {len(times)}" for index in range(len(times))]
            fix = f"raise arrivals.rate above {self.arrivals.rate:g} req/s, or lower groups or prompts"
        check_arrival_times(times, names, fix)

    def _first_arrivals(self) -> list[float]:
        """When each shared-prefix request, or each multi-turn session's first turn, arrives."""
        count = self.shape.sessions if isinstance(self.shape, MultiTurn) else self.shape.num_requests
        return self.arrivals.times(random.Random(self.seed + 1), count)

    @property
    def num_requests(self) -> int:
        return self.shape.num_requests

    def check_context(self, max_context: int) -> None:
        """Refuse a workload whose longest request cannot fit the model's context, before any prompt is built."""
        self.shape.check_context(max_context)

    @property
    def max_concurrency(self) -> int | None:
        return self.arrivals.concurrency

    @property
    def label(self) -> str:
        if isinstance(self.shape, Trace):
            return self.shape.label
        return f"{self.shape.label}-{self.arrivals.label}"

    def requests(
        self,
        tokenize: Callable[[str], Sequence[int]] | None = None,
        prompts: Sequence[str] | None = None,
        *,
        vocab: Vocab | None = None,
    ) -> list[Request]:
        """The requests; ``tokenize`` is unused (the prompts are token ids), ``prompts`` refused."""
        if prompts is not None:
            raise ValueError("prompts= replaces the shipped prompt set; this workload's prompts are synthetic")
        if vocab is None:
            raise ValueError("this workload's prompts are token ids; pass vocab=Vocab(size=..., special_ids=...)")
        if isinstance(self.shape, Trace):
            return self.shape.requests(vocab, self.seed)
        return self.shape.requests(vocab, self.seed, self._first_arrivals())


def parse_shape(table: object, base_dir: Path | None = None) -> Shape:
    """``{kind = "shared_prefix", groups = 8, prompts = 8, prefix = 256, suffix = 32, output = 32}``,
    ``{kind = "multi_turn", sessions = 4, turns = 3, ...}``, ``{kind = "trace", path = "trace.jsonl", ...}``
    (a trace's path is relative to ``base_dir``)."""
    if not isinstance(table, Mapping):
        raise ValueError(f"a workload is a table with kind = {' or '.join(map(repr, SHAPE_KINDS))}, got {table!r}")
    kind = table.get("kind")
    if kind not in SHAPE_KINDS:
        raise ValueError(f"workload kind must be one of {', '.join(map(repr, SHAPE_KINDS))}, got {kind!r}")
    cls, required, known = SHAPE_KINDS[kind]
    fields = {key: value for key, value in table.items() if key != "kind"}
    reject_unknown_keys(fields, known, f"key for workload kind {kind!r}")
    missing = [key for key in required if key not in fields]
    if missing:
        raise ValueError(f"workload kind {kind!r} needs {', '.join(missing)}; it takes {', '.join(known)}")
    if kind == "trace":
        if not isinstance(fields["path"], str) or not fields["path"]:
            raise ValueError(f"trace path must be the JSONL trace's path, got {fields['path']!r}")
        fields["path"] = Path(base_dir or ".") / fields["path"]
    return cls(**fields)


def parse_workload_option(text: str) -> Shape:
    """``shared_prefix:groups=8,prompts=8,prefix=256``; ``multi_turn:sessions=4,turns=3,think_time=0.5``;
    ``trace:PATH`` or ``trace:PATH,time_scale=0.5,max_requests=100``."""
    kind, colon, rest = text.partition(":")
    if not colon or kind not in SHAPE_KINDS:
        raise ValueError(
            f"--workload takes KIND:KEY=VALUE,... with KIND one of {', '.join(SHAPE_KINDS)} "
            f"(e.g. shared_prefix:groups=8,prompts=8,prefix=256 or trace:trace.jsonl), got {text!r}"
        )
    table: dict[str, object] = {"kind": kind}
    for index, item in enumerate(part for part in rest.split(",") if part):
        key, equals, value = item.partition("=")
        if not equals and kind == "trace" and index == 0:
            key, value = "path", item
        elif not equals:
            known = ", ".join(SHAPE_KINDS[kind][2])
            raise ValueError(f"--workload {kind}: {item!r} is not KEY=VALUE; it takes {known}")
        if key in table:
            raise ValueError(f"--workload {kind}: {key} is given twice; give it once")
        table[key] = value if key == "path" else _number(key, value)
    return parse_shape(table)


def _number(key: str, value: str) -> int | float:
    for convert in (int, float):
        try:
            return convert(value)
        except ValueError:
            pass
    raise ValueError(f"--workload: {key}={value!r} is not a number")
