"""Side-by-side latency and throughput of the embedded profile, in one run.

    python bench/run.py [--n 40] [--concurrency 8] [--seconds 10]

Starts a real server on loopback (local driver and embedded profile unless ``--driver nomad``
/ ``--profile production`` say otherwise), then measures, interleaved where it
matters so machine noise hits every row alike:
  bare        the runtime's own python3 -c pass, chrooted on the host (the baseline)
  execute     POST /sandbox/{id}/execute + long-poll to completion, in a live sandbox; and
              the same for `true`, against the runtime's `true` chrooted on the host (a
              baseline of about 1 ms: what is left is hutch's own cost, without python's
              start-up, whose noise is larger than the difference on a busy machine)
  oneshot     POST /sandbox (oneshot) + stream to EOF + execution result, raw HTTP
  client run  SandboxClient.run() of the real @agentuity/core client (Node)
  create      POST /sandbox until idle (then DELETE, not timed); again with resources.disk
              (a 1Gi disk limit: its own loop-mounted file system, drivers/local/disks.py)
  throughput  oneshot `true` runs/s with N concurrent clients
Prints medians and p90s with the difference and ratio against bare, and the median of the
paired differences (each sample less the bare sample taken just before it: steadier when the
machine's speed drifts during the run). Not a test: no pass/fail, docs/benchmarks.md records the
figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.system.server import KEY, Server  # noqa: E402

RUNTIME = "python:3.13"
PY_PASS = ["python3", "-c", "pass"]
H = {"Authorization": f"Bearer {KEY}"}


def runtime_rootfs() -> Path:
    from hutch.core import runtimes
    from hutch.drivers.local.rootfs import default_cache, rootfs_path

    recipe = runtimes.find(RUNTIME)
    assert recipe is not None
    return rootfs_path(default_cache(), recipe)


def bare_once(rootfs: Path, cmd: list[str] = PY_PASS) -> float:
    """The same binary the sandbox runs, started on the host with no isolation (chroot
    only, so it finds its own libraries): the baseline every row is held to."""
    t0 = time.perf_counter()
    subprocess.run(["chroot", str(rootfs), *cmd], check=True)
    return (time.perf_counter() - t0) * 1000


async def execute_once(s: aiohttp.ClientSession, url: str, sid: str, cmd: list[str]) -> float:
    t0 = time.perf_counter()
    async with s.post(f"{url}/sandbox/{sid}/execute", json={"command": cmd}, headers=H) as r:
        eid = (await r.json())["data"]["executionId"]
    async with s.get(f"{url}/sandbox/execution/{eid}?wait=60s", headers=H) as r:
        data = (await r.json())["data"]
    assert data["status"] == "completed" and data["exitCode"] == 0, data
    return (time.perf_counter() - t0) * 1000


async def oneshot_once(s: aiohttp.ClientSession, url: str, cmd: list[str]) -> float:
    t0 = time.perf_counter()
    body = {"runtime": RUNTIME, "command": {"exec": cmd, "mode": "oneshot"}}
    async with s.post(f"{url}/sandbox", json=body, headers=H) as r:
        answer = await r.json()
    assert "data" in answer, f"POST /sandbox answered {r.status}: {answer}"  # the refusal, not a KeyError
    data = answer["data"]
    async with s.get(data["stdoutStreamUrl"]) as r:
        await r.read()
    async with s.get(f"{url}/sandbox/execution/{data['executionId']}?wait=60s", headers=H) as r:
        final = (await r.json())["data"]
    assert final["exitCode"] == 0, final
    return (time.perf_counter() - t0) * 1000


async def create_once(s: aiohttp.ClientSession, url: str, **extra: object) -> float:
    t0 = time.perf_counter()
    async with s.post(f"{url}/sandbox", json={"runtime": RUNTIME, **extra}, headers=H) as r:
        data = (await r.json())["data"]
    took = (time.perf_counter() - t0) * 1000
    assert data["status"] == "idle", data
    async with s.delete(f"{url}/sandbox/{data['sandboxId']}", headers=H) as r:
        await r.read()
    return took


async def throughput(url: str, concurrency: int, seconds: float) -> tuple[float, int]:
    deadline = time.perf_counter() + seconds
    done = 0

    async def worker(s: aiohttp.ClientSession) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await oneshot_once(s, url, ["true"])
            done += 1

    async with aiohttp.ClientSession() as s:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(s) for _ in range(concurrency)))
        return done / (time.perf_counter() - t0), done


def client_runs(url: str, n: int) -> list[float]:
    return client_runs_by_url([url], n)[url]


def client_runs_by_url(urls: list[str], n: int) -> dict[str, list[float]]:
    """``n`` runs on each server of ``urls``, in turns (bench/oneshot_client.mjs)."""
    script = ROOT / "bench" / "oneshot_client.mjs"
    env = {**os.environ, "HUTCH_URL": ",".join(urls), "HUTCH_API_KEY": KEY}
    out = subprocess.run(["node", str(script), str(n), RUNTIME, *PY_PASS], env=env, check=True,
                         capture_output=True, text=True)
    by_url: dict[str, list[float]] = json.loads(out.stdout.strip().splitlines()[-1])["by_url"]
    return by_url


def machine_busy() -> float:
    """CPU seconds every core has spent busy since boot (/proc/stat: user to steal, less idle
    and iowait; guest time is already counted in user)."""
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:9]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def busy_cpus(seconds: float = 2.0) -> float:
    """CPUs kept busy by everything else on the machine while we sit idle (noise)."""
    b0 = machine_busy()
    time.sleep(seconds)
    return (machine_busy() - b0) / seconds


def row(name: str, samples: list[float], bare: float, pairs: list[float] | None = None) -> str:
    """``pairs``: the bare samples taken just before each of ``samples`` (interleaved rows)."""
    med = statistics.median(samples)
    p90 = sorted(samples)[int(len(samples) * 0.9) - 1] if len(samples) >= 10 else max(samples)
    paired = f"{statistics.median(s - b for s, b in zip(samples, pairs, strict=True)):+.1f}" if pairs else ""
    return f"| {name} | {med:.1f} | {p90:.1f} | {med - bare:+.1f} | {paired} | {med / bare:.2f}x |"


async def profile_settings(profile: str) -> dict[str, str]:
    """The server's settings for ``profile``: none for the embedded one; a fresh topic and
    database for the production one, so runs never see each other's data."""
    if profile == "embedded":
        return {}
    from tests.services import fresh_database, kafka_url

    store, name = await fresh_database("bench_run")
    return {"HUTCH_EVENT_LOG": kafka_url("bench-run"), "HUTCH_STORE": store, "database": name}


