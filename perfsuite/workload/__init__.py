"""Seeded workloads: which prompts arrive when, asking for how many tokens.

Pure Python; a tokenizer is passed in as a function. A workload has three
independent parts, each a frozen dataclass:

- prompts: the shipped prompt set, synthetic token ids of drawn lengths, or a
  user's JSONL file;
- output lengths: how many new tokens each request asks for;
- arrivals: offline, a Poisson or gamma process at a rate, or a fixed concurrency.

``Workload.from_dict`` builds one from plain data (a sweep config's entries).
Every bad value raises ValueError naming the field.
"""

from __future__ import annotations

import difflib
import json
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from perfsuite.engine.types import Request, SamplingParams

LENGTH_KINDS = ("fixed", "uniform", "exponential", "from_file")
PROMPT_LENGTH_KINDS = ("fixed", "uniform", "normal")
JSONL_KEYS = ("prompt", "output_len", "max_new_tokens")
WORKLOAD_KEYS = ("arrivals", "num_requests", "output_lengths", "prompts", "seed")


def shipped_prompts() -> tuple[str, ...]:
    """The small prompt set shipped with perfsuite, one prompt a line."""
    text = resources.files("perfsuite").joinpath("data/prompts.txt").read_text(encoding="utf-8")
    # Prompts keep their trailing space ("Fun fact of the day: "), as seed 000 used them.
    return tuple(line.rstrip("\n") for line in text.splitlines() if line.strip())


# --- checks shared by the dataclasses -------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _check_int(value: object, name: str, minimum: int = 1) -> None:
    if not _is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_positive(value: object, name: str) -> None:
    if not _is_number(value) or value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


def _check_bounds(low: object, high: object, name: str, low_alias: str = "low", high_alias: str = "high") -> None:
    _check_int(low, f"{name}.low")
    _check_int(high, f"{name}.high")
    if low > high:
        raise ValueError(f"{name} needs low <= high, got {low_alias}={low}, {high_alias}={high}")


def reject_unknown_keys(keys: Iterable[str], known: Iterable[str], what: str) -> None:
    """Raise ``unknown <what> 'arival' (did you mean 'arrivals'?); known keys: ...`` for the first stranger."""
    known = sorted(known)
    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown {what} {key!r}{hint}; known keys: {', '.join(known)}")


# --- output lengths -------------------------------------------------------------------


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
        _check_bounds(self.low, self.high, "output_lengths", "low (min_new_tokens)", "high (max_new_tokens)")
        _check_positive(self.mean, "output_lengths.mean")

    @property
    def label(self) -> str:
        if self.kind == "fixed":
            return f"out{self.high}"
        if self.kind == "uniform":
            return f"out_uniform{self.low}_{self.high}"
        if self.kind == "exponential":
            return f"out_exp{self.mean:g}_{self.low}_{self.high}"
        return "out_file"

    def sample(self, rng: random.Random, count: int) -> list[int]:
        if self.kind == "fixed":
            return [self.high] * count
        if self.kind == "uniform":
            return [rng.randint(self.low, self.high) for _ in range(count)]
        if self.kind == "exponential":
            return [min(self.high, max(self.low, round(rng.expovariate(1 / self.mean)))) for _ in range(count)]
        raise ValueError("output_lengths kind 'from_file' is read from the JSONL prompt file, not drawn")


