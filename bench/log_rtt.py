"""The production log path's own time, piece by piece, against bare clients, in turns.

    python bench/log_rtt.py [--n 200] [--rounds 4] [--busy 0.0] [--gap MS] [--only NAME ...]

On the shared broker and PostgreSQL server of ``HUTCH_EVENT_LOG`` / ``HUTCH_STORE`` (a fresh
topic and database each run), one operation at a time, ``--n`` of each per round, the pieces
in turns (their order rotates every round, so the machine's drift hits each alike):

  produce-acks1   a bare aiokafka ``send_and_wait`` of one record: acks=1, not idempotent
  produce         the same with hutch's producer settings (idempotent, acks=all, linger 0)
  append          ``KafkaEventLog.append`` of one event (the server's pattern)
  append+applied  the recorder's path: that append, then the projector's ``wait_for`` its
                  position (Kafka fetch -> PostgreSQL WRITE and commit -> the writer wakes)
  pg-commit       a bare asyncpg ``SELECT 1`` and a one-row UPDATE as its own transaction
                  (a commit's WAL flush: what ``synchronous_commit=on`` waits for)

``--busy F`` keeps the event loop busy a fraction F of the time in 1 ms slices of pure Python
(a server's loop serving other requests), as bench/append.py does: what an extra loop turn
costs on a loaded server. ``--gap MS`` waits that long (untimed) before each operation, as a
server waits between a one-shot's appends while its command runs: after a pause the broker's and
the server's threads are asleep, and the operation pays their wake-ups. Prints per piece p50 / p90 in ms, each round's p50, and the
median of the round-by-round p50s. Not a test: docs/benchmarks.md records the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiokafka import AIOKafkaProducer  # noqa: E402

from bench.eventlog import drop_database, fresh_database, pct  # noqa: E402
from hutch.core import ids  # noqa: E402
from hutch.core.events import Event, SandboxStarted  # noqa: E402
from hutch.eventlog.kafka import KafkaEventLog  # noqa: E402
from hutch.eventlog.kafka_topics import ensure_topics  # noqa: E402
from hutch.projections.runner import Projector  # noqa: E402
from hutch.service.composition import open_store  # noqa: E402

PIECES = ("produce-acks1", "produce", "append", "append+applied", "pg-commit")


def now_iso() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


async def busy_loop(fraction: float) -> None:
    """Keep the loop busy ``fraction`` of the time in 1 ms slices (0: never)."""
    if fraction <= 0:
        return
    while True:
        end = time.perf_counter() + 0.001
        while time.perf_counter() < end:
            pass
        await asyncio.sleep(0.001 * (1 - fraction) / fraction)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--event-log", default=os.environ.get("HUTCH_EVENT_LOG"))
    ap.add_argument("--store", default=os.environ.get("HUTCH_STORE"))
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--busy", type=float, default=0.0)
    ap.add_argument("--gap", type=float, default=0.0, help="ms slept, untimed, before each operation")
    ap.add_argument("--only", action="append", choices=PIECES)
    args = ap.parse_args()
    if not (args.event_log or "").startswith("kafka://") or not (args.store or "").startswith("postgres"):
        sys.exit("needs HUTCH_EVENT_LOG=kafka://… and HUTCH_STORE=postgresql://… (svc.env)")
    pieces = tuple(args.only or PIECES)
    netloc = urllib.parse.urlsplit(args.event_log).netloc
    topic = f"hutch-rtt-{uuid.uuid4().hex[:8]}"
    database, dbname = await fresh_database(args.store)
    tmp = Path(tempfile.mkdtemp(prefix="hutch-rtt-"))

    # The hutch log (its own topics), its projector into a fresh PostgreSQL store.
    log = KafkaEventLog.from_url(f"kafka://{netloc}/{topic}", tmp)
    store = open_store(database)
    await log.start()
    await store.start()
    projector = Projector(log, store)
    await projector.start()
    # The bare producers write to a topic of their own (one partition, as the order topic).
    bare_topic = f"{topic}-bare"
    await ensure_topics(netloc, bare_topic, f"{bare_topic}.order", f"{bare_topic}.indexed", partitions=1,
                        replication=None, client_id="hutch-bench")
    common = {"bootstrap_servers": netloc, "client_id": "hutch-bench", "linger_ms": 0}
    same = AIOKafkaProducer(**common, enable_idempotence=True, acks="all", request_timeout_ms=15_000)
    loose = AIOKafkaProducer(**common, enable_idempotence=False, acks=1)
    await same.start()
    await loose.start()
    import asyncpg

    conn = await asyncpg.connect(database)
    await conn.execute("CREATE TABLE rtt (k int PRIMARY KEY, v bigint)")
    await conn.execute("INSERT INTO rtt VALUES (1, 0)")
    sandbox = ids.new_id("sandbox")
    payload = b"x" * 600  # about one event's record

    def event() -> Event:
        return Event(ids.new_id("event"), sandbox, now_iso(), SandboxStarted())

    async def append_applied() -> None:
        (position,) = await log.append([event()])
        await projector.wait_for(position)

    counter = 0

    async def pg_commit() -> None:
        nonlocal counter
        counter += 1
        await conn.execute("UPDATE rtt SET v = $1 WHERE k = 1", counter)

    ops: dict[str, Callable[[], Awaitable[object]]] = {
        "produce-acks1": lambda: loose.send_and_wait(f"{bare_topic}.order", payload, partition=0),
        "produce": lambda: same.send_and_wait(f"{bare_topic}.order", payload, partition=0),
        "append": lambda: log.append([event()]),
        "append+applied": append_applied,
        "pg-commit": pg_commit,
    }
    busy = asyncio.create_task(busy_loop(args.busy))
    taken: dict[str, list[list[float]]] = {p: [] for p in pieces}
    try:
        for p in pieces:  # warm: connections, metadata, the store's mirror
            for _ in range(20):
                await ops[p]()
        for r in range(args.rounds):
            order = pieces[r % len(pieces):] + pieces[:r % len(pieces)]
            for p in order:
                got = []
                for _ in range(args.n):
                    if args.gap > 0:
                        await asyncio.sleep(args.gap / 1000)
                    t = time.perf_counter()
                    await ops[p]()
                    got.append((time.perf_counter() - t) * 1000)
                taken[p].append(got)
    finally:
        busy.cancel()
        await conn.close()
        await same.stop()
        await loose.stop()
        await projector.close()
        await store.close()
        await log.close()
        await drop_database(args.store, dbname)
    load = os.getloadavg()
    print(f"{args.rounds} rounds x {args.n}, one at a time, busy {args.busy:g}, gap {args.gap:g} ms; load average now "
          f"{load[0]:.2f} {load[1]:.2f}")
    print(f"{'piece':16} {'p50':>7} {'p90':>7}  median of round p50s  (round p50s)")
    for p in pieces:
        flat = [x for rnd in taken[p] for x in rnd]
        rounds = [statistics.median(rnd) for rnd in taken[p]]
        print(f"{p:16} {statistics.median(flat):7.2f} {pct(flat, 90):7.2f}  {statistics.median(rounds):7.2f}"
              f"  ({' '.join(f'{x:.2f}' for x in rounds)})")


if __name__ == "__main__":
    asyncio.run(main())
