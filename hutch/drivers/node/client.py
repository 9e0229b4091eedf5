"""``AgentClient``: one agent, seen from the API: signed requests over TLS, the hello proof,
the pinned certificate and instance, errors mapped back to their HutchError class
(``core.errors.from_wire``).

Every request but the hello goes only to the certificate the last hello proved (aiohttp's
``Fingerprint``). A connection that presents another one (the agent restarted with a new
certificate, or something in between ends TLS) is refused in its handshake, before a byte of
the request leaves; the client then asks for a hello again, on a connection of its own, and
sends the request once more only if the agent proves the new certificate."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
from yarl import URL

from hutch.core import phases
from hutch.core.errors import DriverFailure, HutchError, from_wire
from hutch.drivers.node import wire

log = logging.getLogger(__name__)


class AgentUnreachable(DriverFailure):
    """No answer came from the agent (refused, hung up, timed out), as opposed to an error it
    answered: the caller may try another node."""


def _kind(err: Exception) -> str:
    if isinstance(err, aiohttp.ServerFingerprintMismatch):
        return "its certificate is not the one it proved"
    if isinstance(err, aiohttp.ClientConnectorError):
        return "it refused the connection or could not be reached"
    if isinstance(err, aiohttp.ServerDisconnectedError):
        return "it closed the connection"
    if isinstance(err, TimeoutError | aiohttp.ServerTimeoutError):
        return "it timed out"
    return f"the connection failed ({type(err).__name__})"


# An idle connection to an agent is let go after this, before the agent's deadline for the next
# request head (HUTCH_REQUEST_HEAD_SECONDS, 10 s by default: edge/listener.py) closes it: a call
# sent on a connection the agent is closing at that instant would fail, and a POST is not
# retried. (aiohttp's default is 15 s.)
IDLE_SECONDS = 5.0

_ID = re.compile(r"^[a-z]+_[0-9a-z]{16,}$")


def _route(method: str, path_qs: str) -> str:
    """A span's name (core/phases.py): the route, not the sandbox or execution it names."""
    path = path_qs.split("?", 1)[0]
    return f"node hop: {method} " + "/".join("{id}" if _ID.match(p) else p for p in path.split("/"))


