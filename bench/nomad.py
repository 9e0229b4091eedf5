"""Benchmarks of the nomad driver against the real Nomad + containerd (not a test).

    ./scripts/services start nomad && python bench/nomad.py [-n 20]

Measures, at the Driver interface (what the API's create and execute wait for):
- create -> idle, cold: a Nomad job is registered, scheduled and its containerd task started
  (the runtime image is already in containerd, as after `services start nomad`);
- create -> idle from the warm pool: a claim of an idle allocation placed ahead of time;
- execute `true` in a live sandbox (alloc exec websocket -> plugin -> runc exec), and the
  same command run directly with `ctr task exec` on the same container as a baseline;
- destroy (returns once Nomad has the stop; the purge finishes in the background);
- execute through the sandbox's exec agent against its own alloc exec, side by side in one run
  (two sandboxes, one with its agent held off; samples alternate): ``python3 -c pass`` against
  the runtime's own python3 run on this host (bare python, chrooted into the runtime's tree),
  and ``true`` 8 at a time for a few seconds (runs/s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, sys.path[0] is bench/, where this file would shadow python-nomad.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from hutch.blobs.files import FileBlobStore  # noqa: E402
from hutch.drivers.base import ExecRequest, ProvisionRequest  # noqa: E402
from hutch.drivers.local import rootfs  # noqa: E402
from hutch.drivers.nomad.driver import NomadDriver  # noqa: E402

ADDR = os.environ.get("HUTCH_NOMAD_ADDR", "http://127.0.0.1:4646")
REGISTRY = os.environ.get("HUTCH_NOMAD_REGISTRY", "127.0.0.1:5000")


class Null:
    def write(self, stream: str, data: bytes) -> None:
        pass


def row(name: str, samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p90 = ms[min(len(ms) - 1, int(len(ms) * 0.9))]
    return f"| {name} | {statistics.median(ms):.1f} | {p90:.1f} | {len(ms)} |"


async def main(n: int) -> None:
    data = Path(tempfile.mkdtemp(prefix="hutch-bench-nomad-"))
    driver = NomadDriver(address=ADDR, data_dir=data, registry=REGISTRY, token=os.environ.get("HUTCH_NOMAD_TOKEN"),
                         pool_sizes={"base:latest": 3}, blobs=FileBlobStore(data))
    await driver.start()
    rows = []
    try:
        cold, warm, destroy = [], [], []
        # cold: a runtime without a pool
        for i in range(n):
            t = time.perf_counter()
            await driver.provision(ProvisionRequest(f"cold-{i}", "python:3.13"))
            cold.append(time.perf_counter() - t)
            t = time.perf_counter()
            await driver.destroy(f"cold-{i}")
            destroy.append(time.perf_counter() - t)
        for i in range(n):
            while driver.pool_metrics()["pools"]["base:latest"]["ready"] < 1:  # noqa: ASYNC110 (polling a counter)
                await asyncio.sleep(0.05)
            t = time.perf_counter()
            await driver.provision(ProvisionRequest(f"warm-{i}", "base:latest"))
            warm.append(time.perf_counter() - t)
            await driver.destroy(f"warm-{i}")
        rows += [row("create -> idle, cold (python:3.13, image cached)", cold),
                 row("create -> idle, warm pool claim (base:latest)", warm),
                 row("destroy", destroy)]

        await driver.provision(ProvisionRequest("exec", "base:latest"))
        alloc = driver._sandboxes["exec"].alloc_id
        via_nomad, via_ctr = [], []
        ctr = ["ctr", "--address", "/run/hutch-containerd/containerd.sock", "-n", "nomad",
               "tasks", "exec", "--user", "290000", "--exec-id"]
        for i in range(n):
            t = time.perf_counter()
            await driver.exec(ExecRequest(f"x{i}", "exec", ["true"]), Null())
            via_nomad.append(time.perf_counter() - t)
            t = time.perf_counter()
            await asyncio.to_thread(subprocess.run, [*ctr, f"b{i}", f"sandbox-{alloc}", "true"], check=True)
            via_ctr.append(time.perf_counter() - t)
        rows += [row("execute `true` (the driver's default path)", via_nomad),
                 row("baseline: `ctr task exec` of `true`, same container", via_ctr)]
        await driver.destroy("exec")
        rows += await agent_against_alloc(driver, n)
    finally:
        await driver.close()
    print("| what | median ms | p90 ms | n |")
    print("|---|---|---|---|")
    print("\n".join(rows))


async def agent_against_alloc(driver: NomadDriver, n: int) -> list[str]:
    """Execute through the exec agent and as alloc execs, side by side (medians)."""
    await driver.provision(ProvisionRequest("via-agent", "python:3.13"))
    await driver.provision(ProvisionRequest("via-alloc", "python:3.13"))
    await driver._agents.drop("via-alloc")
    await driver._agents.hold("via-alloc")  # its commands run as their own alloc execs
    while driver._agents.live("via-agent") is None:
        driver._agents.ensure(driver.running("via-agent"))
        await asyncio.sleep(0.05)
    # Bare: the runtime's own python3 (the tree its image is made from), chrooted on this host.
    tree = rootfs.built_rootfs("python:3.13", driver.runtime_cache)
    samples: dict[str, list[float]] = {"bare": [], "via-agent": [], "via-alloc": []}
    for i in range(n):
        t = time.perf_counter()
        await asyncio.to_thread(subprocess.run, ["chroot", str(tree), "python3", "-c", "pass"], check=True)
        samples["bare"].append(time.perf_counter() - t)
        for sid in ("via-agent", "via-alloc"):
            t = time.perf_counter()
            result = await driver.exec(ExecRequest(f"p{sid}{i}", sid, ["python3", "-c", "pass"]), Null())
            assert result.exit_code == 0
            samples[sid].append(time.perf_counter() - t)
    bare = statistics.median(samples["bare"])
    rows = [row("bare `python3 -c pass` (the runtime's tree, chrooted on this host)", samples["bare"])]
    for sid in ("via-agent", "via-alloc"):
        extra = (statistics.median(samples[sid]) - bare) * 1000
        rows.append(row(f"execute `python3 -c pass`, {sid[4:]} (+{extra:.1f} ms over bare)", samples[sid]))
    for sid in ("via-agent", "via-alloc"):
        rate = await throughput(driver, sid)
        rows.append(f"| `true` 8 at a time in one sandbox, {sid[4:]} | {rate:.1f} runs/s | | |")
    for sid in ("via-agent", "via-alloc"):
        await driver.destroy(sid)
    return rows


async def throughput(driver: NomadDriver, sid: str, seconds: float = 5.0) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(w: int) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await driver.exec(ExecRequest(f"t{sid}{w}-{done}", sid, ["true"]), Null())
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(8)))
    return done / (time.perf_counter() - started)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=20)
    asyncio.run(main(parser.parse_args().n))
