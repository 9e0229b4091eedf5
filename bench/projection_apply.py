"""A one-shot's projection batches on PostgreSQL, with the store's mirror and without, in turns.

    python bench/projection_apply.py [--n 200]

Two PostgreSQL projection stores, each on a fresh database of the shared server, apply the
batches of ``--n`` one-shots, one batch at a time as the projector does when runs come one
after another: the create, the start with its command, the command's end, the terminate.
Store A reads each batch's state (``LOAD``) as before ``fde94a9``; store B folds from what it
wrote last (projections/postgres_mirror.py). Turns alternate which goes first, so the
machine's load hits both alike. Prints p50 / p90 of one batch's apply and of a one-shot's
four, and B/A. Not a test: docs/benchmarks.md records the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hutch.core import ids  # noqa: E402
from hutch.core.events import (  # noqa: E402
    Event,
    ExecutionFinished,
    ExecutionStarted,
    SandboxCreated,
    SandboxStarted,
    SandboxTerminated,
)
from hutch.core.models import ExecutionStatus, Mode, SandboxSpec  # noqa: E402
from hutch.projections.postgres import PostgresProjectionStore  # noqa: E402
from tests.services import drop_database, fresh_database  # noqa: E402

AT = "2026-11-29T00:00:00.000Z"


def oneshot(start: int) -> list[list[Event]]:
    sid, eid = ids.new_id("sandbox"), ids.new_id("execution")
    spec = SandboxSpec(runtime="python:3.13", runtime_id="srt_x", mode=Mode.ONESHOT)
    datas = [[SandboxCreated(spec=spec)], [SandboxStarted(), ExecutionStarted(eid, ("true",))],
             [ExecutionFinished(eid, ExecutionStatus.COMPLETED, exit_code=0)], [SandboxTerminated(reason="done")]]
    out, pos = [], start
    for batch in datas:
        events = []
        for data in batch:
            pos += 1
            events.append(Event(ids.new_id("event"), sid, AT, data, position=pos))
        out.append(events)
    return out


def p90(xs: list[float]) -> float:
    return sorted(xs)[int(len(xs) * 0.9) - 1]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200, help="one-shots per store")
    a = ap.parse_args()
    dbs = [await fresh_database("bench_apply") for _ in range(2)]
    stores = [PostgresProjectionStore(url) for url, _ in dbs]
    stores[0]._mirror.state_for = lambda events: None  # type: ignore[method-assign]  # A: LOAD always
    batch_ms: list[list[float]] = [[], []]
    run_ms: list[list[float]] = [[], []]
    try:
        for s in stores:
            await s.start()
        positions = [0, 0]
        for i in range(a.n + 5):
            for side in ((0, 1) if i % 2 == 0 else (1, 0)):
                t_run = time.perf_counter()
                for batch in oneshot(positions[side]):
                    t0 = time.perf_counter()
                    await stores[side].apply(batch)
                    if i >= 5:  # warm-up: the pools' connections, the statements' plans
                        batch_ms[side].append((time.perf_counter() - t0) * 1000)
                    positions[side] = batch[-1].position or 0
                if i >= 5:
                    run_ms[side].append((time.perf_counter() - t_run) * 1000)
    finally:
        for s in stores:
            await s.close()
        for _, name in dbs:
            await drop_database(name)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"projection apply, {a.n} one-shots (4 batches each) per store, in turns; load average {load}")
    print("| | A: LOAD + WRITE p50 / p90 ms | B: mirror p50 / p90 ms | B/A p50 |")
    print("|---|---|---|---|")
    for label, got in (("one batch", batch_ms), ("a one-shot's four batches", run_ms)):
        ma, mb = statistics.median(got[0]), statistics.median(got[1])
        print(f"| {label} | {ma:.2f} / {p90(got[0]):.2f} | {mb:.2f} / {p90(got[1]):.2f} | {mb / ma:.3f} |")


if __name__ == "__main__":
    asyncio.run(main())
