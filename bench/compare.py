"""The same bench on two commits, in one interleaved run: did B cost speed?

    python bench/compare.py A B [--bench NAME ...] [-n 30] [--driver local] [--profiles PA,PB]

Checks A and B out (git worktrees under /dev/shm, removed after), starts a server from each
checkout side by side, and times both with bench/run.py's own samplers in turns (A B, B A,
A B, ...: the machine's drift and the other load hit both alike, and neither is always the
one that runs second). The client side (the samplers, the @agentuity/core client) is this
tree's for both: only the servers differ. Prints, per figure, each commit's median and p90,
B/A of the medians and of the p90s, and the median of the round-by-round ratios (steadier
when the machine's speed drifts during the run). A/A (the same commit twice) shows the noise.

Benches (``--bench``, repeatable; default execute oneshot client-run create):
  execute       POST /sandbox/{id}/execute `python3 -c pass` + long-poll, live sandbox (ms)
  execute-true  the same for `true` (ms)
  oneshot       a one-shot `python3 -c pass`: create + stream to EOF + result, raw HTTP (ms)
  client-run    SandboxClient.run() of the real @agentuity/core client (Node) (ms)
  create        create -> idle (ms)
  create-disk   create -> idle with a 1Gi disk limit (ms)
  create-execute  create -> idle, then at once execute `true` + long-poll (ms, the pair; the
                sandbox destroyed after, untimed): a client's first execute beside the pool's refill
  bare          the runtime's `python3 -c pass` chrooted on the host (ms): the baseline; with
                it, execute and oneshot are also printed less each side's bare median
  throughput    one-shot `true` runs/s, --concurrency clients, --rounds of --seconds each
  client-throughput  the same through the real @agentuity/core client's run() (Node,
                bench/client_rate.mjs): its requests as that client makes them
``--profiles production,embedded`` runs side A on the production profile (a fresh Kafka topic
and PostgreSQL database) and B on the embedded one (default: both embedded); with A = B = HEAD,
the two profiles of one tree side by side: what the production log path costs.
Not a test: no pass/fail, the ratios are for a person to read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.run import (  # noqa: E402
    KEY,
    PY_PASS,
    RUNTIME,
    H,
    bare_once,
    bench_server,
    busy_cpus,
    client_runs_by_url,
    create_once,
    execute_once,
    oneshot_once,
    runtime_rootfs,
    throughput,
)


@dataclass
class Side:
    name: str  # "A" or "B"
    commit: str
    subject: str
    url: str = ""
    sandbox: str = ""  # a live sandbox for the execute benches
    profile: str = "embedded"
    samples: dict[str, list[float]] = field(default_factory=dict)


Sampler = Callable[[aiohttp.ClientSession, Side], Awaitable[float]]

async def _bare(s: aiohttp.ClientSession, side: Side) -> float:
    return bare_once(runtime_rootfs())


async def _create_execute(s: aiohttp.ClientSession, side: Side) -> float:
    t0 = time.perf_counter()
    async with s.post(f"{side.url}/sandbox", json={"runtime": RUNTIME}, headers=H) as r:
        sid = (await r.json())["data"]["sandboxId"]
    await execute_once(s, side.url, sid, ["true"])
    took = (time.perf_counter() - t0) * 1000
    async with s.delete(f"{side.url}/sandbox/{sid}", headers=H) as r:
        await r.read()
    return took


LATENCY: dict[str, tuple[str, Sampler]] = {
    "bare": ("bare: the runtime's `python3 -c pass` chrooted on the host, ms", _bare),
    "execute": ("execute `python3 -c pass` in a live sandbox (HTTP), ms",
                lambda s, side: execute_once(s, side.url, side.sandbox, PY_PASS)),
    "execute-true": ("execute `true` in a live sandbox (HTTP), ms",
                     lambda s, side: execute_once(s, side.url, side.sandbox, ["true"])),
    "oneshot": ("one-shot run `python3 -c pass` (HTTP), ms", lambda s, side: oneshot_once(s, side.url, PY_PASS)),
    "create": ("create -> idle, ms", lambda s, side: create_once(s, side.url)),
    "create-disk": ("create -> idle, 1Gi disk limit, ms",
                    lambda s, side: create_once(s, side.url, resources={"disk": "1Gi"})),
    "create-execute": ("create -> idle, then execute `true` at once (HTTP), ms", _create_execute),
}
CLIENT_RUN = "one-shot run `python3 -c pass` (@agentuity/core client.run), ms"
BENCHES = (*LATENCY, "client-run", "throughput", "client-throughput")
DEFAULT = ("execute", "oneshot", "client-run", "create")


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout.strip()


def resolve(rev: str) -> tuple[str, str]:
    """``rev``'s full hash and subject; a clear error if it names no commit."""
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise SystemExit(f"compare: {rev!r} is not a commit of {ROOT}")
    commit = found.stdout.strip()
    return commit, git("log", "-1", "--format=%s", commit)


