"""Token-for-token comparison of an engine's outputs with the reference.

Pure Python. A mismatch report names the request, the first divergent
position, both tokens and the reference's top-1/top-2 logit margin there, so a
reader can tell a real bug (a large margin) from a near-tie that rounding in
a different batch shape can flip (a margin near zero).

``check_greedy_equal`` runs any engine on a few requests and reports its
divergences that way, after ``validate_run_result`` has checked what the
engine returned (an engine the kit does not know is trusted with nothing:
types, ids and counts are checked before any token is compared); ``check_server_greedy`` does it for a server through
``openai-http`` (``perfsuite serve``, vLLM, ...), so a server's claim to
decode greedily is checked rather than taken on trust.
"""

from __future__ import annotations

import reprlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from perfsuite.engine.types import Request, RequestRecord, RunResult, SamplingParams

if TYPE_CHECKING:
    from perfsuite.adapters.protocol import BatchingEngine


@dataclass(frozen=True, slots=True)
class Divergence:
    engine_name: str
    request_id: str
    position: int
    expected_token: int | None  # None: the reference had already stopped
    actual_token: int | None  # None: the engine had already stopped
    reference_margin: float | None
    expected_len: int
    actual_len: int

    def is_near_tie(self, tolerance: float) -> bool:
        """A token flip where the reference itself barely preferred its choice."""
        return (
            self.expected_token is not None
            and self.actual_token is not None
            and self.reference_margin is not None
            and self.reference_margin < tolerance
        )

    def describe(self) -> str:
        margin = "n/a" if self.reference_margin is None else f"{self.reference_margin:.3g}"
        return (
            f"{self.engine_name}: request {self.request_id!r} diverges at output position {self.position}: "
            f"reference token {self.expected_token}, engine token {self.actual_token} "
            f"(reference top-1/top-2 logit margin there: {margin}; "
            f"lengths reference={self.expected_len} engine={self.actual_len})"
        )


def first_divergence(
    engine_name: str,
    request_id: str,
    expected: Sequence[int],
    actual: Sequence[int],
    margins: Sequence[float],
) -> Divergence | None:
    for position in range(max(len(expected), len(actual))):
        want = expected[position] if position < len(expected) else None
        got = actual[position] if position < len(actual) else None
        if want != got:
            return Divergence(
                engine_name=engine_name,
                request_id=request_id,
                position=position,
                expected_token=want,
                actual_token=got,
                reference_margin=margins[position] if position < len(margins) else None,
                expected_len=len(expected),
                actual_len=len(actual),
            )
    return None


def find_divergences(
    engine_name: str,
    expected: Mapping[str, Sequence[int]],
    actual: Mapping[str, Sequence[int]],
    margins: Mapping[str, Sequence[float]],
) -> list[Divergence]:
    missing = sorted(set(expected) - set(actual))
    if missing:
        raise AssertionError(f"{engine_name}: requests {missing} produced no output: a request was lost")
    divergences = []
    for request_id, want in expected.items():
        divergence = first_divergence(engine_name, request_id, want, actual[request_id], margins.get(request_id, ()))
        if divergence is not None:
            divergences.append(divergence)
    return divergences


