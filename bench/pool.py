"""How often a create finds the warm pool empty, in a stream of creates (local driver).

    python bench/pool.py [A B ...] [--n 60] [--concurrency 1 --concurrency 4 ...]

Per side (a commit, or ``.`` for this tree) and concurrency, in turns (A B, B A, ...), a
child process runs that side's LocalDriver (its own data dir, the host's runtimes) and makes
``--n`` sandboxes of ``RUNTIME`` with ``--concurrency`` workers, each create followed by its
sandbox's destroy (as a one-shot's), after the pool first filled. Reported per side: the
share of creates that claimed a pooled sandbox (the rest were made from scratch), and the
p50 / p90 of ``provision`` in ms, of all creates and of the claims and the makes apart.
The load average is printed beside each round. Not a test: the figures are for a person.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = "python:3.13"


async def child(n: int, concurrency: int, data: Path) -> dict[str, object]:
    from hutch.drivers.base import ProvisionRequest
    from hutch.drivers.local.driver import LocalDriver
    from hutch.drivers.local.rootfs import default_cache

    driver = LocalDriver(data, default_cache())
    await driver.start()
    pool = driver._pool
    claims: list[bool] = []
    claim = pool.claim

    async def spied(req):  # type: ignore[no-untyped-def]
        sb = await claim(req)
        claims.append(sb is not None)
        return sb

    pool.claim = spied  # type: ignore[method-assign]
    seq = iter(range(10**9))

    async def one() -> tuple[float, bool]:
        sid = f"pb{os.getpid()}x{next(seq)}"
        t0 = time.perf_counter()
        await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=RUNTIME))
        took = (time.perf_counter() - t0) * 1000
        claimed = claims[-1] if claims else False
        await driver.destroy(sid)
        return took, claimed

    try:
        await one()  # the runtime's pool is filled from its first create
        for _ in range(600):  # up to 30 s
            if len(pool.idle.get(RUNTIME, ())) >= pool.size:
                break
            await asyncio.sleep(0.05)
        claims.clear()
        out: list[tuple[float, bool]] = []
        left = n

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                out.append(await one())

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        for sid in await driver.alive():
            await driver.destroy(sid)
        await driver.close()
    return {"took": [t for t, _ in out], "claimed": [c for _, c in out], "pool": pool.size}


def summary(samples: list[float]) -> str:
    if not samples:
        return "-"
    s = sorted(samples)
    return f"{statistics.median(s):.1f} / {s[int(len(s) * 0.9) - 1] if len(s) >= 10 else s[-1]:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sides", nargs="*", default=["."], help="commits to compare, or . for this tree")
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--concurrency", type=int, action="append")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per side and concurrency")
    ap.add_argument("--child", nargs=3, metavar=("N", "C", "DATA"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        n, c, data = int(args.child[0]), int(args.child[1]), Path(args.child[2])
        print(json.dumps(asyncio.run(child(n, c, data))))
        return
    sys.path.insert(0, str(ROOT))
    from bench.compare import checkouts, resolve

    commits = [s for s in args.sides if s != "."]
    with checkouts([resolve(c)[0] for c in commits]) as paths:
        roots = dict(zip(commits, paths, strict=True))
        roots["."] = ROOT
        results: dict[tuple[str, int], list[dict[str, object]]] = {}
        for c in args.concurrency or [1, 4, 8]:
            for r in range(args.rounds):
                for side in args.sides if r % 2 == 0 else args.sides[::-1]:
                    data = Path(f"/tmp/hutch-poolbench-{side.replace('/', '_')}")
                    data.mkdir(exist_ok=True)
                    env = {**os.environ, "PYTHONPATH": str(roots[side])}
                    load = os.getloadavg()[0]
                    run = subprocess.run([sys.executable, __file__, "--child", str(args.n), str(c), str(data)],
                                         env=env, cwd=roots[side], capture_output=True, text=True, check=False)
                    if run.returncode != 0:
                        raise SystemExit(f"side {side}: {run.stderr[-3000:]}")
                    res = json.loads(run.stdout.strip().splitlines()[-1])
                    res["load"] = load
                    results.setdefault((side, c), []).append(res)
                    print(f"c={c} round {r} {side}: load {load:.1f}, claimed {sum(res['claimed'])}/{len(res['claimed'])}",
                          file=sys.stderr)
    print("| side | c | claimed | provision p50 / p90 ms | claims | makes | load |")
    print("|---|---|---|---|---|---|---|")
    for (side, c), runs in results.items():
        took = [t for r in runs for t in r["took"]]  # type: ignore[attr-defined]
        claimed = [x for r in runs for x in r["claimed"]]  # type: ignore[attr-defined]
        loads = [r["load"] for r in runs]
        print(f"| {side} | {c} | {100 * sum(claimed) / len(claimed):.0f} % | {summary(took)} | "
              f"{summary([t for t, k in zip(took, claimed, strict=True) if k])} | "
              f"{summary([t for t, k in zip(took, claimed, strict=True) if not k])} | "
              f"{min(loads):.1f}-{max(loads):.1f} |")


if __name__ == "__main__":
    main()
