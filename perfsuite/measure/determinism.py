"""Unique completions over N runs: how many different outputs a prompt gets when only its batch changes.

SGLang's determinism figure. Every trial serves every prompt once, in a
composition drawn from the trial's seed (``trial_batches``): the prompts
shuffled, cut into consecutive groups of random sizes, each group one
``engine.run`` (so a prompt meets other companions, in a batch of another
size, at another position), each request arriving at a random offset in
``[0, max_arrival_offset)`` seconds (so it joins a running batch at another
step). A prompt's distinct completions over the N trials are counted: 1 is
deterministic under batching, more means the batch changed its output.

The requests keep their own sampling parameters; with greedy decoding any
count above 1 is the batch's doing. The figure is recorded, not judged: it
decides nothing about speed, and a test that wants it at 1 asserts so.

Pure Python, torch-free: the engine is anything with ``BatchingEngine.run``.
Its records are checked (one per request sent, ids as sent, token ids
integers) before any completion is compared, so a wrong engine is an error
naming it, not a miscount.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from perfsuite.engine.types import Request, RunResult, check_unique_ids

DEFAULT_TRIALS = 5
DEFAULT_MAX_ARRIVAL_OFFSET = 0.02  # seconds: a few decode steps of a small model, so arrivals land on other steps


class RunsRequests(Protocol):
    """What this module needs of a ``perfsuite.adapters.BatchingEngine``."""

    name: str

    def run(
        self, requests: Iterable[Request], on_step: Callable | None = None, max_concurrency: int | None = None
    ) -> RunResult: ...


@dataclass(frozen=True, slots=True)
class Batch:
    """One ``engine.run`` of a trial: which prompts (indices, in the order sent), and when each arrives."""

    indices: tuple[int, ...]
    arrival_offsets: tuple[float, ...]  # seconds after the run starts, one per index


@dataclass(frozen=True, slots=True)
class PromptCompletions:
    """One prompt's distinct completions over the trials (1: the same every time)."""

    request_id: str
    num_distinct: int

    @property
    def is_deterministic(self) -> bool:
        return self.num_distinct == 1


@dataclass(frozen=True, slots=True)
class UniqueCompletions:
    """Distinct completions per prompt over ``num_trials`` shuffled batch compositions drawn from ``seed``."""

    num_trials: int
    seed: int
    max_arrival_offset: float
    prompts: tuple[PromptCompletions, ...]

    @property
    def num_prompts(self) -> int:
        return len(self.prompts)

    @property
    def max_distinct(self) -> int:
        return max(p.num_distinct for p in self.prompts)

    @property
    def mean_distinct(self) -> float:
        return statistics.fmean(p.num_distinct for p in self.prompts)

    @property
    def num_deterministic(self) -> int:
        return sum(p.is_deterministic for p in self.prompts)

    @property
    def fraction_deterministic(self) -> float:
        return self.num_deterministic / self.num_prompts

    def summary(self) -> dict[str, float | int]:
        """The derived figures, as results.json writes them beside the fields for readers outside perfsuite."""
        return {name: getattr(self, name) for name in SUMMARY_KEYS}

    def describe(self) -> str:
        """``max 2 distinct completions over 5 trials; 3 of 4 prompts deterministic``"""
        plural = "s" if self.max_distinct != 1 else ""
        return (
            f"max {self.max_distinct} distinct completion{plural} over {self.num_trials} trials; "
            f"{self.num_deterministic} of {self.num_prompts} prompts deterministic"
        )


SUMMARY_KEYS = ("num_prompts", "max_distinct", "mean_distinct", "num_deterministic", "fraction_deterministic")


