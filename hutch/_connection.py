"""The one connection under :class:`hutch.client.SandboxClient` and every service it is made
of: the aiohttp session, base URL, bearer key and organization, JSON calls, streamed requests
and output streams, and the mapping of failures to :mod:`hutch.errors`. With no server to talk
to it runs the engine in this process (hutch/_embedded.py, the SDK's one bridge to the server's
code, imported only here and only then), started at its first call.

Its methods without an underscore are the SDK's internal API: the services
(hutch/_sandboxes.py, _executions.py, _files.py, _copies.py, _snapshots.py, tenancy.py), the
handles, the terminal and the output readers hold a :class:`Connection` and call it, rather than
reaching into the client's privates.
"""

from __future__ import annotations

import asyncio
import contextlib
import json as jsonlib
import os
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote, urljoin, urlsplit

import aiohttp
import attrs

from hutch import _config
from hutch._shapes import Duration, _query
from hutch._version import __version__
from hutch.errors import ConnectionFailed, InvalidInput, ServerError, error_from_response

if TYPE_CHECKING:
    from hutch._embedded import EmbeddedEngine

__all__ = ["EMBEDDED_URL", "LONG_POLL", "Connected", "Connection", "EngineOptions", "items", "segment"]

LONG_POLL = "5m"  # the longest server-side wait the wire allows per request
EMBEDDED_URL = "http://localhost"  # the embedded engine's private socket answers any host


def segment(value: str) -> str:
    """An id as one segment of a request's path. Ids come from outside (a model's tool call, a
    web form): ``../keys/K`` or ``snapshots/S`` put in ``/sandbox/{id}`` as they are would reach
    the key's or the snapshot's route with this client's key, so a slash is sent escaped (the
    server reads it as part of the id, which then names nothing) and a dot segment, which HTTP
    clients resolve before sending, is refused."""
    if value in ("", ".", ".."):
        raise InvalidInput(f"{value!r} is not an id", field="id")
    return quote(value, safe="")


@attrs.frozen
class EngineOptions:
    """The engine a connection runs in this process: its data dir and driver (None: what the
    environment says, as for ``hutch serve``)."""

    data_dir: str | os.PathLike[str] | None = None
    driver: str | None = None


