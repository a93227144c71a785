"""Length distributions: how many new tokens a request asks for, and how long a synthetic prompt is.

Both are drawn from the caller's ``random.Random``, so one seed gives one
workload; the plain-data forms (``16``, ``{kind = "uniform", low = 4, high = 24}``)
are parsed here too.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from perfsuite.workload.checks import check_bounds, check_int, check_positive, is_int, is_number, reject_unknown_keys

LENGTH_KINDS = ("fixed", "uniform", "exponential", "from_file")
PROMPT_LENGTH_KINDS = ("fixed", "uniform", "normal")

# kind -> (required keys, optional keys with their defaults); "tokens" sets low = high.
KindKeys = dict[str, tuple[tuple[str, ...], dict[str, object]]]
_OUTPUT_LENGTH_KEYS: KindKeys = {
    "fixed": (("tokens",), {}),
    "uniform": (("low", "high"), {}),
    "exponential": (("mean", "high"), {"low": 1}),
    "from_file": ((), {}),
}
_PROMPT_LENGTH_KEYS: KindKeys = {
    "fixed": (("tokens",), {}),
    "uniform": (("low", "high"), {}),
    "normal": (("mean", "stddev", "high"), {"low": 1}),
}


@dataclass(frozen=True, slots=True)
class OutputLengths:
    """How many new tokens each request asks for.

    - ``fixed``: every request asks for ``high``;
    - ``uniform``: uniform in ``low..high``;
    - ``exponential``: exponential with mean ``mean``, at least ``low`` and capped
      at ``high`` (like Anyscale's benchmark: mean 64, cap 256);
    - ``from_file``: each line's ``output_len`` in a JSONL prompt file.
    """

    kind: str = "uniform"
    low: int = 8
    high: int = 128
    mean: float = 64.0

    def __post_init__(self) -> None:
        if self.kind not in LENGTH_KINDS:
            raise ValueError(f"output_lengths.kind must be one of {', '.join(LENGTH_KINDS)}, got {self.kind!r}")
        # The aliases name the CLI's flags, which set low and high.
        check_bounds(self.low, self.high, "output_lengths", "low (min_new_tokens)", "high (max_new_tokens)")
        check_positive(self.mean, "output_lengths.mean")

    @property
    def label(self) -> str:
        if self.kind == "exponential":
            return f"out_exp{self.mean:g}_{self.low}_{self.high}"
        if self.kind == "from_file":
            return "out_file"
        return _label("out", self.kind, self.low, self.high)

    def sample(self, rng: random.Random, count: int) -> list[int]:
        if self.kind == "from_file":
            raise ValueError("output_lengths kind 'from_file' is read from the JSONL prompt file, not drawn")
        return _sample(self.kind, self.low, self.high, rng, count, lambda: rng.expovariate(1 / self.mean))


@dataclass(frozen=True, slots=True)
class PromptLengths:
    """How many prompt tokens each synthetic prompt has.

    - ``fixed``: every prompt has ``high`` tokens;
    - ``uniform``: uniform in ``low..high``;
    - ``normal``: normal with ``mean`` and ``stddev``, rounded and clipped to ``low..high``.
    """

    kind: str
    low: int
    high: int
    mean: float = 0.0
    stddev: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in PROMPT_LENGTH_KINDS:
            raise ValueError(f"prompts.kind must be one of {', '.join(PROMPT_LENGTH_KINDS)}, got {self.kind!r}")
        check_bounds(self.low, self.high, "prompts")
        if not is_number(self.mean):
            raise ValueError(f"prompts.mean must be a number, got {self.mean!r}")
        if not is_number(self.stddev) or self.stddev < 0:
            raise ValueError(f"prompts.stddev must be >= 0, got {self.stddev!r}")

    @property
    def label(self) -> str:
        if self.kind == "normal":
            return f"in_normal{self.mean:g}sd{self.stddev:g}_{self.low}_{self.high}"
        return _label("in", self.kind, self.low, self.high)

    def sample(self, rng: random.Random, count: int) -> list[int]:
        return _sample(self.kind, self.low, self.high, rng, count, lambda: rng.gauss(self.mean, self.stddev))


def _label(prefix: str, kind: str, low: int, high: int) -> str:
    return f"{prefix}{high}" if kind == "fixed" else f"{prefix}_uniform{low}_{high}"


def _sample(kind: str, low: int, high: int, rng: random.Random, count: int, draw: Callable[[], float]) -> list[int]:
    """``fixed``: ``high`` each time; ``uniform``: ``low..high``; else ``draw()`` rounded and clipped to them."""
    if kind == "fixed":
        return [high] * count
    if kind == "uniform":
        return [rng.randint(low, high) for _ in range(count)]
    return [min(high, max(low, round(draw()))) for _ in range(count)]


def parse_output_lengths(value: object) -> OutputLengths:
    """``16`` (fixed), or a table: ``{kind = "fixed", tokens = 16}``, ``{kind = "uniform", low = 4, high = 24}``,
    ``{kind = "exponential", mean = 8, high = 32, low = 1}``, ``{kind = "from_file"}``."""
    if is_int(value):
        value = {"kind": "fixed", "tokens": value}
    if not isinstance(value, Mapping):
        raise ValueError(f"output_lengths must be a token count or a table with a kind, got {value!r}")
    kind, fields = _length_fields(value, _OUTPUT_LENGTH_KEYS, "output_lengths")
    return OutputLengths(kind, **fields)


def parse_prompt_lengths(table: Mapping[str, object]) -> PromptLengths:
    """``{kind = "fixed", tokens = 32}``, ``{kind = "uniform", low = 16, high = 64}``,
    ``{kind = "normal", mean = 64, stddev = 16, high = 128}`` (``low`` defaults to 1)."""
    kind, fields = _length_fields(table, _PROMPT_LENGTH_KEYS, "prompts")
    return PromptLengths(kind, **fields)


def _length_fields(table: Mapping[str, object], keys: KindKeys, name: str) -> tuple[str, dict[str, Any]]:
    """The table's kind and its fields, as given: the lengths' own checks (``__post_init__``) judge the values."""
    kind = table.get("kind")
    if kind not in keys:
        raise ValueError(f"{name}.kind must be one of {', '.join(keys)}, got {kind!r}")
    required, optional = keys[kind]
    reject_unknown_keys(table, ("kind", *required, *optional), f"{name} key for kind {kind!r}")
    missing = [key for key in required if key not in table]
    if missing:
        raise ValueError(f"{name} kind {kind!r} needs {', '.join(missing)}")
    fields = {**optional, **{key: item for key, item in table.items() if key != "kind"}}
    if "tokens" in fields:
        check_int(fields["tokens"], f"{name}.tokens")
        fields["low"] = fields["high"] = fields.pop("tokens")
    return kind, fields
