"""Soak: many concurrent clients doing mixed work for minutes against one embedded server.

    python bench/soak.py [--clients 200] [--minutes 10] [--warmup 60]

Starts a real `hutch serve` (embedded profile, local driver, a fresh data dir), then each
client loops: create a sandbox, execute a command, write a file and read it back, list the
directory, now and then snapshot it (and delete the snapshot), destroy. Reports per operation
the count, p50 and p99 and any non-2xx answer (5xx must be 0); the server's RSS and open file
descriptors at start, after a warm-up at full concurrency (``--warmup``, 60 s: the step from
idle to 200 clients is behind it) and at the end, both differences printed (RSS should stay
flat within 10 %), and a reading every 30 s; and what is left after the server stops: mounts
under the data dir, hutch cgroups, sandbox processes.
Not a test: docs/benchmarks.md records the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.system.server import KEY, Server  # noqa: E402

H = {"Authorization": f"Bearer {KEY}"}
RUNTIME = "base:latest"

latencies: dict[str, list[float]] = collections.defaultdict(list)
statuses: collections.Counter[tuple[str, int]] = collections.Counter()
failures: list[str] = []


async def call(s: aiohttp.ClientSession, op: str, method: str, url: str, **kw: object) -> dict | None:  # type: ignore[type-arg]
    t0 = time.perf_counter()
    try:
        async with s.request(method, url, headers=H, **kw) as r:  # type: ignore[arg-type]
            body = await r.json(content_type=None) if r.content_type == "application/json" else await r.read()
            statuses[(op, r.status)] += 1
            if r.status >= 300 and len(failures) < 50:
                failures.append(f"{op} {r.status} {str(body)[:200]}")
    except (TimeoutError, aiohttp.ClientError) as err:
        statuses[(op, 0)] += 1
        if len(failures) < 50:
            failures.append(f"{op} connection: {err!r}")
        return None
    latencies[op].append((time.perf_counter() - t0) * 1000)
    return body if isinstance(body, dict) else None


async def client(n: int, url: str, deadline: float) -> None:
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        i = 0
        while time.monotonic() < deadline:
            i += 1
            made = await call(s, "create", "POST", f"{url}/sandbox", json={"runtime": RUNTIME})
            if not made or not made.get("success"):
                await asyncio.sleep(1)
                continue
            sid = made["data"]["sandboxId"]
            ex = await call(s, "execute", "POST", f"{url}/sandbox/{sid}/execute",
                            json={"command": ["sh", "-c", f"echo client {n} round {i}"]})
            if ex and ex.get("success"):
                await call(s, "execution wait", "GET", f"{url}/sandbox/execution/{ex['data']['executionId']}?wait=60s")
            content = base64.b64encode(os.urandom(4096)).decode()
            await call(s, "write file", "POST", f"{url}/fs/{sid}", json={"files": [{"path": "f.txt", "content": content}]})
            await call(s, "read file", "GET", f"{url}/fs/{sid}?path=f.txt")
            await call(s, "list files", "GET", f"{url}/fs/list/{sid}")
            if i % 10 == n % 10:  # a snapshot now and then (and its deletion)
                snap = await call(s, "snapshot", "POST", f"{url}/sandbox/{sid}/snapshot", json={"name": f"soak-{n}-{i}"})
                if snap and snap.get("success"):
                    await call(s, "delete snapshot", "DELETE", f"{url}/sandbox/snapshots/{snap['data']['snapshotId']}")
            await call(s, "destroy", "DELETE", f"{url}/sandbox/{sid}")


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def leftovers(data: Path) -> dict[str, list[str]]:
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if line.split()[4].startswith(str(data))]
    # The local driver's cgroups of this server: hutch/<sha256(data dir)[:12]>/… in every hierarchy.
    instance = hashlib.sha256(str(data.resolve()).encode()).hexdigest()[:12]
    cgroups = subprocess.run(["find", "/sys/fs/cgroup", "-maxdepth", "4", "-path", f"*/hutch/{instance}*",
                              "-type", "d"], capture_output=True, text=True).stdout.split()
    procs = subprocess.run(["pgrep", "-af", str(data)], capture_output=True, text=True).stdout.splitlines()
    return {"mounts": mounts, "cgroups": cgroups, "processes": procs}


async def sample(pid: int, every_s: float, until: float, into: list[tuple[float, int, int]]) -> None:
    """RSS (KiB) and open fds every ``every_s`` seconds: the curve, not only its ends."""
    t0 = time.monotonic()
    while time.monotonic() < until:
        await asyncio.sleep(every_s)
        into.append((time.monotonic() - t0, rss_kb(pid), fds(pid)))


async def main(clients: int, minutes: float, warmup_s: float) -> None:
    with tempfile.TemporaryDirectory(prefix="hutch-soak-") as tmp:
        data = Path(tmp) / "data"
        server = Server(data, driver="local", HUTCH_LOG_LEVEL="WARNING").start(timeout=120)
        assert server.proc is not None
        pid = server.proc.pid
        curve: list[tuple[float, int, int]] = []
        try:
            rss_start, fd_start, load_start = rss_kb(pid), fds(pid), os.getloadavg()
            started = time.monotonic()
            end = started + warmup_s + minutes * 60
            sampler = asyncio.create_task(sample(pid, 30, end, curve))
            work = asyncio.gather(*(client(n, server.url, end) for n in range(clients)))
            await asyncio.sleep(warmup_s)  # all clients at work: the step from 0 to full load is behind
            rss_warm, fd_warm = rss_kb(pid), fds(pid)
            await work
            took = time.monotonic() - started
            sampler.cancel()
            await asyncio.sleep(5)  # background clean-up of the last destroys
            rss_end, fd_end, load_end = rss_kb(pid), fds(pid), os.getloadavg()
        finally:
            server.stop()
        left = leftovers(data)
    report(clients, took, warmup_s)

    def mib(kb: int) -> str:
        return f"{kb / 1024:.0f} MiB"

    def pct(a: int, b: int) -> str:
        return f"{(b - a) / max(a, 1) * 100:+.1f} %"

    print(f"server RSS raw: at start (idle) {mib(rss_start)}, at the end {mib(rss_end)} ({pct(rss_start, rss_end)})")
    print(f"server RSS after the {warmup_s:.0f} s warm-up at full concurrency {mib(rss_warm)}, at the end "
          f"{mib(rss_end)} ({pct(rss_warm, rss_end)})")
    print("RSS MiB / open fds every 30 s:", ", ".join(f"{t:.0f}s {r / 1024:.0f}/{f}" for t, r, f in curve))
    print(f"open fds: at start {fd_start}, after warm-up {fd_warm}, at the end {fd_end}")
    print(f"load average (1/5/15 min) at start {loads(load_start)}, at the end {loads(load_end)}")
    print(f"left after stop: {sum(len(v) for v in left.values())} ({ {k: v[:5] for k, v in left.items()} })")
    for line in failures[:20]:
        print("  ", line)


def loads(avg: tuple[float, float, float]) -> str:
    return " / ".join(f"{x:.2f}" for x in avg)


def report(clients: int, took: float, warmup_s: float) -> None:
    total = sum(statuses.values())
    errors5 = sum(n for (_, code), n in statuses.items() if code >= 500 or code == 0)
    sandboxes = sum(n for (op, code), n in statuses.items() if op == "create" and 200 <= code < 300)
    print(f"{clients} clients for {took / 60:.1f} min (the {warmup_s:.0f} s warm-up included): {total} requests "
          f"({total / took:.0f}/s), {sandboxes} sandboxes, 5xx or failed: {errors5}")
    print("| operation | count | p50 ms | p99 ms | non-2xx |")
    print("|---|---|---|---|---|")
    for op, samples in latencies.items():
        ms = sorted(samples)
        bad = sum(n for (o, code), n in statuses.items() if o == op and not 200 <= code < 300)
        print(f"| {op} | {len(ms)} | {statistics.median(ms):.0f} | {ms[min(len(ms) - 1, int(len(ms) * 0.99))]:.0f} | {bad} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Soak an embedded hutch server (local driver) with concurrent clients.")
    ap.add_argument("--clients", type=int, default=200, help="concurrent clients (default 200)")
    ap.add_argument("--minutes", type=float, default=10, help="minutes of work after the warm-up (default 10)")
    ap.add_argument("--warmup", type=float, default=60,
                    help="seconds at full concurrency before the second RSS reading (default 60)")
    a = ap.parse_args()
    asyncio.run(main(a.clients, a.minutes, a.warmup))
