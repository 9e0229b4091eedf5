"""Where the CPU of a one-shot run goes, by process, on the whole machine.

    python bench/oneshot_cpu.py [--driver nomad] [--profile production[,embedded]] [--seconds 20]

Starts a real server (as bench/run.py does), measures the machine's idle load, then runs
one-shot `true` sandboxes at ``--concurrency`` for ``--seconds`` and waits ``--settle``
seconds more for their teardown, and divides the CPU time every process used in that window
(from /proc/stat, less the idle load) by the runs made. Long-lived processes are named by
group (the API server, the Nomad server and clients, containerd, the hutch plugin, Kafka,
PostgreSQL); what exited inside the window (runc, shims, logmon, short commands) is the
rest. The CPU seconds per run set the ceiling of runs a second on this machine: cores ÷ that.

``--profile production,embedded`` measures each profile in turn in one run and prints them side
by side. Beside the CPU it prints the server's own counts per run (GET /metrics: appends, log
writes, projector batches, PostgreSQL statements by pool and kind): those are the same on a busy
machine and an idle one, where whole-machine CPU is not (other work on the machine lands in the
"other" rows and the idle-load correction is only as good as the load is steady). The API
server's own CPU time and that of the PostgreSQL backends serving its database are read from
their own processes, so other load slows them but does not add to them; Kafka's broker and
PostgreSQL as a whole serve whatever else runs on the machine too.
Not a test: docs/benchmarks.md records the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.run import H, bench_server, busy_cpus, machine_busy, oneshot_once, throughput  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def group_of(pid: int, cmdline: str, comm: str, server_pid: int, backends: frozenset[int] = frozenset()) -> str:
    if pid == server_pid:
        return "hutch API server"
    if pid in backends:
        return "postgresql: this server's backends"
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


def per_process(server_pid: int, backends: frozenset[int] = frozenset()) -> dict[int, tuple[str, float]]:
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
        seen[int(entry.name)] = (group_of(int(entry.name), cmdline, comm, server_pid, backends), used)
    return seen


SAMPLE = re.compile(r"^(hutch_(?:eventlog|projector|store)_[a-z_]+)(\{[^}]*\})? (\d+)$")


async def scrape(s: aiohttp.ClientSession, url: str) -> Counter[str]:
    """The server's log-path counters (hutch.core.counters), one key per sample."""
    async with s.get(f"{url}/metrics", headers=H) as r:
        text = await r.text()
    out: Counter[str] = Counter()
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = int(m.group(3))
    return out


async def backend_pids(dsn: str | None) -> frozenset[int]:
    """The PostgreSQL backends connected to this server's own database (none: embedded)."""
    if not dsn:
        return frozenset()
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                "AND pid <> pg_backend_pid()")
    finally:
        await conn.close()
    return frozenset(r["pid"] for r in rows)


class Result:
    def __init__(self, profile: str, driver: str) -> None:
        self.profile, self.driver = profile, driver
        self.groups: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()
        self.runs = 0
        self.rate = self.busy = self.idle_load = 0.0

    def per_run(self, seconds: float) -> float:
        return seconds / self.runs * 1000


