"""A sandbox moved between the cluster's clients (``POST /nodes/{node}/drain`` with ``move``)
keeps its limits and the network rules it has now, read where the kernel keeps them: the new
client's cgroup and the firewall of its network namespace (tests/api/test_node_move_limits.py
proves the same on one host, with a spec recorded before the defaults). The drain is undone
whatever happens: every later test shares these nodes."""

from __future__ import annotations

import asyncio
import glob
import os
import random
import subprocess
from pathlib import Path

import pytest

from hutch.core.driver_types import DEFAULT_PIDS
from tests.cluster.conftest import CLIENTS, Cluster
from tests.cluster.test_node_agents import SERVICES, agent_pid, node_of, run
from tests.services import drop_database, drop_topics, fresh_database, kafka_url
from tests.system.server import Server

pytestmark = pytest.mark.timeout(240)


def _cgroup(controller: str, sid: str, name: str) -> int:
    found = glob.glob(f"/sys/fs/cgroup/{controller}/hutch/*/{sid}/{name}") \
        or glob.glob(f"/sys/fs/cgroup/{controller}/hutch/*/_org-*/{sid}/{name}")  # pids: under its organization's
    assert len(found) == 1, (controller, sid, name, found)
    return int(Path(found[0]).read_text())


def _firewall(node: str) -> str:
    return subprocess.run(["ip", "netns", "exec", node, "iptables-save", "-t", "filter"],
                          capture_output=True, text=True, check=True).stdout


def test_a_sandbox_moved_to_another_client_keeps_its_limits_and_its_current_rules(
        cluster: Cluster, tmp_path: Path) -> None:
    secret = Path(os.environ.get("HUTCH_TEST_CLUSTER_NODE_SECRET_FILE") or SERVICES / "acl" / "node.secret")
    assert secret.is_file(), f"no node secret at {secret}: ./scripts/services start cluster sets the agents up"
    assert all(agent_pid(node) for node in CLIENTS), "the hutch-node system job's agents are not all running"
    url, database = asyncio.run(fresh_database("nodemovelimits"))
    log = kafka_url("nodemovelimits")
    srv = Server(tmp_path, driver="node", HUTCH_NOMAD_ADDR=cluster.addr, HUTCH_NOMAD_TOKEN=cluster.token,
                 HUTCH_NODE_SECRET_FILE=str(secret), HUTCH_EVENT_LOG=log, HUTCH_STORE=url,
                 HUTCH_DEFAULT_MEMORY="96Mi", HUTCH_DEFAULT_CPU="500m")
    for setting in ("HUTCH_NODE_AGENTS", "HUTCH_NODE_SECRET", "HUTCH_NODE_SERVICE", "HUTCH_NODE_NAMESPACE"):
        srv.env.pop(setting, None)  # the catalog's defaults, whatever the shell says
    first, then = (f"198.51.100.{n}/32" for n in random.sample(range(1, 255), 2))  # TEST-NET-2
    victim = CLIENTS[1]
    try:
        srv.start(timeout=120)
        body = {"runtime": "base:latest", "network": {"enabled": True, "allow": [first]}}
        for _ in range(12):
            sid = srv.data("POST", "/sandbox", body, timeout=120)["sandboxId"]
            if node_of(sid) == victim:
                break
            assert srv.call("DELETE", f"/sandbox/{sid}")[0] == 200
        else:
            raise AssertionError(f"12 sandboxes, none on {victim}")
        srv.data("PUT", f"/sandbox/{sid}/network", {"enabled": True, "allow": [then]})
        assert then in _firewall(victim) and first not in _firewall(victim)
        assert run(srv, sid, ["sh", "-c", "echo carried > note.txt"])[0] == 0

        try:
            drained = srv.data("POST", f"/nodes/{victim}/drain", {"move": True}, timeout=120)
        finally:
            srv.data("POST", f"/nodes/{victim}/drain", {"undo": True})
        assert [m["sandboxId"] for m in drained["moved"]] == [sid], drained
        to = node_of(sid)
        assert to != victim and srv.data("GET", f"/sandbox/{sid}")["node"] == to
        assert run(srv, sid, ["cat", "note.txt"]) == (0, "carried\n")  # and its cpu limit is written
        assert _cgroup("memory", sid, "memory.limit_in_bytes") == 96 * 2**20
        assert _cgroup("cpu", sid, "cpu.cfs_quota_us") * 1000 // _cgroup("cpu", sid, "cpu.cfs_period_us") == 500
        assert _cgroup("pids", sid, "pids.max") == DEFAULT_PIDS
        rules = _firewall(to)
        assert then in rules and first not in rules, rules
        assert then not in _firewall(victim)  # the old copy went with its chain
    finally:
        try:
            srv.destroy_every_sandbox()
        finally:
            srv.stop()
            asyncio.run(drop_database(database))
            asyncio.run(drop_topics(log))
