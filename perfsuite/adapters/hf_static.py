"""``hf-static``: Hugging Face ``model.generate`` on left-padded batches, as a naive benchmark batches.

When idle, the engine takes up to B requests that have arrived (first come,
first served), left-pads their prompts into one tensor and runs one greedy
``generate`` over them. The batch ends when every row has met its own stop
rule; until then a finished row keeps being computed, as ``generate`` does.

``generate`` knows one ``max_new_tokens`` and one EOS for the whole batch, so
it runs with the batch's largest ``max_new_tokens`` and with its own EOS
stopping switched off. A streamer (``_StepStreamer``) timestamps each step's
tokens and applies each request's ``SamplingParams`` (length, EOS unless
``ignore_eos``, stop tokens) to its own row; a stopping criterion
(``_RowsFinished``) ends the batch once all rows are done.

Counters are exact and count what ``generate`` computes, per batch of n rows
whose longest prompt has S tokens and which ran ``steps`` forward passes:

- forward passes: ``steps`` (the prefill, then one per decode step);
- decode steps: ``steps - 1``;
- prefill tokens: the real prompt tokens;
- decode tokens: the tokens fed to decode steps for unfinished rows (a row
  with L output tokens feeds L - 1);
- padding tokens: padded slot-tokens, the left padding of the prompts
  (S minus each prompt's length) plus one per decode step for each row that
  had already finished. Attention over the masked pad positions is not counted.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from perfsuite.adapters.peer_support import check_requests_fit
from perfsuite.adapters.protocol import Backend, EngineConfig
from perfsuite.engine.admission import ArrivalQueue, RecordBuilder
from perfsuite.engine.names import HF_STATIC
from perfsuite.engine.types import EngineCounters, Request, RunResult, StepOutput

StepHook = Callable[[list[StepOutput]], None]


class _StepStreamer(BaseStreamer):
    """Times each step's tokens and records them for the rows still going.

    ``generate`` hands a streamer the prompt once, then every step's new token
    column right after choosing it (before it asks its stopping criteria).
    """

    def __init__(self, rows: Sequence[RecordBuilder], eos_token_id: int | None, after_step: StepHook) -> None:
        self.rows = rows
        self.eos_token_id = eos_token_id
        self.after_step = after_step
        self.num_steps = 0
        self._seen_prompt = False

    def put(self, value: torch.Tensor) -> None:
        if not self._seen_prompt:
            self._seen_prompt = True
            return
        new_tokens = value.reshape(-1).tolist()  # the host copy waits for the device
        now = time.perf_counter()
        self.num_steps += 1
        outputs = [
            row.add_token(token, now, self.eos_token_id)
            for row, token in zip(self.rows, new_tokens)
            if not row.is_finished
        ]
        self.after_step(outputs)

    def end(self) -> None:
        pass


class _RowsFinished(StoppingCriteria):
    """Ends the batch once every row has met its own request's length, EOS or stop rule."""

    def __init__(self, rows: Sequence[RecordBuilder]) -> None:
        self.rows = rows

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        # torch types every tensor as Tensor; transformers names the bool one BoolTensor
        return torch.tensor([row.is_finished for row in self.rows], device=input_ids.device)  # type: ignore[return-value]


def _batch_counters(rows: Sequence[RecordBuilder], num_steps: int) -> EngineCounters:
    prompt_lengths = [row.request.num_prompt_tokens for row in rows]
    output_lengths = [len(row.token_ids) for row in rows]
    left_padding = sum(max(prompt_lengths) - length for length in prompt_lengths)
    finished_rows = sum(num_steps - length for length in output_lengths)
    return EngineCounters(
        num_forward_passes=num_steps,
        num_decode_steps=num_steps - 1,
        num_prefill_tokens=sum(prompt_lengths),
        num_decode_tokens=sum(length - 1 for length in output_lengths),
        num_padding_tokens=left_padding + finished_rows,
    )


def _add(total: EngineCounters, batch: EngineCounters) -> EngineCounters:
    return EngineCounters(
        num_forward_passes=total.num_forward_passes + batch.num_forward_passes,
        num_decode_steps=total.num_decode_steps + batch.num_decode_steps,
        num_prefill_tokens=total.num_prefill_tokens + batch.num_prefill_tokens,
        num_decode_tokens=total.num_decode_tokens + batch.num_decode_tokens,
        num_padding_tokens=total.num_padding_tokens + batch.num_padding_tokens,
    )


