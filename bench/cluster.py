"""The nomad driver on the three-client cluster beside the single dev agent (not a test).

    ./scripts/services start nomad && ./scripts/services start cluster
    python bench/cluster.py [-n 20] [--kills 5]

At the Driver interface (what the API's create waits for), side by side in one run:
- create -> idle, cold (python:3.13, image cached on every client; no pool): p50 and p99 on the
  dev agent (server and client on this host, loopback) and on the cluster (the API's host is
  not a client: every placement crosses the cluster network);
- placements per second: 24 creates at concurrency 8, and how the spread policy put them;
- create from a warm pool of 3 (base:latest), the pool refilled before each claim, and the
  first command sent right after it (the claimed allocation's exec agent already runs);
- node loss: kill -9 of a client's Nomad agent and containerd -> the driver's report that the
  sandbox failed, p50 over --kills kills (the client is revived between kills).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

# Run as a script, sys.path[0] is bench/, where nomad.py would shadow python-nomad.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from hutch.blobs.files import FileBlobStore  # noqa: E402
from hutch.drivers.base import ExecRequest, ProvisionRequest  # noqa: E402
from hutch.drivers.nomad.driver import NomadDriver  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEV = ("http://127.0.0.1:4646", "127.0.0.1:5000")
CLUSTER = ("http://10.77.0.1:4656", "10.77.0.1:5000")
CLUSTER_SH = ROOT / "scripts" / "services.d" / "cluster.sh"


def token_for(addr: str) -> str | None:
    """The ACL token of hutch on that Nomad (./scripts/services start prints them)."""
    return os.environ.get("HUTCH_TEST_CLUSTER_TOKEN" if addr == CLUSTER[0] else "HUTCH_NOMAD_TOKEN")


def nomad_get(addr: str, path: str) -> Any:
    token = token_for(addr)
    request = urllib.request.Request(addr + path, headers={"X-Nomad-Token": token} if token else {})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read())


def pct(samples: list[float], q: float) -> float:
    ms = sorted(s * 1000 for s in samples)
    return ms[min(len(ms) - 1, int(len(ms) * q))]


def nodes(addr: str) -> dict[str, str]:
    return {a["JobID"]: a["NodeName"] for a in nomad_get(addr, "/v1/allocations")
            if a["ClientStatus"] in ("pending", "running")}


async def driver_for(addr: str, registry: str, **kw: object) -> NomadDriver:
    data = Path(tempfile.mkdtemp(prefix="hutch-bench-cluster-"))
    d = NomadDriver(address=addr, data_dir=data, registry=registry, token=token_for(addr),
                    blobs=FileBlobStore(data), **kw)  # type: ignore[arg-type]
    await d.start()
    return d


async def cold(addr: str, registry: str, n: int) -> list[float]:
    d = await driver_for(addr, registry)
    try:
        # The image into every client first (three at once: the spread policy covers them all).
        await asyncio.gather(*(d.provision(ProvisionRequest(f"warmup-{i}", "python:3.13")) for i in range(3)))
        for i in range(3):
            await d.destroy(f"warmup-{i}")
        out = []
        for i in range(n):
            t = time.perf_counter()
            await d.provision(ProvisionRequest(f"cold-{i}", "python:3.13"))
            out.append(time.perf_counter() - t)
            await d.destroy(f"cold-{i}")
        return out
    finally:
        await d.close()


async def placements(addr: str, registry: str, count: int = 24, concurrency: int = 8) -> tuple[float, Counter[str]]:
    d = await driver_for(addr, registry)
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            await d.provision(ProvisionRequest(f"place-{i}", "base:latest"))

    try:
        t = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(count)))
        rate = count / (time.perf_counter() - t)
        where = nodes(addr)
        spread = Counter(node for job, node in where.items() if "place-" in job)
        for i in range(count):
            await d.destroy(f"place-{i}")
        return rate, spread
    finally:
        await d.close()


async def warm(addr: str, registry: str, n: int) -> tuple[list[float], list[float]]:
    """Creates claimed from a pool of 3, and the first command (`true`) sent right after each."""
    d = await driver_for(addr, registry, pool_sizes={"base:latest": 3})
    try:
        creates, firsts = [], []
        for i in range(n):
            while d.pool_metrics()["pools"]["base:latest"]["ready"] < 3:  # noqa: ASYNC110 (a counter)
                await asyncio.sleep(0.05)
            t = time.perf_counter()
            await d.provision(ProvisionRequest(f"warm-{i}", "base:latest"))
            creates.append(time.perf_counter() - t)
            t = time.perf_counter()
            result = await d.exec(ExecRequest(f"exe_warm{i}", f"warm-{i}", ["true"]), _Discard())
            firsts.append(time.perf_counter() - t)
            assert result.exit_code == 0, result
            await d.destroy(f"warm-{i}")
        return creates, firsts
    finally:
        await d.close()


class _Discard:
    def write(self, stream: str, data: bytes) -> None:
        pass


def cluster(*args: str) -> None:
    subprocess.run([str(CLUSTER_SH), *args], check=True, capture_output=True)


def ready(addr: str) -> int:
    return sum(1 for n in nomad_get(addr, "/v1/nodes") if n["Status"] == "ready")


async def node_loss(kills: int) -> list[float]:
    ended: dict[str, float] = {}

    async def listener(sid: str, reason: str, failed: bool) -> None:
        ended[sid] = time.perf_counter()

    data = Path(tempfile.mkdtemp(prefix="hutch-bench-loss-"))
    d = NomadDriver(address=CLUSTER[0], data_dir=data, registry=CLUSTER[1], token=token_for(CLUSTER[0]),
                    blobs=FileBlobStore(data))
    d.set_listener(listener)
    await d.start()
    out = []
    try:
        for k in range(kills):
            victim = 1 + k % 3
            sid = ""
            for i in range(12):  # until one lands on the victim
                sid = f"loss-{k}-{i}"
                await d.provision(ProvisionRequest(sid, "base:latest"))
                if any(job.endswith(sid) and node == f"hutch-c{victim}" for job, node in nodes(CLUSTER[0]).items()):
                    break
            t = time.perf_counter()
            cluster("kill", str(victim))
            while sid not in ended:  # the listener sets it
                await asyncio.sleep(0.05)
                assert time.perf_counter() - t < 120, "no failure reported"
            out.append(ended[sid] - t)
            cluster("revive", str(victim))
            while ready(CLUSTER[0]) < 3:  # noqa: ASYNC110
                await asyncio.sleep(0.2)
            for other in list(d._sandboxes):
                await d.destroy(other)
    finally:
        await d.close()
    return out


async def main(n: int, kills: int) -> None:
    rows = []
    for label, (addr, registry) in (("dev agent (1 host)", DEV), ("cluster (3 clients)", CLUSTER)):
        c = await cold(addr, registry, n)
        rows.append(f"| create -> idle, cold, {label} | {statistics.median(c) * 1000:.0f} | {pct(c, 0.99):.0f} | {n} |")
    for label, (addr, registry) in (("dev agent (1 host)", DEV), ("cluster (3 clients)", CLUSTER)):
        w, first = await warm(addr, registry, n)
        rows.append(f"| create -> idle, warm pool of 3, {label} | {statistics.median(w) * 1000:.1f} | "
                    f"{pct(w, 0.99):.1f} | {n} |")
        rows.append(f"| first command (`true`) right after that create, {label} | "
                    f"{statistics.median(first) * 1000:.1f} | {pct(first, 0.99):.1f} | {n} |")
    for label, (addr, registry) in (("dev agent (1 host)", DEV), ("cluster (3 clients)", CLUSTER)):
        rate, spread = await placements(addr, registry)
        rows.append(f"| placements/s, 24 creates at concurrency 8, {label} | {rate:.1f} | spread: "
                    f"{dict(sorted(spread.items()))} | 24 |")
    loss = await node_loss(kills)
    rows.append(f"| node loss: kill -9 -> sandbox failed (s) | {statistics.median(loss):.1f} | "
                f"max {max(loss):.1f} | {kills} |")
    print("| what | median ms (or as named) | p99 ms (or as named) | n |")
    print("|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=20)
    parser.add_argument("--kills", type=int, default=5)
    a = parser.parse_args()
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    asyncio.run(main(a.n, a.kills))
