"""Two API replicas on one Kafka topic and one PostgreSQL database over the cluster (not a test).

    ./scripts/services start kafka postgres cluster
    python bench/replicas.py [-n 30] [--seconds 30] [--kills 5]

Side by side in one run, both replicas up throughout:
- execute `python3 -c pass` in a live python:3.13 sandbox made through A, with the real
  API round trips (POST execute, then the long-poll for its end): through A (its owner) and
  through B (relayed to A), against bare `python3 -c pass` (the runtime's tree, chrooted on
  this host), samples alternating: p50s, the API's cost over bare and the relay's cost;
- one-shot runs/s at concurrency 8 through A alone, and alternating between A and B;
- projection lag: an env change made through A, until B's projection shows it (p50);
- take-over: kill -9 of A while it runs a command -> B reports that command `failed`
  (p50 over --kills kills; A is started again between kills).

Kafka and PostgreSQL come from HUTCH_TEST_EVENT_LOG / HUTCH_TEST_STORE (as the tests take
them); the cluster from HUTCH_TEST_CLUSTER_ADDR / HUTCH_TEST_CLUSTER_REGISTRY.
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
from pathlib import Path

import aiohttp

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from hutch.drivers.local import rootfs  # noqa: E402
from tests.services import drop_database, drop_topics, fresh_database, kafka_url  # noqa: E402
from tests.system.server import KEY, Server  # noqa: E402

H = {"Authorization": f"Bearer {KEY}"}
RUNTIME = "base:latest"


def say(what: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def ms(samples: list[float]) -> str:
    return f"p50 {statistics.median(samples) * 1000:.1f} ms (n={len(samples)})"


async def call(s: aiohttp.ClientSession, method: str, url: str, body: object = None) -> dict[str, object]:
    async with s.request(method, url, json=body, headers=H) as r:
        payload = await r.json()
        assert r.status < 300, (r.status, payload)
        return payload.get("data") or {}


async def execute(s: aiohttp.ClientSession, base: str, sid: str) -> float:
    t0 = time.perf_counter()
    ex = await call(s, "POST", f"{base}/sandbox/{sid}/execute", {"command": ["python3", "-c", "pass"]})
    done = await call(s, "GET", f"{base}/sandbox/execution/{ex['executionId']}?wait=60s")
    assert done.get("exitCode") == 0, done
    return time.perf_counter() - t0


FAILED: list[object] = []  # one-shot runs that did not end with exit code 0: counted, shown


async def oneshot(s: aiohttp.ClientSession, base: str) -> None:
    data = await call(s, "POST", f"{base}/sandbox", {"runtime": RUNTIME, "command": {"exec": ["true"],
                                                                                    "mode": "oneshot"}})
    async with s.get(str(data["stdoutStreamUrl"])) as r:
        await r.read()
    done = await call(s, "GET", f"{base}/sandbox/execution/{data['executionId']}?wait=60s")
    if done.get("exitCode") != 0:
        FAILED.append(done)


async def throughput(bases: list[str], seconds: float, concurrency: int = 8) -> float:
    deadline, count = time.perf_counter() + seconds, 0

    async def worker(s: aiohttp.ClientSession, n: int) -> None:
        nonlocal count
        while time.perf_counter() < deadline:
            await oneshot(s, bases[(n + count) % len(bases)])
            count += 1

    async with aiohttp.ClientSession() as s:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(s, n) for n in range(concurrency)))
        return count / (time.perf_counter() - t0)


async def saw_env(s: aiohttp.ClientSession, base: str, sid: str, value: str) -> bool:
    """Whether ``base``'s projection has the env change setting LAG_<value> (names are shown,
    values are not)."""
    async with s.get(f"{base}/sandbox/sandboxes/{sid}/events?limit=5&direction=desc", headers=H) as r:
        data = (await r.json())["data"]
    events = data if isinstance(data, list) else data.get("events", [])
    return any(e.get("type") == "env" and f"'LAG_{value}'" in str(e) for e in events)


async def lag(s: aiohttp.ClientSession, a: str, b: str, sid: str, n: int) -> list[float]:
    samples = []
    for i in range(n):
        t0 = time.perf_counter()
        await call(s, "PATCH", f"{a}/sandbox/env/{sid}", {"env": {f"LAG_{i}": "1"}})
        # Polled: B's projection is another process's.
        while not await saw_env(s, b, sid, str(i)):  # noqa: ASYNC110
            await asyncio.sleep(0.001)
        samples.append(time.perf_counter() - t0)
    return samples


async def take_over(a: Server, b: Server, kills: int) -> list[float]:
    samples = []
    async with aiohttp.ClientSession() as s:
        for _ in range(kills):
            sid = (await call(s, "POST", f"{a.url}/sandbox", {"runtime": RUNTIME}))["sandboxId"]
            ex = await call(s, "POST", f"{a.url}/sandbox/{sid}/execute", {"command": ["sleep", "600"]})
            await asyncio.sleep(0.5)
            t0 = time.perf_counter()
            a.kill9()
            done = await call(s, "GET", f"{b.url}/sandbox/execution/{ex['executionId']}?wait=60s")
            samples.append(time.perf_counter() - t0)
            assert done["status"] == "failed", done
            await call(s, "DELETE", f"{b.url}/sandbox/{sid}")
            a.start(timeout=120)
    return samples


async def main(args: argparse.Namespace) -> None:
    url, database = await fresh_database("bench_replicas")
    log = kafka_url("bench_replicas")
    root = Path(tempfile.mkdtemp(prefix="hutch-bench-replicas-"))
    env = {"HUTCH_NOMAD_ADDR": os.environ.get("HUTCH_TEST_CLUSTER_ADDR", "http://10.77.0.1:4656"),
           "HUTCH_NOMAD_REGISTRY": os.environ.get("HUTCH_TEST_CLUSTER_REGISTRY", "10.77.0.1:5000"),
           "HUTCH_EVENT_LOG": log, "HUTCH_STORE": url, "HUTCH_NOMAD_POOL": "auto"}
    if token := os.environ.get("HUTCH_TEST_CLUSTER_TOKEN"):  # the cluster's ACLs are on
        env["HUTCH_NOMAD_TOKEN"] = token
    servers = []
    for name in ("a", "b"):
        (root / name).mkdir()
        servers.append(Server(root / name, driver="nomad", HUTCH_REPLICA_ID=f"bench-{name}", **env))
    a, b = servers
    try:
        for srv in servers:
            srv.start(timeout=180)
        async with aiohttp.ClientSession() as s:
            sid = str((await call(s, "POST", f"{a.url}/sandbox", {"runtime": "python:3.13"}))["sandboxId"])
            say(f"sandbox {sid} made through A; executing")
            for _ in range(3):  # warm both paths (the exec agent starts on the first command)
                await execute(s, a.url, sid)
                await execute(s, b.url, sid)
            tree = rootfs.built_rootfs("python:3.13", rootfs.default_cache())
            bare, owner, relayed = [], [], []
            for _ in range(args.n):
                t0 = time.perf_counter()
                await asyncio.to_thread(subprocess.run, ["chroot", str(tree), "python3", "-c", "pass"], check=True)
                bare.append(time.perf_counter() - t0)
                owner.append(await execute(s, a.url, sid))
                relayed.append(await execute(s, b.url, sid))
            say("projection lag")
            lags = await lag(s, a.url, b.url, sid, args.n)
            await call(s, "DELETE", f"{a.url}/sandbox/{sid}")
        say("one-shot runs through A, then through A and B")
        one = await throughput([a.url], args.seconds)
        both = await throughput([a.url, b.url], args.seconds)
        say("take-overs")
        kills = await take_over(a, b, args.kills)
        result = {
            "bare python3 -c pass": ms(bare),
            "execute through the owner": ms(owner), "execute relayed by the other": ms(relayed),
            "API over bare p50 ms": round((statistics.median(owner) - statistics.median(bare)) * 1000, 1),
            "relay cost p50 ms": round((statistics.median(relayed) - statistics.median(owner)) * 1000, 1),
            "one-shot runs/s through A": round(one, 1), "one-shot runs/s through A and B": round(both, 1),
            "one-shot runs that failed": len(FAILED), "first failure": FAILED[0] if FAILED else None,
            "projection lag A->B": ms(lags), "take-over (kill -9 -> failed)": ms(kills),
            "load average": os.getloadavg()[0],
        }
        print(json.dumps(result, indent=2))
    finally:
        for srv in servers:
            srv.stop()
        await drop_database(database)
        await drop_topics(log)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--kills", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
