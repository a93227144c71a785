"""The errors a completion can end in: OpenAI-style API errors and engine failures."""

from __future__ import annotations


class ApiError(Exception):
    """An error answered as OpenAI's ``{"error": {"message", "type", "param"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    @property
    def kind(self) -> str:
        if self.status == 429:
            return "rate_limit_error"
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


def invalid_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)


class EngineFailure(Exception):
    """The engine raised while a request was in it; the request cannot finish."""
