"""A client shard: an ``openai-http`` client on a Ray node that sends its share of a schedule to the server.

Plain Python (the controller's ``ClientShards`` makes it a Ray actor); it
imports neither Ray, until it names its node, nor torch: a shard loads no
model. So it has no tokenizer either: prompts go as token ids, and it counts
the tokens the server streams as ids (``perfsuite serve``; vLLM with
``return_token_ids``). A server that streams text only fails the run with an
error that says so. Every method takes and returns a string of
``perfsuite.cluster.wire``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from perfsuite.cluster import wire
from perfsuite.cluster.actor import this_node

if TYPE_CHECKING:
    from perfsuite.adapters.openai_http import OpenAIHttpEngine

TEXT_ONLY = (
    "client shards (--perf-client-shards) load no tokenizer: they count the token ids the server streams, and this "
    "server streamed text only; measure it with one client (without --perf-client-shards), or serve token ids "
    "(perfsuite serve; vLLM with return_token_ids)"
)


class ClientShardActor:
    def __init__(self, spec_text: str) -> None:
        self._spec = wire.loads(wire.HttpClientSpec, spec_text)
        self._node = this_node()
        self._engines: dict[int, OpenAIHttpEngine] = {}  # batch size -> its client, negotiated once

    def clock(self) -> str:
        return wire.dumps(wire.ClockReading(time.perf_counter()))

    def prepare(self, text: str) -> str:
        """Build the client for a batch size and settle its prompt format with the server, before any timed run."""
        prepare = wire.loads(wire.ShardPrepare, text)
        engine = self._engine(prepare.batch_size, prepare.probe_prompt_ids)
        engine.prompt_format  # noqa: B018 - the probe request, outside any timed run
        return self.clock()

    def run(self, text: str) -> str:
        from perfsuite.adapters.openai_http import OpenAIHttpError

        message = wire.loads(wire.ShardRun, text)
        engine = self._engines.get(message.batch_size)
        if engine is None:
            raise OpenAIHttpError(f"shard {message.shard}: no client prepared for batch size {message.batch_size}")
        run = engine.run(message.requests, max_concurrency=message.max_concurrency, start_at=message.start_time)
        return wire.dumps(wire.ShardResult(message.test_id, message.shard, self._node, run, engine.served_model))

    def _engine(self, batch_size: int, probe_prompt_ids: Sequence[int]):
        from perfsuite.adapters.openai_http import OpenAIHttpEngine

        if batch_size not in self._engines:
            self._engines[batch_size] = OpenAIHttpEngine(
                self._spec.endpoint,
                batch_size,
                _no_tokenizer,
                options=self._spec.options,
                probe_prompt_ids=probe_prompt_ids,
            )
        return self._engines[batch_size]


def _no_tokenizer(text: str) -> Sequence[int]:
    from perfsuite.adapters.openai_http import OpenAIHttpError

    raise OpenAIHttpError(TEXT_ONLY)
