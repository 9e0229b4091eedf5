"""What one idle sandbox costs in memory: kernel objects, its processes, the server's share.

    python bench/idle_memory.py [--n 200] [--concurrency 8] [--settle 3] [--root CHECKOUT]

Starts a real server (local driver, embedded profile), reads the machine's memory, waits
``--settle`` seconds and reads it again (the drift other work causes meanwhile: the noise
floor), makes ``--n`` idle sandboxes, waits ``--settle`` seconds, reads it a third time, and
prints per sandbox the difference: /proc/meminfo (what the whole host gave), the kernel's slab
caches by object type (/proc/slabinfo: which kernel objects a sandbox is made of), the
processes in the server's memory cgroups (each sandbox's pid 1: Rss, Pss, private), the
cgroups' own memory.stat and kmem counters, the mounts and superblocks of a sandbox, the
host's memory cgroups (live and dying), what one new memory cgroup costs the kernel on this host
(its shrinker map: one kmalloc-1k object per 64 memcg-aware shrinkers, i.e. superblocks, the host
ever held at once; docs/idle.md), what one write of a cpu quota costs with none and with N
sandboxes alive (the kernel walks every cpu cgroup at each), and the server process's own Rss
and Pss. ``--root``: the server of another checkout (e.g. main's worktree), for a before/after. Then destroys them all and says what was left. On a
machine shared with other work the host-wide rows move with it: compare them with the
noise floor printed beside them. Not a test: docs/benchmarks.md records the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.run import RUNTIME, H  # noqa: E402
from tests.system.server import Server  # noqa: E402

MEMINFO = ("MemAvailable", "MemFree", "Slab", "SUnreclaim", "SReclaimable", "KernelStack", "PageTables",
           "Shmem", "Cached", "Buffers", "AnonPages")
MEMCG = Path("/sys/fs/cgroup/memory/hutch")
CPUCG = Path("/sys/fs/cgroup/cpu/hutch")
# Where each sandbox's processes are listed: an idle sandbox has no memory cgroup of its own
# (made at its first command; its pid 1 is charged to the instance's), but a freezer one.
FREEZERCG = Path("/sys/fs/cgroup/freezer/hutch")


def meminfo() -> dict[str, int]:
    """/proc/meminfo's rows, in bytes."""
    found = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        found[name] = int(rest.split()[0]) * 1024
    return found


def slabs() -> dict[str, tuple[int, int]]:
    """Each slab cache's (objects in use, their bytes): active objects, not the slabs' capacity,
    which grows in whole slabs and says little at a small N."""
    found = {}
    for line in Path("/proc/slabinfo").read_text().splitlines()[2:]:
        f = line.split()
        found[f[0]] = (int(f[1]), int(f[1]) * int(f[3]))  # active_objs, objsize
    return found


def rollup(pid: int | str) -> dict[str, int]:
    found = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            name, _, rest = line.partition(":")
            found[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        return {}
    return found


def cgroup_pids(instance: str) -> dict[str, list[int]]:
    """The processes in each sandbox's freezer cgroup (and its leaves) of this server."""
    found: dict[str, list[int]] = {}
    for cg in (FREEZERCG / instance).glob("*/**/cgroup.procs"):
        sandbox = cg.relative_to(FREEZERCG / instance).parts[0]
        found.setdefault(sandbox, []).extend(int(p) for p in cg.read_text().split())
    return found


TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """A process's own CPU time and that of its children it waited for (the server's
    launchers), user + system, in seconds: what a create costs in CPU, which the other work on
    a shared machine moves far less than it moves a rate."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    return (int(f[11]) + int(f[12])) / TICK, (int(f[13]) + int(f[14])) / TICK


def run_seconds(pid: int) -> float:
    """CPU time of every thread of a process, from the scheduler's own clock (schedstat, in ns):
    exact for a process that ran a few milliseconds, where /proc/PID/stat's ticks read 0."""
    total = 0
    for task in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, ValueError):
            total += int(task.read_text().split()[0])
    return total / 1e9


