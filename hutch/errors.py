"""Errors the client raises. The root is :class:`SandboxError` (itself a ``core`` ``HutchError``).

Every error carries the server's ``message``, its machine ``code`` and the HTTP ``status``
(``None`` when no response arrived). The class is chosen by the server's code first, then
by the HTTP status, so ``except NotFound`` catches ``SANDBOX_NOT_FOUND`` and a bare 404 alike.
"""

from __future__ import annotations

from typing import Any

from hutch.core.errors import HutchError

__all__ = [
    "Conflict",
    "ConnectionFailed",
    "ExecutionCancelled",
    "ExecutionNotFound",
    "ExecutionTimedOut",
    "FileNotFound",
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
    "ServerError",
    "ServiceUnavailable",
    "SnapshotNotFound",
    "Unauthorized",
    "error_from_response",
]


class SandboxError(HutchError):
    """A request the server refused or could not serve.

    ``status`` and ``code`` are instance attributes here: they are what the server said.
    """

    default_code = "SANDBOX_ERROR"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        field: str | None = None,
        sandbox_id: str | None = None,
        execution_id: str | None = None,
        details: Any = None,
    ) -> None:
        super().__init__(message, field=field)
        # HutchError's code and status are ClassVars (a server error kind has one of each);
        # a client error carries what the server said, and no status when none answered.
        self.code = code or self.default_code  # type: ignore[misc]  # per instance, see above
        self.status = status  # type: ignore[misc,assignment]  # per instance, and int | None
        self.sandbox_id = sandbox_id
        self.execution_id = execution_id
        self.details = details

    @property
    def retriable(self) -> bool:  # type: ignore[override]  # from the status, not a ClassVar
        return self.status in (502, 503, 504) or isinstance(self, ConnectionFailed)

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.message!r}, code={self.code!r}, status={self.status!r})"
        )


class InvalidInput(SandboxError):
    default_code = "INVALID_INPUT"


class Unauthorized(SandboxError):
    default_code = "UNAUTHORIZED"


class NotFound(SandboxError):
    default_code = "NOT_FOUND"


class SandboxNotFound(NotFound):
    default_code = "SANDBOX_NOT_FOUND"


class ExecutionNotFound(NotFound):
    default_code = "EXECUTION_NOT_FOUND"


class RuntimeNotFound(NotFound):
    default_code = "RUNTIME_NOT_FOUND"


class FileNotFound(NotFound):
    """A path that does not exist in the sandbox."""

    default_code = "FILE_NOT_FOUND"


class SnapshotNotFound(NotFound):
    default_code = "SNAPSHOT_NOT_FOUND"


class Conflict(SandboxError):
    default_code = "CONFLICT"


class SandboxBusy(Conflict):
    """Another execution is still running; executions in one sandbox are serialized."""

    default_code = "SANDBOX_BUSY"


class InvalidState(Conflict):
    """The sandbox's state does not allow this (e.g. execute on a terminated sandbox)."""

    default_code = "INVALID_STATE"


class SandboxTerminated(InvalidState):
    default_code = "SANDBOX_TERMINATED"


class ExecutionTimedOut(SandboxError):
    default_code = "EXECUTION_TIMEOUT"


class ExecutionCancelled(SandboxError):
    default_code = "EXECUTION_CANCELLED"


class PayloadTooLarge(SandboxError):
    default_code = "PAYLOAD_TOO_LARGE"


class NotSupported(SandboxError):
    default_code = "NOT_SUPPORTED"


class ServerError(SandboxError):
    default_code = "INTERNAL_ERROR"


class ServiceUnavailable(ServerError):
    default_code = "UNAVAILABLE"


class ConnectionFailed(SandboxError):
    """No HTTP response: the server is down, the URL is wrong, or the connection broke."""

    default_code = "CONNECTION_FAILED"


_BY_CODE: dict[str, type[SandboxError]] = {
    "INVALID_INPUT": InvalidInput,
    "VALIDATION_ERROR": InvalidInput,
    "UNAUTHORIZED": Unauthorized,
    "NOT_FOUND": NotFound,
    "SANDBOX_NOT_FOUND": SandboxNotFound,
    "EXECUTION_NOT_FOUND": ExecutionNotFound,
    "RUNTIME_NOT_FOUND": RuntimeNotFound,
    "SNAPSHOT_NOT_FOUND": SnapshotNotFound,
    "FILE_NOT_FOUND": FileNotFound,
    "SANDBOX_BUSY": SandboxBusy,
    "INVALID_STATE": InvalidState,
    "SANDBOX_TERMINATED": SandboxTerminated,
    "EXECUTION_TIMEOUT": ExecutionTimedOut,
    "EXECUTION_CANCELLED": ExecutionCancelled,
    "PAYLOAD_TOO_LARGE": PayloadTooLarge,
    "NOT_SUPPORTED": NotSupported,
    "DRIVER_ERROR": ServerError,
    "INTERNAL_ERROR": ServerError,
    "EVENT_LOG_UNAVAILABLE": ServiceUnavailable,
}

_BY_STATUS: dict[int, type[SandboxError]] = {
    400: InvalidInput,
    401: Unauthorized,
    403: Unauthorized,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: InvalidInput,
    501: NotSupported,
    503: ServiceUnavailable,
}

_FALLBACK_MESSAGES = {
    400: "the server rejected the request as invalid",
    401: "unauthorized: the API key is missing or wrong (set HUTCH_API_KEY or pass api_key=)",
    403: "forbidden",
    404: "not found",
    409: "conflict with the current state",
    413: "request body too large",
    500: "the server failed to handle the request",
    502: "the server's backend failed",
    503: "the server is unavailable",
}


def error_from_response(
    status: int | None,
    body: Any,
    *,
    sandbox_id: str | None = None,
    execution_id: str | None = None,
) -> SandboxError:
    """Build the right error from an HTTP status and a (possibly non-JSON) body."""
    message: str | None = None
    code: str | None = None
    field: str | None = None
    details: Any = None
    if isinstance(body, dict):
        raw_message = body.get("message")
        raw_error = body.get("error")
        if isinstance(raw_message, str) and raw_message:
            message = raw_message
        elif isinstance(raw_error, str) and raw_error:
            message = raw_error
        elif isinstance(raw_error, dict) and isinstance(raw_error.get("message"), str):
            message = raw_error["message"]
        if isinstance(body.get("code"), str):
            code = body["code"]
        if isinstance(body.get("field"), str):
            field = body["field"]
        details = body.get("details")
    elif isinstance(body, str) and body.strip() and len(body) < 500:
        message = body.strip()
    cls: type[SandboxError] | None = _BY_CODE.get(code or "")
    if cls is None and status is not None:
        cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else SandboxError)
    cls = cls or SandboxError
    # A 404 from a sandbox-scoped route means the sandbox, unless the server said otherwise.
    if cls is NotFound and code is None:
        if execution_id is not None:
            cls = ExecutionNotFound
        elif sandbox_id is not None:
            cls = SandboxNotFound
    if message is None:
        message = _FALLBACK_MESSAGES.get(status or 0, f"request failed (HTTP {status})")
    return cls(
        message,
        code=code,
        status=status,
        field=field,
        sandbox_id=sandbox_id,
        execution_id=execution_id,
        details=details,
    )
