"""hutch's public client: async and blocking Python SDKs for the sandbox API, and the CLI.

    from hutch import SandboxClient          # async (aiohttp)
    from hutch import SyncSandboxClient      # blocking facade (hutch.sync)

    async with SandboxClient() as client:
        result = await client.run(["python3", "-c", "print(6 * 7)"], runtime="python:3.13")
        print(result.exit_code, result.stdout)

Errors are :class:`hutch.errors.SandboxError` subclasses carrying the server's
``message``, ``code`` and HTTP ``status``.
"""

from __future__ import annotations

from hutch import errors
from hutch._interpreter import CodeContext, CodeError, CodeExecution, CodeOutput
from hutch._version import __version__
from hutch.client import (
    Duration,
    ExecutionHandle,
    Files,
    JobHandle,
    OutputSink,
    Sandbox,
    SandboxClient,
    SandboxOptions,
)
from hutch.errors import (
    ConnectionFailed,
    ExecutionNotFound,
    FileNotFound,
    InvalidInput,
    NotFound,
    SandboxBusy,
    SandboxError,
    SandboxNotFound,
    Unauthorized,
)
from hutch.models import (
    Checkpoint,
    CopyResult,
    Execution,
    ExecutionInfo,
    FileToWrite,
    Job,
    Network,
    OutputChunk,
    PauseResult,
    Resources,
    RunResult,
    Runtime,
    RuntimeList,
    SandboxCreated,
    SandboxEvent,
    SandboxFileInfo,
    SandboxInfo,
    SandboxList,
    SandboxStatusInfo,
    Snapshot,
    SnapshotFile,
    SnapshotLineageEntry,
    Timeouts,
    UploadResult,
)
from hutch.sync import SyncJobHandle, SyncSandbox, SyncSandboxClient
from hutch.workspace import SyncWorkspace, Workspace, WorkspaceSnapshot

__all__ = [
    "Checkpoint",
    "CodeContext",
    "CodeError",
    "CodeExecution",
    "CodeOutput",
    "ConnectionFailed",
    "CopyResult",
    "Duration",
    "Execution",
    "ExecutionHandle",
    "ExecutionInfo",
    "ExecutionNotFound",
    "FileNotFound",
    "FileToWrite",
    "Files",
    "InvalidInput",
    "Job",
    "JobHandle",
    "Network",
    "NotFound",
    "OutputChunk",
    "OutputSink",
    "PauseResult",
    "Resources",
    "RunResult",
    "Runtime",
    "RuntimeList",
    "Sandbox",
    "SandboxBusy",
    "SandboxClient",
    "SandboxCreated",
    "SandboxError",
    "SandboxEvent",
    "SandboxFileInfo",
    "SandboxInfo",
    "SandboxList",
    "SandboxNotFound",
    "SandboxOptions",
    "SandboxStatusInfo",
    "Snapshot",
    "SnapshotFile",
    "SnapshotLineageEntry",
    "SyncJobHandle",
    "SyncSandbox",
    "SyncSandboxClient",
    "SyncWorkspace",
    "Timeouts",
    "Unauthorized",
    "UploadResult",
    "Workspace",
    "WorkspaceSnapshot",
    "__version__",
    "errors",
]