async def drop_profile(settings: dict[str, str]) -> None:
    from tests.services import drop_database, drop_topics

    if "HUTCH_EVENT_LOG" in settings:
        await drop_topics(settings["HUTCH_EVENT_LOG"])
        await drop_database(settings["database"])


CLUSTER_SECRET = Path(os.environ.get("HUTCH_SERVICES_DIR", "/var/lib/hutch/services")) / "cluster/acl/node.secret"


def cluster_settings(driver: str) -> dict[str, str]:
    """The server's settings for the three-client cluster of ``./scripts/services start cluster``
    (its HUTCH_TEST_CLUSTER_* as /work/notes/svc.env and scripts/test export them): the nomad
    driver on its Nomad, or the node driver on the agents its hutch-node system job runs, found
    in Nomad's catalog."""
    need = {"addr": "HUTCH_TEST_CLUSTER_ADDR", "token": "HUTCH_TEST_CLUSTER_TOKEN",
            "registry": "HUTCH_TEST_CLUSTER_REGISTRY"}
    missing = [v for v in need.values() if not os.environ.get(v)]
    if missing:
        raise SystemExit(f"--cluster: {', '.join(missing)} not set: start the cluster with "
                         "./scripts/services start cluster and export its settings")
    env = {"HUTCH_NOMAD_ADDR": os.environ[need["addr"]], "HUTCH_NOMAD_TOKEN": os.environ[need["token"]],
           "HUTCH_NOMAD_REGISTRY": os.environ[need["registry"]]}
    if driver == "node":
        secret = Path(os.environ.get("HUTCH_TEST_CLUSTER_NODE_SECRET_FILE") or CLUSTER_SECRET)
        if not secret.is_file():
            raise SystemExit(f"--cluster: no node secret at {secret}: the cluster runs no node agents")
        env.update(HUTCH_NODE_SECRET_FILE=str(secret), HUTCH_NODE_AGENTS="", HUTCH_NODE_SECRET="")
    return env


