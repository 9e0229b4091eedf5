"""The node driver's nodes through the API: where each sandbox runs is recorded in the event
log (``lifecycle:started``'s ``node``) and shown to the operator only; an API restart learns it
from the log, so a node lost meanwhile fails exactly its own sandboxes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from typing import Any

import aiohttp
import jsonschema
import pytest

from hutch.api.keys import ENGINE
from hutch.api.wire_schemas import SCHEMAS
from hutch.core.errors import SandboxNotFound
from hutch.drivers.node import wire
from hutch.drivers.node.catalog import NodeDrain
from tests.api.conftest import KEY, NODE, WIRE, Api, AppFactory
from tests.api.test_tenancy import bearer, new_key, new_org
from tests.drivers_support import NODE_SECRET, start_node


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


async def _agent_says(node_agents: Any, name: str) -> dict[str, Any]:
    """The agent's own capacity answer, asked directly (signed, as the driver asks)."""
    path = "/v1/node"
    async with aiohttp.ClientSession() as s, s.get(f"https://{node_agents.addresses[name]}{path}", ssl=False,
                                                   headers=wire.sign(NODE_SECRET.encode(), "GET", path)) as resp:
        return dict(await resp.json())


async def _cli(api: Api, *argv: str) -> tuple[int, str, str]:
    """``hutch …`` in a process of its own, against this test's server."""
    env = {**os.environ, "HUTCH_URL": str(api.client.make_url("")).rstrip("/"), "HUTCH_API_KEY": KEY}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "hutch", *argv, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


def _valid(name: str, value: Any) -> None:
    jsonschema.validate(value, SCHEMAS[name], cls=jsonschema.Draft202012Validator)


@pytest.mark.runs_on(*NODE)  # draining is the node driver's
async def test_a_drained_node_takes_no_new_sandbox_and_keeps_the_flag_across_its_restart(
        api: Api, node_agents: Any) -> None:
    listed = await api.data("GET", "/nodes")
    _valid("NodeList", listed)
    assert [(n["name"], n["state"], n["draining"]) for n in listed["nodes"]] == [("n1", "up", False), ("n2", "up", False)]
    try:
        code, out, err = await _cli(api, "node", "drain", "n1")
        assert code == 0 and out.startswith("n1  up, draining  "), (code, out, err)
        assert "n1 takes no new sandbox; what it still runs keeps running there" in err
        for _ in range(3):  # every create goes to the other node
            sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
            assert (await api.data("GET", f"/sandbox/{sid}"))["node"] == "n2"
        drained = await api.data("POST", "/nodes/n2/drain", json={})
        _valid("NodeDrained", drained)
        assert drained["node"]["draining"] is True
        full = await api.call("POST", "/sandbox", json={"runtime": "base:latest"}, expect=503)
        assert full["code"] == "NO_CAPACITY" and full["message"].endswith(": n1 is draining; n2 is draining"), full

        # The agent keeps the flag through a kill -9 and its restart, and says so.
        node_agents.kill("n1")
        await asyncio.to_thread(node_agents.restart, "n1")
        assert (await _agent_says(node_agents, "n1"))["draining"] is True
        for _ in range(100):  # the driver sees the new instance, and has it prove itself again
            if [n["state"] for n in (await api.data("GET", "/nodes"))["nodes"]] == ["up", "up"]:
                break
            await asyncio.sleep(0.1)
        code, out, _ = await _cli(api, "node", "list")
        assert code == 0 and [line.split("  ")[:2] for line in out.splitlines()] == [
            ["n1", "up, draining"], ["n2", "up, draining"]], out
    finally:
        for name in ("n1", "n2"):
            await api.data("POST", f"/nodes/{name}/drain", json={"undo": True})
    assert (await _agent_says(node_agents, "n1"))["draining"] is False
    await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201)


@pytest.mark.runs_on(*NODE)  # the nodes' routes
async def test_a_tenant_key_can_neither_drain_nor_list_nodes(api: Api, node_agents: Any) -> None:
    """The attacker holds its organization's admin key: draining a node would steer everyone's
    sandboxes (and listing them map the cluster). Refused, saying why; nothing changed."""
    await new_org(api, "attacker")
    attacker = bearer((await new_key(api, "org_attacker", "admin"))["secret"])
    for method, path, body in (("POST", "/nodes/n1/drain", {}), ("POST", "/nodes/n1/drain", {"undo": True}),
                               ("GET", "/nodes", None)):
        refused = await api.call(method, path, json=body, headers=attacker, expect=403)
        assert refused["message"] == "only the server's administrator (its bootstrap key) may do this", refused
    assert (await _agent_says(node_agents, "n1"))["draining"] is False
    # The operator's own mistakes are named too.
    missing = await api.call("POST", "/nodes/n9/drain", json={}, expect=404)
    assert missing["message"] == "node 'n9' not found; the nodes are: n1, n2", missing
    bad = await api.call("POST", "/nodes/n1/drain", json={"undo": "yes"}, expect=400)
    assert bad["message"] == "undo: expected true or false, got 'yes'", bad
    stray = await api.call("POST", "/nodes/n1/drain", json={"undoo": True}, expect=400)
    assert stray["message"].startswith("undoo: not a field of POST /nodes/{node}/drain"), stray


