"""What the peer adapters check before a run; their run semantics come from ``perfsuite.engine.admission``.

Pure Python, no torch. A peer adapter drives someone else's engine but keeps
``Engine.run``'s semantics, or its latencies would not be comparable: it
lets requests in with an ``ArrivalQueue`` and records them with
``RecordBuilder``s, stopped by each request's own ``SamplingParams``
(``RecordBuilder.add_token``). Duplicate ids and requests that cannot fit
raise ``ValueError`` before anything runs.
"""

from __future__ import annotations

from collections.abc import Iterable

from perfsuite.engine.types import Request


def check_requests_fit(requests: Iterable[Request], max_seq_len: int, vocab_size: int) -> None:
    """Refuse, before anything runs, a request the engine could never serve (it would fail or wait forever)."""
    for request in requests:
        request.check_fits(max_seq_len)
        outside = [t for t in request.prompt_token_ids if not 0 <= t < vocab_size]
        if outside:
            raise ValueError(
                f"request {request.request_id!r}: prompt token ids {outside[:5]} are outside the model's "
                f"vocabulary 0..{vocab_size - 1}"
            )
