"""Sandboxes stored before durations were capped (eece1c6: at most 36500d where given) may hold
a timeout no date reaches (``"999999999999d"``, or 400 nines, infinity to Python). One such
sandbox must spoil nothing else: the reaper still ends every other tenant's sandboxes at their
timeouts, and a listing still lists. Each is stored as an older server stored it: through the
API with the cap lifted."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from hutch.api.e2b.access import wire_id
from hutch.api.e2b.server import create_e2b_app
from hutch.api.keys import ENGINE, TENANTS
from hutch.core import quantities
from hutch.core.errors import HutchError, InvalidInput
from hutch.core.models import SandboxState
from hutch.service.timeouts import Reaper
from tests.api.conftest import KEY, STORE, Api, AppFactory


@pytest.fixture
def driver_name() -> str:
    return "fake"


@contextlib.contextmanager
def before_the_cap() -> Iterator[None]:
    """A server from before eece1c6: a duration's form was checked, not its size."""
    kept = quantities.MAX_DURATION_DAYS
    quantities.MAX_DURATION_DAYS = 10**1000
    try:
        yield
    finally:
        quantities.MAX_DURATION_DAYS = kept


async def made(api: Api, **body: Any) -> str:
    return str((await api.data("POST", "/sandbox", json=body, expect=201))["sandboxId"])


async def status(api: Api, sid: str, wait: str = "terminated", ms: int = 6000) -> str:
    found = await api.data("GET", f"/sandbox/status/{sid}?waitForStatus={wait}&waitMs={ms}")
    return str(found["status"])


@contextlib.asynccontextmanager
async def restarted_reaper(engine: Any, read: Callable[[str], Awaitable[SandboxState | None]] | None = None
                           ) -> AsyncIterator[asyncio.Task[None]]:
    """The server's reaper stopped, as at a restart, and a new one watching (its task), reading
    sandboxes through ``read`` (the engine's reads if None); stopped at the end."""
    next(t for t in asyncio.all_tasks() if t.get_name() == "timeouts").cancel()
    engine.reaper.close()
    reaper = Reaper(engine.parts.store, engine.parts.projector, engine.background, engine.control,
                    read=read or engine.reads.sandbox)
    task = asyncio.create_task(reaper.watch())
    try:
        yield task
    finally:
        task.cancel()
        reaper.close()


@pytest.mark.runs_on(*STORE)  # the reaper's listing over either store
@pytest.mark.parametrize("error", [
    OverflowError("date value out of range"),  # a deadline past any date: not a HutchError
    InvalidInput("timeout.idle: a duration of at most 36500d", field="timeout.idle"),
])
async def test_one_sandbox_the_reaper_cannot_schedule_stops_no_other_timeout(
        make_api: AppFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        error: Exception) -> None:
    """The reaper's start (a restart's) lists the live sandboxes and schedules each: one whose
    schedule raised held the whole listing (retried every second, forever; or, an error not
    hutch's, ended the watch), so no sandbox of any tenant was reaped. The error stands for
    any (a value stored before the cap read as one, eece1c6): it is injected for that sandbox."""
    api = await make_api()
    engine = api.client.server.app[ENGINE]
    first = await made(api, timeout={"idle": "1s"})  # listed before it or after it, whatever the order
    with before_the_cap():
        bad = await made(api, timeout={"idle": "999999999999d"})
    last = await made(api, timeout={"idle": "1s"})
    deadline = Reaper.deadline

    def failing(self: Reaper, sb: SandboxState) -> tuple[float, str] | None:
        if sb.sandbox_id == bad:
            raise error
        return deadline(self, sb)

    monkeypatch.setattr(Reaper, "deadline", failing)
    caplog.set_level(logging.WARNING, logger="hutch.service")
    async with restarted_reaper(engine) as task:  # a new one lists the live sandboxes
        assert [await status(api, good) for good in (first, last)] == ["terminated"] * 2
        await api.call("PATCH", f"/sandbox/env/{bad}", json={"env": {"A": "1"}})  # an event: rescheduled
        await asyncio.sleep(1.2)  # a retry loop's second or third turn
        assert not task.done(), task
        assert await status(api, bad, "running", 10) == "idle"
    said = [r.getMessage() for r in caplog.records if bad in r.getMessage()]
    assert len(said) == 1 and str(error) in said[0], said  # at the listing; the event's the same, unsaid



