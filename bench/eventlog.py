"""Event-log append throughput and projection lag, per profile.

    set -a; eval "$(./scripts/services start kafka postgres)"; set +a
    python bench/eventlog.py                       # production: $HUTCH_EVENT_LOG + $HUTCH_STORE
    python bench/eventlog.py --profile embedded    # SQLite log + in-memory projections
    python bench/eventlog.py --events 200000 --rate 1000 --seconds 20

Each run uses a fresh Kafka topic and a fresh PostgreSQL database (the settings' database
is only used to create it), so runs never see each other's data.

append      ``--events`` events appended by ``--writers`` concurrent writers, each append
            a batch of ``--batch`` events (one Produce per group commit); events/s from
            the first append to the last acknowledgement. Also single-event appends from
            the same writers (the server's pattern: one event per append, group-committed).
lag         a writer appends single events at ``--rate`` per second for ``--seconds``
            (sandbox lifecycles: create, start, execution started/finished, terminate)
            while a Projector follows the log into the store; lag = time from an append's
            acknowledgement to the projector having applied that event (the moment a
            second API process can read it), p50/p99/max.
Not a test: no pass/fail; docs/benchmarks.md records the figures.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hutch.core import ids  # noqa: E402
from hutch.core.eventlog.base import EventLog  # noqa: E402
from hutch.core.events import (  # noqa: E402
    Event,
    ExecutionFinished,
    ExecutionStarted,
    SandboxCreated,
    SandboxStarted,
    SandboxTerminated,
)
from hutch.core.models import ExecutionStatus, SandboxSpec  # noqa: E402
from hutch.projections.base import ProjectionStore  # noqa: E402
from hutch.service.composition import make_projector, open_event_log, open_store  # noqa: E402


def now_iso() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def lifecycle(sandbox_id: str, n: int) -> list[Event]:
    """A realistic stream for one sandbox: create, start, n executions, terminate."""
    at = now_iso()
    data: list[object] = [SandboxCreated(spec=SandboxSpec(runtime="base:latest", runtime_id="srt_bench", name=sandbox_id)),
                          SandboxStarted()]
    for i in range(n):
        eid = ids.new_id("execution")
        data += [ExecutionStarted(eid, ("echo", str(i))),
                 ExecutionFinished(eid, ExecutionStatus.COMPLETED, exit_code=0, duration_ms=3)]
    data.append(SandboxTerminated(reason="bench", deleted=True))
    return [Event(ids.new_id("event"), sandbox_id, at, d) for d in data]  # type: ignore[arg-type]


def events_stream():  # type: ignore[no-untyped-def]
    """Endless events, interleaving 16 sandboxes at a time so partitions all get traffic."""
    while True:
        streams = [iter(lifecycle(ids.new_id("sandbox"), 3)) for _ in range(16)]
        while streams:
            for s in list(streams):
                try:
                    yield next(s)
                except StopIteration:
                    streams.remove(s)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def fresh_database(admin: str) -> tuple[str, str]:
    import asyncpg

    name = f"hutch_bench_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    parts = urllib.parse.urlsplit(admin)
    return urllib.parse.urlunsplit(parts._replace(path="/" + name)), name


async def drop_database(admin: str, name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def bench_append(log: EventLog, total: int, writers: int, batch: int) -> dict[str, float]:
    source = events_stream()
    prepared = [[next(source) for _ in range(min(batch, total - i))] for i in range(0, total, batch)]
    latencies: list[float] = []

    async def writer() -> None:
        while prepared:
            chunk = prepared.pop()
            t = time.perf_counter()
            await log.append(chunk)
            latencies.append(time.perf_counter() - t)

    started = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(writers)))
    elapsed = time.perf_counter() - started
    return {"events": total, "seconds": elapsed, "events_per_s": total / elapsed,
            "append_p50_ms": pct(latencies, 50) * 1000, "append_p99_ms": pct(latencies, 99) * 1000}


async def bench_lag(log: EventLog, store: ProjectionStore, rate: float, seconds: float) -> dict[str, float]:
    projector = make_projector(log, store)
    await projector.start()
    applied: dict[str, float] = {}
    queue = projector.listen()

    async def watch() -> None:
        while True:
            event = await queue.get()
            applied[event.event_id] = time.perf_counter()

    watcher = asyncio.create_task(watch())
    acked: dict[str, float] = {}
    called: dict[str, float] = {}
    source = events_stream()
    pending: set[asyncio.Task[None]] = set()

    async def append_one(event: Event) -> None:
        called[event.event_id] = time.perf_counter()
        await log.append([event])
        acked[event.event_id] = time.perf_counter()

    # Per sandbox, events must be appended in order: one sandbox's next event waits for its
    # previous one (as the API's per-sandbox lock does); different sandboxes overlap.
    last_of: dict[str, asyncio.Task[None]] = {}

    async def chained(event: Event, before: asyncio.Task[None] | None) -> None:
        if before is not None:
            await before
        await append_one(event)

    interval = 1.0 / rate
    started = time.perf_counter()
    n = 0
    while time.perf_counter() - started < seconds:
        target = started + n * interval
        delay = target - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        event = next(source)
        task = asyncio.create_task(chained(event, last_of.get(event.sandbox_id)))
        last_of[event.sandbox_id] = task
        pending.add(task)
        task.add_done_callback(pending.discard)
        n += 1
    sent_seconds = time.perf_counter() - started
    await asyncio.gather(*pending)
    if acked:
        last = max(acked, key=acked.__getitem__)
        deadline = time.perf_counter() + 30
        while last not in applied and time.perf_counter() < deadline:  # noqa: ASYNC110 - a bench, polling is fine
            await asyncio.sleep(0.01)
    watcher.cancel()
    projector.unlisten(queue)
    await projector.close()
    lags = [applied[e] - acked[e] for e in acked if e in applied]
    e2e = [applied[e] - called[e] for e in acked if e in applied]
    return {"events": len(acked), "rate": len(acked) / sent_seconds, "missing": len(acked) - len(lags),
            "lag_p50_ms": statistics.median(lags) * 1000, "lag_p99_ms": pct(lags, 99) * 1000,
            "lag_max_ms": max(lags) * 1000, "append_to_applied_p99_ms": pct(e2e, 99) * 1000}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", choices=("production", "embedded"), default="production")
    ap.add_argument("--event-log", default=os.environ.get("HUTCH_EVENT_LOG"))
    ap.add_argument("--store", default=os.environ.get("HUTCH_STORE"))
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--single", type=int, default=10_000, help="events for the single-event append run")
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--seconds", type=float, default=20)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="hutch-bench-"))
    database: tuple[str, str] | None = None
    if args.profile == "production":
        if not (args.event_log or "").startswith("kafka://") or not (args.store or "").startswith("postgres"):
            sys.exit("production needs --event-log kafka://… and --store postgresql://… "
                     "(or HUTCH_EVENT_LOG/HUTCH_STORE from ./scripts/services start kafka postgres)")
        base = urllib.parse.urlsplit(args.event_log)
        topic_url = f"kafka://{base.netloc}/hutch-bench-{uuid.uuid4().hex[:8]}"
        database = await fresh_database(args.store)
        store_url = database[0]

        def make_log(name: str) -> EventLog:
            return open_event_log(f"{topic_url}-{name}", tmp / name)
    else:
        store_url = "memory"

        def make_log(name: str) -> EventLog:
            return open_event_log("sqlite", tmp / name)

    def make_store() -> ProjectionStore:
        return open_store(store_url)

    print(f"profile {args.profile}: {'Kafka + PostgreSQL' if database else 'SQLite + memory'}")
    try:
        log = make_log("append")
        await log.start()
        try:
            await bench_append(log, 2000, args.writers, args.batch)  # warm up connections and metadata
            r = await bench_append(log, args.events, args.writers, args.batch)
            print(f"append batched  {r['events']} events, {args.writers} writers x {args.batch}/append: "
                  f"{r['events_per_s']:,.0f} events/s (append p50 {r['append_p50_ms']:.1f} ms, p99 {r['append_p99_ms']:.1f} ms)")
            r = await bench_append(log, args.single, args.writers * 4, 1)
            print(f"append single   {r['events']} events, {args.writers * 4} writers x 1/append:   "
                  f"{r['events_per_s']:,.0f} events/s (append p50 {r['append_p50_ms']:.1f} ms, p99 {r['append_p99_ms']:.1f} ms)")
        finally:
            await log.close()

        log = make_log("lag")
        store = make_store()
        await log.start()
        await store.start()
        try:
            r = await bench_lag(log, store, args.rate, args.seconds)
            print(f"projection lag  {r['events']} events at {r['rate']:,.0f}/s: ack->applied p50 {r['lag_p50_ms']:.1f} ms, "
                  f"p99 {r['lag_p99_ms']:.1f} ms, max {r['lag_max_ms']:.1f} ms; append call->applied p99 "
                  f"{r['append_to_applied_p99_ms']:.1f} ms; missing {r['missing']}")
        finally:
            await store.close()
            await log.close()
    finally:
        if database:
            await drop_database(args.store, database[1])


if __name__ == "__main__":
    asyncio.run(main())
