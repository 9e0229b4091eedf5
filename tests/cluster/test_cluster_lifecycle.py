"""`./scripts/services stop cluster` leaves nothing behind, even with sandboxes running (with
networks, so CNI namespaces and mounts exist); `start` brings the same cluster back. Runs after
test_cluster.py (file order) and leaves the cluster started."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.cluster.conftest import CLIENTS, Cluster, spread_sandboxes
from tests.system.server import ROOT, Server

SERVICES = ROOT / "scripts" / "services"


def leftovers(alloc_ids: list[str]) -> dict[str, object]:
    def out(*cmd: str) -> str:
        return subprocess.run(cmd, capture_output=True, text=True).stdout

    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if "/services/cluster/" in line.split()[4] or line.split()[4].startswith("/run/hutch-cluster")]
    return {
        "processes": out("pgrep", "-af", "services/cluster/|hutch-cluster/").split("\n")[:-1],
        "netns": [n for n in out("ip", "netns", "list").split() if n.startswith("hutch-c") or n in alloc_ids],
        "links": [n for n in out("ip", "-o", "link").split() if n.startswith(("hutch-c", "hutch-cl0"))],
        "nat": [r for r in out("iptables", "-w", "-t", "nat", "-S").splitlines() if "HUTCH-CLUSTER" in r],
        "mounts": mounts,
        "cgroups": out("find", "/sys/fs/cgroup", "-maxdepth", "3", "-name", "hutch-c[0-9]").split(),
    }


def test_stop_leaves_nothing_and_start_brings_it_back(server: Server, cluster: Cluster) -> None:
    placed = spread_sandboxes(server, cluster, {"runtime": "base:latest", "network": {"enabled": True}})
    alloc_ids = [a["ID"] for sid in placed for a in cluster.allocs_of(sid)]
    assert any(Path(f"/run/netns/{a}").exists() for a in alloc_ids), "no CNI namespace to clean up"
    stop = subprocess.run([str(SERVICES), "stop", "cluster"], capture_output=True, text=True, timeout=300)
    try:
        assert stop.returncode == 0, stop.stderr
        left = leftovers(alloc_ids)
        assert not any(left.values()), left
        assert "not running" in subprocess.run([str(SERVICES), "status", "cluster"], capture_output=True,
                                               text=True).stderr
    finally:
        start = subprocess.run([str(SERVICES), "start", "cluster"], capture_output=True, text=True, timeout=600)
        assert start.returncode == 0, start.stderr
    assert f"HUTCH_NOMAD_ADDR={cluster.addr}" in start.stdout
    cluster.restarted(start.stdout)  # a new server: a new token for hutch
    cluster.wait_ready(frozenset(CLIENTS))