@contextlib.contextmanager
def checkouts(commits: list[str]) -> Iterator[list[Path]]:
    """Each commit in its own detached worktree on a tmpfs (cheap to write, gone on reboot),
    removed and unregistered after, whatever happened."""
    shm = Path("/dev/shm")
    top = Path(tempfile.mkdtemp(prefix="hutch-compare-", dir=shm if shm.is_dir() else None))
    made: list[Path] = []
    try:
        for i, commit in enumerate(commits):
            path = top / f"{'AB'[i]}-{commit[:10]}"
            git("worktree", "add", "--detach", "--quiet", str(path), commit)
            made.append(path)
        yield made
    finally:
        for path in made:
            with contextlib.suppress(subprocess.CalledProcessError):
                git("worktree", "remove", "--force", str(path))
        shutil.rmtree(top, ignore_errors=True)
        git("worktree", "prune")


def in_turns(round_: int, sides: list[Side]) -> list[Side]:
    return sides if round_ % 2 == 0 else sides[::-1]


async def latency(bench: str, n: int, sides: list[Side]) -> None:
    _, sample = LATENCY[bench]
    async with aiohttp.ClientSession() as s:
        for side in sides:  # warm both paths first: the first of each is not a figure
            await sample(s, side)
        for i in range(n):
            for side in in_turns(i, sides):
                side.samples.setdefault(bench, []).append(await sample(s, side))


async def rates(n_rounds: int, concurrency: int, seconds: float, sides: list[Side], *, client: bool = False) -> None:
    bench = "client-throughput" if client else "throughput"
    for i in range(n_rounds):
        for side in in_turns(i, sides):
            rate = client_rate(side.url, concurrency, seconds) if client else (await throughput(side.url, concurrency,
                                                                                               seconds))[0]
            side.samples.setdefault(bench, []).append(rate)


def client_rate(url: str, concurrency: int, seconds: float) -> float:
    """One round of bench/client_rate.mjs: the real client's one-shot `true` runs a second."""
    env = {**os.environ, "HUTCH_URL": url, "HUTCH_API_KEY": KEY}
    out = subprocess.run(["node", str(ROOT / "bench" / "client_rate.mjs"), str(concurrency), f"{seconds:g}", RUNTIME,
                          "true"], env=env, check=True, capture_output=True, text=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["rate"])


def p90(samples: list[float]) -> float:
    return sorted(samples)[int(len(samples) * 0.9) - 1] if len(samples) >= 10 else max(samples)


def row(label: str, a: list[float], b: list[float]) -> str:
    ma, mb = statistics.median(a), statistics.median(b)
    paired = statistics.median(y / x for x, y in zip(a, b, strict=True))
    return (f"| {label} | {ma:.1f} | {p90(a):.1f} | {mb:.1f} | {p90(b):.1f} | {mb / ma:.3f} | "
            f"{p90(b) / p90(a):.3f} | {paired:.3f} |")


