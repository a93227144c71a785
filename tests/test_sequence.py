"""``Sequence``: the scheduler's per-request state, read a chunk at a time."""

from __future__ import annotations

from perfsuite.engine import FinishReason, Request, SamplingParams
from perfsuite.engine.sequence import Sequence


def test_chunks_read_across_the_prompt_and_the_output_from_one_list():
    sequence = Sequence(Request("r", (5, 6, 7), SamplingParams(3, ignore_eos=True)))
    tokens = sequence.all_token_ids
    assert sequence.append_token(8, eos_token_id=None) is None
    assert sequence.append_token(9, eos_token_id=None) is None
    assert sequence.all_token_ids is tokens, "appended in place, not rebuilt from prompt and output"
    assert sequence.token_ids(0, 2) == (5, 6)
    assert sequence.token_ids(2, 5) == (7, 8, 9)
    assert sequence.token_ids(4, 5) == (9,)
    assert (sequence.num_tokens, sequence.num_output_tokens) == (5, 2)
    assert sequence.append_token(10, eos_token_id=None) is FinishReason.LENGTH
