"""The wire's shapes: what the HTTP API answers (and a few request pieces), snake_case in
Python and camelCase on the wire. The SDK hands these out (``hutch.models`` and
``hutch.tenancy`` re-export them); ``core.serde.converter`` maps them to and from the wire:
field ``sandbox_id`` is key ``sandboxId``, unknown keys from a newer server are ignored, and
``None`` fields are left out, as the wire omits absent optionals.

Statuses are plain strings so a server that adds a status does not break old clients; the
domain's own state (``core.models``) is folded from the log, not read from here.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import attrs

from hutch.core.models import ExecutionStatus, SnapshotFile

__all__ = [
    "TERMINAL_EXECUTION_STATUSES",
    "ApiKey",
    "Checkpoint",
    "CommandInfo",
    "CopyResult",
    "CreateResult",
    "Execution",
    "ExecutionInfo",
    "ExecutionStatusName",
    "FileToWrite",
    "Job",
    "Network",
    "Organization",
    "OutputChunk",
    "PauseResult",
    "Project",
    "Quota",
    "Resources",
    "RunResult",
    "Runtime",
    "RuntimeList",
    "RuntimeRef",
    "RuntimeRequirements",
    "SandboxEvent",
    "SandboxFileInfo",
    "SandboxInfo",
    "SandboxList",
    "SandboxStatusInfo",
    "SandboxStatusName",
    "Snapshot",
    "SnapshotFile",
    "SnapshotLineageEntry",
    "SnapshotRef",
    "SshKey",
    "Timeouts",
    "UploadResult",
    "coerce_files",
]

# The statuses by name, for type hints (``hutch.models.SandboxStatus``); the values are the
# domain's enums' (core.models), which tests/unit/test_wire_models.py holds them to.
SandboxStatusName = Literal[
    "creating",
    "idle",
    "running",
    "paused",
    "stopping",
    "suspended",
    "terminated",
    "failed",
    "deleted",
]
ExecutionStatusName = Literal["queued", "running", "completed", "failed", "timeout", "cancelled"]
TERMINAL_EXECUTION_STATUSES = frozenset(s.value for s in ExecutionStatus if s.is_final)


# ---------------------------------------------------------------- request pieces


@attrs.frozen(kw_only=True)
class Resources:
    memory: str | None = None  # "512Mi", "1Gi"
    cpu: str | None = None  # "500m", "1"
    disk: str | None = None


@attrs.frozen(kw_only=True)
class Network:
    enabled: bool | None = None
    port: int | None = None
    allow: list[str] | None = None  # hutch's egress allow-list: host names, IPv4 addresses/CIDRs
    deny: list[str] | None = None  # hutch's egress deny-list: IPv4 addresses/CIDRs (not with allow)


@attrs.frozen(kw_only=True)
class Timeouts:
    idle: str | None = None  # "10m"
    execution: str | None = None  # "30s"
    paused: str | None = None  # "24h"; "0s" = no limit


def _as_bytes(content: str | bytes | bytearray | memoryview) -> bytes:
    return content.encode() if isinstance(content, str) else bytes(content)


@attrs.frozen
class FileToWrite:
    """A file to write into the sandbox; ``path`` is relative to the workspace."""

    path: str
    content: bytes = attrs.field(converter=_as_bytes)  # text is written as UTF-8

    def to_wire(self) -> dict[str, str]:
        return {"path": self.path, "content": base64.b64encode(self.content).decode("ascii")}


# ---------------------------------------------------------------- results


@attrs.frozen(kw_only=True)
class RuntimeRef:
    id: str
    name: str
    icon_url: str | None = None
    brand_color: str | None = None
    tags: list[str] | None = None


@attrs.frozen(kw_only=True)
class SnapshotRef:
    id: str
    name: str | None = None
    tag: str | None = None
    full_name: str | None = None
    public: bool | None = None


@attrs.frozen(kw_only=True)
class Snapshot:
    """A reusable base for new sandboxes: a runtime, a workspace archive, env and metadata."""

    snapshot_id: str
    name: str
    created_at: str
    size_bytes: int = 0
    file_count: int = 0
    runtime_id: str | None = None
    runtime: str | None = None
    full_name: str | None = None
    description: str | None = None
    message: str | None = None
    tag: str | None = None
    parent_snapshot_id: str | None = None
    source_sandbox_id: str | None = None
    public: bool = False
    status: str = "ready"
    files: list[SnapshotFile] | None = None
    env: dict[str, str] | None = None
    user_metadata: dict[str, str] | None = None
    download_url: str | None = None


@attrs.frozen(kw_only=True)
class SnapshotLineageEntry:
    snapshot_id: str
    name: str
    created_at: str
    public: bool = False
    deleted: bool = False
    full_name: str | None = None
    message: str | None = None
    tag: str | None = None
    parent_snapshot_id: str | None = None


@attrs.frozen(kw_only=True)
class CommandInfo:
    exec: list[str]
    mode: str | None = None
    # ``exec`` as recorded: its first 4 KiB; how many bytes were left out, the whole's SHA-256.
    omitted_bytes: int | None = None
    sha256: str | None = None


@attrs.frozen(kw_only=True)
class SandboxInfo:
    sandbox_id: str
    status: str
    created_at: str | None = None
    executions: int = 0
    identifier: str | None = None
    name: str | None = None
    description: str | None = None
    mode: str | None = None
    region: str | None = None
    runtime: RuntimeRef | None = None
    snapshot: SnapshotRef | None = None
    exit_code: int | None = None
    stdout_stream_url: str | None = None
    stderr_stream_url: str | None = None
    audit_stream_id: str | None = None
    audit_stream_url: str | None = None
    dependencies: list[str] | None = None
    packages: list[str] | None = None
    metadata: dict[str, Any] | None = None
    resources: Resources | None = None
    cpu_time_ms: int | None = None
    memory_byte_sec: float | None = None
    memory_peak_bytes: int | None = None
    network_egress_bytes: int | None = None
    network_enabled: bool | None = None
    network_port: int | None = None
    network_allow: list[str] | None = None
    network_deny: list[str] | None = None
    url: str | None = None
    user: dict[str, Any] | None = None
    agent: dict[str, Any] | None = None
    project: dict[str, Any] | None = None
    org: dict[str, Any] | None = None
    timeout: Timeouts | None = None
    command: CommandInfo | None = None

    @property
    def id(self) -> str:
        """The sandbox's id, by the name a :class:`hutch.Sandbox` handle gives it."""
        return self.sandbox_id


