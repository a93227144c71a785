"""Token-for-token comparison of an engine's outputs with the reference.

Pure Python. A mismatch report names the request, the first divergent
position, both tokens and the reference's top-1/top-2 logit margin there, so a
reader can tell a real bug (a large margin) from a near-tie that rounding in
a different batch shape can flip (a margin near zero).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


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
        divergence = first_divergence(
            engine_name, request_id, want, actual[request_id], margins.get(request_id, ())
        )
        if divergence is not None:
            divergences.append(divergence)
    return divergences


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
