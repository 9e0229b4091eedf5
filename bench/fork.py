"""What a fork costs per copy, against the workspace's size, beside a plain create.

    python bench/fork.py [--driver local|nomad] [--copies 5] [--rounds 3]

In one process (the in-process engine on a fresh data dir), for each workspace (empty, 1 MiB
in one file, 10 MiB in ten, 1,000 files of 1 KiB): a parent sandbox is filled, then
``--rounds`` times ``POST /sandbox/{id}/fork`` with ``--copies`` and the wall time until every
copy is ``idle``, divided by the copies; beside it, a plain create of the same runtime until
``idle`` (the bare baseline: what any new sandbox costs). Medians. Not a test: docs/benchmarks.md
records the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Not this directory: its nomad.py would shadow the python-nomad package.
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from hutch.client import local_client  # noqa: E402

WORKSPACES = {
    "empty": {},
    "1 MiB, 1 file": {"big.bin": os.urandom(1 << 20)},
    "10 MiB, 10 files": {f"f{i}.bin": os.urandom(1 << 20) for i in range(10)},
    "1000 files of 1 KiB": {f"d{i // 100}/f{i}.txt": os.urandom(512).hex().encode() for i in range(1000)},
}


async def until_idle(client, ids: list[str]) -> None:  # type: ignore[no-untyped-def]
    for sid in ids:
        info = await client.get(sid, wait_for_status=["idle", "failed"], wait_ms=120_000)
        assert info.status == "idle", (sid, info.status)


async def main(driver: str, copies: int, rounds: int) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="hutch-bench-fork-") as data:
        async with local_client(data_dir=data, driver=driver) as client:
            warm = await client.create(runtime="base:latest")  # the runtime (and image) ready first
            await until_idle(client, [warm.id])
            await warm.destroy()
            plain = []
            for _ in range(rounds * 2):
                start = time.perf_counter()
                sb = await client.create(runtime="base:latest")
                await until_idle(client, [sb.id])
                plain.append(time.perf_counter() - start)
                await sb.destroy()
            results["plain create"] = {"per_copy_ms": statistics.median(plain) * 1000}
            for label, files in WORKSPACES.items():
                parent = await client.create(runtime="base:latest")
                if files:
                    await parent.write_files(files)
                per_copy = []
                for _ in range(rounds):
                    start = time.perf_counter()
                    made = await parent.fork(copies)
                    await until_idle(client, [m.id for m in made])
                    per_copy.append((time.perf_counter() - start) / copies)
                    for m in made:
                        await m.destroy()
                await parent.destroy()
                median = statistics.median(per_copy) * 1000
                results[label] = {"per_copy_ms": median, "vs_plain_create": median / results["plain create"]["per_copy_ms"]}
    return results


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", default="local")
    ap.add_argument("--copies", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    out = asyncio.run(main(a.driver, a.copies, a.rounds))
    for label, row in out.items():
        ratio = f"  ({row['vs_plain_create']:.2f}x a plain create)" if "vs_plain_create" in row else ""
        print(f"{label:<22} {row['per_copy_ms']:8.1f} ms per copy{ratio}")
    print(json.dumps(out))
