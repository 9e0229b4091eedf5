"""What a tenant reads when a node's agent does not answer: the node's name and what went
wrong, never the agent's address (the cluster's private network, a tenant's map of it) nor
the secret. The operator's log keeps the address and the transport's own words."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator

import pytest

from hutch.core.driver_types import ProvisionRequest
from hutch.core.errors import DriverFailure, HutchError
from hutch.drivers.node import client as node_client
from hutch.drivers.node.client import AgentClient
from hutch.drivers.node.directory import StaticDirectory
from hutch.drivers.node.driver import NodeDriver

SECRET = b"k" * 40


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An agent that dies mid-request: reads it, answers nothing, closes."""
    await reader.read(1024)
    writer.close()


def _leaks(message: str, port: int) -> list[str]:
    return [bit for bit in ("127.0.0.1", str(port), SECRET.decode()) if bit in message]


async def _nothing() -> AsyncIterator[bytes]:
    yield b"x"


async def test_an_unreachable_agent_is_named_not_located(caplog: pytest.LogCaptureFixture) -> None:
    closed = _closed_port()
    server = await asyncio.start_server(_hang_up, "127.0.0.1", 0)
    hangs = server.sockets[0].getsockname()[1]
    caplog.set_level(logging.WARNING, logger=node_client.__name__)
    try:
        for port in (closed, hangs):
            agent = AgentClient("n7", f"127.0.0.1:{port}", SECRET)
            try:
                calls = {
                    "json": agent.json("GET", agent.path("node"), timeout=2),
                    "stream": anext(agent.stream("GET", agent.path("sandboxes", "sb-1", "file", path="a"))),
                    "upload": agent.upload("PUT", agent.path("sandboxes", "sb-1", "file", path="a"), _nothing()),
                    "hello": agent.hello(timeout=2),
                }
                if port == closed:  # a websocket to a hung-up agent fails the handshake, said elsewhere
                    calls["websocket"] = agent.websocket(agent.path("sandboxes", "sb-1", "terminal"))
                for what, call in calls.items():
                    with pytest.raises(DriverFailure) as caught:
                        await call
                    message = caught.value.message
                    assert message.startswith("node n7 did not answer"), (what, message)
                    assert not _leaks(message, port), (what, message)
            finally:
                await agent.close()
            # The operator's log has where it was called.
            assert f"127.0.0.1:{port}" in caplog.text
    finally:
        server.close()
        await server.wait_closed()


async def test_a_create_refused_for_capacity_names_no_address(caplog: pytest.LogCaptureFixture) -> None:
    """The 503 a tenant reads when every node is down lists the nodes' states: by name."""
    closed = _closed_port()
    directory = StaticDirectory(f"n7=127.0.0.1:{closed}")
    driver = NodeDriver(directory, SECRET)
    with pytest.raises(DriverFailure) as caught:  # the server does not start: the operator's own message
        await driver.start()
    assert f"127.0.0.1:{closed}" in caught.value.message  # said to the operator, at start, whole
    # Started anyway (as if the agent had answered at start and died since): placement's 503.
    driver._agents = {"n7": AgentClient("n7", f"127.0.0.1:{closed}", SECRET)}
    try:
        await driver._refresh()
        with pytest.raises(HutchError) as refused:
            await driver.reserve(ProvisionRequest("sb-1", "base:latest"))
        assert refused.value.status == 503 and "n7 did not answer" in refused.value.message, refused.value.message
        assert not _leaks(refused.value.message, closed), refused.value.message
    finally:
        await driver.close()
