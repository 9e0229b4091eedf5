"""Where the CPU of a one-shot run goes, by process, on the whole machine.

    python bench/oneshot_cpu.py [--driver nomad] [--profile production] [--seconds 20]

Starts a real server (as bench/run.py does), measures the machine's idle load, then runs
one-shot `true` sandboxes at ``--concurrency`` for ``--seconds`` and waits ``--settle``
seconds more for their teardown, and divides the CPU time every process used in that window
(from /proc/stat, less the idle load) by the runs made. Long-lived processes are named by
group (the API server, the Nomad server and clients, containerd, the hutch plugin, Kafka,
PostgreSQL); what exited inside the window (runc, shims, logmon, short commands) is the
rest. The CPU seconds per run set the ceiling of runs a second on this machine: cores ÷ that.
Not a test: docs/benchmarks.md records the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.run import bench_server, busy_cpus, machine_busy, oneshot_once, throughput  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def group_of(pid: int, cmdline: str, comm: str, server_pid: int) -> str:
    if pid == server_pid:
        return "hutch API server"
    if " node serve " in cmdline:
        return "hutch node agents"
    if "logmon" in cmdline:
        return "nomad logmon"
    if "nomad" in comm or cmdline.split(" ")[0].endswith("/nomad"):
        return "nomad server" if "/server" in cmdline else "nomad clients"
    if comm.startswith("containerd-shim"):
        return "containerd shims"
    if comm == "containerd":
        return "containerd"
    if comm.startswith("hutch-con"):
        return "hutch-containerd plugin"
    if comm == "java":
        return "kafka (java)"
    if comm.startswith("postgres"):
        return "postgresql"
    if comm == "registry":
        return "registry"
    return "kernel threads" if cmdline == "" else "other long-lived processes"


def per_process(server_pid: int) -> dict[int, tuple[str, float]]:
    """Each living process's group and CPU seconds, its own only (a child that exits
    inside the window falls in the rest)."""
    seen: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        rest = stat[stat.rindex(")") + 2:].split()
        used = (int(rest[11]) + int(rest[12])) / TICK  # utime, stime
        seen[int(entry.name)] = (group_of(int(entry.name), cmdline, comm, server_pid), used)
    return seen


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", choices=("local", "nomad", "node"), default="nomad")
    ap.add_argument("--profile", choices=("embedded", "production"), default="production")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--settle", type=float, default=15, help="seconds after the runs for their teardown")
    args = ap.parse_args()

    async with bench_server(args.driver, args.profile) as server:
        async with aiohttp.ClientSession() as s:
            for _ in range(3):
                await oneshot_once(s, server.url, ["true"])
        await asyncio.sleep(args.settle)
        idle_load = busy_cpus(5)  # cores busy with nothing of ours

        assert server.proc is not None
        before = per_process(server.proc.pid)
        b0, t0 = machine_busy(), time.monotonic()
        rate, runs = await throughput(server.url, args.concurrency, args.seconds)
        await asyncio.sleep(args.settle)
        window = time.monotonic() - t0
        busy = machine_busy() - b0 - idle_load * window
        after = per_process(server.proc.pid)

    groups: Counter[str] = Counter()
    for pid, (group, used) in after.items():
        if pid in before and before[pid][0] == group:
            groups[group] += used - before[pid][1]
    named = sum(groups.values())
    print(f"hutch one-shot CPU: {args.profile} profile, {args.driver} driver; {runs} one-shot `true` runs at "
          f"concurrency {args.concurrency} in {args.seconds:g}s ({rate:.1f}/s), {args.settle:g}s settle; "
          f"{os.cpu_count()} cpus; idle load before {idle_load:.2f} cpus")
    print("| processes | CPU ms per run | share |")
    print("|---|---|---|")
    for group, used in groups.most_common():
        if used > 0:
            print(f"| {group} | {used / runs * 1000:.1f} | {used / busy:.0%} |")
    print(f"| exited within the window (runc, shims, logmon, sandboxes, …) | {(busy - named) / runs * 1000:.1f} | "
          f"{(busy - named) / busy:.0%} |")
    print(f"| **all** | **{busy / runs * 1000:.1f}** | 100% |")
    print(f"ceiling on {os.cpu_count()} cpus at that cost: {(os.cpu_count() or 1) / (busy / runs):.1f} runs/s")


if __name__ == "__main__":
    asyncio.run(main())