def mount_count(pid: int) -> int:
    return len(Path(f"/proc/{pid}/mountinfo").read_text().splitlines())


def superblocks(pid: int) -> int:
    """The superblocks a sandbox made: its mounts' distinct devices (a bind mount shares its
    source's), plus its IPC namespace's internal mqueue mount, which no mount table shows."""
    return len({line.split()[2] for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()}) + 1


def memory_cgroups() -> int:
    """The host's memory cgroups, dying ones included (/proc/cgroups counts both)."""
    for line in Path("/proc/cgroups").read_text().splitlines():
        f = line.split()
        if f[0] == "memory":
            return int(f[2])
    raise RuntimeError("no memory controller in /proc/cgroups")


def memcg_cost(instance: str, k: int = 20) -> float:
    """kmalloc-1k objects one new memory cgroup costs on this host: its shrinker map, one
    object per 64 ids of the most memcg-aware shrinkers the host ever held at once (the
    kernel never lowers that mark). Made and removed in the instance's own subtree. Reads
    low while other memory cgroups on the host are being freed (their maps go meanwhile):
    the per-sandbox kmalloc-1k row is the firmer figure."""
    probe = MEMCG / instance / "probe-shrinker-map"
    probe.mkdir()
    try:
        before = slabs()["kmalloc-1k"][0]
        for i in range(k):
            (probe / str(i)).mkdir()
        after = slabs()["kmalloc-1k"][0]
    finally:
        for i in range(k):
            with contextlib.suppress(FileNotFoundError):
                (probe / str(i)).rmdir()
        probe.rmdir()
    return (after - before) / k


def quota_write_us(instance: str, k: int = 200) -> float:
    """Median microseconds of one write of a cpu quota (``cpu.cfs_quota_us``), in a probe cgroup
    of the instance's own: the kernel checks every cpu cgroup on the host at each, so this is
    what a sandbox's limit costs with the sandboxes alive now (written at a create before
    docs/idle.md's 2026-11-29 evening section, before the first command since)."""
    probe = CPUCG / instance / "probe-quota-walk"
    probe.mkdir()
    took = []
    try:
        for i in range(k):
            t0 = time.perf_counter()
            (probe / "cpu.cfs_quota_us").write_text(str(50_000 + 1_000 * (i % 2)))
            took.append(time.perf_counter() - t0)
    finally:
        probe.rmdir()
    return sorted(took)[k // 2] * 1e6


def memcg(instance: str) -> dict[str, int]:
    base = MEMCG / instance
    stat = dict(line.split() for line in (base / "memory.stat").read_text().splitlines())
    return {"usage_in_bytes": int((base / "memory.usage_in_bytes").read_text()),
            "kmem.usage_in_bytes": int((base / "memory.kmem.usage_in_bytes").read_text()),
            **{k: int(stat[k]) for k in ("total_rss", "total_cache", "total_shmem", "total_mapped_file")}}


@dataclass
class Reading:
    meminfo: dict[str, int]
    slabs: dict[str, tuple[int, int]]
    server: dict[str, int]
    memcg: dict[str, int]
    memory_cgroups: int


def snapshot(server_pid: int, instance: str) -> Reading:
    return Reading(meminfo(), slabs(), rollup(server_pid), memcg(instance), memory_cgroups())


def fitting_memory(n: int) -> str:
    """The memory limit ``n`` sandboxes may each ask for on this host: the server's default
    (512Mi) where it fits, else the largest power-of-two MiB that does. A host takes limits of
    32 x its memory in all (core/capacity.py), 736Gi at 23Gi: 10,000 at 512Mi would be refused
    503 NO_CAPACITY past 1,472. An idle sandbox's limit costs nothing until it is used (its
    /dev tmpfs is sized to it, empty), so what a smaller one measures is the same."""
    total = meminfo()["MemTotal"]
    mib = 512
    while mib > 16 and n * (mib << 20) > total * 32:
        mib //= 2
    return f"{mib}Mi"


async def create_idle(url: str, n: int, concurrency: int, done_at: list[float] | None = None,
                      memory: str = "512Mi") -> list[str]:
    """``done_at``: filled with each create's finishing time (perf_counter), in order."""
    made: list[str] = []
    sem = asyncio.Semaphore(concurrency)
    body = {"runtime": RUNTIME, "resources": {"memory": memory}}

    async def one(s: aiohttp.ClientSession) -> None:
        async with sem, s.post(f"{url}/sandbox", json=body, headers=H) as r:
            data = (await r.json())["data"]
            assert data["status"] == "idle", data
            made.append(data["sandboxId"])
            if done_at is not None:
                done_at.append(time.perf_counter())

    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(one(s) for _ in range(n)))
    return made


