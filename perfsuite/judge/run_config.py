"""What a perf test measured, besides the machine: the identity of a baseline.

Two runs are compared only when both their environment fingerprint (the
machine and library versions, ``measure.environment.Environment``) and their
``RunConfiguration`` match. Test ids alone are not enough: the same
``test_throughput[static-B4-uniform]`` runs a different workload under the
``ci`` and ``full`` profiles, and ``--perf-decode-mode`` changes the runner
without changing any id.

The workload is identified by a digest of the requests themselves (prompt
token ids, output lengths, EOS handling, arrival times) and of how they are
served (closed-loop concurrency, arrival rate), so every way of producing a
workload (profile, sweep config, prompt file, seed) is covered without
listing them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perfsuite.engine.types import Request


@dataclass(frozen=True, slots=True)
class RunConfiguration:
    profile: str
    workload_digest: str
    num_requests: int
    engine: str
    engine_knobs: tuple[tuple[str, int | str | None], ...]  # sorted (name, value) pairs
    decode_mode: str
    max_seq_len: int | None
    repeats: int

    def differences(self, other: RunConfiguration) -> list[str]:
        """``field: this -> other`` for every field that differs, in declaration order."""
        return [
            f"{f.name}: {_shown(getattr(self, f.name))} -> {_shown(getattr(other, f.name))}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "engine_knobs": dict(self.engine_knobs)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunConfiguration:
        if not isinstance(data, dict):
            raise TypeError(f"expected an object, found {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise KeyError(f"unknown configuration fields {unknown}")
        return cls(**{**data, "engine_knobs": knobs(data["engine_knobs"])})


def knobs(values: dict[str, int | str | None]) -> tuple[tuple[str, int | str | None], ...]:
    return tuple(sorted(values.items()))


def workload_digest(
    requests: Sequence[Request], max_concurrency: int | None = None, arrival_rate: float | None = None
) -> str:
    """A short hash of exactly what the engine is asked to serve."""
    served = {
        "max_concurrency": max_concurrency,
        "arrival_rate": arrival_rate,
        "requests": [
            [
                list(r.prompt_token_ids),
                r.sampling_params.max_new_tokens,
                r.sampling_params.ignore_eos,
                list(r.sampling_params.stop_token_ids),
                round(r.arrival_time, 9),
                # Only a follow-up adds its parent and think time, so every earlier digest stays as it was.
                *([r.follows.parent_id, round(r.follows.think_time, 9)] if r.follows is not None else []),
            ]
            for r in requests
        ],
    }
    return hashlib.sha256(json.dumps(served, sort_keys=True).encode()).hexdigest()[:16]


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        return "{" + ", ".join(f"{k}={v}" for k, v in value) + "}"
    return str(value)
