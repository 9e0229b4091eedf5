"""E2B's any-port hosts on the node driver: a port no create declared, opened by a process of
a sandbox on an agent's node, answers at ``{port}-{id}.{domain}`` with the sandbox's traffic
token (the node driver's port_connect, through the agent); a port of the node itself does not."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hutch.api.e2b.server import create_e2b_app
from hutch.api.keys import ENGINE, TENANTS
from hutch.drivers.base import ExecRequest
from tests.api.conftest import KEY, NODE, Api
from tests.drivers_support import Recorder, new_id

DOMAIN = "e2b.test"


async def _get(e2b: Any, port: int, wire_id: str, token: str) -> tuple[int, str]:
    resp = await e2b.get("/", headers={"Host": f"{port}-{wire_id}.{DOMAIN}", "E2B-Traffic-Access-Token": token})
    return resp.status, await resp.text()


@pytest.mark.runs_on(*NODE)  # the node driver's port_connect through the E2B wire
async def test_any_port_of_a_node_sandbox_answers_at_its_host(api: Api, aiohttp_client: Any,
                                                              node_agents: Any) -> None:
    app = api.client.server.app
    e2b = await aiohttp_client(create_e2b_app(app[ENGINE], app[TENANTS], DOMAIN))
    resp = await e2b.post("/sandboxes", json={"templateID": "base", "timeout": 120}, headers={"X-API-Key": KEY})
    created = await resp.json()
    assert resp.status == 201, created
    wire_id, token = created["sandboxID"], created["trafficAccessToken"]
    sid = "sbx_" + wire_id
    serving = asyncio.ensure_future(app[ENGINE].parts.driver.exec(
        ExecRequest(new_id("ex"), sid, ["python3", "-m", "http.server", "8123", "--bind", "127.0.0.1"], timeout=60),
        Recorder()))
    try:
        for _ in range(100):
            status, text = await _get(e2b, 8123, wire_id, token)
            if status != 502:
                break
            await asyncio.sleep(0.1)
        assert status == 200 and "Directory listing" in text, (status, text)
        # The agents' own ports answer on this host's loopback, never at a sandbox's host.
        for address in node_agents.addresses.values():
            port = int(str(address).rsplit(":", 1)[1])
            status, text = await _get(e2b, port, wire_id, token)
            assert status == 502 and f"nothing answers on port {port}" in text, (status, text)
    finally:
        serving.cancel()
