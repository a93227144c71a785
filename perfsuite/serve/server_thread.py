"""A ``CompletionServer`` on its own event loop in a background thread."""

from __future__ import annotations

import asyncio
import threading

from perfsuite.serve.app import CompletionServer


class ServerThread:
    """A ``CompletionServer`` on its own event loop in a background thread (tests, notebooks)."""

    def __init__(self, server: CompletionServer, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = server
        self.host = host
        self.port = port
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="perfsuite-serve", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(timeout=30.0):
            raise RuntimeError("the server did not start within 30 s")
        if self._error is not None:
            raise RuntimeError(f"the server failed to start: {self._error}") from self._error
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout=30.0)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as error:  # reported to __enter__ when it happens before ready
            self._error = error
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self.port = await self.server.start(self.host, self.port)
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            await self.server.stop()
