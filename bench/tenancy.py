"""What tenancy costs: the key check per request, and how long a revocation takes to reach
another API process.

    set -a; eval "$(./scripts/services start kafka postgres)"; set +a
    python bench/tenancy.py                  # both parts
    python bench/tenancy.py --skip-lag       # the key check only (no services needed)

check   in one process, side by side, ``--rounds`` rounds of ``--n`` calls each: the whole
        check the auth middleware makes (authenticate, rate limit, orgId, role) for the
        bootstrap key and for an organization's key (SHA-256 + one dictionary hit), in
        microseconds per call; and end to end through a real server (aiohttp, loopback,
        one connection), ``GET /healthz`` (public: no key check) against ``GET /projects``
        (a key check and a dictionary read), median request time of each.
lag     two ``hutch serve`` processes (fake driver) on one Kafka topic and one PostgreSQL
        database (fresh per run): ``--keys`` times, a key is created and revoked through
        A while B is asked every millisecond; lag = from A's answer to the revocation to
        B's first 401. Median, p90, max.
Not a test: no pass/fail; docs/benchmarks.md records the figures.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hutch.core import tenancy  # noqa: E402
from hutch.core.tenancy import Access  # noqa: E402
from hutch.service.tenancy import Tenants  # noqa: E402


def check_cost(n: int, rounds: int) -> dict[str, float]:
    tenants = Tenants("boot-secret")
    directory = tenants.directory
    secret, event = tenancy.create_key(directory, "org_local", role="member")
    directory.apply("org_local", "2026-01-01T00:00:00Z", event)
    results: dict[str, list[float]] = {"bootstrap": [], "org key": []}
    for _ in range(rounds):
        for label, key in (("bootstrap", "boot-secret"), ("org key", secret)):
            start = time.perf_counter()
            for _ in range(n):
                principal = tenants.authenticate(key)
                tenants.throttle(principal)
                principal = principal.acting_for(None, directory)
                principal.require(Access.READ)
            results[label].append((time.perf_counter() - start) / n * 1e6)
    return {k: statistics.median(v) for k, v in results.items()}


async def end_to_end(n: int, rounds: int) -> dict[str, float]:
    import aiohttp
    from aiohttp.test_utils import TestServer

    from hutch.api.app import create_app
    from hutch.service.config import Config

    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(Config(data_dir=Path(tmp), api_key="boot", driver="fake"))
        async with TestServer(app) as server, aiohttp.ClientSession() as session:
            boot = {"Authorization": "Bearer boot"}
            async with session.post(server.make_url("/keys"), json={"role": "member"}, headers=boot) as resp:
                member = {"Authorization": f"Bearer {(await resp.json())['data']['secret']}"}
            times: dict[str, list[float]] = {"GET /healthz (no key)": [], "GET /projects (org key)": []}
            for _ in range(rounds):
                for label, path, headers in (("GET /healthz (no key)", "/healthz", {}),
                                             ("GET /projects (org key)", "/projects", member)):
                    for _ in range(n):
                        start = time.perf_counter()
                        async with session.get(server.make_url(path), headers=headers) as resp:
                            await resp.read()
                        times[label].append((time.perf_counter() - start) * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def revocation_lag(keys: int) -> list[float]:
    from tests.api.test_tenancy_upgrade import call, serve
    from tests.services import drop_database, drop_topics, fresh_database, kafka_url

    store, database = asyncio.run(fresh_database("bench"))
    log = kafka_url("bench")
    lags: list[float] = []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            env = {"HUTCH_EVENT_LOG": log, "HUTCH_STORE": store}
            a, url_a = serve(Path(tmp), "a", env)
            procs.append(a)
            b, url_b = serve(Path(tmp), "b", env)
            procs.append(b)
            for _ in range(keys):
                made = call(url_a, "POST", "/keys", "boot", {"role": "read-only"})[1]["data"]
                while call(url_b, "GET", "/projects", made["secret"])[0] != 200:
                    time.sleep(0.001)
                call(url_a, "DELETE", f"/keys/{made['id']}", "boot")
                start = time.monotonic()
                while call(url_b, "GET", "/projects", made["secret"])[0] != 401:
                    time.sleep(0.001)
                lags.append((time.monotonic() - start) * 1000)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
        asyncio.run(drop_database(database))
        asyncio.run(drop_topics(log))
    return lags


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--skip-lag", action="store_true")
    args = parser.parse_args()
    report: dict[str, object] = {"check_us": check_cost(args.n * 10, args.rounds),
                                 "request_us": asyncio.run(end_to_end(args.n, args.rounds))}
    if not args.skip_lag:
        if not (os.environ.get("HUTCH_TEST_EVENT_LOG") or os.environ.get("HUTCH_EVENT_LOG")):
            sys.exit("bench/tenancy.py: the lag part needs Kafka and PostgreSQL: "
                     "set -a; eval \"$(./scripts/services start kafka postgres)\"; set +a (or --skip-lag)")
        lags = sorted(revocation_lag(args.keys))
        report["revocation_lag_ms"] = {"median": round(statistics.median(lags), 1),
                                       "p90": round(lags[int(len(lags) * 0.9) - 1], 1), "max": round(lags[-1], 1)}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