class AgentClient:
    def __init__(self, name: str, address: str, secret: bytes) -> None:
        self.name = name  # as the directory lists it; the hello must say the same
        self.address = address
        self._secret = secret
        self._session = self._new_session()
        self.instance: str | None = None  # pinned at hello: another means the agent restarted
        self.ended_seq = 0  # the last sandbox end of this instance reported
        self._pin: aiohttp.Fingerprint | None = None  # the certificate the last hello proved
        self._pinning = asyncio.Lock()  # one hello at a time, however many calls found no pin

    @staticmethod
    def _new_session() -> aiohttp.ClientSession:
        # One session per agent: losing the node aborts exactly its calls (abort()).
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=IDLE_SECONDS))

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
        return (URL(f"https://{self.address}{path_qs}", encoded=True),
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
        """Ask the agent to prove the secret and the certificate of this very connection; pin
        both. Its connection trusts no certificate by itself (``_Seen`` only keeps it): the
        proof is the check."""
        nonce = secrets.token_hex(16)
        url, headers, _ = self._body("GET", self.path("hello", nonce=nonce), None)
        headers["Connection"] = "close"  # its connection is its own: no later request rides on it
        seen = _Seen()
        try:
            # Bounded: a hello to a host that went away must not hold up the reads of the others.
            async with self._session.get(url, headers=headers, ssl=seen,
                                         timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                await self._raise_for(resp)
                answer = await resp.json()
        except HutchError:
            raise
        except (aiohttp.ClientError, TimeoutError) as err:
            raise self._unreachable(err) from err
        if seen.der is None:
            raise DriverFailure(f"the hello of node {self.name} came on a connection without a TLS certificate")
        fingerprint = wire.cert_fingerprint(seen.der)
        name, instance = wire.check_hello(self._secret, nonce, answer, fingerprint)
        if name != self.name:
            log.warning("the agent at %s calls itself %r, the directory %r", self.address, name, self.name)
            raise DriverFailure(f"the agent of node {self.name} calls itself {name!r}")
        if self.instance is not None and instance != self.instance:
            log.warning("node agent %s restarted (instance %s, was %s)", self.name, instance, self.instance)
            self.ended_seq = 0  # a new process counts its ends from 1
        self._pin = aiohttp.Fingerprint(bytes.fromhex(fingerprint))
        self.instance = instance
        return instance

    async def _pinned(self, refused: aiohttp.Fingerprint | None = None) -> aiohttp.Fingerprint:
        """The pin to connect with: hello first when there is none yet, or when ``refused``
        (the pin a connection just failed) is still the one held."""
        async with self._pinning:
            if self._pin is None or self._pin is refused:
                self._pin = None
                try:
                    await self.hello()
                except AgentUnreachable:
                    raise
                except HutchError as err:  # the operator's log has why; the tenant, the node's name
                    log.warning("node agent %s at %s: %s", self.name, self.address, err.message)
                    raise AgentUnreachable(f"node {self.name} did not answer: it could not prove its "
                                           "certificate") from err
            assert self._pin is not None
            return self._pin

    async def _connect(self, method: str, url: URL, headers: dict[str, str], *,
                       data: bytes | Callable[[], AsyncIterator[bytes]] | None = None,
                       timeout: float | None = None) -> aiohttp.ClientResponse:
        """A response (to be released by the caller), from the pinned certificate only."""
        pin = await self._pinned()
        for last in (False, True):
            try:
                return await self._session.request(method, url, data=data() if callable(data) else data,
                                                   headers=headers, ssl=pin,
                                                   timeout=aiohttp.ClientTimeout(total=timeout))
            except aiohttp.ServerFingerprintMismatch:
                # Refused in the handshake: nothing was sent, the same signed request may go again.
                if last:
                    raise
                pin = await self._pinned(refused=pin)
        raise AssertionError("unreachable")

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
        t0 = phases.start()
        url, headers, data = self._body(method, path_qs, body)
        try:
            async with await self._connect(method, url, headers, data=data, timeout=timeout) as resp:
                await self._raise_for(resp)
                return await resp.json()
        except HutchError:
            raise
        except (aiohttp.ClientError, TimeoutError) as err:
            raise self._unreachable(err) from err
        finally:
            if phases.ON:
                phases.end(_route(method, path_qs) + ", whole", t0)

    async def stream(self, method: str, path_qs: str, body: Any = None) -> AsyncIterator[bytes]:
        """A streamed answer's bytes; its error (before any byte) raised at the first step."""
        t0 = phases.start()
        url, headers, data = self._body(method, path_qs, body)
        try:
            async with await self._connect(method, url, headers, data=data) as resp:
                if phases.ON:
                    phases.end(_route(method, path_qs) + ", until its answer's headers", t0)
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
            async with await self._connect(method, url, headers, data=body) as resp:
                await self._raise_for(resp)
                return await resp.json()
        except HutchError:
            raise
        except (aiohttp.ClientError, TimeoutError) as err:
            raise self._unreachable(err) from err

    async def websocket(self, path_qs: str) -> aiohttp.ClientWebSocketResponse:
        url, headers = self._url_headers("GET", path_qs)
        try:
            pin = await self._pinned()
            try:
                return await self._session.ws_connect(url, headers=headers, max_msg_size=4 << 20, ssl=pin)
            except aiohttp.ServerFingerprintMismatch:
                pin = await self._pinned(refused=pin)
                return await self._session.ws_connect(url, headers=headers, max_msg_size=4 << 20, ssl=pin)
        except aiohttp.WSServerHandshakeError as err:
            raise DriverFailure(f"node agent {self.name} refused a websocket ({err.status}): {err.message}") from err
        except (aiohttp.ClientError, TimeoutError) as err:
            raise self._unreachable(err) from err


class _Seen(aiohttp.Fingerprint):
    """Where a pin would check a new connection's certificate, keeps it instead: the hello's
    connection trusts none, its proof is the check. A new one per hello, so the connection
    is new too (aiohttp pools connections by their ssl argument) and this sees its certificate."""

    def __init__(self) -> None:
        super().__init__(bytes(32))
        self.der: bytes | None = None

    def check(self, transport: asyncio.Transport) -> None:
        tls = transport.get_extra_info("ssl_object")
        self.der = tls.getpeercert(binary_form=True) if tls is not None else None
