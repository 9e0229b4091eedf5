"""service.recorder: the one way commands become events, on the embedded log and the memory store."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from hutch.core import counters, lifecycle
from hutch.core.errors import (
    IllegalTransition,
    InvalidInput,
    ProjectionUnavailable,
    SandboxNotFound,
    SnapshotNotFound,
)
from hutch.core.events import SandboxEnvChanged
from hutch.core.lifecycle import ChangeEnv, Create, FinishExecution, Start, StartExecution
from hutch.core.models import ExecutionStatus, Mode, SandboxSpec, SandboxStatus, SnapshotStatus
from hutch.core.snapshots import BeginBuild, DeleteSnapshot
from hutch.eventlog.sqlite import SqliteEventLog
from hutch.projections.memory import MemoryProjectionStore
from hutch.projections.runner import Projector
from hutch.service.reads import Reads
from hutch.service.recorder import Recorder

Parts = tuple[Recorder, Reads, SqliteEventLog]


def _appends() -> int:
    return sum(v for name, _, v in counters.counts() if name == "hutch_eventlog_appends_total")


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Parts]:
    event_log, store = SqliteEventLog(tmp_path / "events.db"), MemoryProjectionStore()
    await event_log.start()
    projector = Projector(event_log, store)
    await projector.start()
    reads = Reads(store, event_log, projector)
    yield Recorder(event_log, store, projector, reads), reads, event_log
    await projector.close()
    await event_log.close()


async def test_a_command_is_decided_appended_and_readable_at_once(parts: Parts) -> None:
    recorder, reads, event_log = parts
    spec = SandboxSpec(runtime="base:latest", runtime_id="srt", org_id="org_acme")
    with pytest.raises(SandboxNotFound):  # nothing but a create lands on an unrecorded id
        await recorder.command("sbx_1", Start())
    [created] = await recorder.command("sbx_1", Create(spec=spec))
    assert created.type == "create" and created.org == "org_acme"
    assert (await reads.require("sbx_1")).status is SandboxStatus.CREATING  # read-your-writes
    [started] = await recorder.command("sbx_1", Start())
    assert started.position is not None and started.org == "org_acme"
    assert (await reads.require("sbx_1")).status is SandboxStatus.IDLE  # read-your-writes
    await recorder.command("sbx_1", ChangeEnv(set={"A": "1"}))
    assert (await reads.require("sbx_1")).spec.env == {"A": "1"}
    before = await event_log.last_position()
    with pytest.raises(IllegalTransition, match="sandbox sbx_1 is idle"):  # an id is used once
        await recorder.command("sbx_1", Create(spec=spec))
    assert await event_log.last_position() == before


async def test_commands_in_one_append_are_recorded_all_or_nothing(parts: Parts) -> None:
    """A create's Start and its command's StartExecution go to the log as one append: durable
    once (the command may start), both projected, or neither written when one is refused."""
    recorder, reads, event_log = parts
    spec = SandboxSpec(runtime="base:latest", runtime_id="srt", org_id="org_acme", mode=Mode.ONESHOT)
    await recorder.command("sbx_1", Create(spec=spec))
    before = await event_log.last_position()
    with pytest.raises(IllegalTransition, match="execute in a oneshot sandbox"):
        await recorder.command_many("sbx_1", [Start(), StartExecution("exe_1", ("a",)), StartExecution("exe_2", ("b",))])
    assert await event_log.last_position() == before  # the Start the refusal came after is not written
    assert (await reads.require("sbx_1")).status is SandboxStatus.CREATING
    appends = _appends()
    durable: list[int] = []
    started, running = await recorder.command_many("sbx_1", [Start(), StartExecution("exe_1", ("true",))],
                                                   durable=durable.append)
    assert _appends() == appends + 1
    assert (started.type, running.type) == ("lifecycle:started", "execution:started")
    assert started.org == running.org == "org_acme"
    assert durable == [running.position] and started.position == running.position - 1  # type: ignore[operator]
    sb = await reads.require("sbx_1")  # read-your-writes: both applied
    assert sb.status is SandboxStatus.RUNNING and sb.running == {"exe_1"}


async def test_an_event_that_does_not_survive_a_round_trip_is_refused(parts: Parts) -> None:
    recorder, _, event_log = parts
    odd = SandboxEnvChanged(set={"A": 1})  # type: ignore[dict-item]  # an int reads back as "1"
    with pytest.raises(InvalidInput, match="does not survive serialisation"):
        await recorder.record("org_acme", lambda: [odd])
    assert await event_log.last_position() == 0


async def test_an_event_that_cannot_be_encoded_is_refused_by_name(parts: Parts) -> None:
    """JSON has no bytes: the encoding's TypeError was a 500; it is the same refusal."""
    recorder, _, event_log = parts
    odd = SandboxEnvChanged(set={"A": b"1"})  # type: ignore[dict-item]
    with pytest.raises(InvalidInput, match="env: event does not survive serialisation"):
        await recorder.record("org_acme", lambda: [odd])
    assert await event_log.last_position() == 0


