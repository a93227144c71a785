"""Admission: when a run's requests get into an engine, and what is recorded of each.

When they are scheduled to arrive is the workload's (``perfsuite.workload.arrivals``); this module
lets each in.

Pure Python, no torch. ``Engine.run`` and every peer adapter (hf-static,
hf-cb, vllm) serve a run with these, so their latencies are comparable:

- a request gets in once its ``arrival_time`` has passed, and its record's
  arrival is the run start plus that offset;
- with ``max_concurrency`` the run is a closed loop: a request gets in only
  while fewer than that many are unfinished, and its arrival is that moment;
- every request gets a record; duplicate ids raise ``ValueError`` before
  anything runs;
- a request that ``follows`` another (a conversation's next turn, ``FollowUp``)
  waits for it: when the parent finishes (``finished``), its prompt becomes the
  parent's prompt and output plus its own message, and it is due
  ``think_time`` later. Only a run loop that reports finished requests can
  serve follow-ups (``resolves_follow_ups=True``); any other refuses them;
- an open-loop admission carries when it was scheduled, when it could first
  have got in (not before the engine's last step ended: ``engine_free_since``)
  and when it did, for the load generator's self-check (``perfsuite.measure.send_lag``).
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from perfsuite.engine.types import FinishReason, Request, RequestRecord, StepOutput, check_unique_ids


@dataclass(frozen=True, slots=True)
class Admission:
    """A request let into the engine, with its record's (absolute, clock) arrival time."""

    request: Request
    arrival_time: float
    scheduled_time: float | None = None  # open loop only: the run start plus the request's offset
    send_ready_time: float | None = None  # the later of that and the end of the engine's last step
    sent_time: float | None = None  # when it got in


class ArrivalQueue:
    """The requests of one run that are not in the engine yet, released when they are due."""

    def __init__(
        self,
        requests: Iterable[Request],
        max_concurrency: int | None,
        clock: Callable[[], float] = time.perf_counter,
        *,
        resolves_follow_ups: bool = False,
        engine_name: str = "this engine",
    ) -> None:
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 or None, got {max_concurrency}")
        self.requests = tuple(sorted(requests, key=lambda r: r.arrival_time))
        check_unique_ids(self.requests)
        if not resolves_follow_ups:
            refuse_follow_ups(self.requests, engine_name)
        self._follow_ups = follow_ups_by_parent(self.requests)
        self.max_concurrency = max_concurrency
        self._pending = deque(r for r in self.requests if r.follows is None)
        self._clock = clock
        self.start_time = clock()

    def __len__(self) -> int:
        """Requests not in the engine yet, follow-ups whose parent has not finished included."""
        return len(self._pending) + sum(len(children) for children in self._follow_ups.values())

    def finished(self, request: Request, output_token_ids: Sequence[int], finished_time: float) -> None:
        """``request`` (as the engine served it) finished at ``finished_time``: its follow-ups become due."""
        offset = finished_time - self.start_time
        for child in self._follow_ups.pop(request.request_id, ()):
            assert child.follows is not None  # follow_ups_by_parent holds only requests that follow another
            due = child.continued(request.prompt_token_ids, tuple(output_token_ids), offset + child.follows.think_time)
            bisect.insort(self._pending, due, key=lambda r: r.arrival_time)

    def start(self) -> float:
        """Start the run's clock now (after the engine's set-up) and return the start time."""
        self.start_time = self._clock()
        return self.start_time

    def admit(self, num_unfinished: int, engine_free_since: float | None = None) -> list[Admission]:
        """Every request whose arrival has passed, as far as the concurrency limit lets them in.

        ``engine_free_since``: when the engine's last step ended. A request due
        during that step could not get in before it ended; that wait is the
        engine's, not the load generator's.
        """
        now = self._clock()
        admitted: list[Admission] = []
        while self._pending and self._pending[0].arrival_time <= now - self.start_time:
            if not self.has_room(num_unfinished + len(admitted)):
                break
            request = self._pending.popleft()
            if self.max_concurrency is not None:
                admitted.append(Admission(request, now))
                continue
            scheduled = self.start_time + request.arrival_time
            ready = scheduled if engine_free_since is None else max(scheduled, engine_free_since)
            admitted.append(Admission(request, scheduled, scheduled, ready, now))
        return admitted

    def has_room(self, num_unfinished: int) -> bool:
        return self.max_concurrency is None or num_unfinished < self.max_concurrency

    def seconds_to_next_arrival(self) -> float:
        """How long until the next pending request arrives (0 if it has); inf when none is pending.

        Asked with only follow-ups left, whose parents are gone, it raises: they would wait forever.
        """
        if not self._pending and self._follow_ups:
            waiting = sorted(child.request_id for children in self._follow_ups.values() for child in children)
            raise RuntimeError(
                f"follow-ups {waiting} wait for {sorted(self._follow_ups)}, which are no longer in flight: "
                "the run loop did not report them finished (ArrivalQueue.finished)"
            )
        if not self._pending:
            return float("inf")
        return max(0.0, self._pending[0].arrival_time - (self._clock() - self.start_time))


def refuse_follow_ups(requests: Iterable[Request], engine_name: str) -> None:
    """``ValueError`` when any request is a conversation's later turn, which ``engine_name`` cannot serve."""
    follow_ups = [r.request_id for r in requests if r.follows is not None]
    if follow_ups:
        shown = ", ".join(repr(request_id) for request_id in follow_ups[:3])
        more = f" and {len(follow_ups) - 3} more" if len(follow_ups) > 3 else ""
        raise ValueError(
            f"{engine_name} cannot serve multi-turn follow-ups ({shown}{more} wait for an earlier turn's output, "
            "which its run loop does not feed back); run a multi_turn workload on static, inflight or paged"
        )


