"""Two API replicas on one log (Kafka + PostgreSQL) over the cluster's agents, both finding
them in Nomad's catalog: `nomad node drain -enable -ignore-system` of a client is seen by both,
and each idle sandbox there is moved once, by the replica that drives it (docs/node.md, "Drain
and move"). The drain is undone whatever happens: every later test shares these nodes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import CLIENTS, Cluster
from tests.cluster.test_node_agents import SERVICES, node_of, run
from tests.services import drop_database, drop_topics, fresh_database, kafka_url
from tests.system.server import Server

pytestmark = pytest.mark.timeout(240)


def _moves(server: Server, sid: str) -> list[dict[str, str]]:
    events = server.data("GET", f"/sandbox/sandboxes/{sid}/events")["events"]
    return [e["event"] for e in events if e["type"] == "lifecycle:moved"]


def test_each_idle_sandbox_is_moved_once_by_the_replica_that_drives_it(cluster: Cluster, tmp_path: Path) -> None:
    secret = Path(os.environ.get("HUTCH_TEST_CLUSTER_NODE_SECRET_FILE") or SERVICES / "acl" / "node.secret")
    assert secret.is_file(), f"no node secret at {secret}: ./scripts/services start cluster sets the agents up"
    url, database = asyncio.run(fresh_database("nodedrainreplicas"))
    log = kafka_url("nodedrainreplicas")
    replicas = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        srv = Server(tmp_path / name, driver="node", HUTCH_NOMAD_ADDR=cluster.addr, HUTCH_NOMAD_TOKEN=cluster.token,
                     HUTCH_NODE_SECRET_FILE=str(secret), HUTCH_EVENT_LOG=log, HUTCH_STORE=url,
                     HUTCH_REPLICA_ID=f"replica-{name}", HUTCH_SSH_PORT="0")
        for setting in ("HUTCH_NODE_AGENTS", "HUTCH_NODE_SECRET", "HUTCH_NODE_SERVICE", "HUTCH_NODE_NAMESPACE"):
            srv.env.pop(setting, None)  # the catalog's defaults, whatever the shell says
        replicas.append(srv)
    a, b = replicas
    victim = CLIENTS[0]
    node_id = cluster.node_id(victim)
    try:
        for srv in replicas:
            srv.start(timeout=120)
        # Each replica places some on the victim, as any create is placed.
        there: dict[str, Server] = {}
        for srv in replicas:
            for _ in range(9):
                sid = srv.data("POST", "/sandbox", {"runtime": "base:latest"})["sandboxId"]
                if node_of(sid) == victim:
                    there[sid] = srv
                    break
            else:
                raise AssertionError(f"9 sandboxes through {srv.url}, none on {victim}")
        for sid, srv in there.items():
            assert run(srv, sid, ["sh", "-c", f"echo {sid} > mine.txt"])[0] == 0

        drained_at = time.monotonic()
        try:
            cluster.drain(node_id)
            for sid in there:
                while (info := a.data("GET", f"/sandbox/{sid}"))["node"] == victim:
                    assert time.monotonic() - drained_at < 20, f"{sid} still on {victim} 20 s after Nomad's drain"
                    time.sleep(0.2)
                assert info["status"] == "idle", info
            moved_in = time.monotonic() - drained_at
            time.sleep(2)  # both replicas have read the node list and their stores since
        finally:
            cluster.undrain(node_id)
        for sid, owner in there.items():
            moved = _moves(a, sid)
            assert [(m["fromNode"], m["reason"]) for m in moved] == [(victim, "its node was drained by Nomad")], moved
            other = b if owner is a else a
            assert run(other, sid, ["cat", "mine.txt"]) == (0, f"{sid}\n")  # its files, through either replica
            # Moved by its owner: the other replica's log has no move of it.
            assert f"sandbox {sid} moved from {victim}" in owner.log.read_text()
            assert f"sandbox {sid} moved from" not in other.log.read_text()
        print(f"Nomad's drain of {victim}: {len(there)} sandboxes of two replicas moved in {moved_in:.1f} s, once each")
    finally:
        for srv in replicas:
            with contextlib.suppress(Exception):
                srv.destroy_every_sandbox()
            srv.stop()
        asyncio.run(drop_database(database))
        asyncio.run(drop_topics(log))
