"""Snapshots: reusable bases for new sandboxes, folded from their own events.

A snapshot is a runtime plus a workspace archive (the files a sandbox's user could write,
captured as a tar.gz by the API, so it means the same under every driver), the env new
sandboxes start with, and metadata. It is taken from a sandbox (ready at once) or built
from a declarative file (``building`` until the archive is uploaded and finalized).

References, as the seeds use them: ``snp_…`` (an id), ``name:tag``, ``@org/name:tag``
(the org part is ours, so it is dropped), or a bare word that is a tag or else a name.
A name:tag pair can be on several snapshots; the newest ready one wins.

``decide(snapshot_id, state, command) -> [events]`` checks a snapshot command against the
snapshot as it is (None: no such snapshot yet) and says what happened, as
``core.lifecycle.decide`` does for sandboxes; a refused command raises and changes nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

import attrs

from hutch.core.errors import IllegalTransition, InvalidInput, SnapshotNotFound
from hutch.core.events import (
    Event,
    SnapshotCreated,
    SnapshotDeleted,
    SnapshotFinalized,
    SnapshotTagged,
)
from hutch.core.models import SandboxState, SnapshotFile, SnapshotState, SnapshotStatus
from hutch.core.serde import converter

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,100}\Z")
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
DEFAULT_TAG = "latest"
CONTENT_HASH_MAX = 128


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


def check_content_hash(value: object) -> str | None:
    """A build's content hash (what lets an unchanged build be skipped), if it gave one."""
    if value is not None and (not isinstance(value, str) or len(value) > CONTENT_HASH_MAX):
        raise InvalidInput("contentHash: expected a hash string", field="contentHash")
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


