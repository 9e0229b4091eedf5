"""Events: past-tense facts with stable type names, never edited once written.

The ``type`` strings are the wire's (the events API returns them as they are): the
seeds name ``create``, ``destroy``, ``pause``, ``resume`` and ``lifecycle:*``. A changed
payload shape gets a new version and an upcaster in ``decode``; old records stay.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, ClassVar

import attrs

from hutch.core.errors import InvalidInput
from hutch.core.models import ExecutionStatus, SandboxSpec, SnapshotFile
from hutch.core.serde import converter
from hutch.core.tenancy import (
    LOCAL_ORG,
    SCOPE,
    TENANCY_EVENTS,
    KeyCreated,
    KeyRevoked,
    OrgCreated,
    Principal,
    ProjectCreated,
    QuotaSet,
    Scope,
    SshKeyAdded,
    SshKeyRemoved,
)

RECORD_VERSION = 1


@attrs.frozen
class SandboxCreated:
    type: ClassVar[str] = "create"
    spec: SandboxSpec
    api_key_id: str | None = None
    initial_execution_id: str | None = None  # the command that runs at create (oneshot)
    # Set when that command waits for the runtime to be built first: the execution is
    # ``queued`` from the create on (readers can wait for it) until it starts.
    initial_command: tuple[str, ...] | None = None


@attrs.frozen
class RuntimeBuildProgress:
    """A creating sandbox waits for its runtime's first build (drivers build a catalog
    runtime on first use): one event per step of the build, in the build's own words."""

    type: ClassVar[str] = "runtime:build"
    runtime: str
    message: str


@attrs.frozen
class SandboxStarted:
    type: ClassVar[str] = "lifecycle:started"
    # The machine it was placed on (the node driver's node name; None elsewhere and in records
    # from before it was recorded). Optional and additive: old records decode as they are. The
    # log, not any process's memory, is where an API restart or a lost node learns it from.
    # Infrastructure: what tenants are shown leaves it out (api/render.py).
    node: str | None = None


@attrs.frozen
class SandboxMoved:
    """An idle sandbox made again on another node from its workspace's files (its env is
    the sandbox's, given to every command): same id, same spec. What ran in it did not move."""

    type: ClassVar[str] = "lifecycle:moved"
    from_node: str
    to_node: str
    reason: str
    lost: str = "its processes: a move carries the workspace's files and the env, not what was running"


@attrs.frozen
class SandboxFailed:
    type: ClassVar[str] = "lifecycle:failed"
    reason: str


@attrs.frozen
class SandboxDiscarded:
    """A survivor ended a sandbox no event recorded: the replica that made it was lost before
    its create was appended (service/takeover.py). Final: a ``create`` or ``lifecycle:started``
    of the same id appended after it (an append that began while that replica's lease held and
    landed late) folds into a sandbox ``failed`` with this reason, never a live one; one
    appended before it is failed by it. Until such a create lands there is no sandbox to see
    (no spec): the projections keep it hidden (``SandboxState.unrecorded``). Its envelope names
    the organization that asked for it (kept with the sandbox's owner row); records from before
    that was kept name none, and are folded as nobody's."""

    type: ClassVar[str] = "lifecycle:discarded"
    reason: str


@attrs.frozen
class SandboxDestroyRequested:
    type: ClassVar[str] = "destroy"
    reason: str = "requested"


@attrs.frozen
class SandboxCompleted:
    """A oneshot sandbox's command finished; the sandbox terminates right after."""

    type: ClassVar[str] = "lifecycle:completed"
    exit_code: int


@attrs.frozen
class SandboxTerminated:
    type: ClassVar[str] = "lifecycle:terminated"
    reason: str
    deleted: bool = False  # destroyed on request (status "deleted") vs ended ("terminated")
    exit_code: int | None = None
    # What it used, read from the driver just before it went (stats: cpu and memory time).
    cpu_seconds: float | None = None
    memory_peak_bytes: int | None = None