class Connection:
    """Session, URL, key, organization and the request helpers every service calls (the
    arguments are :class:`hutch.client.SandboxClient`'s)."""

    def __init__(
        self,
        url: str | None,
        api_key: str | None,
        *,
        connector: aiohttp.BaseConnector | None = None,
        request_timeout: float = 60.0,
        long_poll: Duration = LONG_POLL,
        drain_timeout: float = 30.0,
        org_id: str | None = None,
        engine: EngineOptions | None = None,
    ) -> None:
        # ``engine``: run that engine, whatever the URL argument, HUTCH_URL or a running server
        # say (``hutch.client.local_client``); its key is the one to use.
        found = None if engine is not None else url if connector is not None else _config.resolve_url(url)
        self._url_source = ("the engine in this process" if engine is not None else "the url argument" if url
                            else "HUTCH_URL" if os.environ.get("HUTCH_URL")
                            else "the hutch serve on this machine's data dir")
        #: Whether this connection runs the engine in its own process (no server: hutch/_embedded.py),
        #: started at its first call and stopped by :meth:`close`.
        self.embedded = found is None
        self._engine_options = engine or EngineOptions()
        self.url = (found or EMBEDDED_URL).rstrip("/")
        #: The organization calls act in (``orgId`` on every request), for a key that may act
        #: for several (the server's administrator); None: the key's own.
        self.org_id = org_id
        self.api_key = api_key if engine is not None else _config.resolve_api_key(api_key)
        self._connector = connector
        #: The engine this connection runs (``hutch._embedded.EmbeddedEngine``), once started.
        self.engine: EmbeddedEngine | None = None
        self._engine_lock = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self.request_timeout = request_timeout
        self.long_poll = long_poll
        #: After an execution ends, how long a silent output stream may stay open before we stop reading.
        self.drain_timeout = drain_timeout

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None
        elif self._connector is not None:
            await self._connector.close()
        self._connector = None
        if self.engine is not None:
            engine, self.engine = self.engine, None
            await engine.stop()

    async def session(self) -> aiohttp.ClientSession:
        """The session, with the embedded engine started first when this connection runs one."""
        if self.embedded and self.engine is None:
            async with self._engine_lock:
                if self.engine is None and not self._closed:
                    # The server's code, imported only by a client that runs it.
                    from hutch._embedded import EmbeddedEngine

                    options = self._engine_options
                    engine = EmbeddedEngine(data_dir=options.data_dir, driver=options.driver)
                    self._connector, key = await engine.start()
                    self.engine = engine
                    self.api_key = self.api_key or key
        return self._http()

    def _http(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("SandboxClient is closed")
        if self._session is None:
            # An idle connection is let go after 5 s, before a hutch server's 10 s deadline
            # for the next request head (HUTCH_REQUEST_HEAD_SECONDS) closes it: a request sent
            # on one the server is closing at that instant would fail, and a POST is not retried.
            connector = self._connector or aiohttp.TCPConnector(keepalive_timeout=5)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
                headers={"User-Agent": f"hutch-python/{__version__}", "Accept": "application/json"},
            )
        return self._session

    def params(self, params: Mapping[str, Any] | None) -> dict[str, str]:
        """A query string's parameters as the wire takes them, with this connection's ``orgId``."""
        query = _query(params or {})
        if self.org_id is not None:
            query.setdefault("orgId", self.org_id)
        return query

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        max_seconds: float | None = None,
        sandbox_id: str | None = None,
        execution_id: str | None = None,
    ) -> dict[str, Any]:
        """One JSON call. Returns the whole body (envelope included); raises on any failure."""
        url = self.url + path
        limit = max_seconds if max_seconds is not None else self.request_timeout
        try:
            async with (await self.session()).request(
                method,
                url,
                params=self.params(params),
                json=json,
                headers=self.auth_headers(),
                timeout=aiohttp.ClientTimeout(total=limit, sock_connect=30),
            ) as resp:
                text = await resp.text(errors="replace")
                status = resp.status
        except TimeoutError as err:
            raise ConnectionFailed(
                f"{method} {path}: no answer from {self.url} within {limit:g}s"
            ) from err
        except (aiohttp.ClientError, OSError) as err:
            raise ConnectionFailed(f"cannot reach hutch server at {self.url}: {err} (is it running? the URL came "
                                   f"from {self._url_source}; without one the client runs the engine itself)") from err
        try:
            body: Any = jsonlib.loads(text) if text else None
        except ValueError:
            body = text
        if status >= 400 or (isinstance(body, dict) and body.get("success") is False):
            raise error_from_response(
                status, body, sandbox_id=sandbox_id, execution_id=execution_id
            )
        if not isinstance(body, dict):
            raise ServerError(
                f"{method} {path}: expected a JSON object, got {text[:200]!r}",
                code="BAD_RESPONSE",
                status=status,
            )
        return body

    @staticmethod
    def data(body: Mapping[str, Any]) -> Any:
        """What an answer carries: its envelope's ``data``, else the whole body."""
        return body.get("data", body)

    def absolute(self, url: str) -> str:
        return url if urlsplit(url).scheme else urljoin(self.url + "/", url.lstrip("/"))

    async def stream(self, url: str) -> AsyncIterator[bytes]:
        """The bytes behind an output stream URL, as they arrive, until the server closes it."""
        full = self.absolute(url)
        # Stream URLs are capabilities; only send our key where it cannot leak.
        trusted = self._connector is not None or urlsplit(full)[:2] == urlsplit(self.url)[:2]
        headers = self.auth_headers() if trusted else {}
        try:
            async with (await self.session()).get(
                full, headers=headers, timeout=aiohttp.ClientTimeout(total=None, sock_connect=30)
            ) as resp:
                if resp.status == 404:
                    return
                if resp.status >= 400:
                    raise error_from_response(resp.status, await _error_body(resp))
                async for chunk in resp.content.iter_any():
                    yield chunk
        except (aiohttp.ClientError, OSError) as err:
            raise ConnectionFailed(f"reading output stream {full}: {err}") from err

    @contextlib.asynccontextmanager
    async def raw(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        data: Any = None,
        headers: Mapping[str, str] | None = None,
        sandbox_id: str | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A request whose body and/or answer is streamed (no total time limit; a stalled
        socket still fails after ``request_timeout``). Raises on any 4xx/5xx."""
        try:
            async with (await self.session()).request(
                method,
                self.url + path,
                params=self.params(params),
                data=data,
                headers={**self.auth_headers(), **(headers or {})},
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=30, sock_read=self.request_timeout
                ),
            ) as resp:
                if resp.status >= 400:
                    body = await _error_body(resp)
                    raise error_from_response(resp.status, body, sandbox_id=sandbox_id)
                yield resp
        except aiohttp.ClientError as err:
            raise ConnectionFailed(f"{method} {path}: connection to {self.url} failed: {err}") from err


async def _error_body(resp: aiohttp.ClientResponse) -> Any:
    """A failed answer's body: its JSON, else its text."""
    text = await resp.text(errors="replace")
    try:
        return jsonlib.loads(text)
    except ValueError:
        return text


class Connected(Protocol):
    """What holds a connection (a :class:`hutch.client.SandboxClient`): how the functions that
    take a client (``hutch.history``, ``hutch.terminal.open_terminal``) reach it without
    importing the client."""

    @property
    def connection(self) -> Connection: ...


def items(data: Any, key: str) -> list[Any]:
    """The list under ``key`` of a response's data; a server answering otherwise is broken."""
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise ServerError(
            f"unexpected response shape: expected a list under {key!r}", code="BAD_RESPONSE"
        )
    return data[key]
