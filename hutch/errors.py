"""Errors the client raises: the SDK's face on :mod:`hutch.core.errors`, the one hierarchy the
server raises too. The root is :class:`SandboxError` (another name for ``HutchError``).

Every error carries the server's ``message``, its machine ``code`` and the HTTP ``status``
(``None`` when no response arrived; an error the SDK raises before asking, such as an
``InvalidInput`` for a bad argument, carries its kind's). The class is chosen by the server's
code first, then by the HTTP status, so ``except NotFound`` catches ``SANDBOX_NOT_FOUND`` and a
bare 404 alike.
"""

from __future__ import annotations

from hutch.core.errors import (
    Conflict,
    ConnectionFailed,
    ExecutionCancelled,
    ExecutionNotFound,
    ExecutionTimedOut,
    FileNotFound,
    HutchError,
    InvalidInput,
    InvalidState,
    NotFound,
    NotSupported,
    PayloadTooLarge,
    RuntimeNotFound,
    SandboxBusy,
    SandboxNotFound,
    SandboxTerminatedError,
    ServerError,
    ServiceUnavailable,
    SnapshotNotFound,
    Unauthorized,
    error_from_response,
)

#: The root of every error hutch raises, by the name the SDK has always given it.
SandboxError = HutchError
#: ``core.errors.SandboxTerminatedError``, by its SDK name (``core.events`` has an event so named).
SandboxTerminated = SandboxTerminatedError

__all__ = [
    "Conflict",
    "ConnectionFailed",
    "ExecutionCancelled",
    "ExecutionNotFound",
    "ExecutionTimedOut",
    "FileNotFound",
    "HutchError",
    "InvalidInput",
    "InvalidState",
    "NotFound",
    "NotSupported",
    "PayloadTooLarge",
    "RuntimeNotFound",
    "SandboxBusy",
    "SandboxError",
    "SandboxNotFound",
    "SandboxTerminated",
    "SandboxTerminatedError",
    "ServerError",
    "ServiceUnavailable",
    "SnapshotNotFound",
    "Unauthorized",
    "error_from_response",
]