@pytest.mark.runs_on(*NODE)  # moving is the node driver's
async def test_drain_move_carries_an_idle_sandbox_to_another_node_by_its_files_and_env(
        api: Api, node_agents: Any) -> None:
    try:
        await api.data("POST", "/nodes/n2/drain", json={})  # both land on n1
        idle = (await api.data("POST", "/sandbox", json={"runtime": "base:latest", "env": {"MARK": "kept-env"}},
                               expect=201))["sandboxId"]
        busy = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
        ex = await api.data("POST", f"/sandbox/{idle}/execute",
                            json={"command": ["sh", "-c", "mkdir -p d && echo written-before > d/note.txt"]})
        assert (await api.wait_execution(ex["executionId"]))["exitCode"] == 0
        await api.data("POST", f"/sandbox/sandboxes/{busy}/jobs", json={"command": ["sleep", "60"]}, expect=201)
        await api.data("POST", "/nodes/n2/drain", json={"undo": True})

        code, out, err = await _cli(api, "node", "drain", "n1", "--move")
        assert code == 0, (out, err)
        lines = out.splitlines()
        assert lines[0].startswith("n1  up, draining  1 sandboxes  "), out  # the one left; counted at once
        assert lines[1:] == [f"moved {idle} from n1 to n2",
                             f"left {busy} on n1: it is running: only an idle sandbox moves"], out
        assert "hutch: processes do not follow a move: a moved sandbox keeps its id, files (its workspace) and env, " \
               "not what was running in it" in err, err

        # Same id, now on n2: the file written before is read after, and the env is there.
        assert (await api.data("GET", f"/sandbox/{idle}"))["node"] == "n2"
        ex = await api.data("POST", f"/sandbox/{idle}/execute", json={"command": ["sh", "-c", "cat d/note.txt; echo $MARK"]})
        done = await api.wait_execution(ex["executionId"])
        assert done["exitCode"] == 0 and await api.stream(done["stdoutStreamUrl"]) == b"written-before\nkept-env\n"
        moved = [e["event"] for e in (await api.data("GET", f"/sandbox/sandboxes/{idle}/events"))["events"]
                 if e["type"] == "lifecycle:moved"]
        assert moved == [{"fromNode": "n1", "toNode": "n2", "reason": "its node was drained",
                          "lost": "its processes: a move carries the workspace's files and the env, not what was "
                                  "running"}], moved
        # The old node has nothing left of it: not among its sandboxes, no directory of it.
        path = "/v1/sandboxes"
        async with aiohttp.ClientSession() as s, s.get(f"https://{node_agents.addresses['n1']}{path}", ssl=False,
                                                       headers=wire.sign(NODE_SECRET.encode(), "GET", path)) as r:
            on_n1 = (await r.json())["sandboxes"]
        assert idle not in on_n1 and busy in on_n1, on_n1
        assert not (node_agents.root / "n1" / "sandboxes" / idle).exists()
        assert (await api.data("GET", f"/sandbox/{busy}"))["node"] == "n1"
    finally:
        for name in ("n1", "n2"):
            await api.data("POST", f"/nodes/{name}/drain", json={"undo": True})


class _DrainedInNomad:
    """The agents' directory as Nomad's catalog tells a drained node (``nomad node drain
    -enable -ignore-system``): not offered for placement, its agent still called, its drain told."""

    drained_by = "Nomad"

    def __init__(self, static: Any, node: str) -> None:
        self._static, self._node = static, node

    async def agents(self) -> dict[str, str]:
        return {n: a for n, a in (await self._static.agents()).items() if n != self._node}

    async def reachable(self) -> dict[str, str]:
        return dict(await self._static.agents())

    async def drained(self) -> dict[str, NodeDrain]:
        return {self._node: NodeDrain("2026-11-29T12:40:01.5Z", active=True)}


