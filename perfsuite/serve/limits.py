"""``ServeLimits``: how many requests and prompts, how large a body, how many records a server keeps."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_OPEN_REQUESTS = 256


@dataclass(frozen=True, slots=True)
class ServeLimits:
    """The bounds that keep one server's memory and queue finite.

    ``max_open_requests`` counts engine requests: an HTTP request with several
    prompts holds one per prompt, and takes at most ``max_prompts_per_request``.
    """

    max_open_requests: int = DEFAULT_MAX_OPEN_REQUESTS
    max_prompts_per_request: int = 64
    max_body_bytes: int = 1 << 20
    default_max_tokens: int = 16  # OpenAI's default when a request names none
    num_recent_records: int = 1024
    shutdown_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        for name in (
            "max_open_requests",
            "max_prompts_per_request",
            "max_body_bytes",
            "default_max_tokens",
            "num_recent_records",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"ServeLimits.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def max_prompts(self) -> int:
        """The most prompts one request may hold: more could never be open at once."""
        return min(self.max_prompts_per_request, self.max_open_requests)