@pytest.mark.runs_on("fake-embedded")  # the reaper's own retry, over the engine's reads
async def test_a_sandbox_whose_read_fails_is_retried_alone_backing_off(
        make_api: AppFactory, caplog: pytest.LogCaptureFixture) -> None:
    """An event whose sandbox could not be read was re-queued after a 0.5 s sleep of the whole
    watch, forever, and said so each time: a read that always fails (injected, for one sandbox)
    was a warning every half second. Now it is retried on its own, backing off, said once."""
    api = await make_api()
    engine = api.client.server.app[ENGINE]
    bad = await made(api)
    reads: list[float] = []

    async def read(sandbox_id: str) -> SandboxState | None:
        if sandbox_id == bad:
            reads.append(asyncio.get_running_loop().time())
            raise HutchError("the store is away", status=503)
        return await engine.reads.sandbox(sandbox_id)

    caplog.set_level(logging.WARNING, logger="hutch.service")
    async with restarted_reaper(engine, read) as task:
        await asyncio.sleep(0.1)  # listed: from the listing, no read
        await api.call("PATCH", f"/sandbox/env/{bad}", json={"env": {"A": "1"}})  # an event: a read that fails
        good = await made(api, timeout={"idle": "1s"})  # its events are not held behind the failing one's
        assert await status(api, good) == "terminated"
        await asyncio.sleep(2.5)
        assert not task.done(), task
    # ~3.5 s after its event: read at 0, 0.5, 1.5, 3.5 s (every 0.5 s, it was 8 reads)
    assert 2 <= len(reads) <= 5, [round(t - reads[0], 2) for t in reads]
    said = [r.getMessage() for r in caplog.records if bad in r.getMessage()]
    assert len(said) == 1 and "the store is away" in said[0], said

@pytest.mark.runs_on("fake-embedded")  # the reaper's own listing retry
async def test_a_listing_that_fails_in_the_stores_own_words_is_retried(
        make_api: AppFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The reaper's start lists the live sandboxes, retrying while the store is away; an error
    the store did not translate into hutch's (a connection reset, asyncpg's own) ended the
    watch there, and no timeout of any sandbox was kept from then on. Injected once."""
    api = await make_api()
    engine = api.client.server.app[ENGINE]
    good = await made(api, timeout={"idle": "1s"})
    store = engine.parts.store
    listing = store.list_sandboxes
    failures = [ConnectionResetError("connection reset by peer")]

    async def list_sandboxes(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return await listing(*args, **kwargs)

    monkeypatch.setattr(store, "list_sandboxes", list_sandboxes)
    caplog.set_level(logging.WARNING, logger="hutch.service")
    async with restarted_reaper(engine) as task:
        assert await status(api, good) == "terminated"
        assert not task.done(), task
    assert any("connection reset by peer" in r.getMessage() for r in caplog.records)


@pytest.mark.runs_on("fake-embedded")  # the reaper's own retry of a reap
async def test_a_reap_that_fails_is_tried_again(make_api: AppFactory, caplog: pytest.LogCaptureFixture) -> None:
    """A sandbox's timer fired and its reap failed (its read, the store away a moment; or the
    end itself): the task died with the timer spent, and the sandbox outlived its timeout until
    an event of its own came, if any did. Now the reap is tried again, backing off. Injected:
    the reap's read fails once."""
    api = await make_api()
    engine = api.client.server.app[ENGINE]
    sid = await made(api, timeout={"idle": "1s"})
    failures = [HutchError("the store is away", status=503)]

    async def read(sandbox_id: str) -> SandboxState | None:
        if sandbox_id == sid and failures:
            raise failures.pop()
        return await engine.reads.sandbox(sandbox_id)

    caplog.set_level(logging.WARNING, logger="hutch.service")
    async with restarted_reaper(engine, read):
        assert await status(api, sid) == "terminated"  # listed (no read), then its reap read it
        assert not failures
    assert any(sid in r.getMessage() and "the store is away" in r.getMessage() for r in caplog.records)


@pytest.mark.runs_on(*STORE)  # read back from either store
async def test_a_sandbox_stored_past_the_cap_is_listed_viewed_paused_and_runs(make_api: AppFactory,
                                                                           aiohttp_client: Any) -> None:
    """E2B's end time of such a sandbox (``endAt``: a date-time, required) was a 400 naming
    ``timeout.idle``, and so the tenant's whole listing, on both listing routes, while one
    existed; its pause and its commands were 400s naming ``timeout.paused`` and
    ``timeout.execution``, fields no call can change. A value past the cap is read as the cap."""
    api = await make_api()
    e2b = await aiohttp_client(create_e2b_app(api.client.server.app[ENGINE], api.client.server.app[TENANTS]))
    key = {"X-API-Key": KEY}
    with before_the_cap():
        bad = await made(api, timeout={"idle": "9" * 400 + "d", "paused": "999999999999d",
                                       "execution": "3000000d"})
    other = await made(api, timeout={"idle": "5m"})
    for path in ("/sandboxes", "/v2/sandboxes"):
        resp = await e2b.get(path, headers=key)
        listed = await resp.json()
        assert resp.status == 200, (path, listed)
        ends = {s["sandboxID"]: dt.datetime.fromisoformat(s["endAt"]) for s in listed}
        assert set(ends) == {wire_id(bad), wire_id(other)}, listed
        far = ends[wire_id(bad)] - dt.datetime.now(dt.UTC)
        assert dt.timedelta(days=36499) < far <= dt.timedelta(days=36500), ends
    resp = await e2b.get(f"/sandboxes/{wire_id(bad)}", headers=key)
    assert resp.status == 200, await resp.json()
    ran = await api.data("POST", f"/sandbox/{bad}/execute", json={"command": ["true"]})
    assert (await api.wait_execution(ran["executionId"]))["status"] == "completed"
    resp = await e2b.post(f"/sandboxes/{wire_id(bad)}/pause", headers=key)
    assert resp.status == 204, await resp.text()
    assert await status(api, bad, "paused", 10) == "paused"
