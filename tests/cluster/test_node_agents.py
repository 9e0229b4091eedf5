"""Sandboxes through the node agents of the three-client cluster (issue 35): ``hutch serve``
with ``HUTCH_DRIVER=node`` and no agent list finds the ``hutch-node`` system job's agents in
Nomad's catalog (service hutch-node, namespace hutch-system, ``services start cluster`` runs
them), places sandboxes over the three clients and sends every call to the owning agent.

One server for the module (production profile: its own topic and database). What one host
already proves of the agents (tests/isolation/test_node_loss.py: an init killed, a silent
node, reap, the lost-then-returned ending) is not repeated; here the pieces that only a
cluster has: three hosts in their own network namespaces, agents Nomad restarts, a snapshot
moving between hosts through the shared blob store, a port tunnelled from another host.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.cluster.conftest import CLIENTS, Cluster, wait_status
from tests.services import drop_database, drop_topics, fresh_database, kafka_url
from tests.system.server import KEY, Server

pytestmark = pytest.mark.timeout(240)

SERVICES = Path(os.environ.get("HUTCH_SERVICES_DIR", "/var/lib/hutch/services")) / "cluster"
AGENTS = SERVICES / "agents"  # each client's agent's --data-dir: AGENTS/<node name>
AGENT_PORT = 4750
AUTH = {"Authorization": f"Bearer {KEY}"}


def node_of(sid: str) -> str:
    """The client whose agent holds the sandbox (its directory under that agent's data dir)."""
    held = [n for n in CLIENTS if (AGENTS / n / "sandboxes" / sid).is_dir()]
    assert len(held) == 1, (sid, held)
    return held[0]


def agent_pid(node: str) -> int | None:
    """The pid of the cluster's agent on ``node`` (not the infra test's, on another port)."""
    n = CLIENTS.index(node) + 1
    found = subprocess.run(["pgrep", "-f", f"node serve --name {node} --listen 10.77.0.{10 + n}:{AGENT_PORT} "],
                           capture_output=True, text=True)
    pids = [int(p) for p in found.stdout.split()]
    return pids[0] if len(pids) == 1 else None


@pytest.fixture(scope="module")
def server(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    secret = Path(os.environ.get("HUTCH_TEST_CLUSTER_NODE_SECRET_FILE") or SERVICES / "acl" / "node.secret")
    if not secret.is_file():
        pytest.fail(f"no node secret at {secret}: the cluster's agents are not set up; "
                    "./scripts/services start cluster with this checkout's scripts", pytrace=False)
    for node in CLIENTS:
        if agent_pid(node) is None:
            pytest.fail(f"no node agent runs on {node}: ./scripts/services start cluster runs them as the "
                        "hutch-node system job", pytrace=False)
    url, database = asyncio.run(fresh_database("nodeagents"))
    log = kafka_url("nodeagents")
    data = tmp_path_factory.mktemp("nodeagents") / "data"
    data.mkdir()
    srv = Server(data, driver="node", HUTCH_NOMAD_ADDR=cluster.addr, HUTCH_NOMAD_TOKEN=cluster.token,
                 HUTCH_NODE_SECRET_FILE=str(secret), HUTCH_EVENT_LOG=log, HUTCH_STORE=url)
    for name in ("HUTCH_NODE_AGENTS", "HUTCH_NODE_SECRET", "HUTCH_NODE_SERVICE", "HUTCH_NODE_NAMESPACE"):
        srv.env.pop(name, None)  # the catalog's defaults, whatever the shell says
    srv.start(timeout=120)
    try:
        yield srv
    finally:
        try:
            srv.destroy_every_sandbox()
        finally:
            srv.stop()
            asyncio.run(drop_database(database))
            asyncio.run(drop_topics(log))


def spread(server: Server, body: dict[str, Any], *, most: int = 12) -> dict[str, str]:
    """Sandboxes until every client holds one; {sandbox id: node}."""
    placed: dict[str, str] = {}
    while set(placed.values()) != set(CLIENTS):
        assert len(placed) < most, f"{most} sandboxes never covered every client: {placed}"
        sid = server.data("POST", "/sandbox", body, timeout=120)["sandboxId"]
        placed[sid] = node_of(sid)
    return placed


def run(server: Server, sid: str, command: list[str]) -> tuple[int, str]:
    ex = server.data("POST", f"/sandbox/{sid}/execute", {"command": command})
    with urllib.request.urlopen(ex["stdoutStreamUrl"], timeout=30) as resp:
        out = resp.read().decode()
    done = server.data("GET", f"/sandbox/execution/{ex['executionId']}?wait=30s", timeout=40)
    return int(done["exitCode"]), out


PORT_SERVER = "import http.server as h; h.test(h.SimpleHTTPRequestHandler, port=8000, bind='0.0.0.0')"
# The Nomad server and each agent are on the cluster network: a sandbox reaches neither.
PROBE = ("import socket, sys\n"
         "for host, port in [('10.77.0.1', 4656), ('10.77.0.11', 4750), ('1.1.1.1', 53)]:\n"
         "    try:\n"
         "        socket.create_connection((host, port), 2).close(); print('reached', host); sys.exit(1)\n"
         "    except OSError as err:\n"
         "        print('refused', host, type(err).__name__)\n")


async def _terminal(url: str, sid: str) -> int:
    async with aiohttp.ClientSession() as s, \
            s.ws_connect(f"{url}/sandbox/{sid}/terminal", params={"command": "sh"}, headers=AUTH) as ws:
        await ws.send_bytes(b"echo node-$((6*7))\n")  # the echoed input is not the answer
        screen, asked_exit = "", False
        async with asyncio.timeout(20):
            while True:
                msg = await ws.receive()
                if msg.type is aiohttp.WSMsgType.BINARY:
                    screen += msg.data.decode(errors="replace")
                    if "node-42" in screen and not asked_exit:
                        asked_exit = True
                        await ws.send_bytes(b"exit 3\n")
                elif msg.type is aiohttp.WSMsgType.TEXT:
                    body = json.loads(msg.data)
                    if body["type"] == "exit":
                        assert asked_exit, screen[-300:]
                        return int(body["exitCode"])
                else:
                    raise AssertionError(f"terminal ended before its exit: {screen[-300:]!r}")


async def _through_port(url: str, sid: str) -> str:
    async with aiohttp.ClientSession() as s:
        for _ in range(100):
            async with s.get(f"{url}/proxy/{sid}/hello.txt", headers=AUTH) as resp:
                if resp.status == 200:
                    return await resp.text()
            await asyncio.sleep(0.1)
    raise AssertionError(f"the port of {sid} never answered through /proxy/{sid}/")


def test_sandboxes_on_every_client_through_the_catalogs_agents(server: Server) -> None:
    started = time.monotonic()
    placed = spread(server, {"runtime": "python:3.13", "network": {"port": 8000}})
    for sid, node in placed.items():
        # a command and files, on the agent of its node
        server.data("POST", f"/fs/{sid}", {"files": [
            {"path": "hello.txt", "content": base64.b64encode(f"from {node}".encode()).decode()},
            {"path": "probe.py", "content": base64.b64encode(PROBE.encode()).decode()}]})
        code, out = run(server, sid, ["sh", "-c", "cat hello.txt; echo; id -u"])
        assert code == 0 and out.startswith(f"from {node}\n") and out.split()[-1] != "0", (node, out)
        # egress is off unless asked for: not the cluster network, not the agents, not the internet
        code, out = run(server, sid, ["python3", "probe.py"])
        assert code == 0 and out.count("refused") == 3, (node, out)
        # a port, through the API's path routing and the agent's tunnel from this host
        server.data("POST", f"/sandbox/sandboxes/{sid}/jobs", {"command": ["python3", "-c", PORT_SERVER]})
        assert asyncio.run(_through_port(server.url, sid)) == f"from {node}", node
        # a terminal
        assert asyncio.run(_terminal(server.url, sid)) == 3, node

    # a snapshot taken on one node, started on the others (the blob store is the API's)
    first = next(iter(placed))
    snap = server.data("POST", f"/sandbox/{first}/snapshot", {"name": "across", "tag": "v1"})
    made = spread(server, {"snapshot": snap["snapshotId"]})
    for sid, node in made.items():
        code, out = run(server, sid, ["cat", "hello.txt"])
        assert code == 0 and out == f"from {placed[first]}", (node, out)
    for sid in [*placed, *made]:
        server.call("DELETE", f"/sandbox/{sid}")
    print(f"the catalog's agents: {len(placed) + len(made)} sandboxes on {sorted(set(placed.values()))} "
          f"in {time.monotonic() - started:.1f} s")


def test_an_agent_killed_keeps_or_fails_its_sandboxes_and_leaves_nothing(server: Server) -> None:
    """kill -9 of one client's agent: Nomad restarts it (restart delay 1 s). Back within the
    driver's 8 s, it adopts its sandboxes and they are kept; later, they are failed naming the
    node and ended there when it answers (docs/node.md, "Node loss")."""
    victim = CLIENTS[1]
    placed = spread(server, {"runtime": "base:latest"})
    mine = [s for s, n in placed.items() if n == victim]
    inits = {s: json.loads((AGENTS / victim / "sandboxes" / s / "meta.json").read_text())["init_pid"] for s in mine}
    pid = agent_pid(victim)
    assert pid is not None
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    while (back := agent_pid(victim)) is None or back == pid:
        assert time.monotonic() - killed < 60, f"Nomad did not restart the agent on {victim}"
        time.sleep(0.2)
    print(f"agent on {victim} restarted by Nomad after {time.monotonic() - killed:.1f} s")
    time.sleep(10)  # past the driver's 8 s: it has decided, one way or the other
    for sid in mine:
        info = wait_status(server, sid, ("idle", "running", "failed"), 20)
        if info["status"] == "failed":
            assert victim in info.get("reason", ""), info
            deadline = time.monotonic() + 30
            while (AGENTS / victim / "sandboxes" / sid).exists() or Path(f"/proc/{inits[sid]}").exists():
                assert time.monotonic() < deadline, f"{victim} still holds the failed {sid}"
                time.sleep(0.3)
            print(f"{sid} on {victim}: failed ({info['reason']}) and ended there")
        else:
            code, _ = run(server, sid, ["true"])
            assert code == 0, sid
            print(f"{sid} on {victim}: kept, adopted by the restarted agent")
    for sid, node in placed.items():
        if node != victim:
            assert server.data("GET", f"/sandbox/{sid}")["status"] in ("idle", "running"), sid
    for sid in placed:
        server.call("DELETE", f"/sandbox/{sid}")
    deadline = time.monotonic() + 30
    while left := [s for s in placed if (AGENTS / placed[s] / "sandboxes" / s).exists()]:
        assert time.monotonic() < deadline, f"deleted sandboxes left on their nodes: {left}"
        time.sleep(0.3)


def test_a_drain_in_nomad_moves_the_idle_sandbox_and_leaves_the_running_one(server: Server, cluster: Cluster) -> None:
    """`nomad node drain -enable -ignore-system NODE` (docs/node.md, "Drain and move"): the
    node's agent keeps serving, the idle sandbox there moves to another node with its files
    and env, recorded with a reason naming Nomad's drain; the running one stays. The drain is
    undone whatever happens: every later test shares these nodes."""
    victim, others = CLIENTS[2], CLIENTS[:2]
    node_id = cluster.node_id(victim)
    pid = agent_pid(victim)
    assert pid is not None
    started = time.monotonic()
    made: list[str] = []
    try:
        # Two on the victim, placed as any create is (the agents are shared: no drain of hutch's
        # own steers the other tests' creates meanwhile).
        while len(on_victim := [s for s in made if node_of(s) == victim]) < 2:
            assert len(made) < 12, f"12 sandboxes, {len(on_victim)} on {victim}"
            body = {"runtime": "base:latest", "env": {"MARK": "kept-env"}}
            made.append(server.data("POST", "/sandbox", body)["sandboxId"])
        idle, busy = on_victim
        for sid in set(made) - {idle, busy}:
            server.call("DELETE", f"/sandbox/{sid}")
        assert run(server, idle, ["sh", "-c", "echo written-before > note.txt"])[0] == 0
        server.data("POST", f"/sandbox/sandboxes/{busy}/jobs", {"command": ["sleep", "120"]})
        wait_status(server, busy, ("running",), 10)

        drained_at = time.monotonic()
        cluster.drain(node_id)
        while (info := server.data("GET", f"/sandbox/{idle}"))["node"] == victim:
            assert time.monotonic() - drained_at < 20, f"{idle} still on {victim} 20 s after Nomad's drain"
            time.sleep(0.2)
        moved_in = time.monotonic() - drained_at
        to = info["node"]
        assert to in others and info["status"] == "idle", info
        assert node_of(idle) == to
        code, out = run(server, idle, ["sh", "-c", "cat note.txt; echo $MARK"])
        assert (code, out) == (0, "written-before\nkept-env\n"), out
        events = server.data("GET", f"/sandbox/sandboxes/{idle}/events")["events"]
        moved = [e["event"] for e in events if e["type"] == "lifecycle:moved"]
        assert [(m["fromNode"], m["toNode"], m["reason"]) for m in moved] == [
            (victim, to, "its node was drained by Nomad")], moved
        # The running one stays where it runs, served by the agent Nomad left running there.
        still = server.data("GET", f"/sandbox/{busy}")
        assert (still["node"], still["status"]) == (victim, "running"), still
        assert agent_pid(victim) == pid
        assert run(server, busy, ["true"])[0] == 0
        # The operator reads it as Nomad left it: up (its agent answers), taking no new sandbox.
        listed = {n["name"]: n for n in server.data("GET", "/nodes")["nodes"]}
        assert (listed[victim]["state"], listed[victim]["draining"]) == ("up", True), listed[victim]
        node = cluster.get(f"/v1/node/{node_id}")
        print(f"Nomad's drain of {victim}: {idle} moved to {to} in {moved_in:.1f} s; {busy} left running there; "
              f"the node {node['SchedulingEligibility']}, drain {node['LastDrain']['Status']}")
    finally:
        cluster.undrain(node_id)
    # Placed on again: the directory offers it once Nomad says it is eligible.
    deadline = time.monotonic() + 10
    while not any(n["name"] == victim and not n["draining"] and n["state"] == "up"
                  for n in server.data("GET", "/nodes")["nodes"]):
        assert time.monotonic() < deadline, server.data("GET", "/nodes")
        time.sleep(0.2)
    for sid in made:
        server.call("DELETE", f"/sandbox/{sid}")
    print(f"the drain test took {time.monotonic() - started:.1f} s")