PAUSE_FILESYSTEM = "filesystem"  # SandboxPaused.mode: only the sandbox's files kept


@attrs.frozen
class SandboxPaused:
    type: ClassVar[str] = "pause"
    terminates_at: str | None = None  # when timeout.paused will end it, if set
    # None: paused with its memory kept (every process frozen; the resume thaws them).
    # "filesystem" (PAUSE_FILESYSTEM): only its files kept, every process ended; the resume is a
    # new boot. Recorded so that a restarted server knows there is nothing of it to thaw.
    mode: str | None = None


@attrs.frozen
class SandboxResumed:
    type: ClassVar[str] = "resume"
    auto: bool = False  # resumed by an execute, not by an explicit resume


@attrs.frozen
class SandboxTimeoutChanged:
    """The idle timeout changed while the sandbox lives (E2B's set_timeout: api/e2b/)."""

    type: ClassVar[str] = "timeout"
    idle: str | None = None  # a duration such as 300s; None: no idle timeout


@attrs.frozen
class SandboxNetworkChanged:
    """A live sandbox's egress rules replaced (E2B's update_network, PUT /sandbox/{id}/network):
    the network as it is from then on (its port stays)."""

    type: ClassVar[str] = "network"
    enabled: bool
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()


@attrs.frozen
class SandboxEnvChanged:
    """PATCH /sandbox/env: later executions and jobs see the result."""

    type: ClassVar[str] = "env"
    set: dict[str, str] = attrs.field(factory=dict)
    unset: tuple[str, ...] = ()


@attrs.frozen
class CheckpointCreated:
    type: ClassVar[str] = "checkpoint"
    checkpoint_id: str
    name: str
    parent: str = ""


@attrs.frozen
class CheckpointRestored:
    type: ClassVar[str] = "checkpoint:restored"
    checkpoint_id: str


@attrs.frozen
class CheckpointDeleted:
    type: ClassVar[str] = "checkpoint:deleted"
    checkpoint_id: str


@attrs.frozen
class ExecutionStarted:
    """``command``: the first 4 KiB of the argv the driver was given (the log is kept for ever and
    shared by every tenant: core.limits.recorded_argv); ``command_omitted_bytes`` and
    ``command_sha256`` say how much was left out and what the whole was (absent in older records,
    and whenever nothing was left out)."""

    type: ClassVar[str] = "execution:started"
    execution_id: str
    command: tuple[str, ...]
    timeout_seconds: float | None = None
    kind: str = "exec"
    command_omitted_bytes: int | None = None
    command_sha256: str | None = None


@attrs.frozen
class ExecutionFinished:
    type: ClassVar[str] = "execution:finished"
    execution_id: str
    status: ExecutionStatus
    exit_code: int | None = None
    duration_ms: int | None = None
    error: str | None = None
    output_truncated: bool = False


# Snapshot events are keyed by the snapshot's id (``snp_…``) where sandbox events carry the
# sandbox's: a snapshot outlives the sandbox it came from, and its history is its own.


@attrs.frozen
class SnapshotCreated:
    """A snapshot exists: taken from a sandbox (ready at once) or a build started (building)."""

    type: ClassVar[str] = "snapshot"
    name: str
    runtime: str
    runtime_id: str
    ready: bool = True
    tag: str | None = None
    description: str | None = None
    message: str | None = None
    public: bool = False
    source_sandbox_id: str | None = None
    parent_snapshot_id: str | None = None
    size_bytes: int = 0
    file_count: int = 0
    files: tuple[SnapshotFile, ...] = ()
    env: dict[str, str] = attrs.field(factory=dict)
    metadata: dict[str, str] = attrs.field(factory=dict)
    content_hash: str | None = None
    api_key_id: str | None = None
    dependencies: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()
    org_id: str = "org_local"
    project_id: str | None = None  # its sandbox's project (a build: the key's); None: organization-wide


