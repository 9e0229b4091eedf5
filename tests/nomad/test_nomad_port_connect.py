"""Any port a nomad sandbox's processes listen on, for the server (drivers/nomad/portconnect.py
over the plugin's connect verb, containerd-driver/connect.go), from the attacker's side: the
connection lands on the sandbox's own loopback, never on the client host's port of the same
number, whichever network the sandbox has (none, outbound, a declared port only); a port
where nothing listens is refused; bytes go both ways unchanged, and each side's end reaches
the other."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import time
from collections.abc import AsyncIterator

import pytest

from hutch.drivers.base import ExecRequest, ProvisionRequest
from hutch.drivers.nomad.driver import NomadDriver
from tests.drivers_support import Recorder, new_id

PY = "python:3.13"

# Listens on the sandbox's loopback; each connection: its bytes read to their end, then
# "inside", their sha256 and the bytes themselves sent back, then closed.
_INSIDE = """
import hashlib, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
open("/tmp/listening", "w").close()
while True:
    c, _ = s.accept()
    got = b""
    while chunk := c.recv(65536):
        got += chunk
    c.sendall(b"inside " + hashlib.sha256(got).hexdigest().encode() + b"\\n" + got)
    c.close()
"""


@pytest.fixture
async def host_listener() -> AsyncIterator[int]:
    """A port the client host's loopback listens on (and never answers): a connection made
    on the host instead of inside the sandbox would hang there."""
    held: list[asyncio.StreamWriter] = []
    server = await asyncio.start_server(lambda r, w: held.append(w), "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
    for w in held:
        w.close()


async def listening(driver: NomadDriver, listen: int, **net: object) -> str:
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=PY, **net))  # type: ignore[arg-type]
    await driver.exec(ExecRequest(new_id("ex"), sid, ["sh", "-c", f"python3 -c '{_INSIDE}' {listen} >/dev/null 2>&1 &"]),
                      Recorder())
    deadline = time.monotonic() + 30
    while (await driver.exec(ExecRequest(new_id("ex"), sid, ["test", "-f", "/tmp/listening"]), Recorder())).exit_code:
        assert time.monotonic() < deadline, "the sandbox's server never listened"
        await asyncio.sleep(0.1)
    return sid


async def exchange(sock: socket.socket, data: bytes) -> bytes:
    loop = asyncio.get_running_loop()
    with sock:
        await loop.sock_sendall(sock, data)
        sock.shutdown(socket.SHUT_WR)  # our end: the sandbox's server reads end of file
        got = b""
        while chunk := await asyncio.wait_for(loop.sock_recv(sock, 65536), 30):
            got += chunk
    return got


async def test_the_connection_lands_on_the_sandboxs_own_loopback(driver: NomadDriver, host_listener: int) -> None:
    for net in ({}, {"network_enabled": True}, {"port": 8000}):
        sid = await listening(driver, host_listener, **net)
        got = await exchange(await driver.port_connect(sid, host_listener), b"hello")
        assert got == b"inside " + hashlib.sha256(b"hello").hexdigest().encode() + b"\nhello", (net, got)


async def test_bytes_go_both_ways_unchanged(driver: NomadDriver) -> None:
    sid = await listening(driver, 8123)
    data = os.urandom(1 << 20)
    got = await exchange(await driver.port_connect(sid, 8123), data)
    head, _, body = got.partition(b"\n")
    assert head == b"inside " + hashlib.sha256(data).hexdigest().encode() and body == data
    # Two at once, each its own.
    first, second = [await driver.port_connect(sid, 8123) for _ in range(2)]
    a, b = await asyncio.gather(exchange(first, b"a" * 10), exchange(second, b"b" * 20))
    assert a.endswith(b"\n" + b"a" * 10) and b.endswith(b"\n" + b"b" * 20)


async def test_a_port_where_nothing_listens_is_refused(driver: NomadDriver) -> None:
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=PY))
    with pytest.raises(ConnectionRefusedError, match=f"port 8124 of sandbox {sid}"):
        await driver.port_connect(sid, 8124)
