"""core.snapshots.decide: which snapshot commands each state allows, and what they record."""

from __future__ import annotations

from functools import reduce

import pytest

from hutch.core.errors import IllegalTransition, InvalidInput, SnapshotNotFound
from hutch.core.events import (
    Event,
    EventData,
    SandboxCreated,
    SandboxStarted,
    SandboxTerminated,
    SnapshotCreated,
    SnapshotFinalized,
)
from hutch.core.lifecycle import evolve_sandbox
from hutch.core.models import SandboxSpec, SandboxState, SnapshotFile, SnapshotState, SnapshotStatus
from hutch.core.snapshots import (
    BeginBuild,
    DeleteSnapshot,
    FinalizeBuild,
    SnapshotCommand,
    TagSnapshot,
    TakeSnapshot,
    decide,
    evolve_snapshot,
)

SNAPSHOT_ID = "snp_1"
FILES = (SnapshotFile(path="a.txt", size=3, sha256="0" * 64, mode=0o644),
         SnapshotFile(path="b.txt", size=4, sha256="1" * 64, mode=0o600))


def sandbox(*payloads: EventData) -> SandboxState:
    spec = SandboxSpec(runtime="base:latest", runtime_id="srt_x", env={"A": "1"}, snapshot_id="snp_parent",
                       org_id="org_acme")
    created: list[EventData] = [SandboxCreated(spec=spec), SandboxStarted()]
    events = [Event(f"evt_{i}", "sbx_1", "2026-01-01T00:00:00.000Z", p) for i, p in enumerate([*created, *payloads])]
    out = reduce(evolve_sandbox, events, None)
    assert out is not None
    return out


def step(snapshot: SnapshotState | None, command: SnapshotCommand) -> SnapshotState:
    events = [Event(f"evt_{i}", SNAPSHOT_ID, "2026-01-01T00:00:01.000Z", p)
              for i, p in enumerate(decide(SNAPSHOT_ID, snapshot, command))]
    out = reduce(evolve_snapshot, events, snapshot)
    assert out is not None
    return out


def building() -> SnapshotState:
    return step(None, BeginBuild(name="app", runtime="base:latest", runtime_id="srt_x", tag="v1", org_id="org_acme",
                                 content_hash="abc"))


def test_take_records_the_sandbox_as_it_is() -> None:
    [created] = decide(SNAPSHOT_ID, None, TakeSnapshot(source=sandbox(), name="app", tag="latest", files=FILES,
                                                       public=True, api_key_id="key_1"))
    assert isinstance(created, SnapshotCreated) and created.ready
    assert (created.runtime, created.runtime_id, created.env, created.org_id) == ("base:latest", "srt_x", {"A": "1"},
                                                                                  "org_acme")
    assert (created.source_sandbox_id, created.parent_snapshot_id) == ("sbx_1", "snp_parent")
    assert (created.size_bytes, created.file_count, created.files) == (7, 2, FILES)
    assert step(None, TakeSnapshot(source=sandbox(), name="app", tag="latest", files=FILES)).status \
        is SnapshotStatus.READY


def test_an_ended_sandbox_cannot_be_snapshotted() -> None:
    ended = sandbox(SandboxTerminated(reason="reaped"))
    with pytest.raises(IllegalTransition, match="sandbox sbx_1 is terminated; only a live sandbox"):
        decide(SNAPSHOT_ID, None, TakeSnapshot(source=ended, name="app", tag="latest", files=()))


@pytest.mark.parametrize(("name", "tag", "field"), [("a b", "latest", "name"), ("app", "-x", "tag")])
def test_take_and_build_refuse_bad_names_and_tags(name: str, tag: str, field: str) -> None:
    for command in (TakeSnapshot(source=sandbox(), name=name, tag=tag, files=()),
                    BeginBuild(name=name, runtime="base:latest", runtime_id="srt_x", tag=tag, org_id="org_local")):
        with pytest.raises(InvalidInput) as err:
            decide(SNAPSHOT_ID, None, command)
        assert err.value.field == field


def test_a_build_refuses_a_content_hash_that_is_not_one() -> None:
    with pytest.raises(InvalidInput, match="contentHash") as err:
        decide(SNAPSHOT_ID, None, BeginBuild(name="app", runtime="base:latest", runtime_id="srt_x", tag="v1",
                                             org_id="org_local", content_hash="x" * 129))
    assert err.value.field == "contentHash"


def test_a_snapshot_id_is_made_once() -> None:
    with pytest.raises(IllegalTransition, match=f"snapshot {SNAPSHOT_ID} already exists"):
        decide(SNAPSHOT_ID, building(), TakeSnapshot(source=sandbox(), name="app", tag="latest", files=()))


def test_a_build_is_building_until_finalized_then_ready() -> None:
    snap = building()
    assert snap.status is SnapshotStatus.BUILDING and snap.content_hash == "abc"
    [finalized] = decide(SNAPSHOT_ID, snap, FinalizeBuild(files=FILES, env={"B": "2"}, dependencies=("curl",)))
    assert finalized == SnapshotFinalized(size_bytes=7, file_count=2, files=FILES, env={"B": "2"},
                                          dependencies=("curl",))
    ready = step(snap, FinalizeBuild(files=FILES))
    assert ready.status is SnapshotStatus.READY
    with pytest.raises(IllegalTransition, match=f"snapshot {SNAPSHOT_ID} is already ready"):
        decide(SNAPSHOT_ID, ready, FinalizeBuild(files=()))


def test_tagging_sets_clears_and_refuses_a_bad_tag() -> None:
    snap = building()
    assert step(snap, TagSnapshot("v2")).tag == "v2"
    assert step(snap, TagSnapshot(None)).tag is None
    with pytest.raises(InvalidInput, match=r"'\.x' is not a tag"):
        decide(SNAPSHOT_ID, snap, TagSnapshot(".x"))


@pytest.mark.parametrize("command", [FinalizeBuild(files=()), TagSnapshot("v1"), DeleteSnapshot()])
def test_a_missing_or_deleted_snapshot_is_not_found(command: SnapshotCommand) -> None:
    deleted = step(building(), DeleteSnapshot())
    assert deleted.status is SnapshotStatus.DELETED
    for state in (None, deleted):
        with pytest.raises(SnapshotNotFound, match=f"snapshot {SNAPSHOT_ID} not found"):
            decide(SNAPSHOT_ID, state, command)
