"""The PostgreSQL projection store folds a batch that touches only what it wrote last without
reading it back (projections/postgres_mirror.py), and never from rows the store no longer
holds: another projector's write in between sends it back to the store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest

from hutch.core import counters
from hutch.core.events import (
    Event,
    ExecutionFinished,
    ExecutionStarted,
    SandboxEnvChanged,
    SandboxStarted,
    SandboxTerminated,
)
from hutch.core.models import ExecutionStatus, Mode
from hutch.projections import postgres_mirror
from hutch.projections.memory import MemoryProjectionStore
from hutch.projections.postgres import PostgresProjectionStore
from tests.contracts.test_projection_store import Log, created
from tests.services import drop_database, fresh_database


@pytest.fixture
async def database() -> AsyncIterator[str]:
    url, name = await fresh_database("pgmirror")
    yield url
    await drop_database(name)


def _loads() -> int:
    return sum(value for name, labels, value in counters.counts()
               if name == "hutch_store_statements_total" and labels.get("store") == "projection store"
               and labels.get("kind") == "select projection_position")


async def _same_as_a_fold(stores: Sequence[PostgresProjectionStore], events: list[Event],
                          sandbox_ids: Sequence[str]) -> None:
    """What each store reads back is what the in-memory fold of every event gives."""
    reference = MemoryProjectionStore()
    await reference.apply(events)
    for store in stores:
        assert await store.position() == events[-1].position
        for sid in sandbox_ids:
            assert await store.get_sandbox(sid) == await reference.get_sandbox(sid)
            assert await store.list_executions(sid) == await reference.list_executions(sid)


async def test_a_oneshots_later_batches_are_folded_from_its_own_writes(database: str) -> None:
    store = PostgresProjectionStore(database)
    await store.start()
    try:
        log = Log()
        sid = "sbx_one"
        batches = [
            [log(sid, created(mode=Mode.ONESHOT))],
            [log(sid, SandboxStarted()), log(sid, ExecutionStarted("exec_1", ("true",)))],
            [log(sid, ExecutionFinished("exec_1", ExecutionStatus.COMPLETED, exit_code=0))],
            [log(sid, SandboxTerminated(reason="oneshot done"))],
        ]
        before = _loads()
        for batch in batches:
            await store.apply(batch)
        # The create is read (nothing under its id); the three after it are not.
        assert _loads() - before == 1
        await _same_as_a_fold([store], log.events, [sid])
    finally:
        await store.close()


async def test_a_write_by_another_projector_in_between_is_read_not_overwritten(database: str) -> None:
    """Store A holds sandbox 1 as it wrote it; B (another replica's projector) then applies an
    env change and a command's start to it. A, handed those and a later event, must fold the
    later one into B's rows: its own copy is stale, so it reads the store again."""
    a, b = PostgresProjectionStore(database), PostgresProjectionStore(database)
    await a.start()
    await b.start()
    try:
        log = Log()
        sid = "sbx_1"
        first = [log(sid, created()), log(sid, SandboxStarted())]
        await a.apply(first)
        await a.apply([log(sid, SandboxEnvChanged(set={"A": "1"}))])  # from A's own copy
        by_b = [log(sid, SandboxEnvChanged(set={"B": "2"})), log(sid, ExecutionStarted("exec_b", ("sleep", "9")))]
        await b.apply(log.events)  # B catches up with the whole log, A's part already applied
        later = [log(sid, SandboxTerminated(reason="gone"))]  # ends B's running execution too
        before = _loads()
        await a.apply([*by_b, *later])
        assert _loads() - before >= 1  # A looked at the store again
        await _same_as_a_fold([a, b], log.events, [sid])
        sb = await a.get_sandbox(sid)
        assert sb is not None and sb.spec.env == {"A": "1", "B": "2"} and sb.status.value == "terminated"
        (ex,) = await b.list_executions(sid)
        assert ex.execution_id == "exec_b" and ex.status.is_final
        # And A's next batches are its own again: folded without a read.
        again = [log("sbx_2", created()), log("sbx_2", SandboxStarted())]
        await a.apply(again[:1])
        before = _loads()
        await a.apply(again[1:])
        assert _loads() == before
        await _same_as_a_fold([a, b], log.events, [sid, "sbx_2"])
    finally:
        await a.close()
        await b.close()


async def test_an_execution_it_did_not_see_start_is_read_from_the_store(database: str) -> None:
    """A sandbox A loaded (it existed before A saw it) may have executions A never saw; an
    event naming one of them is folded from the store's row, not as a new execution."""
    a, b = PostgresProjectionStore(database), PostgresProjectionStore(database)
    await a.start()
    await b.start()
    try:
        log = Log()
        sid = "sbx_1"
        await b.apply([log(sid, created()), log(sid, SandboxStarted()), log(sid, ExecutionStarted("exec_1", ("x",))),
                       log(sid, ExecutionFinished("exec_1", ExecutionStatus.COMPLETED, exit_code=0))])
        await a.apply([log(sid, SandboxEnvChanged(set={"A": "1"}))])  # A loads sbx_1: exec_1 is final
        before = _loads()
        await a.apply([log(sid, ExecutionFinished("exec_1", ExecutionStatus.FAILED, error="late"))])
        assert _loads() - before == 1
        await a.apply([log(sid, ExecutionStarted("exec_2", ("y",)))])  # not known to be new: read
        assert _loads() - before == 2
        await _same_as_a_fold([a, b], log.events, [sid])
    finally:
        await a.close()
        await b.close()


async def test_a_rebuild_leaves_nothing_held(database: str) -> None:
    store = PostgresProjectionStore(database)
    await store.start()
    try:
        log = Log()
        await store.apply([log("sbx_1", created()), log("sbx_1", SandboxStarted())])
        await store.rebuild([log.events], log_identity="log-a")
        before = _loads()
        await store.apply([log("sbx_1", SandboxEnvChanged(set={"A": "1"}))])
        assert _loads() - before == 1
        sb = await store.get_sandbox("sbx_1")
        assert sb is not None and sb.spec.env == {"A": "1"}
    finally:
        await store.close()


async def test_it_holds_a_bounded_number_of_sandboxes_the_latest_written(database: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres_mirror, "LIMIT", 10)
    store = PostgresProjectionStore(database)
    await store.start()
    try:
        log = Log()
        for i in range(postgres_mirror.LIMIT + 5):
            await store.apply([log(f"sbx_{i}", created()), log(f"sbx_{i}", SandboxStarted())])
        held = store._mirror._held
        assert len(held) == postgres_mirror.LIMIT and "sbx_0" not in held and f"sbx_{postgres_mirror.LIMIT + 4}" in held
        before = _loads()
        await store.apply([log("sbx_5", SandboxEnvChanged(set={"A": "1"}))])  # held: no read
        await store.apply([log("sbx_0", SandboxEnvChanged(set={"A": "1"}))])  # dropped: read again
        assert _loads() - before == 1
        assert list(held)[-2:] == ["sbx_5", "sbx_0"]
        await _same_as_a_fold([store], log.events, ["sbx_0", "sbx_5"])
    finally:
        await store.close()


async def test_a_create_is_folded_as_new_only_if_the_store_has_nothing_of_it(database: str) -> None:
    """A sandbox created in the batch needs no read, on the WRITE's condition that the store
    has no row of it: a create appended twice under one id (another projector wrote the first)
    is read and folded as a LOAD would have."""
    a, b = PostgresProjectionStore(database), PostgresProjectionStore(database)
    await a.start()
    await b.start()
    try:
        log = Log()
        await a.apply([log("sbx_1", created()), log("sbx_1", SandboxStarted())])  # the first batch reads
        before = _loads()
        await a.apply([log("sbx_2", created()), log("sbx_2", SandboxStarted()),
                       log("sbx_2", ExecutionStarted("exec_1", ("sleep", "9")))])
        assert _loads() == before  # new: nothing to read
        await b.apply(log.events)
        # B holds sbx_2 as loaded by nobody: a second create of it, then an end that must
        # finish the execution the first one left running.
        await b.apply([log("sbx_9", created())])
        again = [log("sbx_2", created("again")), log("sbx_2", SandboxTerminated(reason="x"))]
        before = _loads()
        await b.apply(again)
        assert _loads() - before == 1  # the condition failed: read, as before the mirror
        await _same_as_a_fold([a, b], log.events, ["sbx_1", "sbx_2", "sbx_9"])
        (ex,) = await b.list_executions("sbx_2")
        assert ex.status.is_final
    finally:
        await a.close()
        await b.close()


async def test_a_sandbox_with_many_commands_is_not_remembered_command_by_command(
        database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past FINISHED_LIMIT final executions a sandbox's ids are forgotten: a new command's
    start is then read from the store, and an old one's late event folds as a LOAD would."""
    monkeypatch.setattr(postgres_mirror, "FINISHED_LIMIT", 3)
    store = PostgresProjectionStore(database)
    await store.start()
    try:
        log = Log()
        sid = "sbx_1"
        await store.apply([log(sid, created()), log(sid, SandboxStarted())])
        for i in range(4):
            await store.apply([log(sid, ExecutionStarted(f"exec_{i}", ("x",)))])
            await store.apply([log(sid, ExecutionFinished(f"exec_{i}", ExecutionStatus.COMPLETED, exit_code=0))])
        assert len(store._mirror._held[sid].finished) == 0
        before = _loads()
        await store.apply([log(sid, ExecutionFinished("exec_0", ExecutionStatus.FAILED, error="late"))])
        await store.apply([log(sid, ExecutionStarted("exec_9", ("y",)))])
        assert _loads() - before == 2
        await _same_as_a_fold([store], log.events, [sid])
    finally:
        await store.close()
