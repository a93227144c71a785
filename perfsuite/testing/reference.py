"""The oracle of every equivalence check: unbatched greedy decoding, memoised.

Hypothesis replays many identical requests while it searches and shrinks, so
each (prompt, sampling params) is decoded once. The decoder is perfsuite's
``ReferenceDecoder`` (the Hugging Face model, one request at a time), or
anything with its ``generate(request)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from perfsuite.engine import Request
from perfsuite.testing.greedy import GreedyOutput, GreedyReference
from perfsuite.testing.verdict import LogitsAtTokens

if TYPE_CHECKING:
    from perfsuite.models import LoadedModel


class TokenScorer(Protocol):
    """The teacher-forced reference (``perfsuite.engine.reference.TeacherForcedScorer``)."""

    def score(self, prompt: tuple[int, ...], tokens: tuple[int, ...]) -> LogitsAtTokens: ...


# float32 logits of SmolLM2 differ by ~1e-5 between batch shapes; a flip needs
# the reference's own top-2 margin to be below this.
FLOAT32_NEAR_TIE = 1e-3

# Below this top-1/top-2 logit margin of the reference, a token may flip between batch shapes. float64 leaves
# no room; bfloat16 and float16 keep 8 and 11 significant bits, so logits of a few units move by steps of
# 1/32 or finer, and a different reduction order moves each of two logits by a step or more.
NEAR_TIE_BY_DTYPE = {"float64": 0.0, "float32": FLOAT32_NEAR_TIE, "bfloat16": 0.5, "float16": 0.5}


def near_tie_tolerance(dtype: str) -> float:
    """The margin under which a flipped token counts as a near-tie, for a model run in ``dtype``."""
    try:
        return NEAR_TIE_BY_DTYPE[dtype]
    except KeyError:
        raise ValueError(
            f"no near-tie tolerance for dtype {dtype!r}; choose one of {', '.join(NEAR_TIE_BY_DTYPE)}"
        ) from None


class CachedReference:
    """A ``GreedyReference`` that decodes each distinct (prompt, sampling params) once.

    With a ``scorer`` (``perfsuite.engine.reference.TeacherForcedScorer``) it
    also scores an engine's output given its own prefix (``score``), each
    distinct (prompt, output) once, for the per-token verdict.
    """

    def __init__(self, decoder: GreedyReference, scorer: TokenScorer | None = None) -> None:
        self.decoder = decoder
        self.scorer = scorer
        self._cache: dict[tuple, GreedyOutput] = {}
        self._scores: dict[tuple, LogitsAtTokens] = {}

    @property
    def eos_token_id(self) -> int | None:
        """The model's EOS, as the decoder knows it (None when it says none)."""
        return getattr(self.decoder, "eos_token_id", None)

    def score(self, request: Request, tokens: tuple[int, ...]) -> LogitsAtTokens:
        """The reference's logits at each of ``tokens``, the output of ``request``, given the tokens before it."""
        if self.scorer is None:
            raise ValueError(
                "this reference has no scorer; build it with cached_reference(loaded) for the per-token verdict"
            )
        key = (request.prompt_token_ids, tokens)
        if key not in self._scores:
            self._scores[key] = self.scorer.score(request.prompt_token_ids, tokens)
        return self._scores[key]

    def generate(self, request: Request) -> GreedyOutput:
        key = (request.prompt_token_ids, request.sampling_params)
        if key not in self._cache:
            self._cache[key] = self.decoder.generate(request)
        return self._cache[key]

    def outputs(self, requests: Iterable[Request]) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[float, ...]]]:
        """Each request's reference tokens and the reference's top-1/top-2 margin at each, by request id."""
        tokens, margins = {}, {}
        for request in requests:
            reference = self.generate(request)
            tokens[request.request_id] = tuple(reference.token_ids)
            margins[request.request_id] = tuple(reference.top2_margins)
        return tokens, margins


def cached_reference(loaded: LoadedModel) -> CachedReference:
    """The memoised unbatched oracle of a ``perfsuite.models.load_model`` result (imports torch)."""
    from perfsuite.engine.reference import ReferenceDecoder, TeacherForcedScorer

    return CachedReference(ReferenceDecoder(loaded.model, loaded.eos_token_id), TeacherForcedScorer(loaded.model))