# --- arrivals -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arrivals:
    """When requests arrive.

    - offline (the default): all at t0;
    - ``rate`` req/s: gaps drawn from a gamma distribution with shape
      ``burstiness`` and mean ``1/rate``, as vLLM's ``--request-rate`` and
      ``--burstiness``: 1 is a Poisson process, below 1 burstier, above 1 smoother;
    - ``concurrency=N``: a closed loop; all requests are there at t0 and the run
      keeps at most N in flight (pass ``max_concurrency`` to ``Engine.run``).
    """

    rate: float | None = None
    burstiness: float = 1.0
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.rate is not None:
            _check_positive(self.rate, "arrivals.rate")
        _check_positive(self.burstiness, "arrivals.burstiness")
        if self.concurrency is not None:
            _check_int(self.concurrency, "arrivals.concurrency")
        if self.rate is not None and self.concurrency is not None:
            raise ValueError(
                "arrivals.rate and arrivals.concurrency are mutually exclusive: a rate sends requests open-loop, "
                "a concurrency keeps N in flight; set one of them"
            )
        if self.burstiness != 1 and self.rate is None:
            raise ValueError(
                f"arrivals.burstiness={self.burstiness} needs arrivals.rate; it shapes the gaps between arrivals"
            )

    @property
    def is_offline(self) -> bool:
        return self.rate is None and self.concurrency is None

    @property
    def label(self) -> str:
        if self.concurrency is not None:
            return f"c{self.concurrency}"
        if self.rate is None:
            return "offline"
        if self.burstiness == 1:
            return f"{self.rate:g}rps"
        return f"{self.rate:g}rps_burst{self.burstiness:g}"

    def times(self, rng: random.Random, count: int) -> list[float]:
        if self.rate is None:
            return [0.0] * count
        now, times = 0.0, []
        for _ in range(count):
            times.append(now)
            now += self._gap(rng)
        return times

    def _gap(self, rng: random.Random) -> float:
        if self.burstiness == 1:
            # expovariate, not gammavariate(1, ...): the same draws as before burstiness
            # existed, so stored baselines keep their arrival times.
            return rng.expovariate(self.rate)
        return rng.gammavariate(self.burstiness, 1 / (self.rate * self.burstiness))


# --- prompts --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShippedPrompts:
    """The prompt set shipped with perfsuite, tokenized by the caller."""

    @property
    def label(self) -> str:
        return "in_shipped"

    @property
    def description(self) -> str:
        return "the shipped prompt set"


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
        _check_bounds(self.low, self.high, "prompts")
        if not _is_number(self.mean):
            raise ValueError(f"prompts.mean must be a number, got {self.mean!r}")
        if not _is_number(self.stddev) or self.stddev < 0:
            raise ValueError(f"prompts.stddev must be >= 0, got {self.stddev!r}")

    @property
    def label(self) -> str:
        if self.kind == "fixed":
            return f"in{self.high}"
        if self.kind == "uniform":
            return f"in_uniform{self.low}_{self.high}"
        return f"in_normal{self.mean:g}sd{self.stddev:g}_{self.low}_{self.high}"

    def sample(self, rng: random.Random, count: int) -> list[int]:
        if self.kind == "fixed":
            return [self.high] * count
        if self.kind == "uniform":
            return [rng.randint(self.low, self.high) for _ in range(count)]
        return [min(self.high, max(self.low, round(rng.gauss(self.mean, self.stddev)))) for _ in range(count)]


@dataclass(frozen=True, slots=True)
class Vocab:
    """The token ids synthetic prompts draw from: ``first_id..size-1`` minus ``special_ids``.

    The caller names the ids to avoid (EOS, BOS, padding) because only the model
    knows them; a stop id inside a prompt would change nothing, but BOS or padding
    mid-prompt makes some models misbehave.
    """

    size: int
    special_ids: tuple[int, ...] = ()
    first_id: int = 0

    def __post_init__(self) -> None:
        _check_int(self.size, "vocab.size")
        _check_int(self.first_id, "vocab.first_id", minimum=0)
        if self.first_id >= self.size:
            raise ValueError(f"vocab.first_id must be below vocab.size={self.size}, got {self.first_id}")
        for token_id in self.special_ids:
            _check_int(token_id, "each of vocab.special_ids", minimum=0)
        object.__setattr__(self, "special_ids", tuple(sorted(set(self.special_ids))))
        if self.num_allowed < 1:
            raise ValueError(f"vocab leaves no token id to draw: ids {self.first_id}..{self.size - 1} are all special")

    @property
    def skipped_ids(self) -> tuple[int, ...]:
        return tuple(i for i in self.special_ids if self.first_id <= i < self.size)

    @property
    def num_allowed(self) -> int:
        return self.size - self.first_id - len(self.skipped_ids)

    def draw(self, rng: random.Random, count: int) -> tuple[int, ...]:
        skipped, num_allowed = self.skipped_ids, self.num_allowed
        return tuple(_nth_allowed(self.first_id + rng.randrange(num_allowed), skipped) for _ in range(count))


def _nth_allowed(token_id: int, skipped: tuple[int, ...]) -> int:
    """Map a draw from a range with the skipped ids removed onto the real id (``skipped`` sorted)."""
    for special in skipped:
        if special > token_id:
            break
        token_id += 1
    return token_id


