"""Typed results and request pieces, snake_case in Python, camelCase on the wire.

One cattrs converter (:data:`converter`) maps every attrs class here to and from the wire:
field ``sandbox_id`` is key ``sandboxId``. Unknown keys from a newer server are ignored;
``None`` fields are left out when unstructuring, as the wire omits absent optionals.
Statuses are plain strings so a server that adds a status does not break old clients.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

__all__ = [
    "TERMINAL_EXECUTION_STATUSES",
    "CommandInfo",
    "Execution",
    "ExecutionInfo",
    "ExecutionStatus",
    "FileToWrite",
    "Network",
    "OutputChunk",
    "PauseResult",
    "Resources",
    "RunResult",
    "Runtime",
    "RuntimeList",
    "RuntimeRef",
    "RuntimeRequirements",
    "SandboxCreated",
    "SandboxEvent",
    "SandboxFileInfo",
    "SandboxInfo",
    "SandboxList",
    "SandboxStatus",
    "SandboxStatusInfo",
    "Snapshot",
    "SnapshotFile",
    "SnapshotLineageEntry",
    "SnapshotRef",
    "Timeouts",
    "converter",
    "from_wire",
    "to_wire",
]

SandboxStatus = Literal[
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
ExecutionStatus = Literal["queued", "running", "completed", "failed", "timeout", "cancelled"]
TERMINAL_EXECUTION_STATUSES = frozenset({"completed", "failed", "timeout", "cancelled"})

T = TypeVar("T")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


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


@attrs.frozen(kw_only=True)
class Timeouts:
    idle: str | None = None  # "10m"
    execution: str | None = None  # "30s"
    paused: str | None = None  # "24h"; "0s" = no limit


@attrs.frozen
class FileToWrite:
    """A file to write into the sandbox; ``path`` is relative to the workspace."""

    path: str
    content: bytes = attrs.field(converter=lambda c: c.encode() if isinstance(c, str) else bytes(c))

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
class SnapshotFile:
    path: str  # relative to the workspace
    size: int
    sha256: str
    content_type: str = "application/octet-stream"
    mode: int = 0o644


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
class SandboxCreated:
    """What ``POST /sandbox`` answers: the id, the first status, and the stream URLs."""

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


# ---------------------------------------------------------------- the converter

converter = cattrs.Converter(omit_if_default=False)


_WIRE_MODULES = (__name__, "hutch.tenancy")  # modules whose attrs classes are wire shapes


def _is_ours(cls: type) -> bool:
    return attrs.has(cls) and cls.__module__ in _WIRE_MODULES and cls not in (FileToWrite, OutputChunk)


def _structure_factory(cls: type) -> Any:
    overrides = {f.name: override(rename=_camel(f.name)) for f in attrs.fields(cls)}
    # mypy matches a ** of per-attribute overrides against cattrs' own keyword flags (bool).
    return make_dict_structure_fn(cls, converter, **overrides)  # type: ignore[arg-type]  # overrides, not cattrs' own flags


def _unstructure_factory(cls: type) -> Any:
    overrides = {f.name: override(rename=_camel(f.name)) for f in attrs.fields(cls)}
    inner: Callable[[Any], dict[str, Any]] = make_dict_unstructure_fn(cls, converter, **overrides)  # type: ignore[arg-type]  # overrides, not cattrs' own flags

    def unstructure(obj: Any) -> dict[str, Any]:
        return {k: v for k, v in inner(obj).items() if v is not None}

    return unstructure


converter.register_structure_hook_factory(_is_ours, _structure_factory)
converter.register_unstructure_hook_factory(_is_ours, _unstructure_factory)


def from_wire(cls: type[T], data: Any) -> T:
    """Parse one wire object (camelCase dict) into ``cls``.

    Raises :class:`hutch.errors.ServerError` when the server's answer does not fit, naming what.
    """
    try:
        return converter.structure(data, cls)
    except (cattrs.BaseValidationError, KeyError, TypeError, ValueError) as err:
        from hutch.errors import ServerError

        detail = (
            "; ".join(cattrs.transform_error(err))
            if isinstance(err, cattrs.BaseValidationError)
            else str(err)
        )
        raise ServerError(
            f"unexpected response shape for {cls.__name__}: {detail}", code="BAD_RESPONSE"
        ) from err


def to_wire(obj: Any) -> Any:
    """A model (or list of models) as the wire's camelCase dicts, ``None`` fields left out."""
    return converter.unstructure(obj)


def coerce_files(
    files: Mapping[str, bytes | str] | Iterable[FileToWrite] | None,
) -> list[FileToWrite]:
    """Accept ``{"path": content}`` or an iterable of :class:`FileToWrite`."""
    if files is None:
        return []
    if isinstance(files, Mapping):
        return [FileToWrite(path, content) for path, content in files.items()]
    return [f if isinstance(f, FileToWrite) else FileToWrite(*f) for f in files]
