"""The node-agent path on the three-client cluster, phase by phase, side by side in one run.

    python bench/nodepath.py [--side LABEL=REV:PROFILE ...] [--n 30] [--op OP ...] [--idle N]
                             [--throughput 2x8] [--concurrency 16] [--py-spy DIR]

Each side is a source tree (REV: a commit, checked out as bench/compare.py does, or ``.``: this
tree as it is) and a profile (production: a fresh Kafka topic and PostgreSQL database;
embedded): three ``hutch node serve`` agents of that tree, one in each client's network
namespace of ``./scripts/services start cluster`` (hutch-c1..3, on their addresses, on a port of
their own beside the cluster's hutch-node job, which is left alone), and an API server of that
tree with ``HUTCH_DRIVER=node`` on them. Default sides: ``prod=.:production emb=.:embedded``,
which separates the log path's share (the profiles differ only there) from the node hop's.

Every server and agent runs with HUTCH_PHASES=1 (core/phases.py). In turns (A B, B A, ...,
so drift and other load hit every side alike), ``--n`` rounds of: the runtime's
`python3 -c pass` chrooted on the host (bare), then on every side an execute of it in a live
sandbox, an execute of `true` (bare `true` before it), create -> idle (its delete not timed)
and a one-shot (``--op``: only those, so that the spans are theirs alone; with ``--idle N``, after N idle sandboxes were made on each side, which stay
through the rounds). Then, with ``--throughput RxS``, R rounds of S seconds of one-shot `true` at
``--concurrency`` per side, in turns, with the CPU time each side's API server and agents
spent per one-shot (/proc/PID/stat; Kafka and PostgreSQL, shared by the sides, not counted).
Printed per side: client-side medians against bare, then each process group's spans: calls
per operation, p50 per call, mean per operation (spans nest: rows do not add up).
``node hop: …`` rows are the API's view of an agent call; ``agent: …`` rows the agents' own.

With ``--py-spy DIR``, the first side's API server and its agent on hutch-c1 are recorded
during the timed rounds (DIR/api.svg, DIR/agent.svg); py-spy slows what it samples, so that
run's figures are not ones to quote. Not a test: docs/node.md records the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.compare import checkouts, resolve  # noqa: E402
from bench.run import (  # noqa: E402
    PY_PASS,
    RUNTIME,
    H,
    bare_once,
    busy_cpus,
    create_once,
    drop_profile,
    execute_once,
    oneshot_once,
    profile_settings,
    runtime_rootfs,
    throughput,
)
from tests.system.server import Server  # noqa: E402

NODES = {"hutch-c1": "10.77.0.11", "hutch-c2": "10.77.0.12", "hutch-c3": "10.77.0.13"}
FIRST_PORT = 4761  # the cluster's own agents listen on 4750
RUNTIME_CACHE = os.environ.get("HUTCH_RUNTIME_CACHE", "/var/cache/hutch/runtimes")
TICK = os.sysconf("SC_CLK_TCK")
LATENCY = ("execute", "execute true", "create -> idle", "one-shot")
OPS = {"execute": "execute", "execute-true": "execute true", "create": "create -> idle", "oneshot": "one-shot"}


@dataclass
class Side:
    label: str
    rev: str
    profile: str
    root: Path = ROOT
    commit: str = "(this tree)"
    url: str = ""
    sandbox: str = ""
    server: Server | None = None
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    data: Path = ROOT
    samples: dict[str, list[float]] = field(default_factory=dict)
    cpu_ms_per_run: dict[str, list[float]] = field(default_factory=dict)
    rates: list[float] = field(default_factory=list)

    def pids(self) -> dict[str, list[int]]:
        assert self.server is not None and self.server.proc is not None
        return {"API server": [self.server.proc.pid], "agents": [p.pid for p in self.agents.values()]}


def missing_namespaces() -> list[str]:
    return [f"/run/netns/{n}" for n in NODES if not Path(f"/run/netns/{n}").exists()]


def parse_side(text: str) -> Side:
    label, eq, rest = text.partition("=")
    rev, colon, profile = rest.rpartition(":")
    if not eq or not colon or not label or not rev or profile not in ("production", "embedded"):
        raise argparse.ArgumentTypeError(f"--side {text!r}: LABEL=REV:PROFILE, PROFILE production or embedded")
    return Side(label, rev, profile)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its waited-for children (the agents' sandboxes' setup
    helpers are reaped by them)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / TICK


def start_agents(side: Side, port: int, secret: str) -> str:
    """Three agents of ``side``'s tree, one per client namespace; their HUTCH_NODE_AGENTS."""
    env = {**os.environ, "PYTHONPATH": str(side.root), "HUTCH_NODE_SECRET": secret, "HUTCH_PHASES": "1",
           "HUTCH_RUNTIME_CACHE": RUNTIME_CACHE, "HUTCH_LOG_LEVEL": "WARNING"}
    for name, address in NODES.items():
        argv = ["nsenter", f"--net=/run/netns/{name}", sys.executable, "-m", "hutch", "node", "serve",
                "--name", name, "--listen", f"{address}:{port}", "--data-dir", str(side.data / name)]
        side.agents[name] = subprocess.Popen(argv, cwd=side.root, env=env, stdout=subprocess.PIPE,
                                             stderr=subprocess.STDOUT)
    for name, proc in side.agents.items():
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if "listening" not in line:
            raise SystemExit(f"agent {name} of side {side.label} did not start: {line}{proc.stdout.read().decode()}")
        # Its log goes on being read: a full pipe would stop the agent.
        threading_relay(name, proc)
    return ",".join(f"{name}={address}:{port}" for name, address in NODES.items())


