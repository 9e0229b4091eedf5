"""The embedded event log's append latency, two revisions of hutch/eventlog/sqlite.py in turns.

    python bench/append.py [--against REV] [--rounds 6] [--n 400] [--concurrency 1 16] [--busy 0.5]

A is ``--against`` (default main)'s ``hutch/eventlog/sqlite.py``, loaded from git; B is this
tree's. Each round appends ``--n`` single-event appends (the server's pattern) to a fresh log
of each, A then B, then B then A in the next round, so the machine's drift hits both alike.
At concurrency c, c writers append one event at a time each; a writer's append latency is
from the call to its acknowledgement (committed and fsynced). With ``--busy F``, a coroutine
beside the writers keeps the event loop busy a fraction F of the time in slices of 1 ms of
pure Python (a server's loop serving other requests: the log's thread then waits for the GIL).
Prints per concurrency each side's p50 / p90 in ms and B/A of the medians and the median of
the round-by-round ratios. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.eventlog import lifecycle, pct  # noqa: E402
from hutch.core import ids  # noqa: E402


def load_at(rev: str, tmp: Path) -> ModuleType:
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:hutch/eventlog/sqlite.py"],
                            check=True, capture_output=True, text=True).stdout
    path = tmp / f"sqlite_{rev.replace('/', '_')}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"sqlite_at_{abs(hash(rev))}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def busy_loop(fraction: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        while time.perf_counter() - t < 0.001:
            pass
        await asyncio.sleep(0.001 * (1 - fraction) / fraction)


async def one_round(cls: type, path: Path, n: int, concurrency: int, busy: float) -> list[float]:
    log = cls(path)
    await log.start()
    events = [e for _ in range(n // 6 + 1) for e in lifecycle(ids.new_id("sandbox"), 2)][:n]
    stop = asyncio.Event()
    spinner = asyncio.create_task(busy_loop(busy, stop)) if busy > 0 else None
    took: list[float] = []

    async def writer() -> None:
        while events:
            ev = events.pop()
            t = time.perf_counter()
            await log.append([ev])
            took.append(time.perf_counter() - t)

    try:
        for _ in range(20):  # warm: the file's first pages, the statement cache
            await log.append([lifecycle(ids.new_id("sandbox"), 0)[0]])
        await asyncio.gather(*(writer() for _ in range(concurrency)))
    finally:
        stop.set()
        if spinner:
            await spinner
        await log.close()
    return [t * 1000 for t in took]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="main")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--busy", type=float, default=0.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hutch-append-"))
    a = load_at(args.against, tmp).SqliteEventLog
    from hutch.eventlog.sqlite import SqliteEventLog as b

    print(f"A = {args.against}, B = this tree; n={args.n} x {args.rounds} rounds, busy {args.busy}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for c in args.concurrency:
        got: dict[str, list[float]] = {"A": [], "B": []}
        ratios = []
        for r in range(args.rounds):
            order = [("A", a), ("B", b)] if r % 2 == 0 else [("B", b), ("A", a)]
            medians = {}
            for name, cls in order:
                took = await one_round(cls, tmp / f"{name}{c}-{r}.db", args.n, c, args.busy)
                got[name] += took
                medians[name] = statistics.median(took)
            ratios.append(medians["B"] / medians["A"])
        pa, pb = pct(got["A"], 50), pct(got["B"], 50)
        print(f"c={c:<3} A p50 {pa:.3f} p90 {pct(got['A'], 90):.3f} ms | B p50 {pb:.3f} p90 {pct(got['B'], 90):.3f} ms"
              f" | B/A {pb / pa:.3f}, round by round {statistics.median(ratios):.3f}")
    print(f"load average after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    asyncio.run(main())
