"""Did each request get the work it asked for? Checked before a run (prompt + output fit) and after it.

A request is complete when it produced exactly ``max_new_tokens``, or fewer
but at least one when it was allowed to stop early and did (``stop``: EOS
without ``ignore_eos``, or one of its stop token ids). Anything else — a
server that ignores ``ignore_eos``, one that cuts an output to fit its context
and still says ``length``, zero tokens — makes a run look faster because it did
less, so the run fails with ``ShortOutputError`` instead of being measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perfsuite.adapters.openai_stream import COUNTED_FROM_TEXT, OpenAIHttpError
from perfsuite.engine.types import FinishReason, Request, SamplingParams

_NUM_NAMED = 5  # requests named in a message; the rest are counted


@dataclass(frozen=True, slots=True)
class LengthMismatch:
    """A request whose output length is not what it asked for."""

    request_id: str
    num_asked: int
    num_received: int
    finish_reason: FinishReason | None
    ignore_eos: bool
    count_source: str

    def describe(self) -> str:
        reason = self.finish_reason.value if self.finish_reason is not None else "none"
        eos = ", ignore_eos" if self.ignore_eos else ""
        return (
            f"{self.request_id!r}: asked {self.num_asked}, got {self.num_received} "
            f"(finish_reason {reason}{eos}; counted from {self.count_source})"
        )


class ShortOutputError(OpenAIHttpError):
    """Requests came back with another number of output tokens than asked; ``mismatches`` lists them."""

    def __init__(self, message: str, mismatches: tuple[LengthMismatch, ...]) -> None:
        super().__init__(message)
        self.mismatches = mismatches


def is_complete(params: SamplingParams, num_received: int, finish_reason: FinishReason | None) -> bool:
    if num_received == params.max_new_tokens:
        return True
    may_stop_early = not params.ignore_eos or bool(params.stop_token_ids)
    return 0 < num_received < params.max_new_tokens and may_stop_early and finish_reason is FinishReason.STOP


def check_output_lengths(mismatches: Sequence[LengthMismatch], url: str, eos_control: str) -> None:
    """``ShortOutputError`` naming the first requests and what to do, when there is any mismatch."""
    if not mismatches:
        return
    named = "; ".join(m.describe() for m in mismatches[:_NUM_NAMED])
    more = f"; and {len(mismatches) - _NUM_NAMED} more" if len(mismatches) > _NUM_NAMED else ""
    message = (
        f"{len(mismatches)} requests to {url} came back with another number of output tokens than asked: "
        f"{named}{more}. A run that did less work than its workload would look faster, so it is not measured. "
        + " ".join(_hints(mismatches, eos_control))
    )
    raise ShortOutputError(message, tuple(mismatches))


def _hints(mismatches: Sequence[LengthMismatch], eos_control: str) -> list[str]:
    hints = []
    if any(m.ignore_eos and m.finish_reason is FinishReason.STOP for m in mismatches):
        if eos_control == "ignore_eos":
            hints.append(
                "The server stopped requests that ignore EOS: it does not honour ignore_eos (llama.cpp does not); "
                "send min_tokens instead with --perf-eos-control min_tokens (or both)."
            )
        else:
            hints.append(
                f"The server stopped requests that ignore EOS although min_tokens was sent (eos_control "
                f"{eos_control!r}): it honours neither ignore_eos nor min_tokens; measure it with workloads "
                "that do not ignore EOS."
            )
    if any(m.finish_reason is FinishReason.LENGTH and m.num_received < m.num_asked for m in mismatches):
        hints.append(
            "The server cut outputs short and still said 'length': it may cap prompt + output below its stated "
            "limit; shorten the workload's prompts or outputs, or start the server with a longer context "
            "(vLLM: --max-model-len)."
        )
    if any(m.num_received == 0 for m in mismatches):
        hints.append("A request with no output token has no TTFT or E2E and must not count as served.")
    if any(m.count_source == COUNTED_FROM_TEXT for m in mismatches):
        hints.append(
            "Counts from re-tokenized text are estimates: the server sent neither token ids nor usage; a server "
            "that honours stream_options.include_usage is counted exactly."
        )
    return hints


def check_prompts_fit(requests: Sequence[Request], max_model_len: int | None, model_id: str, url: str) -> None:
    """An error naming the first requests whose prompt + max_new_tokens exceed the server's ``max_model_len``."""
    if max_model_len is None:
        return  # the server does not say; it answers for itself
    too_long = [r for r in requests if r.max_total_tokens > max_model_len]
    if not too_long:
        return
    named = "; ".join(
        f"{r.request_id!r} needs {r.max_total_tokens} tokens "
        f"({r.num_prompt_tokens} prompt + {r.sampling_params.max_new_tokens} output)"
        for r in too_long[:_NUM_NAMED]
    )
    more = f"; and {len(too_long) - _NUM_NAMED} more" if len(too_long) > _NUM_NAMED else ""
    raise OpenAIHttpError(
        f"{len(too_long)} requests do not fit the max_model_len of {max_model_len} tokens that {url} states for "
        f"{model_id!r}: {named}{more}. Nothing was sent. Shorten the workload, or start the server with a "
        "longer context (vLLM: --max-model-len; llama.cpp: --n_ctx)."
    )
