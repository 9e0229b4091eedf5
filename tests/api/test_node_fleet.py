"""The node driver's nodes through the API: where each sandbox runs is recorded in the event
log (``lifecycle:started``'s ``node``) and shown to the operator only; an API restart learns it
from the log, so a node lost meanwhile fails exactly its own sandboxes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from hutch.api.keys import ENGINE
from tests.api.conftest import NODE, Api, AppFactory
from tests.api.test_tenancy import bearer, new_key, new_org


async def _started(api: Api, sid: str, headers: dict[str, str] | None = None, query: str = "") -> dict[str, Any]:
    events = (await api.data("GET", f"/sandbox/sandboxes/{sid}/events{query}", headers=headers or {}))["events"]
    return dict(next(e["event"] for e in events if e["type"] == "lifecycle:started"))


@pytest.mark.runs_on(*NODE)  # only the node driver places sandboxes on nodes
async def test_the_node_is_the_operators_to_see_not_a_tenants(api: Api) -> None:
    await new_org(api, "tenant")
    tenant = bearer((await new_key(api, "org_tenant", "admin"))["secret"])
    created = await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, headers=tenant, expect=201)
    sid = created["sandboxId"]
    # The operator (the bootstrap key) sees where it runs, in the sandbox and in its events.
    node = (await api.data("GET", f"/sandbox/{sid}?orgId=org_tenant"))["node"]
    assert node in ("n1", "n2")
    assert await _started(api, sid, query="?orgId=org_tenant") == {"node": node}
    # The tenant does not, anywhere it reads its sandbox: co-residency is an attacker's first question.
    mine = await api.data("GET", f"/sandbox/{sid}", headers=tenant)
    assert "node" not in mine, mine
    assert await _started(api, sid, tenant) == {}
    history = await api.data("GET", f"/sandbox/sandboxes/{sid}/history", headers=tenant)
    assert all("node" not in step["event"] for step in history["history"]), history
    path = created["auditStreamUrl"].split("://", 1)[1].split("/", 1)[1]
    audit = [json.loads(line) for line in (await (await api.client.get(f"/{path}?follow=false")).text()).splitlines()]
    started = next(r for r in audit if r["type"] == "lifecycle:started")
    assert "node" not in started["detail"], started


@pytest.mark.runs_on(*NODE)  # the node driver's placements across an API restart
async def test_a_restarted_api_knows_each_node_from_the_log_and_a_lost_one_fails_only_its_own(
        make_api: AppFactory, node_agents: Any) -> None:
    api = await make_api()
    made = [(await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
            for _ in range(4)]
    where = {sid: (await api.data("GET", f"/sandbox/{sid}"))["node"] for sid in made}
    assert sorted(where.values()) == ["n1", "n1", "n2", "n2"], where
    await api.client.close()
    # n2 dies while no API runs: the restarted one cannot ask it anything, only the log knows
    # which sandboxes were there.
    node_agents.kill("n2")
    try:
        again = await make_api()
        driver = again.client.server.app[ENGINE].parts.driver
        driver._lost_after = 2.0
        on_n2 = {sid for sid, node in where.items() if node == "n2"}
        for _ in range(100):
            states = {sid: await again.data("GET", f"/sandbox/{sid}") for sid in made}
            if all(states[sid]["status"] == "failed" for sid in on_n2):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(states)
        for sid in on_n2:
            assert states[sid]["reason"] == "node n2 was lost: its agent has not answered for 2 s", states[sid]
        for sid in set(made) - on_n2:  # n1's run on, through the restarted API
            assert states[sid]["status"] == "idle", states[sid]
            ex = await again.data("POST", f"/sandbox/{sid}/execute", json={"command": ["true"]})
            assert (await again.wait_execution(ex["executionId"]))["exitCode"] == 0
    finally:
        await asyncio.to_thread(node_agents.restart, "n2")
