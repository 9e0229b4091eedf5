"""The ProjectionStore contract, run against every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from hutch.core import ids
from hutch.core.errors import NotSupported
from hutch.core.events import (
    Event,
    EventData,
    ExecutionFinished,
    ExecutionStarted,
    SandboxCreated,
    SandboxDiscarded,
    SandboxEnvChanged,
    SandboxStarted,
    SandboxTerminated,
    SnapshotCreated,
    SnapshotDeleted,
    SnapshotFinalized,
    SnapshotTagged,
    decode_or_unreadable,
    recorded_size,
)
from hutch.core.models import (
    ExecutionStatus,
    Mode,
    SandboxSpec,
    SandboxStatus,
    SnapshotFile,
    SnapshotStatus,
)
from hutch.projections.base import ProjectionStore, SandboxQuery, SnapshotQuery, StoreCapabilities
from hutch.service.composition import open_store
from tests.services import drop_database, fresh_database

BACKENDS = ["memory", "postgres"]


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[ProjectionStore]:
    database = None
    if request.param == "postgres":
        url, database = await fresh_database("store")
        s = open_store(url)
    else:
        s = open_store("memory")
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

    def __call__(self, sandbox_id: str, data: EventData, at: str = "2026-01-01T00:00:00.000Z") -> Event:
        self.position += 1
        e = Event(ids.new_id("event"), sandbox_id, at, data, position=self.position)
        self.events.append(e)
        return e


def created(name: str | None = None, mode: Mode = Mode.INTERACTIVE) -> SandboxCreated:
    return SandboxCreated(spec=SandboxSpec(runtime="base:latest", runtime_id="srt_x", name=name, mode=mode))


# What each backend declares it can do beyond the port's required methods, and the optional
# method each flag stands for. A backend declares a flag exactly when it implements the method.
DECLARED = {
    "MemoryProjectionStore": StoreCapabilities(),
    "PostgresProjectionStore": StoreCapabilities(shared=True, atomic_rebuild=True),
}
OPTIONAL_METHODS = {"shared": "wait_for", "atomic_rebuild": "rebuild"}


async def test_declares_exactly_what_it_implements(store: ProjectionStore) -> None:
    assert store.capabilities == DECLARED[type(store).__name__]
    assert set(OPTIONAL_METHODS) == {f.name for f in StoreCapabilities.__attrs_attrs__}
    for flag, method in OPTIONAL_METHODS.items():
        implemented = getattr(type(store), method) is not getattr(ProjectionStore, method)
        assert getattr(store.capabilities, flag) == implemented, (flag, method)
    log = Log()
    batch = [log("sbx_1", created("one")), log("sbx_1", SandboxStarted())]
    if store.capabilities.atomic_rebuild:
        assert await store.rebuild([batch], log_identity="log-a") == log.position
        assert await store.log_identity() == "log-a"
    else:
        with pytest.raises(NotSupported):
            await store.rebuild([batch], log_identity="log-a")
        await store.apply(batch)
    if store.capabilities.shared:
        await store.wait_for(log.position, timeout=5)  # applied already: returns at once
    else:
        with pytest.raises(NotSupported):
            await store.wait_for(log.position, timeout=5)
    assert await store.position() == log.position


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


LOST = "the replica running it (r1) was lost before it recorded the sandbox, which the replica that took it over ended"


@pytest.mark.parametrize("one_batch", [False, True], ids=["apart", "one-batch"])
async def test_a_create_appended_after_its_sandbox_was_discarded_is_failed_not_live(
        store: ProjectionStore, one_batch: bool) -> None:
    """A survivor recorded a sandbox no event recorded as ended (lifecycle:discarded); then the
    lost replica's append of its create, start and command lands (it began while that replica's
    lease held). The sandbox is failed with the survivor's reason, its command never ran; until
    the create lands nobody sees it. The discard is a record from before discards named their
    organization: folded all the same, as nobody's (compatibility)."""
    log = Log()
    discard = log("sbx_1", SandboxDiscarded(reason=LOST))
    late = [log("sbx_1", created("late")), log("sbx_1", SandboxStarted(node="n1")),
            log("sbx_1", ExecutionStarted("exec_1", ("echo", "hi")))]
    if not one_batch:
        await store.apply([discard])
        assert await store.get_sandbox("sbx_1") is None
        for q in (SandboxQuery(include_deleted=True), SandboxQuery(org_id="org_local", include_deleted=True),
                  SandboxQuery(status="failed")):
            assert await store.list_sandboxes(q) == ([], 0), q
        assert await store.event_bytes("org_local") == 0
        assert await store.position() == 1
    await store.apply(late if not one_batch else [discard, *late])
    sb = await store.get_sandbox("sbx_1")
    assert sb is not None and sb.status is SandboxStatus.FAILED, sb
    assert LOST in (sb.reason or "") and sb.discarded == LOST and sb.running == frozenset()
    assert sb.spec.name == "late" and sb.spec.org_id == "org_local"
    ex = await store.get_execution("exec_1")
    assert ex is not None and ex.status is ExecutionStatus.FAILED and LOST in (ex.error or ""), ex
    assert [s.sandbox_id for s in (await store.list_sandboxes(SandboxQuery(org_id="org_local")))[0]] == ["sbx_1"]
    assert [s.sandbox_id for s in (await store.list_sandboxes(SandboxQuery(live=True)))[0]] == []
    # The late append written twice (the Kafka log's duplicate): still over.
    await store.apply([log("sbx_1", created("late")), log("sbx_1", SandboxStarted(node="n1"))])
    dup = await store.get_sandbox("sbx_1")
    assert dup is not None and dup.status is SandboxStatus.FAILED and dup.reason == sb.reason
    # Discarded again (a second survivor's claim): over is over.
    await store.apply([log("sbx_1", SandboxDiscarded(reason="again"))])
    again = await store.get_sandbox("sbx_1")
    assert again is not None and again.status is SandboxStatus.FAILED and again.reason == sb.reason


