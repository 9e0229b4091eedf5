"""A create placed on a node whose agent has just died (the driver's last read, up to a second
old, still saw it) is placed on another node, not answered 502: issue 35's "new sandboxes
placed elsewhere", from the first second on. The dead node's copy, if the agent made one
before dying, is ended when it answers again."""

from __future__ import annotations

import socket
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from hutch.core.driver_types import ProvisionRequest
from hutch.drivers.node import placement, wire
from hutch.drivers.node.client import AgentClient
from hutch.drivers.node.directory import StaticDirectory
from hutch.drivers.node.driver import NodeDriver
from hutch.node import certificate

SECRET = b"k" * 40
GiB = 1 << 30


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _state(name: str, committed: int) -> placement.NodeState:
    return placement.NodeState(name=name, cpus=4, memory_total=16 * GiB, memory_available=16 * GiB,
                               cpu_committed_millis=committed, runtimes=frozenset({"base:latest"}))


async def test_a_create_on_a_dead_agent_lands_on_another_node() -> None:
    made: list[str] = []

    async def provision(request: web.Request) -> web.Response:
        made.append(request.match_info["id"])
        return web.json_response({"ok": True})

    cert = certificate.make("alive")

    async def hello(request: web.Request) -> web.Response:  # an agent that proves itself
        nonce = request.query["nonce"]
        return web.json_response({"name": "alive", "instance": "i-1", "fingerprint": cert.fingerprint,
                                  "proof": wire.hello_proof(SECRET, nonce, "alive", "i-1", cert.fingerprint)})

    app = web.Application()
    app.router.add_put("/v1/sandboxes/{id}", provision)
    app.router.add_get("/v1/hello", hello)
    alive = TestServer(app, host="127.0.0.1")
    await alive.start_server(ssl=cert.context)
    dead = f"127.0.0.1:{_closed_port()}"
    driver = NodeDriver(StaticDirectory(f"dead={dead},alive=127.0.0.1:{alive.port}"), SECRET)
    # As the last read saw them: the dead node the emptier, so placement picks it first.
    driver._agents = {"dead": AgentClient("dead", dead, SECRET),
                      "alive": AgentClient("alive", f"127.0.0.1:{alive.port}", SECRET)}
    driver._states = {"dead": _state("dead", 0), "alive": _state("alive", 2000)}
    try:
        await driver.provision(ProvisionRequest("sb-1", "base:latest"))
        assert made == ["sb-1"]
        assert driver.handle("sb-1") == {"node": "alive"}
        # Creates after it do not try the dead node again until it answers.
        assert driver._states["dead"].unusable
        # What the dead agent may have made is ended there when it answers.
        ended: Any = driver._to_end
        assert ended == {"dead": {"sb-1"}}
    finally:
        await driver.close()
        await alive.close()