def evolve_snapshot(snapshot: SnapshotState | None, event: Event) -> SnapshotState | None:
    """The snapshot after ``event``; None for events that are not about a snapshot."""
    data, at = event.data, event.created_at
    if isinstance(data, SnapshotCreated):
        return SnapshotState(
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
            project_id=data.project_id,
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


# ---------------------------------------------------------------- commands


# What one file takes in a snapshot's record (its event, its row in the store, its answers)
# besides its path: its sha256, content type, size and mode and the JSON around them (~134
# bytes measured in an event of 100,000 files).
FILE_RECORD_BYTES = 128


def record_bytes(files: Iterable[SnapshotFile]) -> int:
    """What a snapshot's list of files takes wherever it is kept (the log, the store, the
    server's memory): counted against its organization's storage with the files' bytes, or a
    snapshot of 100,000 empty files (a 470 KB upload) was a 17 MB record counted as nothing."""
    return sum(len(f.path.encode()) + FILE_RECORD_BYTES for f in files)


# A snapshot a fork keeps of the instant it copied (service/fork.py): its metadata names the forked
# sandbox; listings leave these out unless asked (they are records, not bases a user made).
FORK_OF = "forkOf"


@attrs.frozen
class TakeSnapshot:
    """Record a snapshot of ``source``'s workspace (archived as ``files``): ready at once."""

    source: SandboxState
    name: str
    tag: str
    files: tuple[SnapshotFile, ...]
    description: str | None = None
    public: bool = False
    api_key_id: str | None = None
    metadata: dict[str, str] = attrs.field(factory=dict)  # e.g. a fork's FORK_OF


@attrs.frozen
class BeginBuild:
    """Record a build: a snapshot ``building`` until its archive is uploaded and finalized."""

    name: str
    runtime: str
    runtime_id: str
    tag: str
    org_id: str
    description: str | None = None
    message: str | None = None
    public: bool = False
    content_hash: str | None = None
    api_key_id: str | None = None
    project_id: str | None = None


@attrs.frozen
class FinalizeBuild:
    """A build's archive (``files``), env and installs were checked: the snapshot is ready."""

    files: tuple[SnapshotFile, ...]
    env: dict[str, str] = attrs.field(factory=dict)
    metadata: dict[str, str] = attrs.field(factory=dict)
    dependencies: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()


@attrs.frozen
class TagSnapshot:
    tag: str | None  # None clears it


@attrs.frozen
class DeleteSnapshot:
    pass


SnapshotCommand = TakeSnapshot | BeginBuild | FinalizeBuild | TagSnapshot | DeleteSnapshot
SnapshotEventData = SnapshotCreated | SnapshotFinalized | SnapshotTagged | SnapshotDeleted


def decide(snapshot_id: str, snapshot: SnapshotState | None, command: SnapshotCommand) -> list[SnapshotEventData]:
    """Event payloads the command produces about snapshot ``snapshot_id`` (currently ``snapshot``)."""
    match command:
        case TakeSnapshot() | BeginBuild():
            if snapshot is not None:
                raise IllegalTransition(f"snapshot {snapshot_id} already exists", snapshot_id=snapshot_id)
            if isinstance(command, TakeSnapshot):
                return [_taken(command)]
            return [_build_begun(command)]
        case FinalizeBuild():
            status = _existing(snapshot_id, snapshot).status
            if status is not SnapshotStatus.BUILDING:
                raise IllegalTransition(f"snapshot {snapshot_id} is already {status.value}", snapshot_id=snapshot_id)
            files = command.files
            return [SnapshotFinalized(
                size_bytes=sum(f.size for f in files), file_count=len(files), files=files, env=dict(command.env),
                metadata=dict(command.metadata), dependencies=command.dependencies, packages=command.packages,
            )]
        case TagSnapshot(tag=tag):
            _existing(snapshot_id, snapshot)
            return [SnapshotTagged(tag=None if tag is None else check_tag(tag))]
        case DeleteSnapshot():
            _existing(snapshot_id, snapshot)
            return [SnapshotDeleted()]
    raise TypeError(f"unknown command {command!r}")  # pragma: no cover


def _existing(snapshot_id: str, snapshot: SnapshotState | None) -> SnapshotState:
    if snapshot is None or snapshot.status is SnapshotStatus.DELETED:
        raise SnapshotNotFound(f"snapshot {snapshot_id} not found", snapshot_id=snapshot_id)
    return snapshot


def _taken(command: TakeSnapshot) -> SnapshotCreated:
    source, files = command.source, command.files
    if source.status.is_final:
        raise IllegalTransition(
            f"sandbox {source.sandbox_id} is {source.status.value}; only a live sandbox can be snapshotted",
            sandbox_id=source.sandbox_id,
        )
    spec = source.spec
    return SnapshotCreated(
        name=check_name(command.name), runtime=spec.runtime, runtime_id=spec.runtime_id, tag=check_tag(command.tag),
        description=command.description, public=command.public, source_sandbox_id=source.sandbox_id,
        parent_snapshot_id=spec.snapshot_id, size_bytes=sum(f.size for f in files), file_count=len(files),
        files=files, env=dict(spec.env), metadata=dict(command.metadata), api_key_id=command.api_key_id,
        dependencies=spec.dependencies,
        packages=spec.packages, org_id=spec.org_id, project_id=spec.project_id,
    )


def _build_begun(command: BeginBuild) -> SnapshotCreated:
    return SnapshotCreated(
        name=check_name(command.name), runtime=command.runtime, runtime_id=command.runtime_id, ready=False,
        tag=check_tag(command.tag), description=command.description, message=command.message,
        public=command.public, content_hash=check_content_hash(command.content_hash),
        api_key_id=command.api_key_id, org_id=command.org_id, project_id=command.project_id,
    )


# A snapshot's list of files is in one event, and the production log appends an event whole in
# one record batch (eventlog/kafka_records.py: 8 MiB less 4 KiB). The list may take this much
# as the logs write it (compact ASCII JSON), both profiles alike; the rest of the event (its
# env, at most 256 KiB as execve counts it, metadata, names) fits in what is left. Past it, the
# append failed after the whole export was read, with words that named nothing; the embedded
# log took the same snapshot. A bound on the count alone cannot do: a path may be 4,096 bytes,
# and 24 KiB escaped (a control character is six), so it would have allowed some 300 files.
FILES_RECORD_MAX = 6 * 2**20


def file_record_size(f: SnapshotFile) -> int:
    """The bytes ``f`` takes in its snapshot's event, its comma included."""
    return len(json.dumps(converter.unstructure(f), separators=(",", ":"))) + 1


@attrs.define
class FilesTally:
    """A snapshot's files counted as they are read (an export's or an archive's headers, a
    scan): refused at the first one past ``FILES_RECORD_MAX``, before the rest are read."""

    count: int = 0
    record: int = 0  # its list's bytes in the event
    size: int = 0  # its files' bytes
    quota_record: int = 0  # its record's bytes as storage counts them (``record_bytes``)

    def add(self, f: SnapshotFile) -> None:
        self.count += 1
        self.size += f.size
        self.record += file_record_size(f)
        self.quota_record += len(f.path.encode()) + FILE_RECORD_BYTES
        if self.record > FILES_RECORD_MAX:
            raise InvalidInput(
                f"archive: too many files for one snapshot: their list passes the {FILES_RECORD_MAX} bytes a "
                f"snapshot's record may hold at file {self.count} ({f.path[:200]!r}), as the event log writes it "
                f"(~{FILES_RECORD_MAX // 190} files of 40-character paths, fewer of longer ones); leave build "
                "output and caches out of the workspace, or keep them in several snapshots", field="archive")
