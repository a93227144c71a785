"""Multi-turn chat: sessions whose every turn resends the whole conversation so far plus a new message.

Turn 0 of a session is its first prompt; turn k+1 follows turn k
(``perfsuite.engine.types.FollowUp``): its prompt is turn k's prompt, turn k's
answer and a new user message, and it arrives ``think_time`` seconds after
turn k's answer is complete. Each turn is its own request (``s<session>-t<turn>``),
so each has its own TTFT, measured from its own arrival.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from perfsuite.engine.types import FollowUp, Request, SamplingParams
from perfsuite.workload.checks import check_int, is_number
from perfsuite.workload.limits import check_arrival, check_fits_context, check_num_requests, check_prompt_tokens
from perfsuite.workload.prompts import Vocab

MULTI_TURN_KEYS = ("sessions", "turns", "prompt", "message", "output", "think_time")


@dataclass(frozen=True, slots=True)
class MultiTurn:
    """``sessions`` conversations of ``turns`` turns.

    ``prompt``: tokens of a session's first prompt (say, a system prompt and
    the first question); ``message``: tokens of each later user message;
    ``output``: tokens of each answer (EOS ignored, so exactly that many);
    ``think_time``: seconds between an answer and the next message.
    Sessions differ from their first token on.
    """

    sessions: int
    turns: int
    prompt: int = 64
    message: int = 32
    output: int = 32
    think_time: float = 0.0

    def __post_init__(self) -> None:
        check_int(self.sessions, "multi_turn.sessions")
        check_int(self.turns, "multi_turn.turns")
        check_int(self.prompt, "multi_turn.prompt")
        check_int(self.message, "multi_turn.message")
        check_int(self.output, "multi_turn.output")
        if not is_number(self.think_time) or self.think_time < 0:
            raise ValueError(f"multi_turn.think_time must be seconds >= 0, got {self.think_time!r}")
        what = f"multi_turn sessions x turns = {self.sessions} x {self.turns}"
        check_num_requests(self.num_requests, what, "lower sessions or turns")
        check_prompt_tokens(
            self.sessions * (self.prompt + (self.turns - 1) * self.message),
            f"multi_turn sessions x (prompt + (turns - 1) x message) = {self.sessions} x ({self.prompt} + "
            f"{self.turns - 1} x {self.message})",
            "lower sessions or turns, or shorten prompt or message",
        )
        what = (
            f"multi_turn: a session's last turn, (turns - 1) x think_time = {self.turns - 1} x {self.think_time:g} s "
            "after its first,"
        )
        check_arrival(self.last_turn_delay, what, "lower think_time or turns")

    @property
    def num_requests(self) -> int:
        return self.sessions * self.turns

    @property
    def last_turn_delay(self) -> float:
        """Seconds a session's last turn arrives after its first, at the least (answers take time too)."""
        return (self.turns - 1) * self.think_time

    @property
    def max_total_tokens(self) -> int:
        """A session's last turn: every earlier prompt, message and answer, and its own answer."""
        return self.prompt + (self.turns - 1) * self.message + self.turns * self.output

    def check_context(self, max_context: int) -> None:
        """Refuse a session that outgrows the context, with the number of turns that would fit."""
        fitting = (max_context - self.prompt + self.message) // (self.output + self.message)
        if fitting >= 1:
            fix = f"at most {fitting} turns fit; lower turns, or shorten message or output"
        else:
            fix = "not even the first turn fits; shorten prompt or output"
        what = (
            f"a multi_turn session's last turn (prompt + (turns - 1) x message + turns x output = {self.prompt} + "
            f"{self.turns - 1} x {self.message} + {self.turns} x {self.output})"
        )
        check_fits_context(self.max_total_tokens, max_context, what, fix)

    @property
    def label(self) -> str:
        return (
            f"mt{self.sessions}x{self.turns}-in{self.prompt}-msg{self.message}-out{self.output}"
            f"-think{self.think_time:g}"
        )

    def requests(self, vocab: Vocab, seed: int, arrival_times: list[float]) -> list[Request]:
        """Every session's turns, in order; ``arrival_times``: when each session's first turn arrives."""
        if len(arrival_times) != self.sessions:
            raise ValueError(f"{self.sessions} sessions need as many start times, got {len(arrival_times)}")
        rng = random.Random(f"{seed}:multi_turn")
        starts = vocab.draw_distinct(rng, self.sessions, "multi_turn.sessions")
        params = SamplingParams(self.output, ignore_eos=True)
        requests = []
        for session, (start, arrival) in enumerate(zip(starts, arrival_times)):
            turn = Request(f"s{session}-t0", (start, *vocab.draw(rng, self.prompt - 1)), params, arrival)
            requests.append(turn)
            for index in range(1, self.turns):
                follows = FollowUp(turn.request_id, float(self.think_time), turn.max_total_tokens)
                turn = Request(f"s{session}-t{index}", vocab.draw(rng, self.message), params, follows=follows)
                requests.append(turn)
        return requests
