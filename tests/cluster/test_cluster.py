"""hutch on a real multi-node Nomad cluster (one server, three clients, each client its own
network namespace, address, containerd and plugin): sandboxes spread over the clients and
everything works on whichever one a sandbox lands; a lost client fails its sandboxes, naming
the node, within 30 s, and gives nothing back half-way when it returns; the cluster network
is out of every sandbox's reach."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator

import pytest

from hutch import SyncSandboxClient
from hutch.drivers.nomad import images
from tests.cluster.conftest import CLIENTS, Cluster, spread_sandboxes, wait_status
from tests.isolation import connect_probe
from tests.isolation.test_local_network import fake_internet_running
from tests.system.server import KEY, Server

NODE_LOSS_LIMIT = 30.0  # seconds from the kill to the sandbox's `failed`


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[SyncSandboxClient]:
    with SyncSandboxClient(server.url, KEY) as c:
        yield c


@pytest.fixture(scope="module")
def internet() -> Iterator[tuple[str, int]]:
    with fake_internet_running() as target:
        yield target


def probe(client: SyncSandboxClient, sid: str, targets: list[tuple[str, int]]) -> dict[str, str]:
    out = client.connect(sid).execute(["python3", "-c", connect_probe.SCRIPT, *(f"{h}:{p}" for h, p in targets)],
                                      timeout="60s")
    assert out.exit_code == 0, out.stderr
    return dict(json.loads(out.stdout or "{}"))


def host_addresses() -> list[str]:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True,
                         check=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines()]


def test_sandboxes_spread_and_everything_works_on_every_client(
    server: Server, cluster: Cluster, client: SyncSandboxClient, internet: tuple[str, int]
) -> None:
    placed = spread_sandboxes(server, cluster, {"runtime": "python:3.13", "network": {"enabled": True, "port": 8000}})
    counts = Counter(placed.values())
    assert set(counts) == set(CLIENTS), counts
    inet = f"{internet[0]}:{internet[1]}"
    nomad_host, nomad_port = cluster.addr.split("//")[1].split(":")
    reg_host, reg_port = cluster.registry.split(":")
    for node in CLIENTS:
        sid = next(s for s, n in placed.items() if n == node)
        sb = client.connect(sid)
        # files and executions
        sb.write_files({"note.txt": f"on {node}".encode()})
        assert sb.read_bytes("note.txt") == f"on {node}".encode()
        out = sb.execute(["python3", "-c", "import os; print(open('note.txt').read(), os.getuid())"])
        assert out.exit_code == 0 and out.stdout == f"on {node} {images.SANDBOX_UID}\n", out
        # network: the internet yes; the cluster network and this host no
        forbidden = [(nomad_host, int(nomad_port)), (reg_host, int(reg_port)), ("10.77.0.11", 4646),
                     ("10.77.0.12", 4646), ("10.77.0.13", 4646), ("169.254.169.254", 80)]
        forbidden += [(a, 22) for a in host_addresses() if not a.startswith(("203.0.113.", "10.77.0."))]
        seen = probe(client, sid, [internet, *forbidden])
        assert seen[inet].startswith("open HTTP/1."), (node, seen)
        for host, port in forbidden:
            assert not seen[f"{host}:{port}"].startswith("open"), (node, host, port, seen)
        # a port, served through the API's proxy from whichever client it is on
        serving = sb.start(["python3", "-m", "http.server", "8000"])
        url = f"{server.url}/proxy/{sid}/note.txt"
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    assert resp.read() == f"on {node}".encode()
                    break
            except OSError:
                assert time.monotonic() < deadline, f"port 8000 of {sid} on {node} never answered"
                time.sleep(0.2)
        serving.cancel()
        # a disk checkpoint: taken, changed, restored
        cp = client.create_checkpoint(sid, "before")
        sb.write_files({"note.txt": b"changed"})
        client.restore_checkpoint(sid, cp.id)
        assert sb.read_bytes("note.txt") == f"on {node}".encode()
    # a snapshot taken on one client, used for sandboxes on the others
    first = next(iter(placed))
    snap = client.create_snapshot(first, name="cluster-snap")
    made = spread_sandboxes(server, cluster, {"snapshot": snap.snapshot_id})
    for sid, node in made.items():
        assert client.connect(sid).read_bytes("note.txt").startswith(b"on "), (sid, node)
    # an install layer (built on the API host, pulled by the client from the cluster's registry)
    installed = server.data("POST", "/sandbox", {"runtime": "base:latest", "dependencies": ["jq"]}, timeout=600)
    out = client.connect(installed["sandboxId"]).execute(["jq", "-n", "1+1"])
    assert out.exit_code == 0 and out.stdout == "2\n", out
    for sid in [*placed, *made, installed["sandboxId"]]:
        client.destroy(sid)


def _on(cluster: Cluster, server: Server, node: str) -> tuple[str, dict[str, str]]:
    placed = spread_sandboxes(server, cluster, {"runtime": "base:latest"})
    return next(s for s, n in placed.items() if n == node), placed


# A client's kill -9 and its network going down look alike to hutch (Nomad's heartbeat lapses,
# the node goes down, its allocations are lost): one run of ~25 s proves what both would. The
# partition is the harder case (the client runs on meanwhile and must stop what it held); a
# node agent's kill -9 has its own test (tests/system/test_node_chaos.py).
def test_a_lost_client_fails_its_sandboxes_naming_the_node_and_returns_nothing(server: Server, whole_cluster: Cluster) -> None:
    cluster = whole_cluster
    number, victim = 2, "hutch-c2"
    sid, placed = _on(cluster, server, victim)
    lost = [s for s, n in placed.items() if n == victim]
    kept = [s for s, n in placed.items() if n != victim]
    running = server.data("POST", f"/sandbox/{sid}/execute", {"command": ["sleep", "600"]})
    # The containers of the sandboxes on the victim (a leftover of another server is not ours).
    before = {f"sandbox-{a['ID']}" for s in lost for a in cluster.allocs_of(s) if a["NodeName"] == victim}
    assert before and before <= set(cluster.containers(number)), (before, cluster.containers(number))

    started = time.monotonic()
    cluster.act("link", str(number), "down")
    for s in lost:
        info = wait_status(server, s, ("failed",), NODE_LOSS_LIMIT - (time.monotonic() - started))
        assert victim in info.get("reason", ""), info
    took = time.monotonic() - started
    print(f"node loss (network down): sandboxes failed {took:.1f}s after the loss")
    # The execution ends with it (nothing hangs).
    ex = server.data("GET", f"/sandbox/execution/{running['executionId']}?wait=10s", timeout=20)
    assert ex["status"] not in ("running", "queued"), ex
    # The sandboxes elsewhere are untouched; new sandboxes land on the survivors.
    for s in kept:
        assert server.data("GET", f"/sandbox/{s}")["status"] in ("idle", "running"), s
        assert server.data("POST", f"/sandbox/{s}/execute", {"command": ["true"]})["executionId"]
    for _ in range(4):
        fresh = server.data("POST", "/sandbox", {"runtime": "base:latest"}, timeout=120)["sandboxId"]
        assert cluster.node_of(fresh) != victim

    # The client comes back: what it held is stopped, not resurrected.
    cluster.act("link", str(number), "up")
    cluster.wait_ready()
    deadline = time.monotonic() + 60
    while set(cluster.containers(number)) & before:
        assert time.monotonic() < deadline, f"client {number} still runs {set(cluster.containers(number)) & before}"
        time.sleep(0.5)
    def alive(s: str) -> list[str]:
        return [a["ID"] for a in cluster.allocs_of(s) if a["ClientStatus"] in ("running", "pending", "unknown")]

    while any(alive(s) for s in lost):  # the client reports its kills once it is back
        assert time.monotonic() < deadline, {s: alive(s) for s in lost}
        time.sleep(0.5)
    for s in lost:
        assert server.data("GET", f"/sandbox/{s}")["status"] == "failed", s
        code, _ = server.call("POST", f"/sandbox/{s}/execute", {"command": ["true"]})
        assert code >= 400, s


def test_files_written_through_the_api_reach_each_client_intact(
    server: Server, cluster: Cluster, client: SyncSandboxClient
) -> None:
    """A larger file both ways over the alloc-exec path of each client."""
    payload = bytes(range(256)) * 4096  # 1 MiB
    placed = spread_sandboxes(server, cluster, {"runtime": "base:latest"})
    for sid in placed:
        sb = client.connect(sid)
        sb.write_files({"blob.bin": payload})
        assert sb.read_bytes("blob.bin") == payload
        out = sb.execute(["sh", "-c", "sha256sum blob.bin | cut -c1-16"])
        assert out.stdout == hashlib.sha256(payload).hexdigest()[:16] + "\n"
        client.destroy(sid)