@attrs.frozen(kw_only=True)
class SandboxList:
    sandboxes: list[SandboxInfo]
    total: int


@attrs.frozen(kw_only=True)
class CreateResult:
    """What ``POST /sandbox`` answers: the id, the first status, and the stream URLs
    (``hutch.models.SandboxCreated``; ``core.events.SandboxCreated`` is the event)."""

    sandbox_id: str
    status: str
    execution_id: str | None = None
    url: str | None = None
    stdout_stream_id: str | None = None
    stdout_stream_url: str | None = None
    stderr_stream_id: str | None = None
    stderr_stream_url: str | None = None
    audit_stream_id: str | None = None
    audit_stream_url: str | None = None


@attrs.frozen(kw_only=True)
class SandboxStatusInfo:
    sandbox_id: str
    status: str
    exit_code: int | None = None


@attrs.frozen(kw_only=True)
class Execution:
    """An execution as ``Sandbox.execute`` returns it.

    ``stdout``/``stderr`` hold the captured output when the call captured it (the default),
    else ``None``; the stream URLs stay readable afterwards either way.
    """

    execution_id: str
    status: str
    exit_code: int | None = None
    duration_ms: int | None = None
    stdout_stream_url: str | None = None
    stderr_stream_url: str | None = None
    output_truncated: bool | None = None
    auto_resumed: bool | None = None
    stdout: str | None = None
    stderr: str | None = None
    error: str | None = None  # why it failed, timed out or was cancelled (e.g. killed: out of memory)


@attrs.frozen(kw_only=True)
class ExecutionInfo:
    execution_id: str
    sandbox_id: str
    status: str
    type: str | None = None
    command: list[str] | None = None
    exit_code: int | None = None
    duration_ms: int | None = None
    started_at: str | None = None
    completed_at: str | None = None
    error: str | None = None
    stdout_stream_url: str | None = None
    stderr_stream_url: str | None = None
    output_truncated: bool | None = None
    # ``command`` as recorded: the argv's first 4 KiB; how many bytes were left out (absent:
    # none) and the SHA-256 of the whole argv (each argument and a NUL, as /proc/<pid>/cmdline).
    command_omitted_bytes: int | None = None
    command_sha256: str | None = None

    @property
    def done(self) -> bool:
        return self.status in TERMINAL_EXECUTION_STATUSES


@attrs.frozen(kw_only=True)
class SandboxEvent:
    event_id: str
    sandbox_id: str
    type: str
    created_at: str
    event: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class RuntimeRequirements:
    memory: str | None = None
    cpu: str | None = None
    disk: str | None = None
    network_enabled: bool | None = None


