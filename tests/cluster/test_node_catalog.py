"""The node agents' directory (hutch/drivers/node/catalog.py) against the real cluster's
Nomad: a system job in a namespace of its own registers the ``hutch-node`` service on the
clients it may run on, and the directory follows the catalog by blocking queries.

The job's task is Nomad's ``mock_driver`` (built into the Nomad the services build from source,
without the ``release`` tag): the registration is what is under test, not the agent, and a
mock task costs the shared two cores nothing. A node "joins" by the job's constraint being
widened to it: the third client's allocation starts and registers, as a new client's system
allocation would; the directory picks it up without a restart. Node states (down, ineligible,
draining) are not changed here, the other cluster tests share these nodes: the parsing of those
is tests/unit/test_node_catalog.py's, on answers recorded from this cluster.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from hutch.core.errors import DriverFailure
from hutch.drivers.node.catalog import NomadAgentDirectory
from tests.cluster.conftest import CLIENTS, Cluster, _setting

pytestmark = pytest.mark.timeout(180)

JOB = "hutch-node"
SERVICE = "hutch-node"


class Operator:
    """The cluster's management token: namespaces and the test job."""

    def __init__(self, addr: str, token: str) -> None:
        self.addr, self.token = addr.rstrip("/"), token

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.addr + path, data=data, method=method,
                                         headers={"X-Nomad-Token": self.token})
        with urllib.request.urlopen(request, timeout=20) as resp:
            text = resp.read()
        return json.loads(text) if text.strip() else None


def job(namespace: str, nodes: str) -> dict[str, Any]:
    """A system job registering SERVICE with a dynamic port on every node matching ``nodes``."""
    return {"Job": {
        "ID": JOB, "Name": JOB, "Namespace": namespace, "Type": "system", "Datacenters": ["dc1"],
        "Constraints": [{"LTarget": "${node.unique.name}", "RTarget": nodes, "Operand": "regexp"}],
        "TaskGroups": [{
            "Name": "node", "Count": 1,
            "Networks": [{"DynamicPorts": [{"Label": "agent"}]}],
            "Services": [{"Name": SERVICE, "Provider": "nomad", "PortLabel": "agent"}],
            "Tasks": [{"Name": "agent", "Driver": "mock_driver", "Config": {"run_for": "1h"},
                       "Resources": {"CPU": 10, "MemoryMB": 10}}],
        }],
    }}


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[tuple[Operator, str]]:
    op = Operator(cluster.addr, _setting("HUTCH_TEST_CLUSTER_OPERATOR_TOKEN"))
    name = f"hutch-catalog-{secrets.token_hex(4)}"
    op.call("PUT", f"/v1/namespace/{name}", {"Name": name, "Description": "tests/cluster/test_node_catalog.py"})
    try:
        yield op, name
    finally:
        op.call("DELETE", f"/v1/job/{JOB}?purge=true&namespace={name}")
        deadline = time.monotonic() + 60
        while True:  # a namespace with allocations still stopping refuses to go
            try:
                op.call("DELETE", f"/v1/namespace/{name}")
                break
            except urllib.error.HTTPError as err:
                if time.monotonic() > deadline:
                    raise AssertionError(f"namespace {name} not deleted: {err.read()!r}") from err
                time.sleep(0.5)


def expected(op: Operator, namespace: str) -> dict[str, str]:
    """Node name -> host:port of each live allocation of the job, as Nomad placed them (a
    client registers the service before it tells the servers its allocation runs)."""
    found = {}
    for stub in op.call("GET", f"/v1/job/{JOB}/allocations?namespace={namespace}"):
        if stub["ClientStatus"] not in ("pending", "running") or stub["DesiredStatus"] != "run":
            continue
        alloc = op.call("GET", f"/v1/allocation/{stub['ID']}?namespace={namespace}")
        port = alloc["AllocatedResources"]["Shared"]["Ports"][0]
        found[stub["NodeName"]] = f"{port['HostIP']}:{port['Value']}"
    return found


async def until(directory: NomadAgentDirectory, want: set[str], timeout: float) -> tuple[dict[str, str], float]:
    """The directory's agents once their names are ``want``, and the seconds it took."""
    started = time.monotonic()
    while set(agents := await directory.agents()) != want:
        left = started + timeout - time.monotonic()
        assert left > 0, f"agents after {timeout:.0f} s: {agents}, wanted {sorted(want)}"
        await directory.changed(left)
    return agents, time.monotonic() - started


async def test_the_directory_follows_registrations_as_nodes_join_and_leave(namespace: tuple[Operator, str]) -> None:
    op, ns = namespace
    async with NomadAgentDirectory(op.addr, op.token, namespace=ns, wait="10s") as directory:
        assert await directory.agents() == {}, "a namespace without the job has no agents"

        op.call("POST", f"/v1/jobs?namespace={ns}", job(ns, "^hutch-c[12]$"))
        agents, took = await until(directory, {"hutch-c1", "hutch-c2"}, 60)
        print(f"two agents known {took:.2f} s after the job's registration")
        assert agents == expected(op, ns)
        for name, address in agents.items():
            assert address.startswith(f"10.77.0.1{name[-1]}:"), (name, address)

        # A node joins: the third client's allocation starts and registers; the same
        # directory, never restarted, places on it.
        op.call("POST", f"/v1/jobs?namespace={ns}", job(ns, "^hutch-c[123]$"))
        agents, took = await until(directory, set(CLIENTS), 60)
        print(f"the joining node known {took:.2f} s after the job's update")
        assert agents == expected(op, ns)
        assert set((await directory.nodes()).keys()) == set(CLIENTS)
        assert await directory.reachable() == agents

        # The job stops: its registrations go, and so do the agents.
        op.call("DELETE", f"/v1/job/{JOB}?namespace={ns}")
        _, took = await until(directory, set(), 60)
        print(f"no agents {took:.2f} s after the job was stopped")


async def test_a_token_that_cannot_read_the_namespace_is_a_clear_failure(
        namespace: tuple[Operator, str], cluster: Cluster) -> None:
    _, ns = namespace
    # hutch's own token (the hutch-driver policy of the services) reads only `default`.
    async with NomadAgentDirectory(cluster.addr, cluster.token, namespace=ns) as directory:
        with pytest.raises(DriverFailure) as caught:
            await directory.nodes(timeout=3)
    message = str(caught.value)
    assert f"service 'hutch-node' in namespace {ns!r}" in message, message
    assert "403" in message, message


async def test_a_nomad_that_does_not_answer_is_a_clear_failure() -> None:
    # A port on this host's cluster address where nothing listens; never started by hand: the
    # first call starts it, as the node driver's (which knows only agents()) does.
    addr = os.environ.get("HUTCH_TEST_CLUSTER_ADDR", "http://10.77.0.1:4656").rsplit(":", 1)[0] + ":9"
    directory = NomadAgentDirectory(addr, "x")
    try:
        with pytest.raises(DriverFailure) as caught:
            await directory.nodes(timeout=3)
    finally:
        await directory.close()
    assert "does not answer" in str(caught.value) and addr in str(caught.value), caught.value
