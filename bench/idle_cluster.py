"""Idle sandboxes across the cluster's three clients: what each costs the host, and whether
the cluster still answers and still executes (issue 35: 3,000 idle at <= 1.5 MiB each).

    python bench/idle_cluster.py [--n 300] [--concurrency 8] [--settle 5] [--profile production]
                                 [--cpu 10m] [--memory 64Mi]

Starts three ``hutch node serve`` agents of this tree, one in each client's network namespace
of ``./scripts/services start cluster`` (as bench/nodepath.py does, on ports of their own beside
the cluster's hutch-node job, which is left alone), and an API server with ``HUTCH_DRIVER=node``
on them (``--profile``: production, a fresh Kafka topic and PostgreSQL database; or embedded).
Reads the host's memory, waits ``--settle`` seconds and reads it again (the drift other work
causes: the noise floor), makes ``--n`` idle sandboxes through the API (python:3.13, with
``--cpu``/``--memory`` limits: placement counts limits against each node's capacity, 8x its
cores in CPU, so 1,000 a node need <= 16m each on 2 cores), reads it again and prints per
sandbox: /proc/meminfo (MemAvailable, SUnreclaim, ...), slab caches, each process group's own
memory (the API server, the three agents: Rss and Pss), the sandboxes' pid 1, the spread over
the clients (``GET /nodes``), creates per second by fifths, a list's latency and an execute's
(to its exit) in a probe sandbox on each client (1 CPU: an idle one's 10m would time its CPU
limit's throttling), with none idle and at N. Then destroys them all and looks on every client,
inside its network namespace, for what is left of them (tests/system/host_traces.py: processes,
cgroups, mounts, loop devices, network namespaces, veths, iptables chains). All three agents
share the one machine, so the host-wide rows are the cluster's. Not a test: docs/node.md records
the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.idle_memory import (  # noqa: E402
    MEMCG,
    MEMINFO,
    kib,
    memcg_cost,
    meminfo,
    memory_cgroups,
    rates,
    rollup,
    slabs,
)
from bench.nodepath import NODES, Side, cpu_seconds, missing_namespaces, parse_side, running  # noqa: E402
from bench.run import RUNTIME, H  # noqa: E402
from tests.system import host_traces  # noqa: E402


@dataclass
class Reading:
    meminfo: dict[str, int]
    slabs: dict[str, tuple[int, int]]
    groups: dict[str, dict[str, int]]  # process group -> summed smaps_rollup
    memory_cgroups: int
    cpu: dict[str, float]  # process group -> CPU seconds so far
    at: float


def groups(side: Side) -> dict[str, list[int]]:
    assert side.server is not None and side.server.proc is not None
    return {"API server": [side.server.proc.pid], **{f"agent {n}": [p.pid] for n, p in side.agents.items()}}


def snapshot(side: Side) -> Reading:
    summed: dict[str, dict[str, int]] = {}
    for group, pids in groups(side).items():
        acc: dict[str, int] = {}
        for pid in pids:
            for k, v in rollup(pid).items():
                acc[k] = acc.get(k, 0) + v
        summed[group] = acc
    cpu = {group: sum(cpu_seconds(p) for p in pids) for group, pids in groups(side).items()}
    return Reading(meminfo(), slabs(), summed, memory_cgroups(), cpu, time.monotonic())


def idle_cpu(a: Reading, b: Reading) -> dict[str, float]:
    """Each process group's CPU between two readings, ms per second: what idle sandboxes cost
    while nothing is asked of them (polls, timers)."""
    return {g: (b.cpu[g] - a.cpu[g]) * 1000 / (b.at - a.at) for g in a.cpu}


async def create_idle(url: str, n: int, concurrency: int, limits: dict[str, str], done_at: list[float]) -> list[str]:
    made: list[str] = []
    left = n

    async def worker(s: aiohttp.ClientSession) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            async with s.post(f"{url}/sandbox", json={"runtime": RUNTIME, **({"resources": limits} if limits else {})}, headers=H) as r:
                answer = await r.json()
            if r.status >= 300 or answer["data"]["status"] != "idle":
                raise SystemExit(f"create {len(made) + 1} of {n} answered {r.status}: {answer}")
            made.append(answer["data"]["sandboxId"])
            done_at.append(time.perf_counter())

    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(worker(s) for _ in range(concurrency)))
    return made


async def destroy_all(url: str, ids: list[str], concurrency: int) -> None:
    queue = list(ids)

    async def worker(s: aiohttp.ClientSession) -> None:
        while queue:
            sid = queue.pop()
            async with s.delete(f"{url}/sandbox/{sid}", headers=H) as r:
                if r.status >= 300 and r.status != 404:
                    raise SystemExit(f"destroy {sid} answered {r.status}: {await r.text()}")

    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(worker(s) for _ in range(concurrency)))


async def spread(url: str) -> dict[str, int]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/nodes", headers=H) as r:
        body = await r.json()
    if r.status != 200:
        raise SystemExit(f"GET /nodes answered {r.status}: {body}")
    return {n["name"]: n["sandboxes"] for n in body["data"]["nodes"]}


async def responsiveness(url: str, ids: list[str], probes: list[str]) -> dict[str, float]:
    """A list's first and last page, then an execute of `true` to its exit in a probe sandbox on
    each client (their nodes read with the administrator's key), in ms. Not in an idle one: its
    CPU limit of 10m is 1 ms of CPU per 100 ms period, and an execute that uses it up waits for
    the next period (94-206 ms for `true` at 10m against 8-27 at 1 CPU, local driver)."""
    took: dict[str, float] = {}
    async with aiohttp.ClientSession() as s:
        for name, query in (("list, first page", "limit=100"),
                            ("list, last page", f"limit=100&offset={max(0, len(ids) - 100)}")):
            t0 = time.perf_counter()
            async with s.get(f"{url}/sandbox?{query}", headers=H) as r:
                if r.status != 200:
                    raise SystemExit(f"list ({query}) answered {r.status}: {await r.text()}")
                await r.read()
            took[name] = (time.perf_counter() - t0) * 1000
        on: dict[str, str] = {}
        for sid in probes:
            async with s.get(f"{url}/sandbox/{sid}", headers=H) as r:
                node = (await r.json())["data"].get("node")
            if node is None:
                raise SystemExit(f"GET /sandbox/{sid} shows no node: is the bench's key the administrator's?")
            on.setdefault(node, sid)
        if len(on) != len(NODES):
            raise SystemExit(f"the probes landed on {sorted(on)}, not one on each of {sorted(NODES)}")
        # Twice each: a sandbox's first execute also makes its first execution cgroups.
        for node, turn in ((node, turn) for node in sorted(on) for turn in ("", " again")):
            t0 = time.perf_counter()
            async with s.post(f"{url}/sandbox/{on[node]}/execute", json={"command": ["true"]}, headers=H) as r:
                if r.status != 200:
                    raise SystemExit(f"execute on {node} answered {r.status}: {await r.text()}")
                ex = (await r.json())["data"]["executionId"]
            async with s.get(f"{url}/sandbox/execution/{ex}?wait=30s", headers=H) as r:
                done = (await r.json())["data"]
            if done["status"] != "completed" or done["exitCode"] != 0:
                raise SystemExit(f"execute of `true` on {node} ended {done}")
            took[f"execute `true` on {node}{turn}"] = (time.perf_counter() - t0) * 1000
    return took


def traces(data: Path) -> dict[str, host_traces.Look]:
    return {name: host_traces.look(data / name) for name in NODES}


# Run inside a client's network namespace: its veths and iptables chains are there.
_LEFT = """
import json, sys
from pathlib import Path
from tests.system import host_traces
seen = json.loads(sys.stdin.read())
before = host_traces.Look(set(seen["sandboxes"]), {tuple(p) for p in seen["processes"]}, set(seen["cgroups"]),
                          set(seen["netns"]), set(seen["uids"]), seen["at"])
print(json.dumps(host_traces.leftovers(Path(seen["dir"]), before)))
"""


def leftovers(data: Path, seen: dict[str, host_traces.Look]) -> dict[str, list[str]]:
    left = {}
    for name, look in seen.items():
        arg = {"dir": str(data / name), "sandboxes": sorted(look.sandboxes), "processes": sorted(look.processes),
               "cgroups": sorted(look.cgroups), "netns": sorted(look.netns), "uids": sorted(look.uids), "at": look.at}
        out = subprocess.run(["nsenter", f"--net=/run/netns/{name}", sys.executable, "-c", _LEFT],
                             input=json.dumps(arg), capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
        if out.returncode != 0:
            raise SystemExit(f"the leftover look on {name} failed: {out.stderr[-2000:]}")
        left[name] = json.loads(out.stdout)
    return left


def pid1s(data: Path) -> list[int]:
    """Each sandbox's processes on every client (its memory cgroups under its agent's instance)."""
    pids: list[int] = []
    for name in NODES:
        base = MEMCG / host_traces.instance(data / name)
        for procs in base.glob("*/**/cgroup.procs"):
            pids.extend(int(p) for p in procs.read_text().split())
    return pids


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--profile", choices=("production", "embedded"), default="production")
    ap.add_argument("--cpu", default="10m")
    ap.add_argument("--memory", default="64Mi")
    ap.add_argument("--warm-pool", type=int, default=0, metavar="K",
                    help="the agents' warm spares per runtime (default 0, as bench/idle_memory.py: a spare "
                         "would be counted as left over)")
    args = ap.parse_args()
    os.environ["HUTCH_WARM_POOL"] = str(args.warm_pool)  # the agents inherit it
    if args.n < len(NODES):
        ap.error(f"--n must be at least {len(NODES)}")
    if missing := missing_namespaces():
        raise SystemExit(f"no cluster namespaces ({', '.join(missing)}): ./scripts/services start cluster")
    limits = {"cpu": args.cpu, "memory": args.memory}
    side = parse_side(f"idle=.:{args.profile}")
    n = args.n
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="hutch-idle-cluster-") as tmp:
        async with running([side], Path(tmp)):
            url = side.url
            # Every agent's first sandbox paid (its instance cgroups, the runtime's pages).
            warm = await create_idle(url, 2 * len(NODES), len(NODES), limits, [])
            await destroy_all(url, warm, len(NODES))
            # One at a time with the default limits (1 CPU): each lands on the least committed
            # node, one on each; they stay through the run.
            probes = await create_idle(url, len(NODES), 1, {}, [])
            alone = await responsiveness(url, probes, probes)  # the same reads with none idle
            await asyncio.sleep(args.settle)
            before = snapshot(side)
            await asyncio.sleep(args.settle)
            drift = snapshot(side)
            map_cost = memcg_cost(host_traces.instance(side.data / "hutch-c1"))
            done_at: list[float] = []
            started = time.perf_counter()
            ids = await create_idle(url, n, args.concurrency, limits, done_at)
            took = time.perf_counter() - started
            settled = snapshot(side)
            await asyncio.sleep(args.settle)
            after = snapshot(side)
            placed = await spread(url)
            pids = pid1s(side.data)
            roll = [rollup(p) for p in pids]
            seen = traces(side.data)
            load_at_n = os.getloadavg()
            responsive = await responsiveness(url, ids, probes)
            t0 = time.perf_counter()
            await destroy_all(url, ids + probes, args.concurrency)
            destroyed_in = time.perf_counter() - t0
            await asyncio.sleep(args.settle)
            end = snapshot(side)
            left = leftovers(side.data, seen)
            placed_after = await spread(url)
    load_after = os.getloadavg()

    print(f"hutch idle cluster: node driver, three agents in the cluster's client namespaces, {args.profile} "
          f"profile, runtime {RUNTIME}, warm pool {args.warm_pool}, limits {args.cpu} cpu / {args.memory}; {n} idle sandboxes made in "
          f"{took:.1f} s ({n / took:.0f}/s at {args.concurrency} concurrent; by fifths {rates(started, done_at)}/s); "
          f"load average {load_before[0]:.2f} before, {load_at_n[0]:.2f} at N, {load_after[0]:.2f} at the end; "
          f"figures per sandbox, KiB; 'noise' is the drift over {args.settle:g} s with none made")
    print(f"spread: {', '.join(f'{k} {v}' for k, v in sorted(placed.items()))}; after destroy-all "
          f"{', '.join(f'{k} {v}' for k, v in sorted(placed_after.items()))}")
    print("\n| /proc/meminfo | per sandbox | noise (whole, /n) | after destroy-all (whole, /n) |\n|---|---|---|---|")
    mb, md, ma, me = (x.meminfo for x in (before, drift, after, end))
    for k in MEMINFO:
        print(f"| {k} | {kib((mb[k] - ma[k] if k == 'MemAvailable' else ma[k] - mb[k]) / n)}"
              f"{' (drop)' if k == 'MemAvailable' else ''} | {kib((md[k] - mb[k]) / n)} | {kib((me[k] - mb[k]) / n)} |")
    print("\n| slab cache | objects per sandbox | KiB per sandbox |\n|---|---|---|")
    sb, sa = before.slabs, after.slabs
    grown = sorted(((sa[k][1] - sb.get(k, (0, 0))[1], k) for k in sa), reverse=True)
    for bytes_, k in grown[:12]:
        print(f"| {k} | {(sa[k][0] - sb.get(k, (0, 0))[0]) / n:+.1f} | {kib(bytes_ / n)} |")
    print(f"| (every cache) | | {kib(sum(b for b, _ in grown) / n)} |")
    print("\n| process group | Rss before -> at N, MiB | Rss per sandbox | Pss per sandbox | after destroy-all, MiB |"
          "\n|---|---|---|---|---|")
    for group in before.groups:
        gb, ga, ge = before.groups[group], after.groups[group], end.groups[group]
        print(f"| {group} | {gb.get('Rss', 0) / 2**20:.1f} -> {ga.get('Rss', 0) / 2**20:.1f} | "
              f"{kib((ga.get('Rss', 0) - gb.get('Rss', 0)) / n)} | {kib((ga.get('Pss', 0) - gb.get('Pss', 0)) / n)} | "
              f"{ge.get('Rss', 0) / 2**20:.1f} |")
    cpu0, cpun = idle_cpu(before, drift), idle_cpu(settled, after)
    print(f"\nCPU while idle, ms a second, with none / with {n} idle sandboxes (over {args.settle:g} s each): "
          + ", ".join(f"{g} {cpu0[g]:.1f} / {cpun[g]:.1f}" for g in cpu0))
    print(f"\nthe sandboxes' processes: {len(pids) / n:.2f} per sandbox; Rss "
          f"{kib(sum(r.get('Rss', 0) for r in roll) / n)}, Pss {kib(sum(r.get('Pss', 0) for r in roll) / n)}, private "
          f"{kib(sum(r.get('Private_Clean', 0) + r.get('Private_Dirty', 0) for r in roll) / n)} KiB per sandbox")
    print(f"memory cgroups on the host (dying included): {before.memory_cgroups} -> {after.memory_cgroups} -> "
          f"{end.memory_cgroups} after destroy-all; one new memory cgroup costs {map_cost:.0f} kmalloc-1k objects "
          f"here (its shrinker map: the host has held ~{map_cost * 64:.0f} memcg-aware shrinkers at once)")
    print(f"with none idle (the {len(probes)} probes, 1 CPU each, alone): "
          + ", ".join(f"{k} {v:.0f} ms" for k, v in alone.items()))
    print(f"with {n} idle: " + ", ".join(f"{k} {v:.0f} ms" for k, v in responsive.items())
          + f"; destroy-all took {destroyed_in:.1f} s ({n / destroyed_in:.0f}/s)")
    for name, what in sorted(left.items()):
        print(f"left on {name}: {len(what)}" + (f": {what[:10]}" if what else " (processes, cgroups, mounts, loop "
                                                                     "devices, network namespaces, veths, iptables chains)"))


if __name__ == "__main__":
    asyncio.run(main())
