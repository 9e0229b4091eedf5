"""``hutch mcp --http``'s connections (uvicorn's HTTP/1.1 protocol): a deadline for each request
head and a bound on the connections waiting for one, as ``hutch serve``'s listeners have
(edge/listener.py), with the same settings.

Before, uvicorn's only timer was its keep-alive one, armed after an answer and cancelled by any
byte received: a connection that sent nothing, or trickled a head a byte at a time, was held
for as long as its client liked, and any number of them, up to the open-file limit, stopped the
server accepting anyone else's.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from hutch.core.waiting import WaitingBound, default_waiting, read_settings
from hutch.edge.out_of_files import open_file_limit

# Connections accepted at once, before any of them is counted (asyncio accepts up to the listen
# backlog in one go, then makes their protocols): uvicorn's 2,048 let one burst run the process
# out of descriptors past the bound; aiohttp's (hutch serve's) 128.
BACKLOG = 128


class HeadDeadlineProtocol(H11Protocol):
    """What ``protocol()`` makes: its connections' bound is ``waiting`` (shed when the process
    runs out of descriptors: mcp_http.py)."""

    waiting: WaitingBound[Any]


def settings(environ: dict[str, str] | None = None) -> tuple[float, int]:
    """(the head deadline, the bound) from ``HUTCH_REQUEST_HEAD_SECONDS`` and
    ``HUTCH_MAX_WAITING_CONNECTIONS``; a bad one is a ValueError naming it."""
    seconds, most = read_settings(os.environ if environ is None else environ)
    return seconds, most or default_waiting(open_file_limit())


def protocol(head_seconds: float, most_waiting: int) -> type[HeadDeadlineProtocol]:
    """uvicorn's HTTP/1.1 protocol (``uvicorn.Config(http=...)``) whose connections have
    ``head_seconds`` for each request head, from their start or their last answer's end, and of
    which at most ``most_waiting`` wait for one (the longest-waiting closed first); its
    ``waiting`` is that bound."""
    bound: WaitingBound[HeadDeadline] = WaitingBound(most_waiting, lambda conn: conn.waiting_since(),
                                                     lambda conn: conn.transport.close())

    class HeadDeadline(HeadDeadlineProtocol):
        waiting = bound
        _since: float
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._wait()
            bound.made(self)

        def connection_lost(self, exc: Exception | None) -> None:
            bound.lost(self)
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()  # (a pipelined request may be under way when it returns)
            if not self.transport.is_closing():
                self._wait()

        def _wait(self) -> None:
            self._since = self.loop.time()
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(head_seconds, self._late)

        def waiting_since(self) -> float | None:
            """When it began to wait for a request head; None with a request under way (its
            head in, its answer not all sent), once upgraded, or closed."""
            if self.transport is None or self.transport.is_closing() or self.transport.get_protocol() is not self:
                return None
            return self._since if self.cycle is None or self.cycle.response_complete else None

        def _late(self) -> None:
            self._deadline = None
            if self.waiting_since() is not None:
                self.transport.close()  # as uvicorn's keep-alive timer closes one: no answer

    return HeadDeadline
