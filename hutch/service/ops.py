"""The long-running and one-shot jobs behind ``hutch projector``, ``hutch projections rebuild``
and ``hutch audit``: each opens the log read-only and works until it is done or told to stop.
Their parts come from the composition root (``api.composition``), like the server's."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from hutch.core.errors import InvalidInput
from hutch.core.eventlog.base import EventLog
from hutch.core.events import Event
from hutch.projections.audit import DEFAULT_GROUP, Auditor, JsonlSink, PostgresSink, Sink
from hutch.service.composition import make_projector, open_event_log, open_persistent_store

log = logging.getLogger(__name__)

REBUILD_CHUNK = 2000


async def until_signalled(work: Callable[[], Awaitable[Any]]) -> None:
    """Run ``work`` until SIGINT/SIGTERM, then cancel it and return."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work())
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def run_projector(event_log_url: str, store_url: str, data_dir: Path) -> None:
    """Follow the log into the store until cancelled (``hutch projector``)."""
    event_log = open_event_log(event_log_url, data_dir, read_only=True)
    store = open_persistent_store(store_url)
    await event_log.start()
    try:
        await store.start()
        try:
            projector = make_projector(event_log, store)
            await projector.start()
            log.info("projector: caught up at position %d; following", projector.position)
            try:
                await asyncio.Event().wait()
            finally:
                await projector.close()
        finally:
            await store.close()
    finally:
        await event_log.close()


async def log_batches(event_log: EventLog, upto: int, chunk: int = REBUILD_CHUNK) -> AsyncIterator[Sequence[Event]]:
    """The log from the start up to position ``upto``, in chunks."""
    after = 0
    while after < upto:
        batch = [e for e in await event_log.read(after, limit=chunk) if (e.position or 0) <= upto]
        if not batch:
            return
        yield batch
        after = batch[-1].position or after


async def rebuild(event_log_url: str, store_url: str, data_dir: Path) -> dict[str, Any]:
    """Replay the whole log into a reset store (``hutch projections rebuild``), which is then
    bound to that log (the way to point a store at another log: see ``LogMismatch``).

    On PostgreSQL the reset and the replay are one transaction: readers keep the old state
    until the new one is complete, and a projector running meanwhile waits, then resumes
    from the rebuilt position."""
    event_log = open_event_log(event_log_url, data_dir, read_only=True)
    store = open_persistent_store(store_url)
    started = time.monotonic()
    await event_log.start()
    try:
        await store.start()
        try:
            identity = await event_log.identity()
            upto = await event_log.last_position()
            count = 0

            async def counted() -> AsyncIterator[Sequence[Event]]:
                nonlocal count
                async for batch in log_batches(event_log, upto):
                    count += len(batch)
                    yield batch

            if store.capabilities.atomic_rebuild:
                position = await store.rebuild(counted(), log_identity=identity)
            else:
                await store.reset()
                if identity is not None:
                    await store.bind_log(identity)
                async for batch in counted():
                    await store.apply(batch)
                position = await store.position()
            _, skipped = await store.skipped(limit=0)  # events the store refused, stepped over
        finally:
            await store.close()
    finally:
        await event_log.close()
    return {"events": count, "position": position, "skipped": skipped, "log": identity, "seconds": round(time.monotonic() - started, 3)}


async def run_audit(
    event_log_url: str,
    data_dir: Path,
    *,
    store_url: str | None = None,
    jsonl: Path | None = None,
    group: str = DEFAULT_GROUP,
    until_caught_up: bool = False,
    org: str | None = None,
) -> int:
    """Keep the audit trail (``hutch audit``; ``org``: only that organization's records).
    Returns how many records were written."""
    sinks: list[Sink] = []
    if store_url:
        sinks.append(PostgresSink(store_url))
    if jsonl:
        sinks.append(JsonlSink(jsonl))
    if not sinks:
        raise InvalidInput("audit: give --store postgresql://… and/or --jsonl PATH", field="store")
    event_log = open_event_log(event_log_url, data_dir, read_only=True)
    await event_log.start()
    try:
        auditor = Auditor(event_log, sinks, group=group, org=org)
        task = asyncio.create_task(auditor.run())
        try:
            if until_caught_up:
                caught_up = asyncio.create_task(auditor.caught_up.wait())
                done, _ = await asyncio.wait([task, caught_up], return_when=asyncio.FIRST_COMPLETED)
                caught_up.cancel()
                if task in done:
                    task.result()
            else:
                await task
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return auditor.written
    finally:
        await event_log.close()
