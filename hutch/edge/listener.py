"""How hutch's HTTP listeners run (the API's, with the Web App and the port proxy it serves,
E2B's, and the node agent's): a connection must send its whole request head within a
deadline, and the connections waiting for one are bounded, so that a client that opens
connections and sends nothing, or trickles a head a byte at a time (slowloris), cannot hold
the server's file descriptors and with them every tenant's requests.

Before, a connection that never finished its head was closed only by aiohttp's keep-alive
timer (75 s on the API's listener, an hour on E2B's), and nothing bounded how many there were
but the open-file limit; such connections belong to no organization, so the per-organization
count of requests (api/at_once.py) did not see them.

The deadline (``HUTCH_REQUEST_HEAD_SECONDS``) is aiohttp's keep-alive timer, which has the
semantics wanted: it runs from the connection's start and from each answer's end, bytes
arriving do not push it back, and when it fires it closes the connection only if that is still
waiting for a head (a request being handled -- a long-poll, a stream, a terminal, an upload --
is not cut). The bound (``HUTCH_MAX_WAITING_CONNECTIONS``) is checked as connections are made,
over every listener of the process (they share its descriptors): past it, the connections
that have waited longest are closed first (core/waiting.py keeps the count).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from hutch.core.waiting import WaitingBound
from hutch.edge import out_of_files

log = logging.getLogger("hutch.api")

Waiting = WaitingBound[RequestHandler]


def waiting(limit: int) -> Waiting:
    """The bound for the listeners of one process (they share its descriptors)."""
    return WaitingBound(limit, _waiting_since, RequestHandler.force_close)  # closed as its deadline does


def _waiting_since(handler: RequestHandler) -> float | None:
    """When ``handler``'s connection began to wait for a request head, or None: closed already
    (its connection_lost to come), or a request under way. Waiting: it has had no request yet,
    or it waits for the next (aiohttp's own idle test, as its keep-alive timer makes)."""
    if handler.transport is None:
        return None
    waiter = handler._waiter
    if handler._request_count and (waiter is None or waiter.done()):
        return None
    # When its head deadline falls: its wait's start plus the same deadline for every one; not
    # set yet (0) for the connection being made, the newest.
    return float(handler._next_keepalive_close_time) or math.inf


class _Server(web.Server):
    """aiohttp's server, telling ``Waiting`` of each connection made and lost."""

    def __init__(self, waiting: Waiting, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting = waiting

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self._waiting.made(handler)

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self._waiting.lost(handler)
        super().connection_lost(handler, exc)


class Runner(web.AppRunner):
    """An ``AppRunner`` whose connections have ``head_seconds`` for each request head and count
    toward ``waiting``."""

    def __init__(self, app: web.Application, waiting: Waiting, head_seconds: float, **kwargs: Any) -> None:
        super().__init__(app, keepalive_timeout=head_seconds, access_log=None, **kwargs)
        self._waiting = waiting
        self.head_seconds = head_seconds

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()  # the app started and frozen, its handler's settings
        return _Server(self._waiting, made.request_handler, request_factory=made.request_factory,
                       handler_cancellation=made.handler_cancellation, loop=asyncio.get_running_loop(),
                       **made._kwargs)


class Site(web.TCPSite):
    """aiohttp's ``TCPSite`` for a ``Runner``, whose TLS handshakes have its head deadline too.

    A TLS connection reaches aiohttp (its head deadline, the bound) only once its handshake is
    done; until then asyncio's handshake timeout was the only one, and aiohttp leaves it at its
    60 s: a client that opened connections and sent no ClientHello held each for a minute."""

    async def start(self) -> None:
        await web.BaseSite.start(self)  # then what TCPSite.start does, with the handshake's timeout
        runner = self._runner
        assert isinstance(runner, Runner) and runner.server is not None
        self._server = await asyncio.get_running_loop().create_server(
            runner.server, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            reuse_address=self._reuse_address, reuse_port=self._reuse_port,
            ssl_handshake_timeout=runner.head_seconds if self._ssl_context is not None else None)
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port


def serve(app: web.Application, host: str, port: int, waiting: Waiting, head_seconds: float) -> None:
    """Blocking: serve ``app`` on ``host``:``port`` until SIGTERM or SIGINT, then shut down as
    ``web.run_app`` does (which cannot take a runner of ours): a signal during the start ends
    it too, and what had started is cleaned up."""

    async def run() -> None:
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        assert task is not None
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, task.cancel)
        # Out of descriptors, accept() fails: shed waiting connections, log it once in a while.
        out_of_files.install(loop, waiting.shed, log)
        runner = Runner(app, waiting, head_seconds, shutdown_timeout=60.0)
        try:
            await runner.setup()
            await Site(runner, host, port).start()
            await loop.create_future()  # until a signal
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError):
        asyncio.run(run())
