"""``AgentClient``: one agent, seen from the API: signed requests, the hello proof and the
pinned instance, errors mapped back to their HutchError class (``core.errors.from_wire``)."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
from yarl import URL

from hutch.core.errors import DriverFailure, HutchError, from_wire
from hutch.drivers.node import wire

log = logging.getLogger(__name__)


class AgentUnreachable(DriverFailure):
    """No answer came from the agent (refused, hung up, timed out), as opposed to an error it
    answered: the caller may try another node."""


def _kind(err: Exception) -> str:
    if isinstance(err, aiohttp.ClientConnectorError):
        return "it refused the connection or could not be reached"
    if isinstance(err, aiohttp.ServerDisconnectedError):
        return "it closed the connection"
    if isinstance(err, TimeoutError | aiohttp.ServerTimeoutError):
        return "it timed out"
    return f"the connection failed ({type(err).__name__})"


class AgentClient:
    def __init__(self, name: str, address: str, secret: bytes) -> None:
        self.name = name  # as the directory lists it; the hello must say the same
        self.address = address
        self._secret = secret
        self._session = self._new_session()
        self.instance: str | None = None  # pinned at hello: another means the agent restarted
        self.ended_seq = 0  # the last sandbox end of this instance reported

    @staticmethod
    def _new_session() -> aiohttp.ClientSession:
        # One session per agent: losing the node aborts exactly its calls (abort()).
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))

    async def abort(self) -> None:
        """Break every call in flight (the node is lost) and start afresh for its return."""
        old, self._session = self._session, self._new_session()
        await old.close()

    async def close(self) -> None:
        await self._session.close()

    def path(self, *parts: str, **query: object) -> str:
        tail = "/".join(quote(p, safe="") for p in parts)
        q = {k: v for k, v in query.items() if v is not None}
        return f"/v1/{tail}" + (f"?{urlencode(q, quote_via=quote)}" if q else "")

    def _url_headers(self, method: str, path_qs: str, body: str = wire.EMPTY) -> tuple[URL, dict[str, str]]:
        # encoded=True: sent byte for byte as signed (the agent checks the raw path)
        return (URL(f"http://{self.address}{path_qs}", encoded=True),
                wire.sign(self._secret, method, path_qs, body=body))

    def _body(self, method: str, path_qs: str, body: Any) -> tuple[URL, dict[str, str], bytes | None]:
        data = None if body is None else json.dumps(body).encode()
        url, headers = self._url_headers(method, path_qs, wire.body_digest(data or b""))
        if data is not None:
            headers["Content-Type"] = "application/json"
        return url, headers, data

    def _unreachable(self, err: Exception) -> AgentUnreachable:
        """Said to tenants: the node by name and what went wrong, never its address (the
        transport's own words carry it); the operator's log has both."""
        log.warning("node agent %s at %s did not answer: %s: %s", self.name, self.address, type(err).__name__, err)
        return AgentUnreachable(f"node {self.name} did not answer: {_kind(err)}")

    async def hello(self, *, timeout: float = 5) -> str:
        nonce = secrets.token_hex(16)
        # Bounded: a hello to a host that went away must not hold up the reads of the others.
        answer = await self.json("GET", self.path("hello", nonce=nonce), timeout=timeout)
        name, instance = wire.check_hello(self._secret, nonce, answer)
        if name != self.name:
            log.warning("the agent at %s calls itself %r, the directory %r", self.address, name, self.name)
            raise DriverFailure(f"the agent of node {self.name} calls itself {name!r}")
        self.instance = instance
        return instance

    async def _raise_for(self, resp: aiohttp.ClientResponse) -> None:
        if resp.status < 400:
            return
        text = await resp.text()
        try:
            body: Any = json.loads(text)
        except ValueError:
            body = text
        raise from_wire(resp.status, body)

    async def json(self, method: str, path_qs: str, body: Any = None, *, timeout: float | None = None) -> Any:
        url, headers, data = self._body(method, path_qs, body)
        try:
            async with self._session.request(method, url, data=data, headers=headers,
                                             timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                await self._raise_for(resp)
                return await resp.json()
        except HutchError:
            raise
        except (aiohttp.ClientError, TimeoutError) as err:
            raise self._unreachable(err) from err

    async def stream(self, method: str, path_qs: str, body: Any = None) -> AsyncIterator[bytes]:
        """A streamed answer's bytes; its error (before any byte) raised at the first step."""
        url, headers, data = self._body(method, path_qs, body)
        try:
            async with self._session.request(method, url, data=data, headers=headers,
                                             timeout=aiohttp.ClientTimeout(total=None)) as resp:
                await self._raise_for(resp)
                async for chunk in resp.content.iter_any():
                    yield chunk
        except HutchError:
            raise
        except (aiohttp.ClientError, TimeoutError) as err:
            raise self._unreachable(err) from err

    async def upload(self, method: str, path_qs: str, chunks: AsyncIterable[bytes]) -> Any:
        url, headers = self._url_headers(method, path_qs, wire.STREAM)

        async def body() -> AsyncIterator[bytes]:
            async for chunk in chunks:
                yield chunk

        try:
            async with self._session.request(method, url, data=body(), headers=headers,
                                             timeout=aiohttp.ClientTimeout(total=None)) as resp:
                await self._raise_for(resp)
                return await resp.json()
        except HutchError:
            raise
        except (aiohttp.ClientError, TimeoutError) as err:
            raise self._unreachable(err) from err

    async def websocket(self, path_qs: str) -> aiohttp.ClientWebSocketResponse:
        url, headers = self._url_headers("GET", path_qs)
        try:
            return await self._session.ws_connect(url, headers=headers, max_msg_size=4 << 20)
        except aiohttp.WSServerHandshakeError as err:
            raise DriverFailure(f"node agent {self.name} refused a websocket ({err.status}): {err.message}") from err
        except (aiohttp.ClientError, TimeoutError) as err:
            raise self._unreachable(err) from err
