"""Can one tenant starve another by holding requests? Tenant A, with a member key and no quota
(what a fresh ``hutch serve`` gives), opens more long-polls than the server has file
descriptors; tenant B, on the same server, then creates a sandbox and runs a command.

A real ``hutch serve`` (the fake driver: what is measured is the API's, not a sandbox's), started
with the open-file limit a shell or a plain systemd unit gives a process (1024). The attacker and
B are this test process (its own limit is far higher), so only the server runs out.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.system.server import Server

NOFILE = 1024  # a shell's and a plain systemd unit's soft limit (ulimit -n)
HOLDS = 1100  # more than that


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "data", driver="fake", nofile=(NOFILE, NOFILE)).start()
    try:
        yield srv
        srv.destroy_every_sandbox()
    finally:
        srv.stop()


def key_of(server: Server, org: str) -> str:
    server.data("POST", "/orgs", {"name": org})
    return str(server.data("POST", f"/keys?orgId=org_{org}", {"role": "member"})["secret"])


def call(server: Server, key: str, method: str, path: str, body: object = None,
         timeout: float = 20) -> tuple[int, dict[str, object]]:
    """(status, answer) over a connection of its own, as a client of B's would; a refused or
    unanswered connection is (0, what went wrong)."""
    raw = json.dumps(body).encode() if body is not None else b""
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\nConnection: close\r\n\r\n")
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
            sock.sendall(head.encode() + raw)
            got = b""
            while chunk := sock.recv(65536):
                got += chunk
    except OSError as err:
        return 0, {"error": repr(err)}
    if not got:
        return 0, {"error": "the server closed the connection without an answer"}
    status = int(got.split(b" ", 2)[1])
    return status, json.loads(got.split(b"\r\n\r\n", 1)[1] or b"{}")


@contextlib.contextmanager
def held(server: Server, key: str, path: str, count: int, *, finished: bool = True) -> Iterator[list[socket.socket]]:
    """``count`` connections, each sending ``path`` with ``key`` (``finished``: the whole
    request; else its first line only) and reading nothing."""
    socks: list[socket.socket] = []
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n\r\n".encode()
    if not finished:
        request = request.split(b"\r\n", 1)[0] + b"\r\n"
    try:
        for _ in range(count):
            try:
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=2)
                sock.sendall(request)
            except OSError:
                break  # the server's backlog is full: it holds all it can
            socks.append(sock)
        time.sleep(1)  # the server takes in what it accepted
        yield socks
    finally:
        for sock in socks:
            sock.close()


def answered(socks: list[socket.socket]) -> list[bytes]:
    """What each connection was answered at once (b"": nothing yet)."""
    out = []
    for sock in socks:
        sock.setblocking(False)
        try:
            out.append(sock.recv(65536))
        except (BlockingIOError, ConnectionError):
            out.append(b"")
    return out


def test_a_tenants_long_polls_leave_another_tenant_served(server: Server) -> None:
    a, b = key_of(server, "attacker"), key_of(server, "victim")
    status, made = call(server, a, "POST", "/sandbox", {})
    assert status == 201, made
    sandbox = made["data"]["sandboxId"]  # type: ignore[index]
    wait = f"/sandbox/status/{sandbox}?waitForStatus=terminated&waitMs=600000"
    with held(server, a, wait, HOLDS) as socks:
        status, made = call(server, b, "POST", "/sandbox", {})
        assert status == 201, ("B's create while A holds its long-polls", status, made)
        sandbox_b = made["data"]["sandboxId"]  # type: ignore[index]
        status, ran = call(server, b, "POST", f"/sandbox/{sandbox_b}/execute", {"command": ["echo", "hi"]})
        assert status == 200, ("B's execute while A holds its long-polls", status, ran)
        # A was told, by name, why its requests past its share were refused.
        firsts = answered(socks)
        refused = [got for got in firsts if got.startswith(b"HTTP/1.1 429")]
        assert refused, firsts[-5:]
        assert b"Connection: close" in refused[0] and b"HUTCH_MAX_REQUESTS_PER_ORG=256" in refused[0], refused[0]
    # and with them gone (the server notices within a second), A is served again
    deadline = time.monotonic() + 30
    while (status := call(server, a, "GET", f"/sandbox/{sandbox}")[0]) == 429 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert status == 200


def test_connections_past_the_usual_open_file_limit_leave_another_tenant_served(tmp_path: Path) -> None:
    """Connections that have not finished a request belong to no organization (a front that
    limits connections per client bounds them): what the server may hold is its open-file
    limit, raised at start to the hard limit. Before, a server started from a shell (soft
    limit 1024) on a driver that does not raise it stopped accepting at ~1,000 of them."""
    srv = Server(tmp_path / "data", driver="fake", nofile=(NOFILE, 8 * NOFILE)).start()
    try:
        b = key_of(srv, "victim")
        with held(srv, "", "/healthz", HOLDS, finished=False):
            status, made = call(srv, b, "POST", "/sandbox", {})
            assert status == 201, ("B's create while A holds unfinished requests", status, made)
    finally:
        srv.stop()