@contextlib.asynccontextmanager
async def bench_server(driver: str, profile: str, root: Path = ROOT, *, cluster: bool = False) -> AsyncIterator[Server]:
    """A real server on loopback for one bench run, running the source tree ``root``; its log
    printed if the run fails, its topic and database (production profile) dropped after.
    ``cluster``: the nomad or node driver on the three-client cluster (cluster_settings)."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = await profile_settings(profile)
        env = {k: v for k, v in settings.items() if k.startswith("HUTCH_")}
        agents = None
        if cluster:
            env.update(cluster_settings(driver))
        elif driver == "node":  # two agents on this host (docs/node.md), as the tests run them
            from tests.drivers_support import NODE_SECRET, NodeAgents

            agents = NodeAgents(Path(tmp) / "nodes")
            env.update(HUTCH_NODE_AGENTS=agents.spec, HUTCH_NODE_SECRET=NODE_SECRET)
        server = Server(Path(tmp) / "data", driver=driver, root=root, HUTCH_LOG_LEVEL="WARNING", **env).start(timeout=300)
        try:
            yield server
        except BaseException:
            print(server.log.read_text()[-6000:], file=sys.stderr)
            raise
        finally:
            if agents is not None or cluster:  # an agent that stops leaves its sandboxes running
                with contextlib.suppress(Exception):
                    server.destroy_every_sandbox()
            server.stop()
            if agents is not None:
                agents.stop()
            await drop_profile(settings)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rounds", type=int, default=3, help="throughput rounds; the median is reported")
    ap.add_argument("--driver", choices=("local", "nomad", "node"), default="local",
                    help="nomad: the Nomad named by HUTCH_NOMAD_ADDR / HUTCH_NOMAD_REGISTRY (./scripts/services)")
    ap.add_argument("--cluster", action="store_true",
                    help="nomad or node driver on the three-client cluster (HUTCH_TEST_CLUSTER_*)")
    ap.add_argument("--profile", choices=("embedded", "production"), default="embedded",
                    help="production: a fresh Kafka topic and PostgreSQL database on the services of "
                         "./scripts/services start kafka postgres")
    args = ap.parse_args()

    if args.cluster and args.driver == "local":
        ap.error("--cluster: with --driver nomad or node")
    async with bench_server(args.driver, args.profile, cluster=args.cluster) as server:
        url = server.url
        bare, exe, one, create, create_disk = [], [], [], [], []
        bare_true, exe_true, bare_again = [], [], []
        rootfs = runtime_rootfs()
        noise = busy_cpus()
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{url}/sandbox", json={"runtime": RUNTIME}, headers=H) as r:
                sid = (await r.json())["data"]["sandboxId"]
            for _ in range(3):  # warm caches on every path
                bare_once(rootfs)
                await execute_once(s, url, sid, PY_PASS)
                await oneshot_once(s, url, PY_PASS)
            # Interleaved, so that noise hits every row alike; the executes apart from the
            # creates and one-shots, whose teardown (after each, untimed) would otherwise
            # land on whichever execute follows (on Nomad: 76 ms for `true` right after a
            # destroy, against 18 ms without).
            for _ in range(args.n):
                bare_true.append(bare_once(rootfs, ["true"]))
                exe_true.append(await execute_once(s, url, sid, ["true"]))
                bare.append(bare_once(rootfs))
                exe.append(await execute_once(s, url, sid, PY_PASS))
            for _ in range(args.n):
                bare_again.append(bare_once(rootfs))
                one.append(await oneshot_once(s, url, PY_PASS))
                create.append(await create_once(s, url))
                create_disk.append(await create_once(s, url, resources={"disk": "1Gi"}))
            async with s.delete(f"{url}/sandbox/{sid}", headers=H) as r:  # sandboxes outlive the server
                await r.read()
        client = client_runs(url, args.n)
        rates = [(await throughput(url, args.concurrency, args.seconds))[0] for _ in range(args.rounds)]

    b = statistics.median(bare)
    print(f"hutch bench: {args.profile} profile, {args.driver} driver{' on the cluster' if args.cluster else ''}; "
          f"n={args.n} per row, runtime {RUNTIME}, {os.cpu_count()} cpus, command `python3 -c pass`; "
          f"other load on the machine before the run: {noise:.2f} cpus busy")
    print("| what | median ms | p90 ms | vs bare | paired | ratio |")
    print("|---|---|---|---|---|---|")
    print(row("bare: the runtime's python3 -c pass, chroot on the host", bare, b))
    print(row("execute in a live sandbox (HTTP)", exe, b, bare))
    print(row("bare: the runtime's true, chroot on the host", bare_true, statistics.median(bare_true)))
    print(row("execute `true` in a live sandbox (HTTP), against bare true", exe_true, statistics.median(bare_true),
              bare_true))
    print(row("one-shot run (HTTP)", one, b, bare_again))
    print(row("one-shot run (@agentuity/core client.run)", client, b))
    print(row("create -> idle", create, b))
    print(row("create -> idle, 1Gi disk limit", create_disk, b))
    print(f"| one-shot `true` throughput, {args.concurrency} concurrent | {statistics.median(rates):.1f} runs/s "
          f"(median of {args.rounds} rounds of {args.seconds:g}s: {', '.join(f'{r:.1f}' for r in rates)}) | | | | |")


if __name__ == "__main__":
    asyncio.run(main())
