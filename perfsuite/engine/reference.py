"""The oracle: unbatched greedy decoding, one request at a time.

It deliberately runs the Hugging Face model itself rather than perfsuite's
model runner, so a bug in the runner's positions, masks or cache indexing
cannot hide by appearing on both sides of a comparison.
"""

from __future__ import annotations

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