async def destroy_all(url: str, ids: list[str], concurrency: int) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one(s: aiohttp.ClientSession, sid: str) -> None:
        async with sem, s.delete(f"{url}/sandbox/{sid}", headers=H) as r:
            await r.read()

    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(one(s, sid) for sid in ids))


async def responsiveness(url: str, ids: list[str]) -> dict[str, float]:
    """With every sandbox idle: a list's first and last page, and an execute (to its exit) in a
    sandbox chosen at random, in ms (issue 37: the server stays responsive at 10,000)."""
    took: dict[str, float] = {}
    async with aiohttp.ClientSession() as s:
        for name, query in (("list, first page", "limit=100"), ("list, last page", f"limit=100&offset={max(0, len(ids) - 100)}")):
            t0 = time.perf_counter()
            async with s.get(f"{url}/sandbox?{query}", headers=H) as r:
                assert r.status == 200, await r.text()
                await r.read()
            took[name] = (time.perf_counter() - t0) * 1000
        sid = random.choice(ids)
        t0 = time.perf_counter()
        async with s.post(f"{url}/sandbox/{sid}/execute", json={"command": ["true"]}, headers=H) as r:
            assert r.status == 200, await r.text()
            ex = (await r.json())["data"]["executionId"]
        async with s.get(f"{url}/sandbox/execution/{ex}?wait=30s", headers=H) as r:
            done = (await r.json())["data"]
            assert done["status"] == "completed" and done["exitCode"] == 0, done
        took["execute `true`, to its exit"] = (time.perf_counter() - t0) * 1000
    return took


def leftovers(instance: str, data: Path) -> dict[str, int]:
    """What destroy-all left: sandbox cgroups of this server, their processes, mounts under its
    data directory."""
    cgroups = [d for top in (MEMCG, FREEZERCG, CPUCG) if (top / instance).exists()
               for d in (top / instance).iterdir() if d.is_dir()]
    mounts = [ln for ln in Path("/proc/self/mountinfo").read_text().splitlines() if str(data.resolve()) in ln]
    return {"cgroups": len(cgroups), "processes": sum(len(p) for p in cgroup_pids(instance).values()),
            "mounts": len(mounts)}


def head(root: Path) -> str:
    return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False).stdout.strip()


def kib(n: float) -> str:
    return f"{n / 1024:+.1f}"