@attrs.frozen
class SnapshotFinalized:
    """A build's archive arrived and was checked: the snapshot is ready."""

    type: ClassVar[str] = "snapshot:finalized"
    size_bytes: int
    file_count: int
    files: tuple[SnapshotFile, ...] = ()
    env: dict[str, str] = attrs.field(factory=dict)
    metadata: dict[str, str] = attrs.field(factory=dict)
    dependencies: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()


@attrs.frozen
class SnapshotTagged:
    type: ClassVar[str] = "snapshot:tagged"
    tag: str | None  # None clears it


@attrs.frozen
class SnapshotDeleted:
    type: ClassVar[str] = "snapshot:deleted"


@attrs.frozen
class UnreadableRecord:
    """Not a lifecycle fact: what a reader of the log is handed for a record it cannot decode
    (an unknown type, a payload the converter refuses, not JSON at all) — written by another
    writer or a newer hutch. Never appended. The projection stores refuse it on its own, so it
    is recorded as skipped and the records after it still apply; raising instead would stop
    every reader of the log at that position for ever."""

    type: ClassVar[str] = "log:unreadable"
    reason: str
    record: str  # the record as text, cut at 4 KiB


EventData = (
    SandboxCreated
    | RuntimeBuildProgress
    | SandboxStarted
    | SandboxMoved
    | SandboxFailed
    | SandboxDiscarded
    | SandboxDestroyRequested
    | SandboxCompleted
    | SandboxTerminated
    | SandboxPaused
    | SandboxResumed
    | SandboxEnvChanged
    | SandboxTimeoutChanged
    | SandboxNetworkChanged
    | CheckpointCreated
    | CheckpointRestored
    | CheckpointDeleted
    | ExecutionStarted
    | ExecutionFinished
    | SnapshotCreated
    | SnapshotFinalized
    | SnapshotTagged
    | SnapshotDeleted
    | UnreadableRecord
    | OrgCreated
    | QuotaSet
    | ProjectCreated
    | KeyCreated
    | KeyRevoked
    | SshKeyAdded
    | SshKeyRemoved
)

EVENT_CLASSES: tuple[type[Any], ...] = (
        SandboxCreated,
        RuntimeBuildProgress,
        SandboxStarted,
        SandboxMoved,
        SandboxFailed,
        SandboxDiscarded,
        SandboxDestroyRequested,
        SandboxCompleted,
        SandboxTerminated,
        SandboxPaused,
        SandboxResumed,
        SandboxEnvChanged,
        SandboxTimeoutChanged,
        SandboxNetworkChanged,
        CheckpointCreated,
        CheckpointRestored,
        CheckpointDeleted,
        ExecutionStarted,
        ExecutionFinished,
        SnapshotCreated,
        SnapshotFinalized,
        SnapshotTagged,
        SnapshotDeleted,
        *TENANCY_EVENTS,
)
EVENT_TYPES: dict[str, type[Any]] = {cls.type: cls for cls in EVENT_CLASSES}


# Who is acting: the API key id (``key_…``, never the key) of the request being served. The
# API's auth middleware sets it per request; events built while serving that request (and in
# tasks the request starts, e.g. an execution's end) carry it as their ``actor``. Events of
# the server's own doing outside any request (restart recovery) carry none.
ACTOR: ContextVar[str | None] = ContextVar("hutch_actor", default=None)


def _current_actor() -> str | None:
    return ACTOR.get()


@contextlib.contextmanager
def acting(principal: Principal) -> Iterator[None]:
    """Calls below see what the key's organization may see, and record who acted (a front door
    that is not a request, e.g. the SSH gateway, sets what the API's auth middleware sets)."""
    actor, scope = ACTOR.set(principal.key_id), SCOPE.set(Scope(principal.org_id, principal.projects))
    try:
        yield
    finally:
        SCOPE.reset(scope)
        ACTOR.reset(actor)


