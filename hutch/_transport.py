"""The one HTTP transport under :class:`hutch.client.SandboxClient`: its aiohttp session,
base URL and bearer key, JSON calls and streamed requests, and the mapping of failures to
:mod:`hutch.errors`.

The client's resource classes (``hutch/_sandboxes.py``, ``_executions.py``, ``_files.py``,
``_copies.py``, ``_snapshots.py``) all derive from :class:`Transport`, and
``SandboxClient`` derives from all of them: one object, one session, methods grouped by
resource.
"""

from __future__ import annotations

import asyncio
import contextlib
import json as jsonlib
import os
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

import aiohttp

from hutch import _config
from hutch._shapes import Duration, _query
from hutch._version import __version__
from hutch.errors import ConnectionFailed, ServerError, error_from_response

if TYPE_CHECKING:
    from hutch.client import SandboxClient

LONG_POLL = "5m"  # the longest server-side wait the wire allows per request
EMBEDDED_URL = "http://localhost"  # the embedded engine's private socket answers any host


class Transport:
    """Session, URL, key and the request helpers every resource class calls."""

    def __init__(
        self,
        url: str | None,
        api_key: str | None,
        *,
        connector: aiohttp.BaseConnector | None,
        request_timeout: float,
        long_poll: Duration,
        drain_timeout: float,
        org_id: str | None,
    ) -> None:
        found = url if connector is not None else _config.resolve_url(url)
        self._url_source = ("the url argument" if url else "HUTCH_URL" if os.environ.get("HUTCH_URL")
                            else "the hutch serve on this machine's data dir")
        #: Whether this client runs the engine in its own process (no server: ``hutch.local_engine``),
        #: started at its first call and stopped by :meth:`close`.
        self.embedded = found is None
        self.url = (found or EMBEDDED_URL).rstrip("/")
        #: The organization calls act in (``orgId`` on every request), for a key that may act
        #: for several (the server's administrator); None: the key's own.
        self.org_id = org_id
        self.api_key = _config.resolve_api_key(api_key)
        self._connector = connector
        self._engine: Any = None  # hutch.local_engine.EmbeddedEngine, once started
        self._engine_lock = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self.request_timeout = request_timeout
        self.long_poll = long_poll
        #: After an execution ends, how long a silent output stream may stay open before we stop reading.
        self.drain_timeout = drain_timeout

    def _as_client(self) -> SandboxClient:
        """This object as the :class:`SandboxClient` it is (the resource classes are only
        ever its bases), for the handles that hold a client."""
        from hutch.client import SandboxClient

        assert isinstance(self, SandboxClient), "resource classes are bases of SandboxClient only"
        return self

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None
        elif self._connector is not None:
            await self._connector.close()
        self._connector = None
        if self._engine is not None:
            engine, self._engine = self._engine, None
            await engine.stop()

    async def _ready(self) -> aiohttp.ClientSession:
        """The session, with the embedded engine started first when this client runs one."""
        if self.embedded and self._engine is None:
            async with self._engine_lock:
                if self._engine is None and not self._closed:
                    # The server's code, imported only by a client that runs it.
                    from hutch.local_engine import EmbeddedEngine

                    engine = EmbeddedEngine()
                    self._connector, key = await engine.start()
                    self._engine = engine
                    self.api_key = self.api_key or key
        return self._http()

    def _http(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("SandboxClient is closed")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=self._connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
                headers={"User-Agent": f"hutch-python/{__version__}", "Accept": "application/json"},
            )
        return self._session

    def _params(self, params: Mapping[str, Any] | None) -> dict[str, str]:
        query = _query(params or {})
        if self.org_id is not None:
            query.setdefault("orgId", self.org_id)
        return query

    def _auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    async def _request(
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
            async with (await self._ready()).request(
                method,
                url,
                params=self._params(params),
                json=json,
                headers=self._auth_headers(),
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
    def _data(body: Mapping[str, Any]) -> Any:
        return body.get("data", body)

    def _absolute(self, url: str) -> str:
        return url if urlsplit(url).scheme else urljoin(self.url + "/", url.lstrip("/"))

    async def _iter_stream(self, url: str) -> AsyncIterator[bytes]:
        """The bytes behind an output stream URL, as they arrive, until the server closes it."""
        full = self._absolute(url)
        # Stream URLs are capabilities; only send our key where it cannot leak.
        trusted = self._connector is not None or urlsplit(full)[:2] == urlsplit(self.url)[:2]
        headers = self._auth_headers() if trusted else {}
        try:
            async with (await self._ready()).get(
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
    async def _raw(
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
            async with (await self._ready()).request(
                method,
                self.url + path,
                params=self._params(params),
                data=data,
                headers={**self._auth_headers(), **(headers or {})},
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


def _items(data: Any, key: str) -> list[Any]:
    """The list under ``key`` of a response's data; a server answering otherwise is broken."""
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise ServerError(
            f"unexpected response shape: expected a list under {key!r}", code="BAD_RESPONSE"
        )
    return data[key]
