"""Prompt sources: the shipped prompt set, synthetic token ids of drawn lengths, or a user's JSONL file.

Text prompts are tokenized by the caller; synthetic prompts are token ids
drawn from a ``Vocab`` the caller describes, because only the model knows its
special ids.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from perfsuite.workload.checks import check_int, is_int, reject_unknown_keys
from perfsuite.workload.jsonl import json_object, numbered_lines
from perfsuite.workload.lengths import PROMPT_LENGTH_KINDS, PromptLengths, parse_prompt_lengths

JSONL_KEYS = ("prompt", "output_len", "max_new_tokens")


def shipped_prompts() -> tuple[str, ...]:
    """The small prompt set shipped with perfsuite, one prompt a line."""
    text = resources.files("perfsuite").joinpath("data/prompts.txt").read_text(encoding="utf-8")
    # Prompts keep their trailing space ("Fun fact of the day: "), as seed 000 used them.
    return tuple(line.rstrip("\n") for line in text.splitlines() if line.strip())


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
        check_int(self.size, "vocab.size")
        check_int(self.first_id, "vocab.first_id", minimum=0)
        if self.first_id >= self.size:
            raise ValueError(f"vocab.first_id must be below vocab.size={self.size}, got {self.first_id}")
        for token_id in self.special_ids:
            check_int(token_id, "each of vocab.special_ids", minimum=0)
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

    def draw_distinct(self, rng: random.Random, count: int, what: str) -> tuple[int, ...]:
        """``count`` different ids: the first tokens that keep ``what`` (groups, sessions) from sharing a prefix."""
        if count > self.num_allowed:
            raise ValueError(
                f"{count} {what} need as many different first tokens, but the vocabulary has {self.num_allowed}; "
                f"ask for at most {self.num_allowed}"
            )
        skipped = self.skipped_ids
        return tuple(_nth_allowed(self.first_id + i, skipped) for i in rng.sample(range(self.num_allowed), count))


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
        numbered = numbered_lines(self.path, "prompt file")
        if not numbered:
            raise ValueError(
                f"{self.path} has no prompts; write one JSON object per line, "
                'e.g. {"prompt": "Hello", "output_len": 32}'
            )
        return tuple(_parse_prompt_line(self.path, number, line) for number, line in numbered)

    def output_lengths(self) -> tuple[int, ...]:
        lengths = []
        for line in self.lines():
            if line.output_len is None:
                raise ValueError(
                    f'{self.path} line {line.line_number}: "output_len" is missing; '
                    "output_lengths kind 'from_file' needs it on every line"
                )
            lengths.append(line.output_len)
        return tuple(lengths)


def _parse_prompt_line(path: Path, number: int, line: str) -> PromptLine:
    where = f"{path} line {number}"
    obj = json_object(line, where, '{"prompt": "..."}')
    reject_unknown_keys(obj, JSONL_KEYS, "key", where)
    prompt = obj.get("prompt")
    if "prompt" not in obj:
        raise ValueError(f'{where}: "prompt" is missing; each line needs {{"prompt": "<text>"}}')
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f'{where}: "prompt" must be a non-empty string, got {json.dumps(prompt)}')
    if "output_len" in obj and "max_new_tokens" in obj:
        raise ValueError(f'{where}: "output_len" and "max_new_tokens" mean the same; give one of them')
    key = "max_new_tokens" if "max_new_tokens" in obj else "output_len"
    output_len = obj.get(key)
    if output_len is not None and (not is_int(output_len) or output_len < 1):
        raise ValueError(f'{where}: "{key}" must be an integer >= 1, got {json.dumps(output_len)}')
    return PromptLine(prompt, output_len, number)


PromptSource = ShippedPrompts | SyntheticPrompts | JsonlPrompts


def parse_prompts(value: object, base_dir: Path | None = None) -> PromptSource:
    """``"shipped"``; ``32`` (synthetic, exactly 32 tokens); a table: ``{kind = "uniform", low = 16, high = 64}``,
    ``{kind = "normal", mean = 64, stddev = 16, high = 128}``, ``{kind = "jsonl", path = "prompts.jsonl"}``."""
    if value == "shipped" or value == {"kind": "shipped"}:
        return ShippedPrompts()
    if is_int(value):
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
    return SyntheticPrompts(parse_prompt_lengths(value))