def follow_ups_by_parent(requests: Sequence[Request]) -> dict[str, list[Request]]:
    """Each parent's follow-ups, checked: the parent is in the run and the bounds agree.

    The bounds also rule out a cycle: each turn's ``max_total_tokens`` exceeds its parent's.
    """
    by_id = {r.request_id: r for r in requests}
    children: dict[str, list[Request]] = {}
    for request in requests:
        if request.follows is None:
            continue
        parent = by_id.get(request.follows.parent_id)
        if parent is None:
            raise ValueError(
                f"request {request.request_id!r} follows {request.follows.parent_id!r}, which is not in the run; "
                "serve a conversation's turns in one run"
            )
        if request.follows.max_context_tokens != parent.max_total_tokens:
            raise ValueError(
                f"request {request.request_id!r}: max_context_tokens={request.follows.max_context_tokens} but its "
                f"parent {parent.request_id!r} can reach {parent.max_total_tokens} tokens; make them equal"
            )
        children.setdefault(parent.request_id, []).append(request)
    return children


def resolved_prompts(requests: Sequence[Request], outputs: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """Each request's prompt as the engine served it, follow-ups' from their parents' ``outputs`` (by request id).

    For checks after a run (greedy equivalence, lengths): a follow-up's prompt is only known then.
    """
    by_id = {r.request_id: r for r in requests}
    prompts: dict[str, tuple[int, ...]] = {}
    for request in requests:
        unresolved = []  # the request and its ancestors up to one resolved already, or the conversation's start
        current: Request | None = request
        while current is not None and current.request_id not in prompts:
            unresolved.append(current)
            current = None if current.follows is None else by_id[current.follows.parent_id]
        for turn in reversed(unresolved):
            if turn.follows is None:
                prompts[turn.request_id] = turn.prompt_token_ids
            else:
                parent_id = turn.follows.parent_id
                prompts[turn.request_id] = prompts[parent_id] + tuple(outputs[parent_id]) + turn.prompt_token_ids
    return prompts


@dataclass(slots=True)
class RecordBuilder:
    """One request's tokens and timestamps as they come; ``build`` makes its ``RequestRecord``."""

    request: Request
    arrival_time: float
    first_scheduled_time: float | None = None
    token_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    finished_time: float | None = None
    finish_reason: FinishReason | None = None
    scheduled_time: float | None = None
    send_ready_time: float | None = None
    sent_time: float | None = None
    num_cached_tokens: int | None = None
    logprobs: list[float] = field(default_factory=list)  # of the tokens that came with one

    @classmethod
    def admitted(cls, admission: Admission) -> RecordBuilder:
        """The record of a request the ``ArrivalQueue`` let in, with its send times."""
        return cls(
            admission.request,
            admission.arrival_time,
            scheduled_time=admission.scheduled_time,
            send_ready_time=admission.send_ready_time,
            sent_time=admission.sent_time,
        )

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def scheduled_at(self, scheduled_time: float, num_cached_tokens: int | None = None) -> None:
        """The request's first step (later calls change nothing); ``num_cached_tokens``: its prefix cache hit."""
        if self.first_scheduled_time is None:
            self.first_scheduled_time = scheduled_time
            self.num_cached_tokens = num_cached_tokens

    def add(self, output: StepOutput, token_time: float) -> None:
        """A token whose finish reason the engine decided (perfsuite's scheduler)."""
        if self.is_finished:
            raise RuntimeError(f"request {self.request.request_id!r} got a token after it finished")
        self.token_ids.append(output.token_id)
        self.token_times.append(token_time)
        if output.logprob is not None:
            self.logprobs.append(output.logprob)
        if output.finish_reason is not None:
            self.finish(output.finish_reason, token_time)

    def add_token(self, token_id: int, token_time: float, eos_token_id: int | None) -> StepOutput:
        """A token from an engine that does not stop requests our way: the request's own rule decides."""
        reason = self.request.sampling_params.finish_reason(token_id, len(self.token_ids) + 1, eos_token_id)
        output = StepOutput(self.request.request_id, token_id, reason)
        self.add(output, token_time)
        return output

    def add_tokens(
        self, token_ids: Sequence[int], times: Sequence[float], eos_token_id: int | None
    ) -> list[StepOutput]:
        """Tokens up to the first that finishes the request; any the engine produced past it are dropped."""
        outputs = []
        for token_id, token_time in zip(token_ids, times):
            outputs.append(self.add_token(token_id, token_time, eos_token_id))
            if self.is_finished:
                break
        return outputs

    def finish(self, reason: FinishReason, finished_time: float) -> None:
        self.finish_reason = reason
        self.finished_time = finished_time

    def build(self) -> RequestRecord:
        return RequestRecord(
            request_id=self.request.request_id,
            num_prompt_tokens=self.request.num_prompt_tokens,
            output_token_ids=tuple(self.token_ids),
            arrival_time=self.arrival_time,
            first_scheduled_time=self.first_scheduled_time,
            token_times=tuple(self.token_times),
            finished_time=self.finished_time,
            finish_reason=self.finish_reason,
            scheduled_time=self.scheduled_time,
            send_ready_time=self.send_ready_time,
            sent_time=self.sent_time,
            num_cached_tokens=self.num_cached_tokens,
            # all or nothing: a record's log-probabilities line up with its tokens
            output_logprobs=tuple(self.logprobs)
            if self.token_ids and len(self.logprobs) == len(self.token_ids)
            else None,
        )
