"""The cluster of ``./scripts/services start cluster`` (one Nomad server, three clients each in
its own network namespace with its own containerd) and a real ``hutch serve`` on the
production profile driving it. ``scripts/test`` starts the cluster and exports its settings as
HUTCH_TEST_CLUSTER_ADDR / HUTCH_TEST_CLUSTER_REGISTRY / HUTCH_TEST_CLUSTER_TOKEN (its ACLs are
on); without them these tests fail."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.services import drop_database, drop_topics, fresh_database, kafka_url
from tests.system.server import ROOT, Server

CLUSTER_SH = ROOT / "scripts" / "services.d" / "cluster.sh"
CLIENTS = ("hutch-c1", "hutch-c2", "hutch-c3")


def _setting(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: the cluster tests need the real cluster; start it with "
                    "./scripts/services start cluster (scripts/test does, and exports its settings)", pytrace=False)
    return value


class Cluster:
    def __init__(self, addr: str, registry: str, token: str) -> None:
        self.addr, self.registry, self.token = addr, registry, token

    def get(self, path: str) -> Any:
        request = urllib.request.Request(self.addr + path, headers={"X-Nomad-Token": self.token})
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(resp.read())

    def restarted(self, settings: str) -> None:
        """After a stop and start: the new server's token (from the start's settings), here and
        for what reads the environment later in this session."""
        for line in settings.splitlines():
            if line.startswith("HUTCH_NOMAD_TOKEN="):
                self.token = os.environ["HUTCH_TEST_CLUSTER_TOKEN"] = line.split("=", 1)[1]
            if line.startswith("HUTCH_NOMAD_OPERATOR_TOKEN="):
                os.environ["HUTCH_TEST_CLUSTER_OPERATOR_TOKEN"] = line.split("=", 1)[1]

    def ready_nodes(self) -> set[str]:
        return {n["Name"] for n in self.get("/v1/nodes") if n["Status"] == "ready"
                and n.get("Drivers", {}).get("hutch-containerd", {}).get("Healthy")}

    def wait_ready(self, names: frozenset[str] = frozenset(CLIENTS), timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not names <= (ready := self.ready_nodes()):
            assert time.monotonic() < deadline, f"cluster nodes ready: {sorted(ready)}, wanted {sorted(names)}"
            time.sleep(0.3)

    def node_of(self, sandbox_id: str) -> str:
        """The client node the sandbox's allocation runs on."""
        running = [a for a in self.get("/v1/allocations") if a["JobID"].endswith("-" + sandbox_id)
                   and a["ClientStatus"] in ("running", "pending")]
        assert len(running) == 1, (sandbox_id, running)
        return str(running[0]["NodeName"])

    def allocs_of(self, sandbox_id: str) -> list[dict[str, Any]]:
        return [a for a in self.get("/v1/allocations") if a["JobID"].endswith("-" + sandbox_id)]

    def operate(self, method: str, path: str, body: Any = None) -> Any:
        """As the cluster's operator (node:write: drains and eligibility)."""
        token = _setting("HUTCH_TEST_CLUSTER_OPERATOR_TOKEN")
        request = urllib.request.Request(self.addr + path, method=method, headers={"X-Nomad-Token": token},
                                         data=None if body is None else json.dumps(body).encode())
        with urllib.request.urlopen(request, timeout=20) as resp:
            text = resp.read()
        return json.loads(text) if text.strip() else None

    def node_id(self, name: str) -> str:
        return str(next(n["ID"] for n in self.get("/v1/nodes") if n["Name"] == name))

    def drain(self, node_id: str) -> None:
        """`nomad node drain -enable -ignore-system` (docs/node.md): the node's agent stays."""
        self.operate("PUT", f"/v1/node/{node_id}/drain",
                     {"DrainSpec": {"Deadline": 3600 * 10**9, "IgnoreSystemJobs": True}, "MarkEligible": False})

    def undrain(self, node_id: str) -> None:
        """`nomad node drain -disable` and eligibility back; true in Nomad before returning."""
        self.operate("PUT", f"/v1/node/{node_id}/drain", {"DrainSpec": None, "MarkEligible": True})
        self.operate("PUT", f"/v1/node/{node_id}/eligibility", {"Eligibility": "eligible"})
        deadline = time.monotonic() + 30
        while (node := self.get(f"/v1/node/{node_id}"))["Drain"] or node["SchedulingEligibility"] != "eligible":
            assert time.monotonic() < deadline, f"node {node['Name']} still drained: {node['SchedulingEligibility']}"
            time.sleep(0.2)

    def act(self, *args: str) -> None:
        proc = subprocess.run([str(CLUSTER_SH), *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)

    def containers(self, number: int) -> list[str]:
        """Task ids in client N's containerd (what runs there, whatever Nomad thinks)."""
        proc = subprocess.run(["ctr", "--address", f"/run/hutch-cluster/c{number}/containerd.sock",
                               "--namespace", "nomad", "tasks", "ls", "-q"], capture_output=True, text=True)
        return proc.stdout.split() if proc.returncode == 0 else []


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    c = Cluster(_setting("HUTCH_TEST_CLUSTER_ADDR"), _setting("HUTCH_TEST_CLUSTER_REGISTRY"),
                _setting("HUTCH_TEST_CLUSTER_TOKEN"))
    try:
        c.wait_ready(timeout=60)
    except OSError as err:
        pytest.fail(f"the cluster's Nomad server at {c.addr} does not answer: {err}; "
                    "start it with ./scripts/services start cluster", pytrace=False)
    return c


@pytest.fixture
def whole_cluster(cluster: Cluster) -> Iterator[Cluster]:
    """For tests that take nodes away: every client is back (and ready) afterwards."""
    yield cluster
    for n in range(1, len(CLIENTS) + 1):
        cluster.act("link", str(n), "up")
        if f"hutch-c{n}" not in cluster.ready_nodes():
            cluster.act("revive", str(n))
    cluster.wait_ready()


@pytest.fixture(scope="module")
def server(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`hutch serve` on the production profile (its own topic and database) over the cluster."""
    url, database = asyncio.run(fresh_database("cluster"))
    log = kafka_url("cluster")
    data = tmp_path_factory.mktemp("cluster") / "data"
    data.mkdir()
    srv = Server(data, driver="nomad", HUTCH_NOMAD_ADDR=cluster.addr, HUTCH_NOMAD_REGISTRY=cluster.registry,
                 HUTCH_NOMAD_TOKEN=cluster.token,
                 HUTCH_EVENT_LOG=log, HUTCH_STORE=url, HUTCH_NOMAD_POOL="off")
    srv.start(timeout=120)
    try:
        yield srv
    finally:
        try:
            for sb in srv.data("GET", "/sandbox?limit=100").get("sandboxes", []):
                srv.call("DELETE", f"/sandbox/{sb['sandboxId']}")
        finally:  # the server never outlives the module, whatever the clean-up met
            srv.stop()
            asyncio.run(drop_database(database))
            asyncio.run(drop_topics(log))


def spread_sandboxes(server: Server, cluster: Cluster, body: dict[str, Any], *, most: int = 12) -> dict[str, str]:
    """Create sandboxes until every client node has one; {sandbox id: node name}."""
    placed: dict[str, str] = {}
    while set(placed.values()) != set(CLIENTS):
        assert len(placed) < most, f"{most} sandboxes never covered every node: {placed}"
        sid = server.data("POST", "/sandbox", body, timeout=300)["sandboxId"]
        placed[sid] = cluster.node_of(sid)
    return placed


def wait_status(server: Server, sid: str, statuses: tuple[str, ...], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        info: dict[str, Any] = server.data("GET", f"/sandbox/{sid}")
        if info["status"] in statuses:
            return info
        assert time.monotonic() < deadline, f"sandbox {sid} is {info['status']} after {timeout}s, wanted {statuses}"
        time.sleep(0.1)