class HFStaticEngine:
    """Static batching with ``model.generate``; the batch is left-padded with an attention mask."""

    name = HF_STATIC
    # Left padding with the attention mask and the position ids generate derives
    # from it computes what unbatched decoding computes: held to it by
    # tests/test_adapter_equivalence.py (generate picks from float32 logits, so in
    # float64 only a top-2 margin below float32 resolution could differ).
    greedy_equal = True

    def __init__(self, model, eos_token_id: int | None, pad_token_id: int, config: EngineConfig) -> None:
        self.model = model
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.config = config

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    def run(
        self,
        requests: Iterable[Request],
        on_step: StepHook | None = None,
        max_concurrency: int | None = None,
    ) -> RunResult:
        """Serve ``requests`` with ``Engine.run``'s semantics (see ``perfsuite.engine.admission``).

        Requests get in between steps, as in ``Engine.run``; one that gets in
        while a batch runs waits for the next batch.
        """
        arrivals = ArrivalQueue(requests, max_concurrency, engine_name=self.name)
        check_requests_fit(arrivals.requests, self.config.max_seq_len, self.model.get_input_embeddings().num_embeddings)
        records: dict[str, RecordBuilder] = {}
        waiting: deque[RecordBuilder] = deque()
        counters = EngineCounters()

        def admit(num_running: int) -> None:
            for admission in arrivals.admit(len(waiting) + num_running):
                row = RecordBuilder(admission.request, admission.arrival_time)
                records[admission.request.request_id] = row
                waiting.append(row)

        start = arrivals.start()
        while arrivals or waiting:
            admit(0)
            if not waiting:
                time.sleep(arrivals.seconds_to_next_arrival())
                continue
            batch = [waiting.popleft() for _ in range(min(self.batch_size, len(waiting)))]
            counters = _add(counters, self._generate(batch, on_step, admit))
        return RunResult(self.name, tuple(r.build() for r in records.values()), start, time.perf_counter(), counters)

    def _generate(
        self, rows: list[RecordBuilder], on_step: StepHook | None, admit: Callable[[int], None]
    ) -> EngineCounters:
        def after_step(outputs: list[StepOutput]) -> None:
            if on_step is not None:
                on_step(outputs)
            admit(sum(1 for row in rows if not row.is_finished))

        streamer = _StepStreamer(rows, self.eos_token_id, after_step)
        started = time.perf_counter()
        for row in rows:
            row.scheduled_at(started)
        input_ids, attention_mask = self._left_padded([row.request for row in rows])
        generation_config = GenerationConfig(
            do_sample=False,
            max_new_tokens=max(row.request.sampling_params.max_new_tokens for row in rows),
            # generate fills unset fields from the model's own generation config, EOS
            # included; an empty list is "set" and stops nothing, so a row that ignores
            # EOS keeps its tokens and _RowsFinished alone decides when each row is done.
            eos_token_id=[],
            pad_token_id=self.pad_token_id,
        )
        self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=generation_config,
            stopping_criteria=StoppingCriteriaList([_RowsFinished(rows)]),
            streamer=streamer,
        )
        unfinished = [row.request.request_id for row in rows if not row.is_finished]
        if unfinished:
            raise RuntimeError(f"generate stopped before requests {unfinished} met their own stop rules")
        return _batch_counters(rows, streamer.num_steps)

    def _left_padded(self, requests: Sequence[Request]) -> tuple[torch.Tensor, torch.Tensor]:
        longest = max(r.num_prompt_tokens for r in requests)
        ids = [[self.pad_token_id] * (longest - r.num_prompt_tokens) + list(r.prompt_token_ids) for r in requests]
        mask = [[0] * (longest - r.num_prompt_tokens) + [1] * r.num_prompt_tokens for r in requests]
        device = self.model.device
        # input_ids, attention_mask: [n, longest]
        return torch.tensor(ids, device=device), torch.tensor(mask, device=device)


def _pad_token_id(backend: Backend) -> int:
    """Any id works (padded positions are masked out); prefer the tokenizer's own."""
    pad = getattr(backend.tokenizer, "pad_token_id", None)
    if pad is None:
        pad = backend.eos_token_id
    return 0 if pad is None else int(pad)


def build(backend: Backend, config: EngineConfig) -> HFStaticEngine:
    if backend.model is None:
        raise ValueError("hf-static drives a Hugging Face model; this backend has none (a fake runner?)")
    return HFStaticEngine(backend.model, backend.eos_token_id, _pad_token_id(backend), config)
