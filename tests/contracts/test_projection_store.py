"""The ProjectionStore contract, run against every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from core import ids
from core.events import (
    Event,
    ExecutionFinished,
    ExecutionStarted,
    SandboxCreated,
    SandboxStarted,
    SandboxTerminated,
)
from core.models import ExecutionStatus, Mode, SandboxSpec, SandboxStatus
from projections.base import ProjectionStore, SandboxQuery
from projections.memory import MemoryProjectionStore
from projections.postgres import PostgresProjectionStore
from tests.services import drop_database, fresh_database

BACKENDS = ["memory", "postgres"]


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[ProjectionStore]:
    database = None
    if request.param == "postgres":
        url, database = await fresh_database("store")
        s: ProjectionStore = PostgresProjectionStore(url)
    else:
        s = MemoryProjectionStore()
    await s.start()
    await s.reset()
    yield s
    await s.close()
    if database:
        await drop_database(database)


class Log:
    """Hands out positions like a log would."""

    def __init__(self) -> None:
        self.position = 0
        self.events: list[Event] = []

    def __call__(self, sandbox_id: str, data: object, at: str = "2026-01-01T00:00:00.000Z") -> Event:
        self.position += 1
        e = Event(ids.new_id("event"), sandbox_id, at, data, position=self.position)  # type: ignore[arg-type]
        self.events.append(e)
        return e


def created(name: str | None = None, mode: Mode = Mode.INTERACTIVE) -> SandboxCreated:
    return SandboxCreated(spec=SandboxSpec(runtime="base:latest", runtime_id="srt_x", name=name, mode=mode))


async def test_folds_a_sandbox_lifecycle(store: ProjectionStore) -> None:
    log = Log()
    await store.apply([log("sbx_1", created("one")), log("sbx_1", SandboxStarted())])
    sb = await store.get_sandbox("sbx_1")
    assert sb is not None and sb.status is SandboxStatus.IDLE and sb.spec.name == "one"
    await store.apply([log("sbx_1", ExecutionStarted("exec_1", ("ls",)))])
    sb = await store.get_sandbox("sbx_1")
    assert sb is not None and sb.status is SandboxStatus.RUNNING and sb.executions == 1
    await store.apply([log("sbx_1", ExecutionFinished("exec_1", ExecutionStatus.COMPLETED, exit_code=3, duration_ms=5))])
    sb = await store.get_sandbox("sbx_1")
    ex = await store.get_execution("exec_1")
    assert sb is not None and sb.status is SandboxStatus.IDLE
    assert ex is not None and ex.status is ExecutionStatus.COMPLETED and ex.exit_code == 3 and ex.command == ("ls",)
    assert await store.position() == log.position


async def test_applying_the_same_events_twice_changes_nothing(store: ProjectionStore) -> None:
    log = Log()
    batch = [log("sbx_1", created()), log("sbx_1", SandboxStarted()), log("sbx_1", ExecutionStarted("exec_1", ("a",)))]
    await store.apply(batch)
    await store.apply(batch)  # a replay after a crash
    sb = await store.get_sandbox("sbx_1")
    assert sb is not None and sb.executions == 1
    assert len(await store.list_executions("sbx_1")) == 1
    assert await store.position() == 3


async def test_terminating_a_sandbox_ends_its_running_executions(store: ProjectionStore) -> None:
    log = Log()
    await store.apply([log("sbx_1", created()), log("sbx_1", SandboxStarted()),
                       log("sbx_1", ExecutionStarted("exec_1", ("sleep", "9"))),
                       log("sbx_1", SandboxTerminated(reason="host restarted"))])
    ex = await store.get_execution("exec_1")
    assert ex is not None and ex.status is ExecutionStatus.CANCELLED and "host restarted" in (ex.error or "")


async def test_list_filters_sorts_and_pages(store: ProjectionStore) -> None:
    log = Log()
    for i in range(5):
        sid = f"sbx_{i}"
        await store.apply([log(sid, created(f"n{i}", Mode.ONESHOT if i == 0 else Mode.INTERACTIVE), at=f"2026-01-01T00:00:0{i}.000Z"),
                           log(sid, SandboxStarted(), at=f"2026-01-01T00:00:0{i}.000Z")])
    await store.apply([log("sbx_4", SandboxTerminated(reason="done", deleted=True))])
    page, total = await store.list_sandboxes(SandboxQuery(limit=2))
    assert total == 4 and [s.sandbox_id for s in page] == ["sbx_3", "sbx_2"]
    page, _ = await store.list_sandboxes(SandboxQuery(limit=2, offset=2, direction="asc"))
    assert [s.sandbox_id for s in page] == ["sbx_2", "sbx_3"]
    page, total = await store.list_sandboxes(SandboxQuery(mode="oneshot"))
    assert total == 1 and page[0].sandbox_id == "sbx_0"
    page, total = await store.list_sandboxes(SandboxQuery(deleted_only=True))
    assert [s.sandbox_id for s in page] == ["sbx_4"]
    page, total = await store.list_sandboxes(SandboxQuery(name="n2"))
    assert [s.sandbox_id for s in page] == ["sbx_2"]
    _, total = await store.list_sandboxes(SandboxQuery(live=False))
    assert total == 0


async def test_executions_are_listed_newest_first_with_limit(store: ProjectionStore) -> None:
    log = Log()
    await store.apply([log("sbx_1", created()), log("sbx_1", SandboxStarted())])
    for i in range(4):
        await store.apply([log("sbx_1", ExecutionStarted(f"exec_{i}", ("x",)))])
    assert [e.execution_id for e in await store.list_executions("sbx_1", limit=2)] == ["exec_3", "exec_2"]
    assert await store.list_executions("sbx_nope") == []


async def test_reset_then_rebuild_gives_the_same_state(store: ProjectionStore) -> None:
    log = Log()
    await store.apply([log("sbx_1", created()), log("sbx_1", SandboxStarted()),
                       log("sbx_1", ExecutionStarted("exec_1", ("a",))),
                       log("sbx_1", ExecutionFinished("exec_1", ExecutionStatus.TIMEOUT, exit_code=124))])
    before = (await store.get_sandbox("sbx_1"), await store.get_execution("exec_1"))
    await store.reset()
    assert await store.position() == 0 and await store.get_sandbox("sbx_1") is None
    await store.apply(log.events)
    assert (await store.get_sandbox("sbx_1"), await store.get_execution("exec_1")) == before