async def test_a_discard_naming_its_tenant_is_filed_under_it_and_listed_nowhere(store: ProjectionStore) -> None:
    """A survivor's discard names the organization that asked for the sandbox (its owner row's):
    its log bytes count against that organization's quota, its tenant may read its end
    (``unrecorded=True``), and there is still no sandbox to get or list, in any organization.
    A create that lands late makes it the tenant's failed sandbox."""
    log = Log()
    discard = log("sbx_1", SandboxDiscarded(reason=LOST))
    discard = Event(discard.event_id, "sbx_1", discard.created_at, discard.data, position=discard.position,
                    org="org_acme", project="prj_1")
    await store.apply([discard])
    assert await store.get_sandbox("sbx_1") is None
    ended = await store.get_sandbox("sbx_1", unrecorded=True)
    assert ended is not None and ended.unrecorded and ended.spec.org_id == "org_acme"
    assert ended.spec.project_id == "prj_1" and ended.reason == LOST
    for q in (SandboxQuery(include_deleted=True), SandboxQuery(org_id="org_acme", include_deleted=True),
              SandboxQuery(org_id="org_acme", status="failed"), SandboxQuery(org_id="org_local"),
              SandboxQuery(org_id="org_acme", projects=("prj_1",), live=False)):
        assert await store.list_sandboxes(q) == ([], 0), q
    assert await store.event_bytes("org_acme") == recorded_size(discard)
    assert await store.event_bytes("org_local") == 0
    spec = SandboxSpec(runtime="base:latest", runtime_id="srt_x", org_id="org_acme", project_id="prj_1")
    late = log("sbx_1", SandboxCreated(spec=spec))
    await store.apply([late])
    sb = await store.get_sandbox("sbx_1")
    assert sb is not None and sb.status is SandboxStatus.FAILED and sb.discarded == LOST and sb.spec.org_id == "org_acme"
    assert [s.sandbox_id for s in (await store.list_sandboxes(SandboxQuery(org_id="org_acme")))[0]] == ["sbx_1"]
    assert await store.event_bytes("org_acme") == recorded_size(discard) + recorded_size(late)