@dataclass(frozen=True, slots=True)
class SyntheticPrompts:
    """Prompts of exactly the drawn number of tokens, made of token ids, not text.

    Building ids directly keeps the length exact whatever the tokenizer would
    have merged; ``Workload.requests`` needs a ``Vocab`` for them.
    """

    lengths: PromptLengths

    @property
    def label(self) -> str:
        return self.lengths.label

    @property
    def description(self) -> str:
        return "synthetic token ids"

    def token_ids(self, rng: random.Random, count: int, vocab: Vocab) -> list[tuple[int, ...]]:
        return [vocab.draw(rng, length) for length in self.lengths.sample(rng, count)]


@dataclass(frozen=True, slots=True)
class PromptLine:
    """One line of a JSONL prompt file."""

    text: str
    output_len: int | None
    line_number: int


@dataclass(frozen=True, slots=True)
class JsonlPrompts:
    """A user's prompts: one JSON object a line, ``{"prompt": "...", "output_len": 64}``.

    ``output_len`` (or its alias ``max_new_tokens``) is optional unless the
    output lengths are ``from_file``. Blank lines are skipped.
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def label(self) -> str:
        return f"in_{self.path.stem}"

    @property
    def description(self) -> str:
        return f"the JSONL file {self.path}"

    def lines(self) -> tuple[PromptLine, ...]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as err:
            raise ValueError(f"cannot read prompt file {self.path}: {err.strerror}") from None
        except UnicodeDecodeError:
            raise ValueError(f"{self.path} is not UTF-8 text; save the prompt file as UTF-8") from None
        # split("\n"), not splitlines(): a JSON string may hold a raw U+2028.
        numbered = [(number, line) for number, line in enumerate(text.split("\n"), start=1) if line.strip()]
        if not numbered:
            raise ValueError(
                f"{self.path} has no prompts; write one JSON object per line, "
                'e.g. {"prompt": "Hello", "output_len": 32}'
            )
        return tuple(_parse_prompt_line(self.path, number, line) for number, line in numbered)

    def output_lengths(self) -> tuple[int, ...]:
        lines = self.lines()
        for line in lines:
            if line.output_len is None:
                raise ValueError(
                    f'{self.path} line {line.line_number}: "output_len" is missing; '
                    "output_lengths kind 'from_file' needs it on every line"
                )
        return tuple(line.output_len for line in lines)


def _parse_prompt_line(path: Path, number: int, line: str) -> PromptLine:
    where = f"{path} line {number}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        message = f"not valid JSON ({err.msg}, column {err.colno}); write one object per line"
        raise ValueError(f"{where}: {message}") from None
    if not isinstance(obj, dict):
        raise ValueError(f'{where}: expected a JSON object like {{"prompt": "..."}}, got {json.dumps(obj)}')
    try:
        reject_unknown_keys(obj, JSONL_KEYS, "key")
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    prompt = obj.get("prompt")
    if "prompt" not in obj:
        raise ValueError(f'{where}: "prompt" is missing; each line needs {{"prompt": "<text>"}}')
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f'{where}: "prompt" must be a non-empty string, got {json.dumps(prompt)}')
    if "output_len" in obj and "max_new_tokens" in obj:
        raise ValueError(f'{where}: "output_len" and "max_new_tokens" mean the same; give one of them')
    key = "max_new_tokens" if "max_new_tokens" in obj else "output_len"
    output_len = obj.get(key)
    if output_len is not None and (not _is_int(output_len) or output_len < 1):
        raise ValueError(f'{where}: "{key}" must be an integer >= 1, got {json.dumps(output_len)}')
    return PromptLine(prompt, output_len, number)


PromptSource = ShippedPrompts | SyntheticPrompts | JsonlPrompts


# --- the workload ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Workload:
    """Prompts, output lengths and arrival times, all from one seed.

    EOS is ignored so every request produces exactly its drawn length and runs
    are comparable.
    """

    num_requests: int = 32
    lengths: OutputLengths = field(default_factory=OutputLengths)
    arrivals: Arrivals = field(default_factory=Arrivals)
    seed: int = 0
    prompts: PromptSource = field(default_factory=ShippedPrompts)

    def __post_init__(self) -> None:
        _check_int(self.num_requests, "num_requests")
        if not _is_int(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if self.lengths.kind == "from_file" and not isinstance(self.prompts, JsonlPrompts):
            raise ValueError(
                "output_lengths kind 'from_file' reads output_len from a JSONL prompt file, "
                f"but the prompts are {self.prompts.description}; use JSONL prompts "
                '(prompts = {kind = "jsonl", path = "..."} in a config) or another output_lengths kind'
            )

    @classmethod
    def from_dict(cls, spec: Mapping[str, object], *, base_dir: Path | None = None) -> Workload:
        """A workload from plain data; each key as in ``parse_prompts``, ``parse_output_lengths``, ``parse_arrivals``.

        ``{"num_requests": 8, "seed": 0, "prompts": 32, "output_lengths": {"kind": "uniform", "low": 4,
        "high": 24}, "arrivals": {"rate": 4.0}}``; a JSONL path is relative to ``base_dir``.
        """
        if not isinstance(spec, Mapping):
            raise ValueError(f"a workload spec must be a table of {', '.join(WORKLOAD_KEYS)}, got {spec!r}")
        reject_unknown_keys(spec, WORKLOAD_KEYS, "workload key")
        defaults = cls()
        return cls(
            num_requests=spec.get("num_requests", defaults.num_requests),
            lengths=parse_output_lengths(spec["output_lengths"]) if "output_lengths" in spec else defaults.lengths,
            arrivals=parse_arrivals(spec["arrivals"]) if "arrivals" in spec else defaults.arrivals,
            seed=spec.get("seed", defaults.seed),
            prompts=parse_prompts(spec["prompts"], base_dir) if "prompts" in spec else defaults.prompts,
        )

    @property
    def max_concurrency(self) -> int | None:
        """Pass to ``Engine.run(requests, max_concurrency=...)``; None for an open loop."""
        return self.arrivals.concurrency

    @property
    def label(self) -> str:
        """A readable id such as ``in32-out_uniform4_24-4rps``."""
        return f"{self.prompts.label}-{self.lengths.label}-{self.arrivals.label}"

    def output_lengths(self) -> list[int]:
        if self.lengths.kind == "from_file":
            from_file = self.prompts.output_lengths()
            return [from_file[index % len(from_file)] for index in range(self.num_requests)]
        return self.lengths.sample(random.Random(self.seed), self.num_requests)

    def arrival_times(self) -> list[float]:
        return self.arrivals.times(random.Random(self.seed + 1), self.num_requests)

    def prompt_token_ids(
        self,
        tokenize: Callable[[str], Sequence[int]] | None = None,
        texts: Sequence[str] | None = None,
        vocab: Vocab | None = None,
    ) -> list[tuple[int, ...]]:
        """One prompt per request; text prompts repeat in order when there are fewer than requests."""
        if isinstance(self.prompts, SyntheticPrompts):
            if texts is not None:
                raise ValueError("prompts= replaces the shipped prompt set; this workload's prompts are synthetic")
            if vocab is None:
                raise ValueError("synthetic prompts need vocab=Vocab(size=..., special_ids=(eos, bos, ...))")
            # A string seed keeps this stream apart from the lengths' and arrivals' integer seeds.
            return self.prompts.token_ids(random.Random(f"{self.seed}:prompts"), self.num_requests, vocab)
        texts = self._texts(texts)
        if tokenize is None:
            raise ValueError(f"{self.prompts.description} is text; pass tokenize=")
        token_ids = [tuple(tokenize(text)) for text in texts]
        return [token_ids[index % len(texts)] for index in range(self.num_requests)]

    def _texts(self, override: Sequence[str] | None) -> tuple[str, ...]:
        if isinstance(self.prompts, JsonlPrompts):
            if override is not None:
                raise ValueError(f"prompts= replaces the shipped prompt set; this workload reads {self.prompts.path}")
            return tuple(line.text for line in self.prompts.lines())
        texts = shipped_prompts() if override is None else tuple(override)
        if not texts:
            raise ValueError("the prompt set is empty; pass at least one prompt")
        return texts

    def requests(
        self,
        tokenize: Callable[[str], Sequence[int]] | None = None,
        prompts: Sequence[str] | None = None,
        *,
        vocab: Vocab | None = None,
    ) -> list[Request]:
        """The requests, ``req-0`` onwards; ``prompts`` (texts) replaces the shipped set."""
        token_ids = self.prompt_token_ids(tokenize, prompts, vocab)
        return [
            Request(
                request_id=f"req-{index}",
                prompt_token_ids=token_ids[index],
                sampling_params=SamplingParams(max_new_tokens=length, ignore_eos=True),
                arrival_time=arrival,
            )
            for index, (length, arrival) in enumerate(zip(self.output_lengths(), self.arrival_times()))
        ]


def mixed_workload(num_requests: int = 32, min_new_tokens: int = 8, max_new_tokens: int = 128, seed: int = 0) -> Workload:
    """The default mixed workload: uniform 8..128 new tokens, all at t0."""
    return Workload(num_requests, OutputLengths("uniform", min_new_tokens, max_new_tokens), seed=seed)


# --- plain data -> parts (for Workload.from_dict and sweep configs) ------------------------

# kind -> (required keys, optional keys with their defaults); "tokens" sets low = high.
_OUTPUT_LENGTH_KEYS: dict[str, tuple[tuple[str, ...], dict[str, object]]] = {
    "fixed": (("tokens",), {}),
    "uniform": (("low", "high"), {}),
    "exponential": (("mean", "high"), {"low": 1}),
    "from_file": ((), {}),
}
_PROMPT_LENGTH_KEYS: dict[str, tuple[tuple[str, ...], dict[str, object]]] = {
    "fixed": (("tokens",), {}),
    "uniform": (("low", "high"), {}),
    "normal": (("mean", "stddev", "high"), {"low": 1}),
}


def parse_output_lengths(value: object) -> OutputLengths:
    """``16`` (fixed), or a table: ``{kind = "fixed", tokens = 16}``, ``{kind = "uniform", low = 4, high = 24}``,
    ``{kind = "exponential", mean = 8, high = 32, low = 1}``, ``{kind = "from_file"}``."""
    if _is_int(value):
        value = {"kind": "fixed", "tokens": value}
    if not isinstance(value, Mapping):
        raise ValueError(f"output_lengths must be a token count or a table with a kind, got {value!r}")
    kind, fields = _length_fields(value, _OUTPUT_LENGTH_KEYS, "output_lengths")
    return OutputLengths(kind, **fields)


def parse_prompts(value: object, base_dir: Path | None = None) -> PromptSource:
    """``"shipped"``; ``32`` (synthetic, exactly 32 tokens); a table: ``{kind = "uniform", low = 16, high = 64}``,
    ``{kind = "normal", mean = 64, stddev = 16, high = 128}``, ``{kind = "jsonl", path = "prompts.jsonl"}``."""
    if value == "shipped" or value == {"kind": "shipped"}:
        return ShippedPrompts()
    if _is_int(value):
        value = {"kind": "fixed", "tokens": value}
    if not isinstance(value, Mapping):
        raise ValueError(
            f'prompts must be "shipped", a token count, or a table with kind = '
            f"{', '.join((*PROMPT_LENGTH_KINDS, 'jsonl'))}, got {value!r}"
        )
    if value.get("kind") == "jsonl":
        reject_unknown_keys(value, ("kind", "path"), "prompts key for kind 'jsonl'")
        path = value.get("path")
        if not isinstance(path, str) or not path:
            raise ValueError(f"prompts.path must be the JSONL file's path, got {path!r}")
        return JsonlPrompts(Path(base_dir or ".") / path)
    kind, fields = _length_fields(value, _PROMPT_LENGTH_KEYS, "prompts")
    return SyntheticPrompts(PromptLengths(kind, **fields))


def parse_arrivals(value: object) -> Arrivals:
    """``"offline"``; ``4.0`` (Poisson, req/s); a table: ``{rate = 4.0, burstiness = 0.5}``, ``{concurrency = 4}``."""
    if value == "offline":
        return Arrivals()
    if _is_number(value):
        return Arrivals(rate=float(value))
    if not isinstance(value, Mapping):
        raise ValueError(
            'arrivals must be "offline", a rate in requests/s, or a table of rate, burstiness, concurrency; '
            f"got {value!r}"
        )
    reject_unknown_keys(value, ("burstiness", "concurrency", "rate"), "arrivals key")
    return Arrivals(**value)


def _length_fields(
    table: Mapping[str, object], keys: dict[str, tuple[tuple[str, ...], dict[str, object]]], name: str
) -> tuple[str, dict[str, object]]:
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
        _check_int(fields["tokens"], f"{name}.tokens")
        fields["low"] = fields["high"] = fields.pop("tokens")
    return kind, fields