async def measure(args: argparse.Namespace, profile: str) -> Result:
    res = Result(profile, args.driver)
    async with bench_server(args.driver, profile, cluster=args.cluster) as server, aiohttp.ClientSession() as s:
        for _ in range(3):
            await oneshot_once(s, server.url, ["true"])
        await asyncio.sleep(args.settle)
        res.idle_load = busy_cpus(5)  # cores busy with nothing of ours

        assert server.proc is not None
        backends = await backend_pids(server.env.get("HUTCH_STORE"))
        before = per_process(server.proc.pid, backends)
        counted = await scrape(s, server.url)
        spy = None
        if args.py_spy:  # the API server's stacks for the window, collapsed (py-spy's "raw")
            out = Path(args.py_spy) / f"api-{profile}.txt"
            spy = await asyncio.create_subprocess_exec(
                "py-spy", "record", "-p", str(server.proc.pid), "-d", f"{args.seconds:g}", "-r", "100",
                "--nonblocking", "-f", "raw", "-o", str(out),
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        b0, t0 = machine_busy(), time.monotonic()
        res.rate, res.runs = await throughput(server.url, args.concurrency, args.seconds)
        await asyncio.sleep(args.settle)
        window = time.monotonic() - t0
        res.busy = machine_busy() - b0 - res.idle_load * window
        # Backends the server's pools opened within the window count too, all their CPU (a
        # server that sends more statements at once opens more: leaving them out favoured it).
        late = await backend_pids(server.env.get("HUTCH_STORE")) - backends
        after = per_process(server.proc.pid, backends | late)
        res.counts = await scrape(s, server.url)
        res.counts.subtract(counted)  # with one /metrics' own reads: a few statements, no events
        if spy is not None:
            await spy.wait()

    for pid, (group, used) in after.items():
        if pid in before and before[pid][0] == group:
            res.groups[group] += used - before[pid][1]
        elif pid in late:
            res.groups[group] += used
    return res


def report(res: Result, args: argparse.Namespace) -> None:
    named = sum(res.groups.values())
    where = " on the cluster" if args.cluster else ""
    print(f"\nhutch one-shot CPU: {res.profile} profile, {res.driver} driver{where}; {res.runs} one-shot `true` runs at "
          f"concurrency {args.concurrency} in {args.seconds:g}s ({res.rate:.1f}/s), {args.settle:g}s settle; "
          f"{os.cpu_count()} cpus; idle load before {res.idle_load:.2f} cpus")
    print("| processes | CPU ms per run | share |")
    print("|---|---|---|")
    for group, used in res.groups.most_common():
        if used > 0:
            print(f"| {group} | {res.per_run(used):.1f} | {used / res.busy:.0%} |")
    print(f"| exited within the window (runc, shims, logmon, sandboxes, …) | {res.per_run(res.busy - named):.1f} | "
          f"{(res.busy - named) / res.busy:.0%} |")
    print(f"| **all** | **{res.per_run(res.busy):.1f}** | 100% |")
    print(f"ceiling on {os.cpu_count()} cpus at that cost: {(os.cpu_count() or 1) / (res.busy / res.runs):.1f} runs/s")


def side_by_side(results: list[Result]) -> None:
    """The load-independent counts per run, and the processes' own CPU, profile by profile."""
    names = [r.profile for r in results]
    print(f"\n| per one-shot run | {' | '.join(names)} |")
    print(f"|---|{'---|' * len(names)}")
    print(f"| runs/s (machine-wide, load-dependent) | {' | '.join(f'{r.rate:.1f}' for r in results)} |")
    print(f"| CPU ms, all processes (load-dependent) | "
          f"{' | '.join(f'{r.per_run(r.busy):.1f}' for r in results)} |")
    for group in ("hutch API server", "postgresql: this server's backends"):
        print(f"| CPU ms, {group} (own process) | "
              f"{' | '.join(f'{r.per_run(r.groups[group]):.1f}' for r in results)} |")
    keys = sorted({k for r in results for k, v in r.counts.items() if v})
    for key in keys:
        print(f"| {key} | {' | '.join(f'{r.counts[key] / r.runs:.2f}' for r in results)} |")
    for r in results:
        writes, events = r.counts["hutch_eventlog_writes_total"], r.counts["hutch_eventlog_write_events_total"]
        batches, applied = r.counts["hutch_projector_batches_total"], r.counts["hutch_projector_events_total"]
        print(f"{r.profile}: {events / max(writes, 1):.2f} events per log write, "
              f"{applied / max(batches, 1):.2f} events per projector batch")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", choices=("local", "nomad", "node"), default="nomad")
    ap.add_argument("--profile", default="production",
                    help="embedded, production, or both comma-separated (measured in turn, printed side by side)")
    ap.add_argument("--cluster", action="store_true",
                    help="nomad or node driver on the three-client cluster (HUTCH_TEST_CLUSTER_*)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--settle", type=float, default=15, help="seconds after the runs for their teardown")
    ap.add_argument("--py-spy", metavar="DIR", help="record the API server's stacks in the window (py-spy on PATH)")
    args = ap.parse_args()
    profiles = [p.strip() for p in args.profile.split(",") if p.strip()]
    unknown = [p for p in profiles if p not in ("embedded", "production")]
    if not profiles or unknown:
        ap.error(f"--profile: {', '.join(unknown) or 'nothing'} is not embedded or production")
    if args.cluster and args.driver == "local":
        ap.error("--cluster: with --driver nomad or node")

    results = []
    for profile in profiles:
        results.append(await measure(args, profile))
        report(results[-1], args)
    side_by_side(results)


if __name__ == "__main__":
    asyncio.run(main())
