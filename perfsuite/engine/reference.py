"""The oracle: unbatched greedy decoding, one request at a time.

It deliberately runs the Hugging Face model itself rather than perfsuite's
model runner, so a bug in the runner's positions, masks or cache indexing
cannot hide by appearing on both sides of a comparison.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from perfsuite.engine.types import FinishReason, Request


@dataclass(frozen=True, slots=True)
class ReferenceOutput:
    request_id: str
    token_ids: tuple[int, ...]
    top2_margins: tuple[float, ...]  # top-1 minus top-2 logit at each chosen token
    finish_reason: FinishReason


class ReferenceDecoder:
    def __init__(self, model, eos_token_id: int | None) -> None:
        self.model = model
        self.eos_token_id = eos_token_id

    @torch.inference_mode()
    def generate(self, request: Request) -> ReferenceOutput:
        params = request.sampling_params
        input_ids = torch.tensor([request.prompt_token_ids], device=self.model.device)
        past = None
        token_ids: list[int] = []
        margins: list[float] = []
        while True:
            out = self.model(input_ids=input_ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            top2 = out.logits[0, -1].topk(2)
            token = int(top2.indices[0])
            token_ids.append(token)
            margins.append(float(top2.values[0] - top2.values[1]))
            reason = params.finish_reason(token, len(token_ids), self.eos_token_id)
            if reason is not None:
                return ReferenceOutput(request.request_id, tuple(token_ids), tuple(margins), reason)
            input_ids = torch.tensor([[token]], device=self.model.device)


# The reference computes the engine's weights one format wider, as LayerCast does (weights kept in the low
# precision, arithmetic in float32): its logits are then close to exact for those weights, ties in the engine's
# dtype are broken by the true values, and the tolerance covers one side's rounding (the engine's), not two.
WIDER = {torch.bfloat16: torch.float32, torch.float16: torch.float32, torch.float32: torch.float64}


def reference_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the teacher-forced reference computes a ``dtype`` model in: one format wider, float64 as is."""
    return WIDER.get(dtype, dtype)


@dataclass(frozen=True, slots=True)
class TokenLogits:
    """The reference's argmax, its logit and the logit of the engine's token at each output position
    (``perfsuite.testing.verdict.TokenScores``)."""

    argmax_tokens: tuple[int, ...]
    argmax_logits: tuple[float, ...]
    token_logits: tuple[float, ...]


class TeacherForcedScorer:
    """The reference's logits at every token an engine produced, given the engine's own prefix.

    One forward pass of the Hugging Face model (not perfsuite's runner) over
    the prompt and the output but its last token; the logits at the last
    prompt position and after each output token score the next one. The
    model's weights, as stored in its dtype, are computed in
    ``reference_dtype`` (a copy is made on the first score).
    """

    def __init__(self, model) -> None:
        self._model = model
        self.dtype = reference_dtype(model.dtype)

    @property
    def model(self):
        if self._model.dtype != self.dtype:
            self._model = copy.deepcopy(self._model).to(self.dtype)
        return self._model

    @torch.inference_mode()
    def score(self, prompt: tuple[int, ...], tokens: tuple[int, ...]) -> TokenLogits:
        """The scores of ``tokens`` up to the first that is not in the vocabulary (none past it)."""
        model = self.model
        vocab_size = model.config.vocab_size
        tokens = tokens[: next((i for i, t in enumerate(tokens) if t >= vocab_size), len(tokens))]
        if not tokens:
            return TokenLogits((), (), ())
        input_ids = torch.tensor([prompt + tokens[:-1]], device=model.device)  # [1, P + N - 1]
        logits = model(input_ids=input_ids).logits[0, len(prompt) - 1 :]  # [N, vocab]
        best_logits, best_tokens = logits.max(dim=-1)
        token_logits = logits.gather(1, torch.tensor(tokens, device=model.device)[:, None]).squeeze(1)
        return TokenLogits(tuple(best_tokens.tolist()), tuple(best_logits.tolist()), tuple(token_logits.tolist()))