def threading_relay(name: str, proc: subprocess.Popen[bytes]) -> None:
    import threading

    def relay() -> None:
        assert proc.stdout is not None
        with contextlib.suppress(ValueError, OSError):
            for line in proc.stdout:
                print(f"[agent {name}] {line.decode()}", end="", file=sys.stderr)

    threading.Thread(target=relay, daemon=True).start()


def stop_agents(side: Side) -> None:
    for proc in side.agents.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in side.agents.values():
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # A stopped agent leaves its sandboxes running: end whatever is left (root, agent stopped).
    env = {**os.environ, "PYTHONPATH": str(side.root), "HUTCH_RUNTIME_CACHE": RUNTIME_CACHE}
    for name in side.agents:
        subprocess.run(["nsenter", f"--net=/run/netns/{name}", sys.executable, "-m", "hutch", "node", "reap",
                        "--data-dir", str(side.data / name)], cwd=side.root, env=env, check=False,
                       capture_output=True, timeout=120)


@contextlib.contextmanager
def trees(sides: list[Side]) -> Iterator[None]:
    revs = sorted({s.rev for s in sides if s.rev != "."})
    commits = {rev: resolve(rev) for rev in revs}
    with checkouts([commits[r][0] for r in revs]) as paths:
        where = dict(zip(revs, paths, strict=True))
        for side in sides:
            if side.rev != ".":
                side.root, side.commit = where[side.rev], f"{commits[side.rev][0][:10]} {commits[side.rev][1]}"
        yield


@contextlib.asynccontextmanager
async def running(sides: list[Side], tmp: Path) -> AsyncIterator[None]:
    """Every side's agents and server up before any sandbox is made: a node-driver server
    starting ends what the agents run that its log does not know."""
    settings: list[dict[str, str]] = []
    try:
        for i, side in enumerate(sides):
            secret = secrets.token_hex(32)
            side.data = tmp / side.label
            spec = start_agents(side, FIRST_PORT + i, secret)
            s = await profile_settings(side.profile)
            settings.append(s)
            env = {k: v for k, v in s.items() if k.startswith("HUTCH_")}
            side.server = Server(side.data / "api", driver="node", root=side.root, HUTCH_LOG_LEVEL="WARNING",
                                 HUTCH_PHASES="1", HUTCH_NODE_AGENTS=spec, HUTCH_NODE_SECRET=secret,
                                 HUTCH_NODE_SECRET_FILE="", **env)
            (side.data / "api").parent.mkdir(parents=True, exist_ok=True)
            side.server.start(timeout=300)
            side.url = side.server.url
        yield
    finally:
        for side in sides:
            if side.server is not None:
                with contextlib.suppress(Exception):
                    side.server.destroy_every_sandbox()
                side.server.stop()
            stop_agents(side)
        for s in settings:
            with contextlib.suppress(Exception):
                await drop_profile(s)


def in_turns(i: int, sides: list[Side]) -> list[Side]:
    return sides if i % 2 == 0 else sides[::-1]


async def idle(sides: list[Side], count: int) -> None:
    """``count`` idle sandboxes on each side, made 8 at a time, left for the teardown to end:
    a node that runs many answers creates and capacity reads as one that runs few should."""
    async with aiohttp.ClientSession() as s:
        for side in sides:
            left = count

            async def maker(side: Side = side) -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    # Small limits: placement counts limits (8x a node's cores in CPU), not use.
                    body = {"runtime": RUNTIME, "resources": {"cpu": "20m", "memory": "64Mi"}}
                    async with s.post(f"{side.url}/sandbox", json=body, headers=H) as r:
                        answer = await r.json()
                    if r.status >= 300:
                        raise SystemExit(f"side {side.label}: an idle sandbox's create answered {r.status}: {answer}")

            await asyncio.gather(*(maker() for _ in range(8)))