def rates(started: float, done_at: list[float], parts: int = 5) -> str:
    """Creates per second in each fifth of the run: whether creating slows as N grows."""
    out = []
    edges = [started] + [done_at[min(len(done_at) - 1, (len(done_at) * i) // parts - 1)] for i in range(1, parts + 1)]
    for i in range(parts):
        made = len(done_at) * (i + 1) // parts - len(done_at) * i // parts
        out.append(f"{made / max(edges[i + 1] - edges[i], 1e-9):.0f}")
    return "/".join(out)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose server runs (default: this one)")
    ap.add_argument("--phases", action="store_true",
                    help="run the server with HUTCH_PHASES=1 and print its spans (p50/p90 ms, whole run)")
    args = ap.parse_args()
    root = args.root.resolve()
    commit = head(root)  # now: the checkout may move on while the run lasts
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        # As many sandboxes as asked for (the host's default maximum is 4,000), each asking for
        # a memory limit that fits (fitting_memory).
        memory = fitting_memory(args.n)
        server = Server(data, driver="local", root=root, PYTHONPATH=str(root), HUTCH_LOG_LEVEL="WARNING",
                        HUTCH_WARM_POOL="0", HUTCH_PHASES="1" if args.phases else "0",
                        HUTCH_MAX_SANDBOXES=str(max(4000, args.n + 2))).start(timeout=300)
        assert server.proc is not None
        instance = hashlib.sha256(str(data.resolve()).encode()).hexdigest()[:12]
        ids: list[str] = []
        try:
            ids = await create_idle(server.url, 2, 2)  # the instance's cgroups exist; first-use costs paid
            await destroy_all(server.url, ids, 2)
            await asyncio.sleep(args.settle)
            before = snapshot(server.proc.pid, instance)
            await asyncio.sleep(args.settle)
            drift = snapshot(server.proc.pid, instance)
            map_cost = memcg_cost(instance)
            quota_before = quota_write_us(instance)
            done_at: list[float] = []
            cpu_before, client_before = cpu_seconds(server.proc.pid), time.process_time()
            run_before = run_seconds(server.proc.pid)
            started = time.perf_counter()
            ids = await create_idle(server.url, args.n, args.concurrency, done_at, memory)
            took = time.perf_counter() - started
            cpu_after, client_cpu = cpu_seconds(server.proc.pid), time.process_time() - client_before
            server_run = run_seconds(server.proc.pid) - run_before
            await asyncio.sleep(args.settle)
            after = snapshot(server.proc.pid, instance)
            quota_after = quota_write_us(instance)
            procs = cgroup_pids(instance)
            init_cpu = sum(run_seconds(pids[0]) for pids in procs.values() if pids)
            mounts = [mount_count(pids[0]) for pids in procs.values() if pids]
            blocks = [superblocks(pids[0]) for pids in procs.values() if pids]
            memcgs = sum(1 for d in (MEMCG / instance).rglob("*") if d.is_dir())
            cpucgs = sum(1 for d in (CPUCG / instance).rglob("*") if d.is_dir())  # task groups the walk visits
            roll = [rollup(p) for pids in procs.values() for p in pids]
            responsive = await responsiveness(server.url, ids)
            t0 = time.perf_counter()
            await destroy_all(server.url, ids, args.concurrency)
            destroyed_in = time.perf_counter() - t0
            ids = []
            await asyncio.sleep(args.settle)
            end = snapshot(server.proc.pid, instance)
            left = leftovers(instance, data)
        finally:
            if ids:
                await destroy_all(server.url, ids, args.concurrency)
            server.stop()
            spans = json.loads((data / "phases.json").read_text()) if args.phases else {}
    n = args.n
    load = [f"{x:.2f}" for x in os.getloadavg()]
    print(f"hutch idle memory: server of {root} ({commit or 'no git'}), local driver, embedded profile, runtime {RUNTIME}, "
          f"warm pool off; {n} idle sandboxes of {memory} memory "
          f"made in {took:.1f} s ({n / took:.0f}/s at {args.concurrency} concurrent; by fifths of the run "
          f"{rates(started, done_at)}/s); load average {' '.join(load)} at the end; figures per sandbox, KiB; "
          f"'noise' is the same reading's drift over {args.settle:g} s with no sandbox made")
    print("\n| /proc/meminfo | per sandbox | noise (whole, /n) | after destroy-all (whole, /n) |\n|---|---|---|---|")
    mb, md, ma, me = (x.meminfo for x in (before, drift, after, end))
    for k in MEMINFO:
        print(f"| {k} | {kib((ma[k] - mb[k]) / n)} | {kib((md[k] - mb[k]) / n)} | {kib((me[k] - mb[k]) / n)} |")
    print("\n| slab cache | objects per sandbox | KiB per sandbox |\n|---|---|---|")
    sb, sa = before.slabs, after.slabs
    grown = sorted(((sa[k][1] - sb.get(k, (0, 0))[1], k) for k in sa), reverse=True)
    for bytes_, k in grown[:20]:
        print(f"| {k} | {(sa[k][0] - sb.get(k, (0, 0))[0]) / n:+.1f} | {kib(bytes_ / n)} |")
    total_slab = sum(b for b, _ in grown)
    print(f"| (every cache) | | {kib(total_slab / n)} |")
    print(f"\nprocesses in the sandboxes' cgroups: {sum(len(p) for p in procs.values()) / n:.2f} per sandbox; "
          f"each sandbox's pid 1 and any other: Rss {kib(sum(r.get('Rss', 0) for r in roll) / n)}, "
          f"Pss {kib(sum(r.get('Pss', 0) for r in roll) / n)}, private "
          f"{kib(sum(r.get('Private_Clean', 0) + r.get('Private_Dirty', 0) for r in roll) / n)} KiB per sandbox")
    print(f"mounts in a sandbox's mount namespace: {min(mounts)} to {max(mounts)}; superblocks a sandbox made "
          f"(its mounts' devices and its IPC namespace's mqueue): {min(blocks)} to {max(blocks)}")
    print(f"memory cgroups: {memcgs / n:.2f} per sandbox in the instance's subtree; the host's (dying included) "
          f"{before.memory_cgroups} -> {after.memory_cgroups} -> {end.memory_cgroups} after destroy-all "
          f"({(end.memory_cgroups - before.memory_cgroups) / n:+.2f} per sandbox left); one new memory cgroup costs "
          f"{map_cost:.0f} kmalloc-1k objects on this host (its shrinker map: the host has held up to "
          f"~{map_cost * 64:.0f} memcg-aware shrinkers at once)")
    print(f"one write of a cpu quota (the kernel walks every cpu cgroup): {quota_before:.0f} us with no sandbox, "
          f"{quota_after:.0f} us with {n}; cpu cgroups (task groups) {cpucgs / n:.2f} per sandbox in the instance's subtree")
    cb, ca = before.memcg, after.memcg
    print("memory cgroups (the server's instance subtree), per sandbox: "
          + ", ".join(f"{k} {kib((ca[k] - cb[k]) / n)}" for k in ca))
    per = 1000 / n
    print(f"CPU a create, ms (user + system; /proc/PID/stat, {TICK} ticks a second): the server "
          f"{(cpu_after[0] - cpu_before[0]) * per:.2f} (by schedstat {server_run * per:.2f}), its launchers (hutch-nsexec, waited for) "
          f"{(cpu_after[1] - cpu_before[1]) * per:.2f}, each sandbox's pid 1 so far (its setup; schedstat) "
          f"{init_cpu * per:.2f}, this bench's client {client_cpu * per:.2f}")
    vb, va, ve = before.server, after.server, end.server
    print(f"with {n} idle: " + ", ".join(f"{k} {v:.0f} ms" for k, v in responsive.items())
          + f"; destroy-all took {destroyed_in:.1f} s ({n / destroyed_in:.0f}/s) and left {left}")
    print(f"server process: Rss {kib((va['Rss'] - vb['Rss']) / n)}, Pss {kib((va['Pss'] - vb['Pss']) / n)} KiB "
          f"per sandbox ({vb['Rss'] / 2**20:.1f} -> {va['Rss'] / 2**20:.1f} MiB; "
          f"{ve['Rss'] / 2**20:.1f} MiB after destroy-all)")
    if spans:
        print("\n| span (HUTCH_PHASES=1, the whole run: creates, list, execute, destroys) | count | p50 ms | p90 ms | "
              "sum s |\n|---|---|---|---|---|")
        for name, took in sorted(spans.items(), key=lambda kv: -sum(kv[1])):
            took = sorted(took)
            print(f"| {name} | {len(took)} | {took[len(took) // 2]:.3f} | {took[len(took) * 9 // 10]:.3f} | "
                  f"{sum(took) / 1000:.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