@contextlib.asynccontextmanager
async def servers(driver: str, roots: list[Path], sides: list[Side], live_sandbox: bool) -> AsyncIterator[None]:
    async with contextlib.AsyncExitStack() as stack:
        for root, side in zip(roots, sides, strict=True):
            side.url = (await stack.enter_async_context(bench_server(driver, side.profile, root=root))).url
        if live_sandbox:
            async with aiohttp.ClientSession() as s:
                for side in sides:
                    async with s.post(f"{side.url}/sandbox", json={"runtime": RUNTIME}, headers=H) as r:
                        side.sandbox = (await r.json())["data"]["sandboxId"]
        try:
            yield
        finally:
            if live_sandbox:  # sandboxes outlive their server
                async with aiohttp.ClientSession() as s:
                    for side in sides:
                        async with s.delete(f"{side.url}/sandbox/{side.sandbox}", headers=H) as r:
                            await r.read()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", metavar="A", help="the commit to compare against (e.g. main)")
    ap.add_argument("b", metavar="B", help="the commit under test (e.g. HEAD)")
    ap.add_argument("--bench", action="append", choices=BENCHES,
                    help=f"repeatable; default: {' '.join(DEFAULT)}")
    ap.add_argument("-n", type=int, default=30, help="samples per side and latency bench")
    ap.add_argument("--driver", choices=("local", "nomad"), default="local")
    ap.add_argument("--concurrency", type=int, default=8, help="throughput: concurrent clients")
    ap.add_argument("--seconds", type=float, default=5, help="throughput: length of a round")
    ap.add_argument("--rounds", type=int, default=3, help="throughput: rounds per side")
    ap.add_argument("--profiles", default="embedded,embedded", metavar="PA,PB",
                    help="the profile of side A and of side B: embedded or production")
    args = ap.parse_args()
    if args.n < 1 or args.rounds < 1:
        ap.error("-n and --rounds must be at least 1")
    profiles = args.profiles.split(",")
    if len(profiles) != 2 or any(p not in ("embedded", "production") for p in profiles):
        ap.error(f"--profiles: two of embedded / production, comma-separated (e.g. production,embedded), "
                 f"not {args.profiles!r}")
    benches = list(dict.fromkeys(args.bench or DEFAULT))
    sides = [Side("A", *resolve(args.a), profile=profiles[0]), Side("B", *resolve(args.b), profile=profiles[1])]
    # Stopped (a timeout, ^C from a supervisor), it still stops both servers and removes the
    # checkouts: the cancel unwinds through the context managers below.
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)

    with checkouts([side.commit for side in sides]) as roots:
        async with servers(args.driver, roots, sides, live_sandbox=any(b.startswith("execute") for b in benches)):
            noise = busy_cpus()
            loadavg = " ".join(f"{x:.2f}" for x in os.getloadavg())
            for bench in benches:
                if bench in LATENCY:
                    await latency(bench, args.n, sides)
                elif bench == "client-run":
                    client_runs_by_url([side.url for side in sides], 1)  # warm: not a figure
                    by_url = client_runs_by_url([side.url for side in sides], args.n)
                    for side in sides:
                        side.samples[bench] = by_url[side.url]
                else:
                    await rates(args.rounds, args.concurrency, args.seconds, sides, client=bench == "client-throughput")

    a, b = sides
    which = f"{a.profile} profile" if a.profile == b.profile else f"{a.profile} (A) and {b.profile} (B) profiles"
    print(f"hutch compare: {which}, {args.driver} driver, runtime {RUNTIME}, {os.cpu_count()} cpus; "
          f"{args.n} samples per side and latency bench, {args.rounds} per side of throughput, in turns "
          f"(A B, B A, ...); other load before the run: {noise:.2f} cpus busy, load average {loadavg}")
    for side in sides:
        print(f"{side.name} = {side.commit[:10]} {side.subject}")
    print("| figure | A median | A p90 | B median | B p90 | B/A median | B/A p90 | B/A paired |")
    print("|---|---|---|---|---|---|---|---|")
    for bench in benches:
        if bench in LATENCY:
            label = LATENCY[bench][0]
        elif bench == "client-run":
            label = CLIENT_RUN
        else:
            through = " (@agentuity/core client.run)" if bench == "client-throughput" else ""
            label = (f"one-shot `true` runs/s{through}, {args.concurrency} concurrent, {args.seconds:g}s rounds "
                     "(higher is better)")
        print(row(label, a.samples[bench], b.samples[bench]))
    if "bare" in benches:
        print("| over bare (each side's median less its own bare median) | A | | B | | B - A | | |")
        for bench in benches:
            if bench in ("execute", "oneshot"):  # those of `python3 -c pass`, the bare command
                over = [statistics.median(side.samples[bench]) - statistics.median(side.samples["bare"])
                        for side in sides]
                print(f"| {LATENCY[bench][0]} | {over[0]:+.1f} | | {over[1]:+.1f} | | {over[1] - over[0]:+.1f} | | |")


if __name__ == "__main__":
    asyncio.run(main())