@attrs.frozen(kw_only=True)
class Runtime:
    id: str
    name: str
    description: str | None = None
    icon_url: str | None = None
    brand_color: str | None = None
    url: str | None = None
    tags: list[str] | None = None
    requirements: RuntimeRequirements | None = None
    readme: str | None = None
    # hutch's extras: built for the server's driver (else built at first use), being built
    # now, and the build's size and time.
    available: bool | None = None
    building: bool | None = None
    size_bytes: int | None = None
    built_at: str | None = None
    build_seconds: float | None = None


@attrs.frozen(kw_only=True)
class RuntimeList:
    runtimes: list[Runtime]
    total: int


@attrs.frozen(kw_only=True)
class PauseResult:
    sandbox_id: str
    status: str
    checkpoint_id: str | None = None
    terminates_at: str | None = None
    memory: bool | None = None  # False: paused filesystem-only (pause(memory=False))


@attrs.frozen(kw_only=True)
class SandboxFileInfo:
    path: str
    size: int | None = None
    is_dir: bool = False
    is_symlink: bool | None = None
    link_target: str | None = None
    mode: str | None = None
    mod_time: str | None = None


@attrs.frozen(kw_only=True)
class RunResult:
    """The outcome of a one-shot :meth:`SandboxClient.run`."""

    sandbox_id: str
    exit_code: int
    duration_ms: int
    stdout: str
    stderr: str
    execution_id: str | None = None
    status: str | None = None
    output_truncated: bool | None = None
    error: str | None = None  # why it failed, timed out or was cancelled (e.g. killed: out of memory)


@attrs.frozen
class Job:
    """A background job (``POST /sandbox/sandboxes/{id}/jobs``): it outlives the request that
    started it; its output goes to the stream URLs."""

    job_id: str
    sandbox_id: str
    command: list[str]
    status: str  # pending | running | completed | failed | cancelled
    exit_code: int | None = None
    started_at: str | None = None
    completed_at: str | None = None
    error: str | None = None
    stdout_stream_url: str | None = None
    stderr_stream_url: str | None = None
    command_omitted_bytes: int | None = None  # ``command`` as recorded: see ExecutionInfo
    command_sha256: str | None = None

    @property
    def done(self) -> bool:
        return self.status in ("completed", "failed", "cancelled")


@attrs.frozen
class Checkpoint:
    """A disk checkpoint: a named restore point of one sandbox's writable filesystem."""

    id: str
    name: str
    created_at: str
    parent: str = ""  # the checkpoint this state grew from ("" for the base)


@attrs.frozen
class UploadResult:
    """What ``POST /fs/upload`` extracted."""

    files: int = 0
    directories: int = 0
    symlinks: int = 0
    bytes: int = 0


@attrs.frozen
class CopyResult:
    """The outcome of :meth:`hutch.SandboxClient.copy_to` / ``copy_from`` (the CLI's ``fs cp --json``)."""

    source: str
    destination: str
    bytes_transferred: int
    files_transferred: int
    directories_created: list[str] = attrs.field(factory=list)


@attrs.frozen
class OutputChunk:
    """A piece of streamed output: ``stream`` is "stdout" or "stderr"."""

    stream: Literal["stdout", "stderr"]
    data: bytes


# ---------------------------------------------------------------- organizations (client.tenancy)


@attrs.frozen
class Quota:
    sandboxes: int | None = None
    memory_bytes: int | None = None
    cpu_millis: int | None = None
    snapshot_bytes: int | None = None


@attrs.frozen
class Organization:
    id: str
    name: str
    created_at: str
    quota: Quota = Quota()
    usage: Quota | None = None  # what live sandboxes and snapshots use now (from get_org)


@attrs.frozen
class Project:
    id: str
    name: str
    org_id: str
    created_at: str


@attrs.frozen
class ApiKey:
    id: str
    name: str
    org_id: str
    role: str  # admin | member | read-only
    prefix: str
    created_at: str
    projects: tuple[str, ...] = ()
    expires_at: str | None = None
    revoked_at: str | None = None
    rate: float | None = None
    burst: int | None = None
    secret: str | None = None  # only in what create_key returns: shown once, kept nowhere


@attrs.frozen
class SshKey:
    """A public key registered for the SSH gateway (``ssh -p PORT sbx_…@host``)."""

    id: str
    org_id: str
    name: str
    public_key: str
    fingerprint: str
    created_at: str
    added_by: str | None = None
    projects: list[str] = attrs.field(factory=list)


def coerce_files(
    files: Mapping[str, bytes | str] | Iterable[FileToWrite] | None,
) -> list[FileToWrite]:
    """Accept ``{"path": content}`` or an iterable of :class:`FileToWrite`."""
    if files is None:
        return []
    if isinstance(files, Mapping):
        return [FileToWrite(path, content) for path, content in files.items()]
    return [f if isinstance(f, FileToWrite) else FileToWrite(*f) for f in files]