@attrs.frozen
class Event:
    """The envelope. ``position`` is assigned by the log on append and orders everything.
    ``actor`` (for the audit trail) is taken from ``ACTOR`` when not given. ``org`` and
    ``project`` name the organization (and project) the event's sandbox, snapshot or
    tenancy record belongs to; None in records from before tenancy (``org_local``)."""

    event_id: str
    sandbox_id: str
    created_at: str
    data: EventData
    position: int | None = None
    actor: str | None = attrs.field(factory=_current_actor, kw_only=True)
    org: str | None = attrs.field(default=None, kw_only=True)
    project: str | None = attrs.field(default=None, kw_only=True)
    # The bytes of its record (``recorded_size``), when the log that hands it out was given
    # the record (``Encoded``): the projections' folds count them without encoding it again.
    # Not part of the event: never compared, never written.
    size: int | None = attrs.field(default=None, kw_only=True, eq=False, repr=False)

    @property
    def type(self) -> str:
        return self.data.type

    @property
    def org_id(self) -> str:
        return self.org or LOCAL_ORG


def encode(event: Event) -> dict[str, Any]:
    """The stored record (JSON-ready). Position is not part of it: the log owns positions."""
    return {
        "v": RECORD_VERSION,
        "eventId": event.event_id,
        "sandboxId": event.sandbox_id,
        "type": event.type,
        "createdAt": event.created_at,
        "data": converter.unstructure(event.data),
    } | ({"actor": event.actor} if event.actor is not None else {}) | (
        {"orgId": event.org} if event.org is not None else {}) | (
        {"projectId": event.project} if event.project is not None else {})


@attrs.frozen(slots=True)
class Encoded:
    """An event and its record as the logs write it (compact, ASCII JSON), made by
    ``encoded`` only: the recorder's round-trip check, the quota's size and the log's write
    share these bytes instead of encoding the event three times (issue 37)."""

    event: Event
    record: str

    @property
    def size(self) -> int:
        return len(self.record)  # ASCII: a character is a byte


def encoded(event: Event) -> Encoded:
    return Encoded(event, json.dumps(encode(event), separators=(",", ":")))


def recorded_size(event: Event) -> int:
    """The bytes ``event`` takes as a record, as both logs write it (compact, ASCII JSON), so
    that every store and replica folds the same count."""
    return event.size if event.size is not None else encoded(event).size


def decode(record: dict[str, Any], position: int | None = None) -> Event:
    try:
        cls = EVENT_TYPES[record["type"]]
    except KeyError as err:
        raise InvalidInput(f"unknown event type {record.get('type')!r} in the log") from err
    data: EventData = converter.structure(record.get("data") or {}, cls)
    return Event(
        event_id=record["eventId"],
        sandbox_id=record["sandboxId"],
        created_at=record["createdAt"],
        data=data,
        position=position,
        actor=record.get("actor"),
        org=record.get("orgId"),
        project=record.get("projectId"),
    )


_UNREADABLE_KEEP = 4096


def decode_or_unreadable(raw: bytes | str, position: int) -> Event:
    """``decode`` for a log reader: a record that cannot be decoded becomes an event whose
    data is ``UnreadableRecord`` (keeping the ids it has, if any) instead of an exception."""
    record: Any = None
    try:
        record = json.loads(raw)
        return decode(record, position=position)
    except Exception as err:
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        fields = record if isinstance(record, dict) else {}

        def text_of(key: str, default: str) -> str:
            value = fields.get(key)
            return value if isinstance(value, str) else default

        return Event(
            event_id=text_of("eventId", f"unreadable-{position}"),
            sandbox_id=text_of("sandboxId", ""),
            created_at=text_of("createdAt", "1970-01-01T00:00:00Z"),
            data=UnreadableRecord(reason=f"{type(err).__name__}: {err}"[:_UNREADABLE_KEEP],
                                  record=text[:_UNREADABLE_KEEP]),
            position=position,
            actor=None,
        )