async def test_a_discard_after_the_create_landed_fails_the_sandbox_and_its_commands(store: ProjectionStore) -> None:
    """The create landed after the survivor looked and before its lifecycle:discarded: the
    sandbox it ends is failed with its reason, and so is the command that ran in it."""
    log = Log()
    await store.apply([log("sbx_1", created()), log("sbx_1", SandboxStarted()),
                       log("sbx_1", ExecutionStarted("exec_1", ("sleep", "9")))])
    await store.apply([log("sbx_1", SandboxDiscarded(reason=LOST))])
    sb = await store.get_sandbox("sbx_1")
    assert sb is not None and sb.status is SandboxStatus.FAILED and sb.reason == LOST and sb.running == frozenset()
    ex = await store.get_execution("exec_1")
    assert ex is not None and ex.status is ExecutionStatus.FAILED and LOST in (ex.error or "")
    # One that ended already stays as it ended.
    await store.apply([log("sbx_2", created()), log("sbx_2", SandboxStarted()),
                       log("sbx_2", SandboxTerminated(reason="done")), log("sbx_2", SandboxDiscarded(reason=LOST))])
    ended = await store.get_sandbox("sbx_2")
    assert ended is not None and ended.status is SandboxStatus.TERMINATED and ended.reason == "done"


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


async def test_a_deleted_sandbox_stays_readable_with_its_executions(store: ProjectionStore) -> None:
    log = Log()
    await store.apply([log("sbx_1", created("gone")), log("sbx_1", SandboxStarted()),
                       log("sbx_1", ExecutionStarted("exec_1", ("a",))),
                       log("sbx_1", ExecutionFinished("exec_1", ExecutionStatus.COMPLETED, exit_code=0, duration_ms=1)),
                       log("sbx_1", ExecutionStarted("exec_2", ("b",))),
                       log("sbx_1", SandboxTerminated(reason="done", deleted=True)),
                       log("sbx_2", created("kept")), log("sbx_2", SandboxStarted())])
    sb = await store.get_sandbox("sbx_1")
    assert sb is not None and sb.status is SandboxStatus.DELETED and sb.spec.name == "gone" and sb.executions == 2
    assert [e.execution_id for e in await store.list_executions("sbx_1")] == ["exec_2", "exec_1"]
    assert [e.execution_id for e in await store.list_executions("sbx_1", limit=1)] == ["exec_2"]
    ex = await store.get_execution("exec_2")
    assert ex is not None and ex.status is ExecutionStatus.CANCELLED  # ended with its sandbox
    page, total = await store.list_sandboxes(SandboxQuery())
    assert total == 1 and [s.sandbox_id for s in page] == ["sbx_2"]
    page, total = await store.list_sandboxes(SandboxQuery(include_deleted=True, sort="name", direction="asc"))
    assert total == 2 and [s.sandbox_id for s in page] == ["sbx_1", "sbx_2"]
    page, _ = await store.list_sandboxes(SandboxQuery(status="deleted"))
    assert [s.sandbox_id for s in page] == ["sbx_1"]
    _, total = await store.list_sandboxes(SandboxQuery(deleted_only=True, org_id="org_other"))
    assert total == 0
    await store.apply(log.events)  # a replay after a crash changes nothing, deleted or not
    sb = await store.get_sandbox("sbx_1")
    assert sb is not None and sb.executions == 2 and await store.position() == len(log.events)