def _event_dumps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The event ids of every event record JSON-encoded from now on, one per encoding."""
    seen: list[str] = []
    dumps = json.dumps

    def counting(obj: Any, *args: Any, **kwargs: Any) -> str:
        if isinstance(obj, dict) and "eventId" in obj:
            seen.append(obj["eventId"])
        return dumps(obj, *args, **kwargs)

    monkeypatch.setattr(json, "dumps", counting)
    return seen


async def test_each_event_is_encoded_once_for_the_check_the_quota_and_the_log(
        parts: Parts, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 37: the round-trip check, the quota's size and the log's write were three
    encodings of every event on the request path; they share one. The log is handed the
    records (``Encoded``) and writes those bytes; the quota is told their length."""
    recorder, reads, event_log = parts
    metered: list[int] = []

    async def meter(org: str, size: int, refuse: bool) -> None:
        metered.append(size)

    recorder.meter = meter
    handed: list[Sequence[object]] = []
    append = event_log.append

    async def spying(events: Sequence[Any]) -> list[int]:
        handed.append(list(events))
        return await append(events)

    monkeypatch.setattr(event_log, "append", spying)
    spec = SandboxSpec(runtime="base:latest", runtime_id="srt", org_id="org_acme", mode=Mode.ONESHOT)
    seen = _event_dumps(monkeypatch)
    events = await recorder.command_many("sbx_1", [Create(spec=spec), Start(), StartExecution("exe_1", ("true",))],
                                         minted=True)
    ids = [e.event_id for e in events]
    # It was five times each: the check, the quota, the log, and the folds of the store and of
    # Reads' own copy (each counts a sandbox's bytes in the log: SandboxState.log_bytes).
    assert sorted(seen) == sorted(ids)
    [records] = handed
    assert [type(r).__name__ for r in records] == ["Encoded"] * 3  # core.events.Encoded
    assert metered == [sum(len(r.record) for r in records)]  # type: ignore[attr-defined]
    stored = await event_log.read(0)
    size = sum(len(r.record) for r in records)  # type: ignore[attr-defined]
    assert (await reads.require("sbx_1")).log_bytes == size == sum(lifecycle.recorded_size(e) for e in stored)
    assert (await reads.store.get_sandbox("sbx_1")).log_bytes == size  # type: ignore[union-attr]
    assert [e.event_id for e in stored] == ids
    seen.clear()
    await recorder.record("org_acme", lambda: [SandboxEnvChanged(set={"A": "1"})])
    assert len(seen) == 1  # unmetered: it was two, the check's and the log's


async def test_snapshot_commands_are_decided_in_core(parts: Parts) -> None:
    recorder, reads, event_log = parts
    with pytest.raises(SnapshotNotFound, match="snapshot snp_1 not found"):
        await recorder.snapshot("snp_1", DeleteSnapshot())
    assert await event_log.last_position() == 0
    await recorder.snapshot("snp_1", BeginBuild(name="app", runtime="base:latest", runtime_id="srt", tag="v1",
                                                org_id="org_acme"))
    [deleted] = await recorder.snapshot("snp_1", DeleteSnapshot())
    assert deleted.org == "org_acme"
    snap = await reads.store.get_snapshot("snp_1")
    assert snap is not None and snap.status is SnapshotStatus.DELETED


class FlakyStore(MemoryProjectionStore):
    """A memory store that is away while ``away`` is set (its applies fail and are retried)."""

    away = False

    async def apply(self, events):  # type: ignore[no-untyped-def]
        if self.away:
            raise ConnectionError("the store is away")
        return await super().apply(events)


class ImpatientProjector(Projector):
    """A request gives up on a store that is away after 30 s: how long is not under test here,
    and 1 s shows the same (the test took 31 s)."""

    async def wait_for(self, position: int, timeout: float = 1.0, *, what: str = "") -> None:
        await super().wait_for(position, timeout, what=what)


async def test_what_follows_a_launched_start_waits_until_the_store_shows_it(tmp_path: Path) -> None:
    """A command launched once its start is in the log (``durable``) runs on when the store is
    away and the request fails; ``settled`` holds its end back until the store shows the start,
    so the end is not refused as "not running"."""
    event_log, store = SqliteEventLog(tmp_path / "events.db"), FlakyStore()
    await event_log.start()
    projector = ImpatientProjector(event_log, store)
    await projector.start()
    recorder = Recorder(event_log, store, projector, Reads(store, event_log, projector))
    try:
        spec = SandboxSpec(runtime="base:latest", runtime_id="srt")
        await recorder.command("sbx_1", Create(spec=spec))
        await recorder.command("sbx_1", Start())
        store.away = True
        launched: list[int] = []
        with pytest.raises(ProjectionUnavailable):
            async with asyncio.timeout(40):
                await recorder.command("sbx_1", StartExecution("exe_1", ("true",)), durable=launched.append)
        assert launched, "the command was launched once its start was in the log"
        waiting = asyncio.create_task(recorder.settled(launched[0]))
        await asyncio.sleep(1.5)  # past the projector's patience: settled waits on through it
        assert not waiting.done(), "settled returned while the store did not show the start"
        store.away = False
        await asyncio.wait_for(waiting, 10)
        await recorder.command("sbx_1", FinishExecution("exe_1", ExecutionStatus.COMPLETED, exit_code=0))
        assert (await store.get_execution("exe_1")).status is ExecutionStatus.COMPLETED  # type: ignore[union-attr]
    finally:
        await projector.close()
        await event_log.close()
