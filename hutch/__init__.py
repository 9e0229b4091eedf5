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
from hutch.client import Duration, ExecutionHandle, Files, OutputSink, Sandbox, SandboxClient
from hutch.errors import (
    ConnectionFailed,
    ExecutionNotFound,
    InvalidInput,
    NotFound,
    SandboxBusy,
    SandboxError,
    SandboxNotFound,
    Unauthorized,
)
from hutch.models import (
    Execution,
    ExecutionInfo,
    FileToWrite,
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
    Timeouts,
)
from hutch.sync import SyncSandbox, SyncSandboxClient

__version__ = "0.1.0"

__all__ = [
    "ConnectionFailed",
    "Duration",
    "Execution",
    "ExecutionHandle",
    "ExecutionInfo",
    "ExecutionNotFound",
    "FileToWrite",
    "Files",
    "InvalidInput",
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
    "SandboxStatusInfo",
    "SyncSandbox",
    "SyncSandboxClient",
    "Timeouts",
    "Unauthorized",
    "__version__",
    "errors",
]