async def test_counts_what_each_organizations_sandboxes_write_to_the_log(store: ProjectionStore) -> None:
    """eventBytes of the storage quota: the encoded size of every event of an organization's
    sandboxes, deleted ones too (the log keeps them), folded with the state so that a rebuild
    (the memory store's every start) counts the same."""
    log = Log()
    mine = SandboxSpec(runtime="base:latest", runtime_id="srt_x", org_id="org_a", env={"K": "v" * 500})
    theirs = SandboxSpec(runtime="base:latest", runtime_id="srt_x", org_id="org_b")
    await store.apply([log("sbx_1", SandboxCreated(spec=mine)), log("sbx_1", SandboxStarted()),
                       log("sbx_1", SandboxEnvChanged(set={"K": "w" * 900})),
                       log("sbx_1", SandboxTerminated(reason="done", deleted=True)),
                       log("sbx_2", SandboxCreated(spec=mine)), log("sbx_2", ExecutionStarted("exec_1", ("a",))),
                       log("sbx_3", SandboxCreated(spec=theirs))])
    by_org = {org: sum(recorded_size(e) for e in log.events if e.sandbox_id in sids)
              for org, sids in (("org_a", ("sbx_1", "sbx_2")), ("org_b", ("sbx_3",)))}
    assert by_org["org_a"] > 2 * 500 + 900
    assert await store.event_bytes("org_a") == by_org["org_a"]
    assert await store.event_bytes("org_b") == by_org["org_b"] and await store.event_bytes("org_c") == 0
    gone = await store.get_sandbox("sbx_1")
    assert gone is not None and gone.log_bytes == sum(recorded_size(e) for e in log.events[:4])
    await store.apply(log.events)  # a replay changes nothing
    assert await store.event_bytes("org_a") == by_org["org_a"]
    await store.reset()
    await store.apply(log.events)
    assert await store.event_bytes("org_a") == by_org["org_a"]


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


def snap_created(name: str, tag: str | None = "latest", *, ready: bool = True, source: str | None = None,
                 public: bool = False, content_hash: str | None = None, size: int = 0) -> SnapshotCreated:
    files = (SnapshotFile(path="a.txt", size=size, sha256="0" * 64, mode=0o644, content_type="text/plain"),)
    return SnapshotCreated(name=name, runtime="base:latest", runtime_id="srt_x", ready=ready, tag=tag,
                           source_sandbox_id=source, public=public, content_hash=content_hash, size_bytes=size,
                           file_count=1, files=files, env={"A": "1"})


async def test_folds_snapshots_and_queries_them(store: ProjectionStore) -> None:
    log = Log()
    await store.apply([
        log("snp_1", snap_created("app", "v1", source="sbx_1", size=10), at="2026-01-01T00:00:01.000Z"),
        log("snp_2", snap_created("app", "v2", source="sbx_1", size=30, public=True), at="2026-01-01T00:00:02.000Z"),
        log("snp_3", snap_created("other", ready=False, content_hash="h1"), at="2026-01-01T00:00:03.000Z"),
    ])
    one = await store.get_snapshot("snp_1")
    assert one is not None and one.status is SnapshotStatus.READY and one.tag == "v1" and one.env == {"A": "1"}
    assert one.files[0].path == "a.txt" and one.source_sandbox_id == "sbx_1"
    found, total = await store.list_snapshots(SnapshotQuery())
    assert [s.snapshot_id for s in found] == ["snp_2", "snp_1"] and total == 2  # building ones are not listed
    assert (await store.list_snapshots(SnapshotQuery(ready_only=False)))[1] == 3
    assert [s.snapshot_id for s in (await store.list_snapshots(SnapshotQuery(sort="size", direction="asc")))[0]] \
        == ["snp_1", "snp_2"]
    assert [s.snapshot_id for s in (await store.list_snapshots(SnapshotQuery(public=True)))[0]] == ["snp_2"]
    assert [s.snapshot_id for s in (await store.list_snapshots(SnapshotQuery(name="app", tag="v1")))[0]] == ["snp_1"]
    assert (await store.list_snapshots(SnapshotQuery(source_sandbox_id="sbx_9")))[1] == 0
    page, total = await store.list_snapshots(SnapshotQuery(limit=1, offset=1))
    assert [s.snapshot_id for s in page] == ["snp_1"] and total == 2
    hashed, _ = await store.list_snapshots(SnapshotQuery(content_hash="h1", ready_only=False))
    assert [s.snapshot_id for s in hashed] == ["snp_3"]
    building, _ = await store.list_snapshots(SnapshotQuery(ready_only=False, building_only=True))
    assert [s.snapshot_id for s in building] == ["snp_3"]

    await store.apply([
        log("snp_3", SnapshotFinalized(size_bytes=5, file_count=0, files=(), env={"B": "2"}, metadata={"m": "x"})),
        log("snp_1", SnapshotTagged(tag=None)),
        log("snp_2", SnapshotDeleted()),
    ])
    three = await store.get_snapshot("snp_3")
    assert three is not None and three.status is SnapshotStatus.READY and three.env == {"A": "1", "B": "2"}
    assert three.metadata == {"m": "x"} and three.size_bytes == 5
    one = await store.get_snapshot("snp_1")
    assert one is not None and one.tag is None
    gone = await store.get_snapshot("snp_2")
    assert gone is not None and gone.status is SnapshotStatus.DELETED  # kept for lineage
    assert [s.snapshot_id for s in (await store.list_snapshots(SnapshotQuery()))[0]] == ["snp_3", "snp_1"]
    assert (await store.list_snapshots(SnapshotQuery(ready_only=False, building_only=True)))[1] == 0
    # Snapshot events are not sandboxes.
    assert await store.get_sandbox("snp_1") is None
    assert (await store.list_sandboxes(SandboxQuery(include_deleted=True)))[1] == 0