async def latency(sides: list[Side], n: int, bare: dict[str, list[float]], ops: tuple[str, ...]) -> None:
    rootfs = runtime_rootfs()
    async with aiohttp.ClientSession() as s:
        for side in sides:
            async with s.post(f"{side.url}/sandbox", json={"runtime": RUNTIME}, headers=H) as r:
                side.sandbox = (await r.json())["data"]["sandboxId"]
            for _ in range(3):  # warm every path timed: the first of each is not a figure
                if "execute" in ops:
                    await execute_once(s, side.url, side.sandbox, PY_PASS)
                if "execute true" in ops:
                    await execute_once(s, side.url, side.sandbox, ["true"])
                if "create -> idle" in ops:
                    await create_once(s, side.url)
                if "one-shot" in ops:
                    await oneshot_once(s, side.url, PY_PASS)
        for i in range(n):
            turn = in_turns(i, sides)
            if "execute" in ops:
                bare.setdefault("python3 -c pass", []).append(bare_once(rootfs))
                for side in turn:
                    side.samples.setdefault("execute", []).append(
                        await execute_once(s, side.url, side.sandbox, PY_PASS))
            if "execute true" in ops:
                bare.setdefault("true", []).append(bare_once(rootfs, ["true"]))
                for side in turn:
                    side.samples.setdefault("execute true", []).append(
                        await execute_once(s, side.url, side.sandbox, ["true"]))
            if "create -> idle" in ops:
                for side in turn:
                    side.samples.setdefault("create -> idle", []).append(await create_once(s, side.url))
            if "one-shot" in ops:
                if "execute" not in ops:
                    bare.setdefault("python3 -c pass", []).append(bare_once(rootfs))
                for side in turn:
                    side.samples.setdefault("one-shot", []).append(await oneshot_once(s, side.url, PY_PASS))
        for side in sides:
            async with s.delete(f"{side.url}/sandbox/{side.sandbox}", headers=H) as r:
                await r.read()


async def rates(sides: list[Side], rounds: int, seconds: float, concurrency: int) -> None:
    for i in range(rounds):
        for side in in_turns(i, sides):
            pids = side.pids()
            before = {group: sum(cpu_seconds(p) for p in ps) for group, ps in pids.items()}
            rate, done = await throughput(side.url, concurrency, seconds)
            side.rates.append(rate)
            for group, ps in pids.items():
                spent = sum(cpu_seconds(p) for p in ps) - before[group]
                side.cpu_ms_per_run.setdefault(group, []).append(spent * 1000 / max(done, 1))


def p90(samples: list[float]) -> float:
    return sorted(samples)[int(len(samples) * 0.9) - 1] if len(samples) >= 10 else max(samples)


def span_table(spans: dict[str, list[float]], ops: int) -> list[str]:
    rows = ["| span | calls per op | p50 ms per call | mean ms per op |", "|---|---|---|---|"]
    for name in sorted(spans):
        took = spans[name]
        rows.append(f"| {name} | {len(took) / ops:.2f} | {statistics.median(took):.3f} | {sum(took) / ops:.3f} |")
    return rows


def spans_of(side: Side) -> dict[str, list[float]]:
    """The API server's and its agents' spans, merged (they are named apart)."""
    merged: dict[str, list[float]] = {}
    files = [side.data / "api" / "phases.json", *(side.data / name / "phases.json" for name in side.agents)]
    for path in files:
        if path.is_file():
            for name, took in json.loads(path.read_text()).items():
                merged.setdefault(name, []).extend(took)
    return merged


