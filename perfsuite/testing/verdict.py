"""The per-token verdict: every token an engine produced, checked against the reference given the engine's own prefix.

Comparing two free-running greedy sequences stops at their first difference,
and in a low precision that difference is often a tie the rounding of a
different batch shape flips: the check learns nothing after it. Here the
reference is instead *teacher-forced*: one forward pass over the prompt and
the engine's own output gives the reference's logits at every position the
engine sampled (``perfsuite.engine.reference.TeacherForcedScorer``), so a
flip does not end the check and a later bug is still seen.

A token passes when it is the reference's argmax, or when its reference logit
is within ``LogitTolerance.allowed(argmax logit)`` of the argmax's: ``ulps``
units in the last place of the engine's dtype at the argmax logit's
magnitude (``ulp``). float64 allows 0 (an exact tie only). Whatever the
tolerance, the engine must stop where its own tokens say (EOS, a stop token,
``max_new_tokens``): a token after that, or one missing before it, is wrong.

Pure Python: the scores come in, the verdict goes out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from perfsuite.engine.types import Request

# Stored mantissa bits and the least normal exponent of each floating-point format.
FLOAT_FORMATS: dict[str, tuple[int, int]] = {
    "float64": (52, -1022),
    "float32": (23, -126),
    "float16": (10, -14),
    "bfloat16": (7, -126),
}

# How many ulps of the engine's dtype, at the argmax logit's magnitude, a token's reference logit may sit below the
# argmax's: the smallest power of two at least 1.5 x the largest lift of a top-5 token over the argmax that correct
# arrangements (perfsuite's in-flight and paged engines, the Hugging Face model alone) showed on tiny-random
# (bench/correctness_power.py: bfloat16 8.68 ulps over 2724 positions, float16 7.72 and float32 24.79 over 1322).
# float64 is the reference's own dtype: exact ties only. See docs/correctness.md#the-per-token-verdict.
ULPS_BY_DTYPE: dict[str, float] = {"float64": 0.0, "float32": 64.0, "float16": 16.0, "bfloat16": 16.0}


def ulp(x: float, dtype: str) -> float:
    """One unit in the last place of ``dtype`` at ``x``'s magnitude: 2 ** (floor(log2 |x|) - mantissa bits).

    Below the least normal number (0 included) it is the least normal's ulp.
    """
    mantissa_bits, min_exponent = _format(dtype)
    if not math.isfinite(x):
        raise ValueError(f"no ulp of {x!r}: a logit must be finite")
    exponent = math.frexp(x)[1] - 1 if x != 0 else min_exponent  # frexp: x = m * 2**e with 0.5 <= |m| < 1
    return math.ldexp(1.0, max(exponent, min_exponent) - mantissa_bits)


def _format(dtype: str) -> tuple[int, int]:
    try:
        return FLOAT_FORMATS[dtype]
    except KeyError:
        raise ValueError(f"no floating-point format {dtype!r}; choose one of {', '.join(FLOAT_FORMATS)}") from None


@dataclass(frozen=True, slots=True)
class LogitTolerance:
    """How far below the reference's argmax logit an engine's token may score: ``ulps`` of ``dtype`` there."""

    dtype: str
    ulps: float

    def __post_init__(self) -> None:
        _format(self.dtype)
        if not 0 <= self.ulps < math.inf:
            raise ValueError(f"ulps={self.ulps!r}: give a number of ulps >= 0 (0: only exact ties pass)")

    @classmethod
    def for_dtype(cls, dtype: str, ulps: float | None = None) -> LogitTolerance:
        """The measured default of ``dtype`` (``ULPS_BY_DTYPE``), or ``ulps``."""
        _format(dtype)
        return cls(dtype, ULPS_BY_DTYPE[dtype] if ulps is None else ulps)

    def allowed(self, argmax_logit: float) -> float:
        """The largest gap (argmax logit minus the token's) that passes."""
        return self.ulps * ulp(argmax_logit, self.dtype)

    def in_ulps(self, gap: float, argmax_logit: float) -> float:
        return gap / ulp(argmax_logit, self.dtype)

    def describe(self) -> str:
        return f"{self.ulps:g} ulps of {self.dtype}" + (" (exact ties)" if self.ulps == 0 else "")


@dataclass(frozen=True, slots=True)
class TokenScores:
    """The reference's logits at each token of one request's output, given the output before it.

    ``argmax_tokens[i]`` and ``argmax_logits[i]``: the reference's choice at
    output position i and its logit; ``token_logits[i]``: the reference's
    logit of the engine's own token there.
    """

    argmax_tokens: tuple[int, ...]
    argmax_logits: tuple[float, ...]
    token_logits: tuple[float, ...]


class LogitsAtTokens(Protocol):
    """What the verdict reads of a scorer's answer: ``TokenScores``, or the engine's ``TokenLogits``."""

    @property
    def argmax_tokens(self) -> tuple[int, ...]: ...
    @property
    def argmax_logits(self) -> tuple[float, ...]: ...
    @property
    def token_logits(self) -> tuple[float, ...]: ...


Scorer = Callable[[Request, tuple[int, ...]], LogitsAtTokens]
"""``(request, the engine's output tokens) -> TokenScores`` for those tokens (``CachedReference.score``)."""


@dataclass(frozen=True, slots=True)
class WrongToken:
    """One token that fails: a wrong choice, one after the engine should have stopped, or one missing."""

    engine_name: str
    request_id: str
    position: int
    kind: str  # "wrong token", "after the end", "missing", "not in the vocabulary"
    engine_token: int | None
    reference_token: int | None
    engine_logit: float | None
    reference_logit: float | None
    allowed: float | None
    gap_ulps: float | None
    num_tokens: int  # the engine's output length
    expected_len: str  # what the engine's own tokens call for

    def describe(self) -> str:
        where = f"{self.engine_name}: request {self.request_id!r}, output position {self.position}"
        if self.kind == "missing":
            return f"{where}: no token, yet its output of {self.num_tokens} tokens must go on ({self.expected_len})"
        if self.kind == "not in the vocabulary":
            return f"{where}: engine token {self.engine_token} is not in the model's vocabulary"
        if self.kind == "after the end":
            ended = f"after the output should have ended ({self.expected_len})"
            return f"{where}: engine token {self.engine_token} {ended}"
        assert self.reference_logit is not None and self.engine_logit is not None  # a wrong-token row has both
        gap = self.reference_logit - self.engine_logit
        return (
            f"{where}: engine token {self.engine_token} (reference logit {self.engine_logit:.6g}), reference argmax "
            f"{self.reference_token} (logit {self.reference_logit:.6g}); {gap:.3g} below it ({self.gap_ulps:.3g} "
            f"ulps), tolerance {self.allowed:.3g}"
        )


@dataclass(frozen=True, slots=True)
class TokenCheck:
    """An engine's outputs on one scenario, token by token, against the teacher-forced reference."""

    engine_name: str
    num_requests: int
    num_checked: int
    num_exact: int
    num_within: int  # not the argmax, but within the tolerance (exact ties included)
    max_gap_ulps: float  # the largest gap of a token within the tolerance, in ulps (0 when none)
    wrong: tuple[WrongToken, ...]
    tolerance: LogitTolerance

    @property
    def passed(self) -> bool:
        return not self.wrong

    @property
    def num_wrong(self) -> int:
        return len(self.wrong)

    @property
    def near_ties(self) -> tuple[()]:
        """None: the per-token verdict has no near-ties to count (``num_within`` says how many tokens it let pass)."""
        return ()

    def summary(self) -> str:
        within = f"{self.num_within} within {self.tolerance.describe()}"
        if self.num_within:
            within += f" (largest {self.max_gap_ulps:.3g} ulps)"
        return (
            f"{self.engine_name}: {self.num_checked} tokens of {self.num_requests} requests checked against the "
            f"reference given the engine's own prefix: {self.num_exact} exact, {within}, {self.num_wrong} wrong"
        )

    def describe(self, max_shown: int = 10) -> str:
        lines = [self.summary()]
        lines += [f"  {wrong.describe()}" for wrong in self.wrong[:max_shown]]
        if len(self.wrong) > max_shown:
            lines.append(f"  ... and {len(self.wrong) - max_shown} more")
        return "\n".join(lines)

    def assert_passed(self, max_near_ties: int | None = None) -> None:
        if not self.passed:
            raise AssertionError("outputs differ from the unbatched reference:\n" + self.describe())


def expected_length(request: Request, tokens: Sequence[int], eos_token_id: int | None) -> tuple[int, str]:
    """Where the output ``tokens`` must end, by their own stop tokens and ``max_new_tokens``, and why."""
    params = request.sampling_params
    for index, token in enumerate(tokens):
        reason = params.finish_reason(token, index + 1, eos_token_id)
        if reason is not None:
            why = "max_new_tokens" if index + 1 >= params.max_new_tokens else f"token {token} stops it"
            return index + 1, f"{index + 1} tokens: {why}"
    return params.max_new_tokens, f"max_new_tokens={params.max_new_tokens}"


def check_tokens(
    engine_name: str,
    requests: Sequence[Request],
    outputs: Mapping[str, Sequence[int]],
    score: Scorer,
    tolerance: LogitTolerance,
    eos_token_id: int | None,
) -> TokenCheck:
    """Judge each request's ``outputs`` token by token (the outputs already validated: one per request, int ids).

    A follow-up (``Request.follows``) is scored on the prompt its parent's
    engine output makes, as the engine served it.
    """
    tally = _Tally(engine_name, tolerance)
    prompts: dict[str, tuple[int, ...]] = {}
    for request in _parents_first(requests):
        if request.follows is not None:
            parent_id = request.follows.parent_id
            request = request.continued(prompts[parent_id], tuple(outputs[parent_id]), 0.0)
        prompts[request.request_id] = request.prompt_token_ids
        tally.add(request, tuple(outputs[request.request_id]), score, eos_token_id)
    return tally.check(len(requests))


def _parents_first(requests: Sequence[Request]) -> list[Request]:
    ordered, seen, pending = [], set(), list(requests)
    while pending:
        ready = [r for r in pending if r.follows is None or r.follows.parent_id in seen]
        if not ready:
            raise ValueError(f"requests {[r.request_id for r in pending]} follow requests that are not among them")
        ordered += ready
        seen |= {r.request_id for r in ready}
        pending = [r for r in pending if r.request_id not in seen]
    return ordered


class _Tally:
    def __init__(self, engine_name: str, tolerance: LogitTolerance) -> None:
        self.engine_name, self.tolerance = engine_name, tolerance
        self.num_checked = self.num_exact = self.num_within = 0
        self.max_gap_ulps = 0.0
        self.wrong: list[WrongToken] = []

    def add(self, request: Request, tokens: tuple[int, ...], score: Scorer, eos_token_id: int | None) -> None:
        end, why = expected_length(request, tokens, eos_token_id)
        scored = tokens[:end]
        scores: LogitsAtTokens = score(request, scored) if scored else TokenScores((), (), ())
        for position, token in enumerate(scored):
            self._judge(request.request_id, position, token, scores, len(tokens), why)
        if len(tokens) > end:
            self.wrong.append(self._ended(request.request_id, end, "after the end", tokens[end], len(tokens), why))
        elif len(tokens) < end:
            self.wrong.append(self._ended(request.request_id, len(tokens), "missing", None, len(tokens), why))

    def _judge(
        self, request_id: str, position: int, token: int, scores: LogitsAtTokens, num_tokens: int, why: str
    ) -> None:
        self.num_checked += 1
        if position >= len(scores.argmax_tokens):  # the scorer stops at a token id past the vocabulary
            self.wrong.append(self._ended(request_id, position, "not in the vocabulary", token, num_tokens, why))
            return
        best, best_logit = scores.argmax_tokens[position], scores.argmax_logits[position]
        logit = scores.token_logits[position]
        if token == best:
            self.num_exact += 1
            return
        gap, allowed = best_logit - logit, self.tolerance.allowed(best_logit)
        gap_ulps = self.tolerance.in_ulps(gap, best_logit)
        if gap <= allowed:
            self.num_within += 1
            self.max_gap_ulps = max(self.max_gap_ulps, gap_ulps)
            return
        self.wrong.append(
            WrongToken(
                self.engine_name,
                request_id,
                position,
                "wrong token",
                token,
                best,
                logit,
                best_logit,
                allowed,
                gap_ulps,
                num_tokens,
                why,
            )
        )

    def _ended(
        self, request_id: str, position: int, kind: str, token: int | None, num_tokens: int, why: str
    ) -> WrongToken:
        return WrongToken(
            self.engine_name, request_id, position, kind, token, None, None, None, None, None, num_tokens, why
        )

    def check(self, num_requests: int) -> TokenCheck:
        return TokenCheck(
            self.engine_name,
            num_requests,
            self.num_checked,
            self.num_exact,
            self.num_within,
            self.max_gap_ulps,
            tuple(self.wrong),
            self.tolerance,
        )
