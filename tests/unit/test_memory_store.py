"""The embedded projection store keeps in memory what is alive, not everything it ever ran:
deleted sandboxes and their executions live in its on-disk archive (projections/ended.py).
The behaviour every backend shares is in tests/contracts/test_projection_store.py."""

from __future__ import annotations

import pytest

from hutch.core import ids
from hutch.core.events import (
    Event,
    ExecutionFinished,
    ExecutionStarted,
    SandboxCreated,
    SandboxStarted,
    SandboxTerminated,
)
from hutch.core.models import ExecutionStatus, SandboxSpec, SandboxStatus
from hutch.projections import base
from hutch.projections.base import SandboxQuery
from hutch.projections.memory import MemoryProjectionStore


def _events(n: int) -> list[Event]:
    out: list[Event] = []
    for i in range(n):
        sid = f"sbx_{i:05d}"
        spec = SandboxSpec(runtime="base:latest", runtime_id="srt_x", name=f"n{i}", org_id=f"org_{i % 3}")
        for data in (SandboxCreated(spec=spec), SandboxStarted(), ExecutionStarted(f"exec_{i:05d}", ("x",)),
                     ExecutionFinished(f"exec_{i:05d}", ExecutionStatus.COMPLETED, exit_code=0, duration_ms=1)):
            out.append(Event(ids.new_id("event"), sid, "2026-01-01T00:00:00.000Z", data, position=len(out) + 1))
        if i % 10:  # one sandbox in ten stays alive
            out.append(Event(ids.new_id("event"), sid, "2026-01-01T00:00:00.000Z",
                             SandboxTerminated(reason="done", deleted=True), position=len(out) + 1))
    return out


async def test_deleted_sandboxes_leave_memory_for_the_archive() -> None:
    store = MemoryProjectionStore()
    await store.apply(_events(2000))
    assert len(store._sandboxes) == 200 and len(store._executions) == 200 and len(store._by_sandbox) == 200
    assert store._ended.count == 1800
    _, total = await store.list_sandboxes(SandboxQuery(include_deleted=True, limit=1))
    assert total == 2000
    page, total = await store.list_sandboxes(SandboxQuery(deleted_only=True, org_id="org_1", limit=3,
                                                          sort="name", direction="asc"))
    assert total == 600 and [s.spec.name for s in page] == ["n1", "n1003", "n1006"]
    await store.close()


async def test_a_late_event_for_a_deleted_sandbox_is_folded_and_archived_again() -> None:
    store = MemoryProjectionStore()
    events = _events(2)  # sbx_00001 is deleted
    await store.apply(events)
    late = Event(ids.new_id("event"), "sbx_00001", "2026-01-01T00:00:01.000Z",
                 SandboxTerminated(reason="again", deleted=True), position=len(events) + 1)
    await store.apply([late])
    assert "sbx_00001" not in store._sandboxes and store._ended.count == 1
    sb = await store.get_sandbox("sbx_00001")
    assert sb is not None and sb.status is SandboxStatus.DELETED and sb.executions == 1
    assert [e.execution_id for e in await store.list_executions("sbx_00001")] == ["exec_00001"]
    assert await store.position() == len(events) + 1
    await store.close()


async def test_an_event_the_fold_raises_on_half_way_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sandbox evolves before its executions do: a fold that raises on the execution
    must not leave the sandbox evolved (a database would have rolled both back)."""
    store = MemoryProjectionStore()
    log = _events(1)[:3]  # created, started, exec_00000 started
    await store.apply(log)
    before = await store.get_sandbox("sbx_00000")
    finished = Event(ids.new_id("event"), "sbx_00000", "2026-01-01T00:00:01.000Z",
                     ExecutionFinished("exec_00000", ExecutionStatus.COMPLETED, exit_code=0, duration_ms=1), position=4)
    second = Event(ids.new_id("event"), "sbx_00000", "2026-01-01T00:00:01.000Z",
                   ExecutionStarted("exec_00001", ("y",)), position=5)

    def refuse(execution: object, event: Event) -> object:
        raise ValueError(f"malformed {event.type}")

    monkeypatch.setattr(base, "evolve_execution", refuse)
    await store.apply([finished, second])
    assert await store.get_sandbox("sbx_00000") == before
    assert [e.execution_id for e in await store.list_executions("sbx_00000")] == ["exec_00000"]
    assert store._by_sandbox["sbx_00000"] == ["exec_00000"]
    skipped, total = await store.skipped()
    assert total == 2 and [s.position for s in skipped] == [4, 5] and "ValueError: malformed" in skipped[0].error
    assert await store.position() == 5