@contextlib.asynccontextmanager
async def spied(side: Side, out: Path | None) -> AsyncIterator[None]:
    if out is None:
        yield
        return
    os.makedirs(out, exist_ok=True)
    assert side.server is not None and side.server.proc is not None
    targets = {"api": side.server.proc.pid, "agent": side.agents["hutch-c1"].pid}
    # The agent's pid is nsenter's until it execs python: the same pid once it has.
    spies = [await asyncio.create_subprocess_exec(
        "py-spy", "record", "--pid", str(pid), "--rate", "500", "--format", "flamegraph", "--output",
        str(out / f"{what}.svg"), "--nonblocking", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for what, pid in targets.items()]
    await asyncio.sleep(1)
    try:
        yield
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
            _, err = await asyncio.wait_for(spy.communicate(), 60)
            if spy.returncode != 0:
                print(f"py-spy failed ({spy.returncode}): {err.decode()[-2000:]}", file=sys.stderr)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--side", action="append", type=parse_side, metavar="LABEL=REV:PROFILE",
                    help="repeatable; default: prod=.:production emb=.:embedded")
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--throughput", default="", metavar="RxS", help="R rounds of S seconds per side (e.g. 2x8)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--op", action="append", choices=OPS,
                    help="repeatable; default: all four (one alone: its spans are its own)")
    ap.add_argument("--idle", type=int, default=0, metavar="N",
                    help="N idle sandboxes per side, spread over its agents, before the timed rounds")
    ap.add_argument("--py-spy", type=Path, metavar="DIR")
    args = ap.parse_args()
    sides: list[Side] = args.side or [parse_side("prod=.:production"), parse_side("emb=.:embedded")]
    if len({s.label for s in sides}) != len(sides):
        ap.error("--side: each LABEL once")
    if args.n < 1:
        ap.error("--n must be at least 1")
    rounds, seconds = 0, 0.0
    if args.throughput:
        r, _, s = args.throughput.partition("x")
        try:
            rounds, seconds = int(r), float(s)
        except ValueError:
            ap.error(f"--throughput {args.throughput!r}: RxS, e.g. 2x8")
    if missing := missing_namespaces():
        raise SystemExit(f"no cluster namespaces ({', '.join(missing)}): ./scripts/services start cluster")

    ops = tuple(OPS[o] for o in dict.fromkeys(args.op or OPS))
    bare: dict[str, list[float]] = {}
    load_before = os.getloadavg()
    with trees(sides), tempfile.TemporaryDirectory(prefix="hutch-nodepath-") as tmp:
        async with running(sides, Path(tmp)):
            if args.idle:
                await idle(sides, args.idle)
            noise = busy_cpus()
            async with spied(sides[0], args.py_spy):
                await latency(sides, args.n, bare, ops)
                if rounds:
                    await rates(sides, rounds, seconds, args.concurrency)
        spans = {side.label: spans_of(side) for side in sides}
    load_after = os.getloadavg()

    print(f"hutch nodepath: node driver, three agents per side in the cluster's client namespaces, runtime "
          f"{RUNTIME}, {os.cpu_count()} cpus, n={args.n} per row per side, in turns; other load before: "
          f"{noise:.2f} cpus busy; {args.idle} idle sandboxes per side; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
          f"{' (under py-spy: figures not to quote)' if args.py_spy else ''}")
    for side in sides:
        print(f"{side.label} = {side.profile} profile, {side.commit}")
    b_py, b_true = (statistics.median(bare.get(k) or [0.0]) for k in ("python3 -c pass", "true"))
    print(f"\nbare: python3 -c pass {b_py:.1f} ms p50, true {b_true:.1f} ms p50\n")
    print("| figure | " + " | ".join(f"{s.label} p50 | {s.label} p90 | {s.label} over bare" for s in sides) + " |")
    print("|---|" + "---|---|---|" * len(sides))
    for fig in ops:
        base = b_true if fig == "execute true" else b_py if fig in ("execute", "one-shot") else 0.0
        cells = []
        for s in sides:
            med = statistics.median(s.samples[fig])
            cells.append(f"{med:.1f} | {p90(s.samples[fig]):.1f} | {f'{med - base:+.1f}' if base else ''}")
        print(f"| {fig} | " + " | ".join(cells) + " |")
    if rounds:
        cells = [f"{statistics.median(s.rates):.1f} runs/s | {', '.join(f'{r:.1f}' for r in s.rates)} | "
                 for s in sides]
        print(f"| one-shot `true`, {args.concurrency} concurrent | " + " | ".join(cells) + " |")
        for group in ("API server", "agents"):
            cells = [f"{statistics.median(s.cpu_ms_per_run[group]):.1f} | "
                     f"{', '.join(f'{v:.1f}' for v in s.cpu_ms_per_run[group])} | " for s in sides]
            print(f"| CPU ms per one-shot, {group} | " + " | ".join(cells) + " |")
    rounds_done = args.n + 3  # warm-ups included: the spans count them too
    for side in sides:
        print(f"\n{side.label}: spans over {rounds_done} rounds of ({', '.join(ops)})"
              f"{' and the throughput rounds' if rounds else ''}, per round:")
        print("\n".join(span_table(spans[side.label], rounds_done)))


if __name__ == "__main__":
    asyncio.run(main())
