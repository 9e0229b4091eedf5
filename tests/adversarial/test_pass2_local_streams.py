"""Second adversarial pass, what one tenant's readers can make the server hold: a follower of
an audit stream or of the Web App's live events whose client stops reading (a socket with a
tiny window, never read), while its own sandbox and another organization work.

The API layer decides these, so they run in process (fake driver), where the projector's
listeners can be looked at: what a stalled reader holds is the measure. The projector and its
listeners are the same on both profiles; the embedded one is enough (and quick)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from hutch.api.keys import ENGINE
from tests.api.conftest import Api
from tests.api.test_tenancy import bearer, new_key, new_org


@pytest.fixture
def driver_name() -> str:
    return "fake"


@pytest.fixture
def profile() -> dict[str, str]:
    return {}


@contextlib.contextmanager
def stalled(api: Api, path: str, headers: dict[str, str] | None = None) -> Iterator[socket.socket]:
    """A client that asks for ``path`` and then reads nothing: a 4 KiB receive window, so the
    server's writes stop after a few dozen KiB."""
    server = api.client.server
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((server.host, server.port))
    lines = [f"GET {path} HTTP/1.1", f"Host: {server.host}:{server.port}",
             *(f"{k}: {v}" for k, v in (headers or {}).items()), "", ""]
    sock.sendall("\r\n".join(lines).encode())
    try:
        yield sock
    finally:
        sock.close()


async def work(api: Api, headers: dict[str, str], sandbox_id: str, rounds: int, size: int = 200) -> None:
    """``rounds`` commands; each one's argument (``size`` bytes) is in its audit record."""
    for _ in range(rounds):
        ex = await api.data("POST", f"/sandbox/{sandbox_id}/execute", headers=headers,
                            json={"command": ["echo", "x" * size]})
        await api.data("GET", f"/sandbox/execution/{ex['executionId']}?wait=10s", headers=headers)


def listeners(api: Api) -> list[Any]:
    return list(api.client.app[ENGINE].parts.projector._listeners)


def read_all(sock: socket.socket) -> bytes:
    """The whole chunked answer (the connection stays open after it: keep-alive)."""
    sock.settimeout(30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # reading again, at full speed
    got = b""
    while not got.endswith(b"\r\n0\r\n\r\n") and (chunk := sock.recv(1 << 20)):
        got += chunk
    return got


def dechunk(raw: bytes) -> bytes:
    body = raw.split(b"\r\n\r\n", 1)[1]
    out = b""
    while body:
        size_s, _, rest = body.partition(b"\r\n")
        size = int(size_s, 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2:]
    return out


async def test_a_stalled_audit_follower_holds_little_and_misses_nothing(api: Api) -> None:
    """Beta follows its own sandbox's audit stream and stops reading. Before, its listener
    took every event of the server (alpha's included) and kept them while its client did not
    read: memory without bound, and held by a URL that needs no key. Now it takes its
    sandbox's events only, holds at most a bounded backlog, and when read again still
    delivers every event of the sandbox, in order, to its end."""
    await new_org(api, "alpha")
    await new_org(api, "beta")
    alpha = bearer((await new_key(api, "org_alpha", "member"))["secret"])
    beta = bearer((await new_key(api, "org_beta", "member"))["secret"])
    mine = await api.data("POST", "/sandbox", headers=beta, json={}, expect=201)
    theirs = (await api.data("POST", "/sandbox", headers=alpha, json={}, expect=201))["sandboxId"]
    audit = "/" + mine["auditStreamUrl"].split("://", 1)[1].split("/", 1)[1]
    before = len(listeners(api))
    with stalled(api, audit) as sock:
        await work(api, alpha, theirs, 60)
        held = listeners(api)[before:]
        assert held, "the follower is not listening"
        for _ in range(40):  # its own work, past the socket's window and then the backlog
            await work(api, beta, mine["sandboxId"], 20, size=100_000)
            if all(getattr(q, "overflowed", False) for q in held):
                break
        for q in held:
            others = [e for e in list(q._queue) if e.sandbox_id != mine["sandboxId"]]
            assert not others, f"a stalled follower of beta's sandbox holds {len(others)} events of others"
            assert 0 < q.maxsize <= 1000 and q.qsize() <= q.maxsize, (q.maxsize, q.qsize())
            assert q.overflowed, "the follower never filled its backlog: the test did not stall it"
        await api.call("DELETE", f"/sandbox/{mine['sandboxId']}", headers=beta)
        body = await asyncio.to_thread(lambda: dechunk(read_all(sock)))
    positions = [json.loads(line)["position"] for line in body.splitlines()]
    logged = [e.position for e in await api.client.app[ENGINE].parts.log.read(0, sandbox_id=mine["sandboxId"])]
    assert positions == logged, f"{len(positions)} records for {len(logged)} events"
    assert len(listeners(api)) == before


async def test_the_live_feed_of_a_stalled_browser_holds_only_its_organizations_events(api: Api) -> None:
    """A signed-in browser of beta that stops reading /app/live held every event of the
    server. Its listener now takes beta's events only and is bounded."""
    await new_org(api, "alpha")
    await new_org(api, "beta")
    alpha = bearer((await new_key(api, "org_alpha", "member"))["secret"])
    beta_key = (await new_key(api, "org_beta", "member"))["secret"]
    resp = await api.client.post("/app/session", json={"apiKey": beta_key})
    assert resp.status == 201
    cookie = "; ".join(f"{c.key}={c.value}" for c in resp.cookies.values())
    theirs = (await api.data("POST", "/sandbox", headers=alpha, json={}, expect=201))["sandboxId"]
    before = len(listeners(api))
    with stalled(api, "/app/live", {"Cookie": cookie}):
        for _ in range(50):
            if len(listeners(api)) > before:
                break
            await asyncio.sleep(0.02)
        await work(api, alpha, theirs, 40)
        held = listeners(api)[before:]
        assert held, "the live feed is not listening"
        for q in held:
            assert not [e for e in list(q._queue) if e.org_id != "org_beta"], "beta's feed holds alpha's events"
            assert 0 < q.maxsize <= 1000, q.maxsize
