"""core.snapshots: references, names, tags and the fold."""

from __future__ import annotations

import pytest

from hutch.core.errors import InvalidInput
from hutch.core.events import (
    Event,
    EventData,
    SandboxStarted,
    SnapshotCreated,
    SnapshotDeleted,
    SnapshotFinalized,
    SnapshotTagged,
)
from hutch.core.models import SnapshotStatus
from hutch.core.packages import check_dependencies, check_packages
from hutch.core.snapshots import (
    Ref,
    check_name,
    check_tag,
    evolve_snapshot,
    is_snapshot_event,
    parse_ref,
)


@pytest.mark.parametrize(("raw", "ref"), [
    ("snp_01abc", Ref(snapshot_id="snp_01abc")),
    ("myapp:v1.2", Ref(name="myapp", tag="v1.2")),
    ("@acme/myapp:latest", Ref(name="myapp", tag="latest")),
    (" latest ", Ref(word="latest")),
    ("my-app_2", Ref(word="my-app_2")),
])
def test_parse_ref(raw: str, ref: Ref) -> None:
    assert parse_ref(raw) == ref


@pytest.mark.parametrize("raw", ["", "  ", None, 3, "a b:c", "app:", ":tag", "../x", "app:-bad", "a/b"])
def test_parse_ref_refuses_what_is_not_a_reference(raw: object) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_ref(raw, "snapshot")
    assert err.value.field == "snapshot"


def test_names_and_tags() -> None:
    assert check_name("a-B_9") == "a-B_9"
    assert check_tag("v1.0-rc_1") == "v1.0-rc_1"
    for bad in ("", "a.b", "x" * 101, "a/b", "é"):
        with pytest.raises(InvalidInput, match="name"):
            check_name(bad)
    for bad in ("", ".hidden", "-x", "x" * 129, "a b", "a:b"):
        with pytest.raises(InvalidInput, match="tag"):
            check_tag(bad)


def event(data: EventData, at: str = "2026-01-01T00:00:00.000Z") -> Event:
    return Event("evt_1", "snp_1", at, data)


def test_fold() -> None:
    built = evolve_snapshot(None, event(SnapshotCreated(name="app", runtime="base:latest", runtime_id="srt_x",
                                                        ready=False, tag="v1", env={"A": "1"})))
    assert built is not None and built.status is SnapshotStatus.BUILDING and built.snapshot_id == "snp_1"
    ready = evolve_snapshot(built, event(SnapshotFinalized(size_bytes=3, file_count=1, files=(), env={"B": "2"},
                                                           metadata={"k": "v"}), "2026-01-01T00:00:01.000Z"))
    assert ready is not None and ready.status is SnapshotStatus.READY and ready.env == {"A": "1", "B": "2"}
    assert ready.updated_at == "2026-01-01T00:00:01.000Z" and ready.created_at == built.created_at
    untagged = evolve_snapshot(ready, event(SnapshotTagged(tag=None)))
    assert untagged is not None and untagged.tag is None
    gone = evolve_snapshot(untagged, event(SnapshotDeleted()))
    assert gone is not None and gone.status is SnapshotStatus.DELETED
    assert evolve_snapshot(None, event(SnapshotTagged(tag="x"))) is None  # nothing to tag
    assert evolve_snapshot(ready, event(SandboxStarted())) is None
    assert is_snapshot_event(event(SnapshotDeleted())) and not is_snapshot_event(event(SandboxStarted()))


@pytest.mark.parametrize("spec", ["typescript", "zod@3", "@types/node@22.1.0", "left-pad@^1.3.0", "json@latest",
                                  "@scope/pkg", "a@>=1.2.3"])
def test_registry_package_specs_pass(spec: str) -> None:
    assert check_packages([spec]) == (spec,)


@pytest.mark.parametrize("spec", ["file:/etc", "/abs", "./rel", "../up", "git+ssh://h/x.git", "github:u/r", "u/r",
                                  "https://x/y.tgz", "a@npm:b", "--prefix=/", "-g", "a b", "a;b", "a|b", "$x", ""])
def test_other_package_specs_are_refused(spec: str) -> None:
    with pytest.raises(InvalidInput) as err:
        check_packages([spec])
    assert err.value.field == "packages"


@pytest.mark.parametrize("dep", ["curl", "jq=1.7.1-3", "libc6:amd64", "g++"])
def test_apt_dependencies(dep: str) -> None:
    assert check_dependencies([dep, dep]) == (dep,)


@pytest.mark.parametrize("dep", ["-o", "Curl", "a/b", "../x", "a b", "jq;x", "", "a=b c"])
def test_bad_apt_dependencies(dep: str) -> None:
    with pytest.raises(InvalidInput):
        check_dependencies([dep])
