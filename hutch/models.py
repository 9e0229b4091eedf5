"""Typed results and request pieces, snake_case in Python, camelCase on the wire.

The SDK's face on :mod:`hutch.core.wire` (the shapes, shared with the server) and
:mod:`hutch.core.serde` (the one converter): field ``sandbox_id`` is key ``sandboxId``.
Unknown keys from a newer server are ignored; ``None`` fields are left out when
unstructuring, as the wire omits absent optionals. Statuses are plain strings so a server
that adds a status does not break old clients.
"""

from __future__ import annotations

from hutch.core.serde import converter, from_wire, to_wire
from hutch.core.wire import (
    TERMINAL_EXECUTION_STATUSES,
    Checkpoint,
    CommandInfo,
    CopyResult,
    CreateResult,
    Execution,
    ExecutionInfo,
    ExecutionStatusName,
    FileToWrite,
    Job,
    Network,
    OutputChunk,
    PauseResult,
    Resources,
    RunResult,
    Runtime,
    RuntimeList,
    RuntimeRef,
    RuntimeRequirements,
    SandboxEvent,
    SandboxFileInfo,
    SandboxInfo,
    SandboxList,
    SandboxStatusInfo,
    SandboxStatusName,
    Snapshot,
    SnapshotFile,
    SnapshotLineageEntry,
    SnapshotRef,
    Timeouts,
    UploadResult,
    coerce_files,
)

#: ``POST /sandbox``'s answer, by the name the SDK has always given it.
SandboxCreated = CreateResult
#: The status names, for type hints (plain strings on the wire).
SandboxStatus = SandboxStatusName
ExecutionStatus = ExecutionStatusName

__all__ = [
    "TERMINAL_EXECUTION_STATUSES",
    "Checkpoint",
    "CommandInfo",
    "CopyResult",
    "CreateResult",
    "Execution",
    "ExecutionInfo",
    "ExecutionStatus",
    "FileToWrite",
    "Job",
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
    "UploadResult",
    "coerce_files",
    "converter",
    "from_wire",
    "to_wire",
]