async def test_sandboxes_are_found_by_the_snapshot_they_came_from(store: ProjectionStore) -> None:
    log = Log()
    spec = SandboxSpec(runtime="base:latest", runtime_id="srt_x", snapshot_id="snp_1")
    await store.apply([log("sbx_1", SandboxCreated(spec=spec)), log("sbx_2", created("plain"))])
    found, total = await store.list_sandboxes(SandboxQuery(snapshot_id="snp_1"))
    assert [s.sandbox_id for s in found] == ["sbx_1"] and total == 1


async def test_a_store_binds_to_one_log_until_reset(store: ProjectionStore) -> None:
    assert await store.log_identity() is None
    assert await store.bind_log("sqlite:first") == "sqlite:first"
    # A second bind (another projector, another log) does not move it.
    assert await store.bind_log("kafka:x/other@1") == "sqlite:first"
    assert await store.log_identity() == "sqlite:first"
    await store.reset()
    assert await store.log_identity() is None
    assert await store.bind_log("kafka:x/other@1") == "kafka:x/other@1"


async def test_folds_organizations_projects_and_keys(store: ProjectionStore) -> None:
    from hutch.core.tenancy import (
        LOCAL_ORG,
        KeyCreated,
        KeyRevoked,
        OrgCreated,
        ProjectCreated,
        QuotaRecord,
        QuotaSet,
        Role,
    )

    log = Log()
    await store.apply([
        log("org_acme", OrgCreated(name="acme")),
        log("org_acme", ProjectCreated(project_id="proj_1", name="web")),
        log("org_acme", KeyCreated(key_id="key_1", role=Role.MEMBER, name="ci", secret_hash="ab" * 32,
                                   prefix="hk_abc", projects=("proj_1",))),
        log("org_acme", QuotaSet(quota=QuotaRecord(sandboxes=3))),
        log("org_acme", KeyRevoked(key_id="key_1")),
        log(LOCAL_ORG, QuotaSet(quota=QuotaRecord(memory_bytes=2**30))),
    ])
    found = await store.directory()
    assert found.position == 6 == await store.position()
    assert set(found.orgs) == {LOCAL_ORG, "org_acme"}
    assert found.orgs["org_acme"].quota.sandboxes == 3 and found.orgs[LOCAL_ORG].quota.memory_bytes == 2**30
    assert found.projects["proj_1"].org_id == "org_acme"
    key = found.keys["key_1"]
    assert key.role is Role.MEMBER and key.projects == ("proj_1",) and key.revoked_at is not None
    assert found.by_hash["ab" * 32] == "key_1"
    # Sandboxes and snapshots are filtered by their organization.
    spec = SandboxSpec(runtime="base:latest", runtime_id="srt_x", org_id="org_acme", project_id="proj_1")
    await store.apply([log("sbx_a", SandboxCreated(spec=spec)), log("sbx_l", created())])
    mine, total = await store.list_sandboxes(SandboxQuery(org_id="org_acme"))
    assert total == 1 and mine[0].sandbox_id == "sbx_a"
    assert (await store.list_sandboxes(SandboxQuery(org_id=LOCAL_ORG)))[1] == 1
    assert (await store.list_sandboxes(SandboxQuery(org_id="org_acme", projects=("proj_2",))))[1] == 0
    await store.apply([log("snp_a", SnapshotCreated(name="s", runtime="base:latest", runtime_id="srt_x",
                                                    org_id="org_acme"))])
    assert (await store.list_snapshots(SnapshotQuery(org_id="org_acme")))[1] == 1
    assert (await store.list_snapshots(SnapshotQuery(org_id=LOCAL_ORG)))[1] == 0
    await store.reset()
    assert set((await store.directory()).orgs) == {LOCAL_ORG}


