"""The domain's state: what a sandbox and an execution are at a point in the log.

Frozen attrs classes; ``core.lifecycle.evolve`` is the only thing that makes a new one
from an event. Times are ISO-8601 UTC strings, as the wire carries them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import attrs


class SandboxStatus(StrEnum):
    CREATING = "creating"
    IDLE = "idle"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPING = "stopping"
    SUSPENDED = "suspended"
    TERMINATED = "terminated"
    FAILED = "failed"
    DELETED = "deleted"

    @property
    def is_final(self) -> bool:
        return self in (SandboxStatus.TERMINATED, SandboxStatus.FAILED, SandboxStatus.DELETED)


class ExecutionStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self not in (ExecutionStatus.QUEUED, ExecutionStatus.RUNNING)


class Mode(StrEnum):
    ONESHOT = "oneshot"
    INTERACTIVE = "interactive"


@attrs.frozen
class ResourceSpec:
    """As the user gave them (normalised strings) plus parsed values for drivers."""

    memory: str | None = None
    cpu: str | None = None
    disk: str | None = None
    memory_bytes: int | None = None
    cpu_millis: int | None = None
    disk_bytes: int | None = None


@attrs.frozen
class NetworkSpec:
    enabled: bool = False
    port: int | None = None
    allow: tuple[str, ...] = ()  # hutch's egress allow-list (core/egress.py); () = unrestricted
    # A deny-list of IPv4 CIDRs (core/egress.parse_deny), never with ``allow`` (a list already
    # denies what it does not name); () = none.
    deny: tuple[str, ...] = ()


ON_IDLE_PAUSE = "pause"  # TimeoutSpec.on_idle: pause, the memory kept
ON_IDLE_PAUSE_FILESYSTEM = "pause-filesystem"  # pause filesystem-only (E2B's keep_memory=False)


@attrs.frozen
class TimeoutSpec:
    idle: str | None = None
    execution: str | None = None
    paused: str | None = None
    # What the idle timeout does: None ends the sandbox; "pause" pauses it (E2B's
    # lifecycle.on_timeout "pause"), and a resume carries on from there; "pause-filesystem"
    # pauses it filesystem-only (E2B's keep_memory false), and a resume boots it again.
    on_idle: str | None = None
    # What the idle timeout counts from: None, the sandbox's last activity (it ends once idle that
    # long); "set", when it was set (the create, a change, a resume), busy or not: E2B's timeout,
    # which ends a sandbox whose commands still run. A string, not a bool, so that the records of
    # every other sandbox stay as they were (None is left out of them).
    since: str | None = None


@attrs.frozen
class SandboxSpec:
    """Everything a create request asked for, validated. Carried by the SandboxCreated event."""

    runtime: str
    runtime_id: str
    mode: Mode = Mode.INTERACTIVE
    name: str | None = None
    description: str | None = None
    resources: ResourceSpec = ResourceSpec()
    env: dict[str, str] = attrs.field(factory=dict)
    network: NetworkSpec = NetworkSpec()
    timeout: TimeoutSpec = TimeoutSpec()
    command: tuple[str, ...] | None = None
    metadata: dict[str, Any] | None = None  # arbitrary JSON, kept as given
    project_id: str | None = None
    org_id: str = "org_local"  # the organization it belongs to (core.tenancy; older records: org_local)
    snapshot_id: str | None = None  # created from this snapshot (its runtime, env, workspace)
    dependencies: tuple[str, ...] = ()  # apt packages installed into this sandbox's runtime
    packages: tuple[str, ...] = ()  # npm packages installed globally in it
    # As recorded, ``command`` is the first 4 KiB of the command's argv (core.limits.recorded_argv):
    # how many bytes of it the record left out, and the SHA-256 of the whole. None: nothing left out.
    command_omitted_bytes: int | None = None
    command_sha256: str | None = None
    # The sandbox account's name (home /home/<user>), where the E2B wire asks for E2B's "user";
    # None: hutch's own, agentuity. Not on the Agentuity wire.
    user: str | None = None


@attrs.frozen
class CheckpointState:
    checkpoint_id: str
    name: str
    created_at: str
    parent: str = ""  # the name of the checkpoint this state grew from ("" for the base)


@attrs.frozen
class SandboxState:
    sandbox_id: str
    spec: SandboxSpec
    status: SandboxStatus
    created_at: str
    updated_at: str
    executions: int = 0  # how many were ever started
    running: frozenset[str] = frozenset()  # execution ids in flight
    exit_code: int | None = None  # of the oneshot command / last execution, when final
    reason: str | None = None  # why it failed or terminated
    paused_at: str | None = None
    terminates_at: str | None = None  # a paused sandbox's deadline (timeout.paused)
    paused_mode: str | None = None  # a paused sandbox's: None, memory kept; "filesystem", its files only
    timeout_set_at: str | None = None  # when its timeout was last set, where it counts from then (timeout.since)
    checkpoints: tuple[CheckpointState, ...] = ()
    current_checkpoint: str = ""  # name of the checkpoint last taken or restored: the next one's parent
    initial_execution_id: str | None = None
    api_key_id: str | None = None  # which key created it (audit)
    cpu_seconds: float | None = None  # recorded as it ended (a "usage" event)
    memory_peak_bytes: int | None = None
    # What its events take in the event log (each record as encoded, core.events.recorded_size):
    # the log is kept for ever, so this counts against the organization's storage quota.
    log_bytes: int = 0
    node: str | None = None  # the machine it runs on, as recorded (lifecycle:started, lifecycle:moved)
    # Set when a survivor ended it as a sandbox no event recorded (lifecycle:discarded): why.
    discarded: str | None = None

    @property
    def unrecorded(self) -> bool:
        """Ended before any event recorded its creation (``lifecycle:discarded`` alone): no spec,
        no organization. The stores keep it, so that a create appended late lands on it and is
        failed, and show it to no reader (as if absent) until then."""
        return self.discarded is not None and not self.created_at


@attrs.frozen
class ExecutionState:
    execution_id: str
    sandbox_id: str
    command: tuple[str, ...]
    status: ExecutionStatus
    created_at: str
    type: str = "exec"
    started_at: str | None = None
    completed_at: str | None = None
    exit_code: int | None = None
    duration_ms: int | None = None
    error: str | None = None
    output_truncated: bool = False
    timeout_seconds: float | None = None
    # ``command`` as its event recorded it: its argv's first 4 KiB (core.limits.recorded_argv);
    # how many bytes it left out and the SHA-256 of the whole. None: nothing left out.
    command_omitted_bytes: int | None = None
    command_sha256: str | None = None


class SnapshotStatus(StrEnum):
    BUILDING = "building"  # a build was started; its archive and finalize have not arrived
    READY = "ready"
    DELETED = "deleted"


@attrs.frozen
class SnapshotFile:
    """A file in a snapshot's workspace archive: in its events and on the wire alike."""

    path: str  # relative to the workspace
    size: int
    sha256: str
    mode: int = 0o644
    content_type: str = "application/octet-stream"


@attrs.frozen
class SnapshotState:
    """A reusable base: a runtime plus a workspace archive, env and metadata (core.snapshots)."""

    snapshot_id: str
    name: str
    runtime: str
    runtime_id: str
    status: SnapshotStatus
    created_at: str
    updated_at: str
    tag: str | None = None
    description: str | None = None
    message: str | None = None
    public: bool = False
    source_sandbox_id: str | None = None  # the sandbox it was taken from (None: built)
    parent_snapshot_id: str | None = None  # the snapshot that sandbox was created from
    size_bytes: int = 0
    file_count: int = 0
    files: tuple[SnapshotFile, ...] = ()
    env: dict[str, str] = attrs.field(factory=dict)
    metadata: dict[str, str] = attrs.field(factory=dict)
    content_hash: str | None = None  # a build's content hash: unchanged content is not rebuilt
    api_key_id: str | None = None
    org_id: str = "org_local"
    dependencies: tuple[str, ...] = ()  # apt packages its sandboxes get installed
    packages: tuple[str, ...] = ()  # npm packages its sandboxes get installed
    # Its sandbox's project (a build's: the building key's). None, as every snapshot recorded
    # before snapshots had projects: organization-wide, seen by keys not limited to projects.
    project_id: str | None = None
