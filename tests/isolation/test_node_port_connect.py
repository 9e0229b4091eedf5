"""The node driver's ``port_connect`` (hutch/drivers/node/ports.py, hutch/node/ports.py) from
the attacker's side: a port a sandbox's process opens is reached through the agent, inside
the sandbox's network namespace; a port of the node itself (the agent's own listener, or
anything else on the host's loopback) gives nothing, and a bad port number is refused."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hutch.core.errors import InvalidInput, SandboxNotFound
from hutch.drivers.base import Driver, ExecRequest, ProvisionRequest
from tests.drivers_support import (
    NodeAgents,
    Recorder,
    built_runtimes,  # noqa: F401  (fixture)
    new_id,
    require_root,
    start_node,
)

pytestmark = pytest.mark.isolation

_SERVE_ONCE = """
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
c, _ = s.accept()
c.sendall(b"inside:" + c.recv(16))
c.close()
"""


@pytest.fixture(scope="module")
def agent(built_runtimes: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[NodeAgents]:  # noqa: F811
    require_root()
    agents = NodeAgents(tmp_path_factory.mktemp("node-ports"), ("p1",))
    yield agents  # type: ignore[misc]
    agents.stop()


@pytest.fixture
async def driver(agent: NodeAgents) -> AsyncIterator[Driver]:
    d = await start_node(agent)
    yield d
    for sid in await d.alive():
        await d.destroy(sid)
    await d.close()


async def _connected(driver: Driver, sid: str, port: int) -> socket.socket:
    """The listener inside starts with its exec: refused until it listens."""
    for _ in range(100):
        try:
            return await driver.port_connect(sid, port)  # type: ignore[attr-defined, no-any-return]
        except ConnectionRefusedError:
            await asyncio.sleep(0.1)
    raise AssertionError(f"port {port} of {sid} never answered")


async def test_a_port_a_process_opens_is_reached_through_the_agent(agent: NodeAgents, driver: Driver) -> None:
    sid = new_id()
    await driver.provision(ProvisionRequest(sid, "python:3.13"))  # no network: loopback only
    serving = asyncio.ensure_future(driver.exec(ExecRequest(new_id("ex"), sid, ["python3", "-c", _SERVE_ONCE, "8123"],
                                                            timeout=60), Recorder()))
    try:
        sock = await _connected(driver, sid, 8123)
        loop = asyncio.get_running_loop()
        with sock:
            await loop.sock_sendall(sock, b"hi")
            assert await asyncio.wait_for(loop.sock_recv(sock, 64), 20) == b"inside:hi"
            assert await asyncio.wait_for(loop.sock_recv(sock, 64), 20) == b""  # its close reaches us
        assert (await asyncio.wait_for(serving, 30)).exit_code == 0
    finally:
        serving.cancel()
    with pytest.raises(ConnectionRefusedError):  # it served once; nothing listens there now
        await driver.port_connect(sid, 8123)  # type: ignore[attr-defined]


async def test_the_nodes_own_ports_are_not_reached(agent: NodeAgents, driver: Driver) -> None:
    """The agent's listen port and a listener on the host's loopback answer from the host (so
    the probe can fail), never through a sandbox's port."""
    sid = new_id()
    await driver.provision(ProvisionRequest(sid, "base:latest"))
    agent_port = int(agent.addresses["p1"].rsplit(":", 1)[1])
    socket.create_connection(("127.0.0.1", agent_port), timeout=5).close()
    with socket.socket() as host:
        host.bind(("127.0.0.1", 0))
        host.listen()
        host.setblocking(False)
        for port in (agent_port, host.getsockname()[1]):
            with pytest.raises(ConnectionRefusedError):
                await driver.port_connect(sid, port)  # type: ignore[attr-defined]
        with pytest.raises(BlockingIOError):  # no connection ever came to the host's listener
            host.accept()


async def test_a_bad_port_or_an_unknown_sandbox_is_refused_by_name(agent: NodeAgents, driver: Driver) -> None:
    sid = new_id()
    await driver.provision(ProvisionRequest(sid, "base:latest"))
    for bad in (0, 65536, -1):
        with pytest.raises(InvalidInput, match=f"port must be a TCP port number \\(1-65535\\), not .{bad}."):
            await driver.port_connect(sid, bad)  # type: ignore[attr-defined]
    await driver.destroy(sid)
    with pytest.raises(SandboxNotFound, match=f"sandbox {sid} not found"):
        await driver.port_connect(sid, 8000)  # type: ignore[attr-defined]