@pytest.mark.runs_on(*NODE)  # moving is the node driver's
async def test_a_drain_in_nomad_moves_the_idle_sandboxes_once_and_leaves_the_running_one(
        api: Api, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="hutch.service.nodes")
    driver = api.client.server.app[ENGINE].parts.driver
    static = driver._directory
    try:
        await api.data("POST", "/nodes/n2/drain", json={})  # both land on n1
        idle = (await api.data("POST", "/sandbox", json={"runtime": "base:latest", "env": {"MARK": "kept-env"}},
                               expect=201))["sandboxId"]
        busy = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
        ex = await api.data("POST", f"/sandbox/{idle}/execute", json={"command": ["sh", "-c", "echo before > note.txt"]})
        assert (await api.wait_execution(ex["executionId"]))["exitCode"] == 0
        await api.data("POST", f"/sandbox/sandboxes/{busy}/jobs", json={"command": ["sleep", "60"]}, expect=201)
        await api.data("POST", "/nodes/n2/drain", json={"undo": True})

        driver._directory = _DrainedInNomad(static, "n1")  # `nomad node drain -enable n1`, as the catalog tells it
        for _ in range(100):
            if (await api.data("GET", f"/sandbox/{idle}"))["node"] == "n2":
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"{idle} never moved off n1")
        ex = await api.data("POST", f"/sandbox/{idle}/execute", json={"command": ["sh", "-c", "cat note.txt; echo $MARK"]})
        done = await api.wait_execution(ex["executionId"])
        assert done["exitCode"] == 0 and await api.stream(done["stdoutStreamUrl"]) == b"before\nkept-env\n"
        still = await api.data("GET", f"/sandbox/{busy}")
        assert (still["node"], still["status"]) == ("n1", "running"), still

        await asyncio.sleep(2.5)  # the driver's reads go on: the same drain is not told twice
        moved = [e["event"] for e in (await api.data("GET", f"/sandbox/sandboxes/{idle}/events"))["events"]
                 if e["type"] == "lifecycle:moved"]
        assert moved == [{"fromNode": "n1", "toNode": "n2", "reason": "its node was drained by Nomad",
                          "lost": "its processes: a move carries the workspace's files and the env, not what was "
                                  "running"}], moved
        said = [r.getMessage() for r in caplog.records if r.name == "hutch.service.nodes"]
        assert [m for m in said if m.startswith("node n1 was drained by Nomad")] == [
            "node n1 was drained by Nomad: moving the idle sandboxes this replica drives there"], said
        assert f"left sandbox {busy} on n1 (drained by Nomad): it is running: only an idle sandbox moves" in said, said
    finally:
        driver._directory = static
        await api.data("POST", "/nodes/n2/drain", json={"undo": True})


def test_a_tenant_sees_a_move_but_not_the_nodes() -> None:
    from hutch.api.render import redact_event
    from hutch.core.events import Event, SandboxMoved

    moved = SandboxMoved("n1", "n2", "its node was drained")
    event = Event("evt_1", "sbx_1", "2026-11-29T00:00:00Z", moved)
    assert redact_event(event, operator=True)["fromNode"] == "n1"
    assert redact_event(event) == {"reason": "its node was drained", "lost": moved.lost}


@pytest.mark.runs_on(*NODE)  # moving is the node driver's
async def test_a_move_with_nowhere_to_go_leaves_the_sandbox_as_it_was(api: Api) -> None:
    try:
        await api.data("POST", "/nodes/n2/drain", json={})
        sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
        drained = await api.data("POST", "/nodes/n1/drain", json={"move": True})
        _valid("NodeDrained", drained)
        assert drained["moved"] == [] and drained["left"] == [{
            "sandboxId": sid, "reason": "no node can take a sandbox of 512Mi memory and 1000m cpu: "
                                        "n1 is the node it moves from; n2 is draining"}], drained
        still = await api.data("GET", f"/sandbox/{sid}")
        assert (still["node"], still["status"]) == ("n1", "idle")
        ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["true"]})
        assert (await api.wait_execution(ex["executionId"]))["exitCode"] == 0
    finally:
        for name in ("n1", "n2"):
            await api.data("POST", f"/nodes/{name}/drain", json={"undo": True})


@pytest.mark.runs_on(*WIRE)  # a driver of one machine
async def test_a_driver_without_nodes_says_so(api: Api) -> None:
    refused = await api.call("GET", "/nodes", expect=501)
    assert refused["message"] == ("driver fake has no nodes: it runs sandboxes on this machine "
                                  "(nodes are the node driver's, HUTCH_DRIVER=node)"), refused
    await api.call("POST", "/nodes/n1/drain", json={}, expect=501)


@pytest.mark.runs_on(*NODE)  # the node driver's lookups
async def test_another_replicas_driver_finds_a_sandbox_where_the_log_says(api: Api, node_agents: Any) -> None:
    """A replica reads another's sandbox (its usage on GET /sandbox/{id}, served by any replica):
    its driver placed nothing, and asks the log, not every agent, where it is."""
    sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
    other = await start_node(node_agents)
    try:
        with pytest.raises(SandboxNotFound):
            await other.list_files(sid, ".")

        async def in_log(sandbox_id: str) -> str | None:
            return str((await api.data("GET", f"/sandbox/{sandbox_id}"))["node"])

        other.set_locator(in_log)
        assert isinstance(await other.list_files(sid, "."), list)
        assert (await other.usage(sid)).memory_peak_bytes
    finally:
        await other.close()
