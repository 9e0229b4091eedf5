"""Snapshots: reusable bases for new sandboxes, folded from their own events.

A snapshot is a runtime plus a workspace archive (the files a sandbox's user could write,
captured as a tar.gz by the API, so it means the same under every driver), the env new
sandboxes start with, and metadata. It is taken from a sandbox (ready at once) or built
from a declarative file (``building`` until the archive is uploaded and finalized).

References, as the seeds use them: ``snp_…`` (an id), ``name:tag``, ``@org/name:tag``
(the org part is ours, so it is dropped), or a bare word that is a tag or else a name.
A name:tag pair can be on several snapshots; the newest ready one wins.
"""

from __future__ import annotations

import re

import attrs

from core.errors import InvalidInput
from core.events import Event, SnapshotCreated, SnapshotDeleted, SnapshotFinalized, SnapshotTagged
from core.models import Snapshot, SnapshotStatus

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
DEFAULT_TAG = "latest"


def check_name(value: object, field: str = "name") -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise InvalidInput(f"{field}: {value!r} may only hold letters, digits, _ and - (1-100 of them)", field=field)
    return value


def check_tag(value: object, field: str = "tag") -> str:
    if not isinstance(value, str) or not TAG_RE.match(value):
        raise InvalidInput(
            f"{field}: {value!r} is not a tag (letters, digits, _, . and -, not starting with . or -, at most 128)",
            field=field,
        )
    return value


@attrs.frozen
class Ref:
    """A parsed snapshot reference: exactly one of ``snapshot_id`` or ``name``/``word``."""

    snapshot_id: str | None = None
    name: str | None = None
    tag: str | None = None
    word: str | None = None  # bare: a tag, else a name


def parse_ref(value: object, field: str = "snapshot") -> Ref:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{field}: expected a snapshot id (snp_...), name:tag or tag", field=field)
    ref = value.strip()
    if ref.startswith("snp_"):
        return Ref(snapshot_id=ref)
    if ref.startswith("@"):  # @org/name:tag: every snapshot here is in the one org
        _, _, ref = ref.partition("/")
    if ":" in ref:
        name, _, tag = ref.partition(":")
        return Ref(name=check_name(name, field), tag=check_tag(tag, field))
    return Ref(word=check_tag(ref, field))


def evolve_snapshot(snapshot: Snapshot | None, event: Event) -> Snapshot | None:
    """The snapshot after ``event``; None for events that are not about a snapshot."""
    data, at = event.data, event.created_at
    if isinstance(data, SnapshotCreated):
        return Snapshot(
            snapshot_id=event.sandbox_id,
            name=data.name,
            runtime=data.runtime,
            runtime_id=data.runtime_id,
            status=SnapshotStatus.READY if data.ready else SnapshotStatus.BUILDING,
            created_at=at,
            updated_at=at,
            tag=data.tag,
            description=data.description,
            message=data.message,
            public=data.public,
            source_sandbox_id=data.source_sandbox_id,
            parent_snapshot_id=data.parent_snapshot_id,
            size_bytes=data.size_bytes,
            file_count=data.file_count,
            files=data.files,
            env=dict(data.env),
            metadata=dict(data.metadata),
            content_hash=data.content_hash,
            api_key_id=data.api_key_id,
            org_id=data.org_id,
            dependencies=data.dependencies,
            packages=data.packages,
        )
    if snapshot is None:
        return None
    match data:
        case SnapshotFinalized():
            return attrs.evolve(
                snapshot, status=SnapshotStatus.READY, size_bytes=data.size_bytes, file_count=data.file_count,
                files=data.files, env={**snapshot.env, **data.env}, metadata={**snapshot.metadata, **data.metadata},
                dependencies=data.dependencies, packages=data.packages, updated_at=at,
            )
        case SnapshotTagged(tag=tag):
            return attrs.evolve(snapshot, tag=tag, updated_at=at)
        case SnapshotDeleted():
            return attrs.evolve(snapshot, status=SnapshotStatus.DELETED, updated_at=at)
    return None


def is_snapshot_event(event: Event) -> bool:
    return isinstance(event.data, (SnapshotCreated, SnapshotFinalized, SnapshotTagged, SnapshotDeleted))