class InvalidRunResult(AssertionError):
    """An engine's result that cannot be compared with the reference; ``problems`` say why, one line each."""

    def __init__(self, engine_name: str, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        lines = "\n".join(f"  {problem}" for problem in self.problems)
        super().__init__(f"{engine_name}: its result cannot be compared with the reference; fix the engine:\n{lines}")


def validate_run_result(requests: Sequence[Request], result: object) -> list[str]:
    """What is wrong with ``result`` as the answer of ``run(requests)``, one line each; empty when nothing is.

    ``BatchingEngine.run`` must return a ``RunResult`` whose records are
    ``RequestRecord``s, exactly one for each request sent (none unknown,
    none twice, none missing), each with a tuple of token ids that are
    non-negative Python ints. A ``5.0`` equals ``5`` but is not a token id.
    """
    if not isinstance(result, RunResult):
        must = "it must return a perfsuite.engine.RunResult with one record per request"
        return [f"run() returned {_shown(result)}; {must}"]
    if not isinstance(result.records, (tuple, list)):
        return [f"RunResult.records is {_shown(result.records)}; it must be a tuple of perfsuite.engine.RequestRecord"]
    problems = []
    ids = []
    for index, record in enumerate(result.records):
        if not isinstance(record, RequestRecord):
            problems.append(f"records[{index}] is {_shown(record)}, not a perfsuite.engine.RequestRecord")
        elif not isinstance(record.request_id, str):
            problems.append(f"records[{index}] has request_id {_shown(record.request_id)}, not a request's str id")
        else:
            ids.append(record.request_id)
            problems += token_id_problems(record.request_id, record.output_token_ids)
    return _request_id_problems([r.request_id for r in requests], ids) + problems


def _request_id_problems(sent: Sequence[str], returned: Sequence[str]) -> list[str]:
    counts, known = Counter(returned), set(sent)
    problems = [f"a record for request id {rid!r}, which was never sent" for rid in counts if rid not in known]
    twice = [(rid, n) for rid, n in counts.items() if n > 1]
    problems += [f"request id {rid!r} has {n} records; return exactly one per request" for rid, n in twice]
    missing = [rid for rid in sent if rid not in counts]
    if missing:
        problems.append(f"no record for requests {missing}: a request was lost")
    return problems


def token_id_problems(request_id: str, token_ids: object) -> list[str]:
    """What is wrong with one request's output token ids (at most one line), or nothing."""
    if not isinstance(token_ids, (tuple, list)):
        return [f"request {request_id!r}: output_token_ids is {_shown(token_ids)}, not a tuple of ints"]
    bad = [(position, token) for position, token in enumerate(token_ids) if not _is_token_id(token)]
    if not bad:
        return []
    position, token = bad[0]
    return [
        f"request {request_id!r}: {len(bad)} of {len(token_ids)} output token ids are not non-negative ints, "
        f"the first at output position {position}: {_shown(token)}; return Python ints (int(t), not a float or tensor)"
    ]


def _is_token_id(token: object) -> bool:
    return isinstance(token, int) and not isinstance(token, bool) and token >= 0


def _shown(value: object) -> str:
    return "None" if value is None else f"{type(value).__name__} {reprlib.repr(value)}"


def assert_outputs_equal(
    engine_name: str,
    expected: Mapping[str, Sequence[int]],
    actual: Mapping[str, Sequence[int]],
    margins: Mapping[str, Sequence[float]],
    near_tie_tolerance: float = 0.0,
) -> list[Divergence]:
    """Fail on any divergence that is not a near-tie; return the near-ties."""
    divergences = find_divergences(engine_name, expected, actual, margins)
    real = [d for d in divergences if not d.is_near_tie(near_tie_tolerance)]
    if real:
        raise AssertionError("outputs differ from the unbatched reference:\n" + "\n".join(d.describe() for d in real))
    return [d for d in divergences if d.is_near_tie(near_tie_tolerance)]


class GreedyOutput(Protocol):
    """What the reference decodes for one request (``perfsuite.engine.reference.ReferenceOutput``, frozen)."""

    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def top2_margins(self) -> Sequence[float]: ...


class GreedyReference(Protocol):
    """Unbatched greedy decoding, one request at a time (``perfsuite.engine.reference.ReferenceDecoder``)."""

    def generate(self, request: Request) -> GreedyOutput: ...


@dataclass(frozen=True, slots=True)
class GreedyCheck:
    """An engine's outputs on some requests against unbatched greedy decoding."""

    engine_name: str
    num_requests: int
    divergences: tuple[Divergence, ...]
    near_tie_tolerance: float

    @property
    def real_divergences(self) -> tuple[Divergence, ...]:
        return tuple(d for d in self.divergences if not d.is_near_tie(self.near_tie_tolerance))

    @property
    def near_ties(self) -> tuple[Divergence, ...]:
        return tuple(d for d in self.divergences if d.is_near_tie(self.near_tie_tolerance))

    @property
    def passed(self) -> bool:
        return not self.real_divergences

    def describe(self) -> str:
        verdict = "equal to unbatched greedy decoding" if self.passed else "differs from unbatched greedy decoding"
        lines = [
            f"{self.engine_name}: {verdict} on {self.num_requests} requests "
            f"({len(self.real_divergences)} diverge, {len(self.near_ties)} near-ties below a margin of "
            f"{self.near_tie_tolerance:g})"
        ]
        lines += [f"  {d.describe()}" for d in self.real_divergences]
        lines += [f"  near-tie: {d.describe()}" for d in self.near_ties]
        return "\n".join(lines)

    def assert_passed(self, max_near_ties: int | None = None) -> None:
        """Fail on any divergence that is not a near-tie, or on more near-ties than chance explains."""
        if not self.passed:
            raise AssertionError(self.describe())
        if max_near_ties is not None and len(self.near_ties) > max_near_ties:
            raise AssertionError(f"too many near-ties to be chance (at most {max_near_ties}):\n{self.describe()}")


def check_greedy_equal(
    engine: BatchingEngine,
    requests: Sequence[Request],
    reference: GreedyReference,
    near_tie_tolerance: float = 0.0,
    engine_name: str | None = None,
) -> GreedyCheck:
    """Serve ``requests`` with ``engine`` (all at t0) and compare each output with ``reference``'s.

    The reference decodes first and the engine runs after, so the two never
    share a model at the same time (a server thread may hold the same one).
    A multi-turn follow-up is decoded on the conversation the reference's own
    outputs make: a greedy-equal engine serves it that same prompt. What
    ``run`` returns is validated first (``validate_run_result``); a result
    that is not one record of int token ids for each request raises
    ``InvalidRunResult`` naming every problem.
    """
    expected, margins = reference_outputs(requests, reference)
    name = engine_name or engine.name
    result = engine.run(requests)
    problems = validate_run_result(requests, result)
    if problems:
        raise InvalidRunResult(name, problems)
    divergences = find_divergences(name, expected, result.outputs(), margins)
    return GreedyCheck(name, len(requests), tuple(divergences), near_tie_tolerance)


def reference_outputs(
    requests: Sequence[Request], reference: GreedyReference
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[float, ...]]]:
    """Each request's reference tokens and margins; a follow-up's after its parent's, on the prompt they make."""
    expected: dict[str, tuple[int, ...]] = {}
    margins: dict[str, tuple[float, ...]] = {}
    prompts: dict[str, tuple[int, ...]] = {}
    pending = list(requests)
    while pending:
        waiting = [r for r in pending if r.follows is not None and r.follows.parent_id not in expected]
        if len(waiting) == len(pending):
            raise ValueError(f"requests {[r.request_id for r in waiting]} follow requests that are not among them")
        waiting_ids = {r.request_id for r in waiting}
        for request in pending:
            if request.request_id in waiting_ids:
                continue
            if request.follows is not None:
                parent_id = request.follows.parent_id
                request = request.continued(prompts[parent_id], expected[parent_id], 0.0)
            output = reference.generate(request)
            prompts[request.request_id] = request.prompt_token_ids
            expected[request.request_id] = tuple(output.token_ids)
            margins[request.request_id] = tuple(output.top2_margins)
        pending = waiting
    return expected, margins


