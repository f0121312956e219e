"""The HTTP connections `moerag serve` accepts: none held open by a client that sends nothing.

uvicorn closes a keep-alive connection that stays idle after a response (`timeout_keep_alive`),
but not one that never sends a whole request: a socket opened and left silent, or a request
whose headers stop half-way, held its connection (and a file descriptor) forever.
`HeaderTimeoutProtocol` closes a connection whose request headers are not complete
MOERAG_HEADER_SECONDS after it opened or after its last response. A request's body and a
streamed answer are not bounded by it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.core.settings import Settings


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing a connection whose request headers are late."""

    header_seconds = 10.0  # MOERAG_HEADER_SECONDS, set by `configure` in each serving process

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request's headers are due in time too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_seconds, self._late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def configure(settings: Settings) -> None:
    """The header timeout of this process's connections (a worker of `serve --workers N` calls it
    too: the class, not its attribute, travels to the worker)."""
    HeaderTimeoutProtocol.header_seconds = settings.header_seconds


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's connection options for `moerag serve`: the protocol above and its timeouts."""
    configure(settings)
    return {"http": HeaderTimeoutProtocol, "timeout_keep_alive": settings.keep_alive_seconds}