def unique_completions(
    engine: RunsRequests,
    requests: Sequence[Request],
    trials: int = DEFAULT_TRIALS,
    *,
    seed: int = 0,
    max_arrival_offset: float = DEFAULT_MAX_ARRIVAL_OFFSET,
) -> UniqueCompletions:
    """Serve ``requests`` ``trials`` times in seeded shuffled compositions (module doc); count each one's outputs.

    ``ValueError`` for unusable input (fewer than 2 trials, no requests,
    repeated ids, follow-ups, a bad offset) and for an engine whose records
    do not answer what was sent.
    """
    _check_arguments(requests, trials, max_arrival_offset)
    seen: list[set[tuple[int, ...]]] = [set() for _ in requests]
    for trial in range(trials):
        for batch in trial_batches(len(requests), trial, seed, max_arrival_offset):
            sent = [
                dataclasses.replace(requests[i], arrival_time=offset)
                for i, offset in zip(batch.indices, batch.arrival_offsets)
            ]
            outputs = completions_of(engine.name, sent, engine.run(sent), trial)
            for index, request in zip(batch.indices, sent):
                seen[index].add(outputs[request.request_id])
    prompts = tuple(PromptCompletions(r.request_id, len(found)) for r, found in zip(requests, seen))
    return UniqueCompletions(trials, seed, float(max_arrival_offset), prompts)


def trial_batches(num_prompts: int, trial: int, seed: int, max_arrival_offset: float) -> tuple[Batch, ...]:
    """Trial ``trial``'s composition: every prompt once, shuffled, in consecutive groups of random sizes.

    The same ``(seed, trial)`` gives the same batches in any process (a
    string seed is hashed by SHA-512, not by Python's salted ``hash``).
    """
    rng = random.Random(f"perfsuite-determinism:{seed}:{trial}")
    order = list(range(num_prompts))
    rng.shuffle(order)
    batches, start = [], 0
    while start < num_prompts:
        size = rng.randint(1, num_prompts - start)
        indices = tuple(order[start : start + size])
        offsets = tuple(rng.uniform(0.0, max_arrival_offset) if max_arrival_offset > 0 else 0.0 for _ in indices)
        batches.append(Batch(indices, offsets))
        start += size
    return tuple(batches)


def completions_of(engine_name: str, sent: Sequence[Request], result: Any, trial: int) -> dict[str, tuple[int, ...]]:
    """Each sent request's output token ids, once the engine's answer is checked against what was sent."""
    where = f"engine {engine_name!r}, trial {trial}"
    records = getattr(result, "records", None)
    if not isinstance(records, (tuple, list)):
        raise ValueError(f"{where}: run() returned {type(result).__name__}, not a RunResult with records")
    wanted = {r.request_id for r in sent}
    outputs: dict[str, tuple[int, ...]] = {}
    for record in records:
        request_id = getattr(record, "request_id", None)
        if request_id not in wanted:
            raise ValueError(f"{where}: a record for {request_id!r}, which was not sent")
        if request_id in outputs:
            raise ValueError(f"{where}: two records for {request_id!r}")
        outputs[request_id] = _token_ids(where, request_id, getattr(record, "output_token_ids", None))
    missing = sorted(wanted - set(outputs))
    if missing:
        raise ValueError(f"{where}: no record for {len(missing)} of {len(sent)} requests sent ({missing[:3]!r})")
    return outputs


def _token_ids(where: str, request_id: str, tokens: Any) -> tuple[int, ...]:
    if not isinstance(tokens, (tuple, list)) or not all(type(t) is int for t in tokens):
        raise ValueError(
            f"{where}: request {request_id!r}'s output_token_ids are not a sequence of ints: {tokens!r:.80}"
        )
    return tuple(tokens)


def _check_arguments(requests: Sequence[Request], trials: int, max_arrival_offset: float) -> None:
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 2:
        raise ValueError(f"trials must be an integer >= 2 (one trial always counts 1 completion), got {trials!r}")
    if not requests:
        raise ValueError("no requests: give at least one prompt to serve")
    if not isinstance(max_arrival_offset, (int, float)) or not 0 <= max_arrival_offset < math.inf:
        raise ValueError(f"max_arrival_offset must be finite seconds >= 0, got {max_arrival_offset!r}")
    check_unique_ids(requests)
    follow_ups = [r.request_id for r in requests if r.follows is not None]
    if follow_ups:
        raise ValueError(
            f"{follow_ups[0]!r} is a later turn of a conversation: its prompt is its parent's output, so a "
            "changed composition changes its prompt too; measure determinism on single-turn requests"
        )
