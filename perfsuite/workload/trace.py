"""Trace replay: requests read from a JSONL trace in Mooncake's format, prompts made to share what it says.

One JSON object a line::

    {"timestamp": 27482, "input_length": 1200, "output_length": 52, "hash_ids": [46, 47, 48]}

``timestamp``: when the request arrived, in milliseconds (non-decreasing
down the file); ``input_length`` and ``output_length``: its prompt and output
tokens; ``hash_ids``: one id per ``block_size`` tokens of the prompt (the last
block may be partial). Two requests whose ``hash_ids`` start alike share those
blocks of prompt tokens exactly: each id's tokens are drawn from the seed and
the id alone. Other keys on a line are ignored. Every bad line fails the whole
trace, naming its line number and field.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from perfsuite.engine.types import Request, SamplingParams
from perfsuite.workload.checks import check_int, check_positive, is_int, is_number
from perfsuite.workload.jsonl import json_object, numbered_lines
from perfsuite.workload.limits import (
    MAX_NUM_REQUESTS,
    check_arrival,
    check_fits_context,
    check_num_requests,
    check_prompt_tokens,
    long_gaps,
)
from perfsuite.workload.prompts import Vocab

TRACE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
TRACE_KEYS = ("path", "block_size", "time_scale", "max_requests")
MOONCAKE_BLOCK_SIZE = 512


@dataclass(frozen=True, slots=True)
class TraceLine:
    """One request of a trace."""

    line_number: int
    timestamp: float  # ms
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Trace:
    """A JSONL trace replayed: arrivals at its timestamps times ``time_scale`` (0.5 replays twice as fast),
    the first ``max_requests`` lines (all without), ``block_size`` prompt tokens per hash id."""

    path: Path
    block_size: int = MOONCAKE_BLOCK_SIZE
    time_scale: float = 1.0
    max_requests: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))
        check_int(self.block_size, "trace.block_size")
        check_positive(self.time_scale, "trace.time_scale")
        if self.max_requests is not None:
            check_int(self.max_requests, "trace.max_requests")

    @property
    def label(self) -> str:
        scale = "" if self.time_scale == 1 else f"-x{self.time_scale:g}"
        cap = "" if self.max_requests is None else f"-first{self.max_requests}"
        return f"trace_{self.path.stem}{scale}{cap}"

    @property
    def num_requests(self) -> int:
        return len(self.lines())

    def lines(self) -> tuple[TraceLine, ...]:
        """The trace's first ``max_requests`` lines, each checked; blank lines are skipped."""
        lines: list[TraceLine] = []
        for number, raw in numbered_lines(self.path, "trace"):
            line = parse_trace_line(raw, f"{self.path} line {number}", number, self.block_size)
            if lines and line.timestamp < lines[-1].timestamp:
                raise ValueError(
                    f'{self.path} line {number}: "timestamp" {line.timestamp:g} is earlier than line '
                    f"{lines[-1].line_number}'s {lines[-1].timestamp:g}; sort the trace by timestamp"
                )
            if lines:
                self._check_arrival(line, lines)
            lines.append(line)
            if self.max_requests is not None and len(lines) == self.max_requests:
                break
            fix = f"replay the first {MAX_NUM_REQUESTS} with max_requests={MAX_NUM_REQUESTS}"
            check_num_requests(len(lines), f"{self.path}: its first {len(lines)} lines", fix)
        if not lines:
            raise ValueError(
                f'{self.path} has no requests; write one JSON object per line, e.g. {{"timestamp": 0, '
                '"input_length": 600, "output_length": 32, "hash_ids": [0, 1]}'
            )
        what = f"{self.path}: the input_length of its {len(lines)} lines"
        check_prompt_tokens(sum(line.input_length for line in lines), what, "replay fewer with max_requests=N")
        return tuple(lines)

    def _arrival(self, line: TraceLine, first: TraceLine) -> float:
        """Seconds after the first line's arrival."""
        return (line.timestamp - first.timestamp) / 1000 * self.time_scale

    def _check_arrival(self, line: TraceLine, earlier: list[TraceLine]) -> None:
        what = f'{self.path} line {line.line_number} ("timestamp" {line.timestamp:.10g} ms)'
        fix = f"replay the lines before it with max_requests={len(earlier)}, or compress time with time_scale"
        check_arrival(self._arrival(line, earlier[0]), what, fix)

    def long_gaps(self) -> list[str]:
        """A warning for each gap between consecutive lines' arrivals that the engine would idle through."""
        lines = self.lines()
        names = [f"line {line.line_number}" for line in lines]
        return [f"{self.path}: {gap}" for gap in long_gaps([self._arrival(line, lines[0]) for line in lines], names)]

    def check_context(self, max_context: int) -> None:
        """Refuse the first line whose prompt and output cannot fit the model's context."""
        for line in self.lines():
            what = (
                f"{self.path} line {line.line_number} (input_length + output_length = {line.input_length} + "
                f"{line.output_length})"
            )
            fix = "drop or shorten that line, or replay the lines before it with max_requests"
            check_fits_context(line.input_length + line.output_length, max_context, what, fix)

    def requests(self, vocab: Vocab, seed: int) -> list[Request]:
        """``req-0`` onwards in trace order; the first line arrives at 0."""
        lines = self.lines()
        blocks: dict[int, tuple[int, ...]] = {}
        requests = []
        for index, line in enumerate(lines):
            prompt: list[int] = []
            for hash_id in line.hash_ids:
                if hash_id not in blocks:
                    blocks[hash_id] = vocab.draw(random.Random(f"{seed}:trace-block:{hash_id}"), self.block_size)
                prompt.extend(blocks[hash_id])
            arrival = self._arrival(line, lines[0])
            params = SamplingParams(line.output_length, ignore_eos=True)
            requests.append(Request(f"req-{index}", tuple(prompt[: line.input_length]), params, arrival_time=arrival))
        return requests


def parse_trace_line(raw: str, where: str, number: int, block_size: int) -> TraceLine:
    obj = json_object(raw, where, '{"timestamp": 0, ...}')
    missing = [key for key in TRACE_FIELDS if key not in obj]
    if missing:
        raise ValueError(f"{where}: {', '.join(map(repr, missing))} missing; each line needs {', '.join(TRACE_FIELDS)}")
    timestamp = obj["timestamp"]
    if not is_number(timestamp) or timestamp < 0:
        raise ValueError(f'{where}: "timestamp" must be milliseconds >= 0, got {json.dumps(timestamp)}')
    for key in ("input_length", "output_length"):
        if not is_int(obj[key]) or obj[key] < 1:
            raise ValueError(f'{where}: "{key}" must be an integer >= 1 (tokens), got {json.dumps(obj[key])}')
    hash_ids = obj["hash_ids"]
    if not isinstance(hash_ids, list) or not all(is_int(h) and h >= 0 for h in hash_ids):
        raise ValueError(f'{where}: "hash_ids" must be a list of integers >= 0, got {json.dumps(hash_ids)}')
    input_length = obj["input_length"]
    num_blocks = -(-input_length // block_size)
    if len(hash_ids) != num_blocks:
        raise ValueError(
            f'{where}: "input_length" {input_length} fills {num_blocks} block(s) of {block_size} tokens but '
            f'"hash_ids" has {len(hash_ids)}; fix the line, or set block_size to the trace\'s block size'
        )
    return TraceLine(number, float(timestamp), input_length, obj["output_length"], tuple(hash_ids))