def malformed() -> SandboxEnvChanged:
    """An env change no API builds (``set`` must be a mapping): folding it raises, as folding
    a malformed event from another writer to the log (or an older version) would."""
    return SandboxEnvChanged(set=None)  # type: ignore[arg-type]  # the malformed part


async def test_an_event_the_store_refuses_is_stepped_over_recorded_and_later_ones_apply(
    store: ProjectionStore,
) -> None:
    log = Log()
    await store.apply([log("sbx_1", created("one")), log("sbx_1", SandboxStarted())])
    poison = log("sbx_1", malformed())
    later = [log("sbx_1", ExecutionStarted("exec_1", ("ls",))), log("sbx_2", created("two"))]
    await store.apply([poison, *later])  # in one batch with good events
    assert await store.position() == log.position
    sb = await store.get_sandbox("sbx_1")
    assert sb is not None and sb.status is SandboxStatus.RUNNING and sb.executions == 1 and sb.spec.env == {}
    assert await store.get_sandbox("sbx_2") is not None
    skipped, total = await store.skipped()
    assert total == 1 and len(skipped) == 1
    assert (skipped[0].position, skipped[0].event_id, skipped[0].sandbox_id, skipped[0].type) == (
        poison.position, poison.event_id, "sbx_1", "env")
    assert "TypeError" in skipped[0].error and skipped[0].skipped_at.endswith("Z")
    await store.apply(log.events)  # a replay: nothing applied or recorded twice
    assert (await store.skipped())[1] == 1
    alone = log("sbx_2", malformed())  # the only event of its batch
    await store.apply([alone])
    await store.apply([log("sbx_2", SandboxStarted())])
    assert await store.position() == log.position
    assert [s.position for s in (await store.skipped())[0]] == [poison.position, alone.position]
    assert (await store.skipped(limit=1))[0][0].position == poison.position
    sb = await store.get_sandbox("sbx_2")
    assert sb is not None and sb.status is SandboxStatus.IDLE
    await store.reset()
    assert await store.skipped() == ([], 0)
    # Replaying the log steps over the same events again (in one transaction where the store can).
    if store.capabilities.atomic_rebuild:
        assert await store.rebuild([log.events[:4], log.events[4:]]) == log.position
    else:
        await store.apply(log.events)
    assert [s.position for s in (await store.skipped())[0]] == [poison.position, alone.position]
    sb = await store.get_sandbox("sbx_1")
    assert sb is not None and sb.executions == 1 and await store.position() == log.position


async def test_a_record_the_log_could_not_decode_is_stepped_over_and_recorded(store: ProjectionStore) -> None:
    """What a log reader hands over for a record nobody can decode (core.events.
    decode_or_unreadable): refused on its own, recorded, and the events after it apply."""
    log = Log()
    await store.apply([log("sbx_1", created("one"))])
    log.position += 1
    unreadable = decode_or_unreadable(b'{"type": "from-the-future", "sandboxId": "sbx_1"}', log.position)
    await store.apply([unreadable, log("sbx_1", SandboxStarted())])
    assert await store.position() == log.position
    sb = await store.get_sandbox("sbx_1")
    assert sb is not None and sb.status is SandboxStatus.IDLE
    skipped, total = await store.skipped()
    assert total == 1 and (skipped[0].position, skipped[0].type, skipped[0].sandbox_id) == (
        unreadable.position, "log:unreadable", "sbx_1")
    assert "from-the-future" in skipped[0].error