def check_server_greedy(
    engine: BatchingEngine,
    requests: Sequence[Request],
    reference: GreedyReference,
    near_tie_tolerance: float = 0.0,
) -> GreedyCheck:
    """``check_greedy_equal`` for a server behind an ``openai-http`` engine, named by its URL and model.

    ``reference`` must decode the model the server serves, in the precision
    it serves it (SmolLM2 float32 against vLLM's float32, say); near-ties
    below ``near_tie_tolerance`` are reported apart, as for in-process engines.
    An engine that cannot claim exact token ids (text prompts or text-only
    output, see ``openai_http``) is still compared, but its report says so:
    retokenized text need not be the server's tokens.
    """
    check = check_greedy_equal(engine, requests, reference, near_tie_tolerance, server_name(engine))
    if not engine.greedy_equal:
        note = " (text in or out: the server's tokens are not seen exactly, so a divergence may be retokenization)"
        return GreedyCheck(check.engine_name + note, check.num_requests, check.divergences, near_tie_tolerance)
    return check


def server_name(engine: BatchingEngine) -> str:
    """``openai-http at URL (model M)``, as far as the engine says."""
    name = engine.name
    base_url = getattr(engine, "base_url", None)
    if base_url:
        name += f" at {base_url}"
    served = getattr(engine, "served_model", None)
    model_id = getattr(served, "model_id", None)
    return f"{name} (model {model_id})" if model_id else name


# Prompts that tokenize to a few tokens in any English tokenizer; outputs long enough to show a drift.
GREEDY_CHECK_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "1, 2, 3, 4,",
    "Batching requests together",
    "The quick brown fox",
)


def greedy_check_requests(
    tokenize: Callable[[str], Sequence[int]], max_new_tokens: int = 24, prompts: Sequence[str] = GREEDY_CHECK_PROMPTS
) -> list[Request]:
    """A few requests for a greedy check: each prompt once, each run to ``max_new_tokens`` (EOS ignored)."""
    return [
        Request(f"greedy-{i}", tuple(tokenize(text)), SamplingParams(max_new_tokens, ignore_eos=True))
        for i, text in enumerate(prompts)
    ]
