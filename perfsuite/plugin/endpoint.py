"""``--perf-endpoint``: whether the server answers, asked once a session, when a test first builds its client.

A server that is not there failed every ``openai-http`` test on its own, each
with the client's traceback and each after its own connect (30 s apiece where
a firewall drops the packets). Now the first test that builds the client asks
``/v1/models`` once: when that fails, that test fails with one line naming
the URL and what to check, and every later one is skipped, pointing at it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest


@dataclass(slots=True)
class EndpointCheck:
    """The session's one question to ``endpoint``, and its answer once asked."""

    endpoint: str
    api_key: str | None = None
    failure: str | None = None  # why the server did not answer; None: it did, or not asked yet
    is_asked: bool = False
    is_reported: bool = False  # a test has failed with ``failure``; later ones are skipped

    def require(self) -> None:
        """Return when the server answered; else fail the first test that asks, and skip every later one."""
        if not self.is_asked:
            self.failure = self._ask()
            self.is_asked = True
        if self.failure is None:
            return
        if not self.is_reported:
            self.is_reported = True
            pytest.fail(self.failure, pytrace=False)
        pytest.skip(f"--perf-endpoint {self.endpoint} did not answer; the session's first openai-http test says why")

    def _ask(self) -> str | None:
        from perfsuite.adapters.openai_http import base_url
        from perfsuite.adapters.server_info import ServerInfoError, fetch_server_info

        try:
            fetch_server_info(base_url(self.endpoint), api_key=self.api_key)
        except ServerInfoError as error:
            return str(error)  # it names the URL, what failed and what to check
        return None
