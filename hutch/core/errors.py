"""One error hierarchy for the server and the SDK, rooted at :class:`HutchError`.

Every class knows its HTTP status and a stable machine code: the server answers with them
(``to_wire``), and the SDK turns an answer back into the same class (``error_from_response``),
so ``except NotFound`` catches a ``SandboxNotFound`` raised in the server, in the SDK, or read
from a bare 404 alike. ``hutch.errors`` is the SDK's face on this module.

Foreign errors are translated at the boundary with ``raise ... from err`` so a user
sees what was wrong (and which field), never a traceback.
"""

from __future__ import annotations

from typing import Any

#: HTTP statuses worth a retry: the backend or the server is briefly away.
RETRY_STATUSES = frozenset({502, 503, 504})


class HutchError(Exception):
    """The root. ``status`` and ``code`` are the class's own (one HTTP status and one machine
    code per kind); an error read from a server's answer carries what that answer said instead,
    and ``status`` is ``None`` when no answer arrived (:class:`ConnectionFailed`).

    ``retriable`` is the kind's when the error was raised here, and follows the status when it
    came from an answer (502, 503 and 504 are worth a retry, whatever the code).
    """

    status: int | None = 500
    code: str = "INTERNAL_ERROR"
    retriable: bool = False

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        code: str | None = None,
        status: int | None = None,
        sandbox_id: str | None = None,
        execution_id: str | None = None,
        details: Any = None,
        **context: Any,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code:
            self.code = code
        if status is not None:
            # Context once took any keyword, a sandbox's ``status=`` among them: refuse it loudly.
            if not isinstance(status, int) or isinstance(status, bool):
                raise TypeError(f"status: an HTTP status (int), got {status!r}; a sandbox's state is sandbox_status=")
            self.status = status
            self.retriable = status in RETRY_STATUSES
        self.sandbox_id = sandbox_id
        self.execution_id = execution_id
        self.details = details
        self.context = context

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code!r}, status={self.status!r})"

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"success": False, "message": self.message, "code": self.code}
        if self.field:
            body["field"] = self.field
        return body


class InvalidInput(HutchError):
    status = 400
    code = "INVALID_INPUT"


class Unauthorized(HutchError):
    status = 401
    code = "UNAUTHORIZED"


class Forbidden(HutchError):
    """The key is known but its role does not allow this (never used to hide another
    organization's ids: those are ``NotFound``, as if they did not exist)."""

    status = 403
    code = "FORBIDDEN"


class QuotaExceeded(HutchError):
    """An organization's quota would be exceeded; the message names the quota, its limit
    and its use. 403, not 402: the real client turns 402 into an upgrade prompt without
    the message, and not 409/429, which it would retry."""

    status = 403
    code = "QUOTA_EXCEEDED"

    def to_wire(self) -> dict[str, Any]:
        return super().to_wire() | {k: self.context[k] for k in ("quota", "limit", "used") if k in self.context}


class RateLimited(HutchError):
    status = 429
    code = "RATE_LIMITED"


class NotFound(HutchError):
    status = 404
    code = "NOT_FOUND"


class SandboxNotFound(NotFound):
    code = "SANDBOX_NOT_FOUND"


class ExecutionNotFound(NotFound):
    code = "EXECUTION_NOT_FOUND"


class RuntimeNotFound(NotFound):
    code = "RUNTIME_NOT_FOUND"


class CheckpointNotFound(NotFound):
    code = "CHECKPOINT_NOT_FOUND"


class SnapshotNotFound(NotFound):
    code = "SNAPSHOT_NOT_FOUND"


class FileNotFound(NotFound):
    """A path that does not exist in the sandbox."""

    code = "FILE_NOT_FOUND"


class Conflict(HutchError):
    status = 409
    code = "CONFLICT"


class SandboxBusy(Conflict):
    """Another execution is still running; executions in one sandbox are serialized."""

    code = "SANDBOX_BUSY"


class InvalidState(Conflict):
    """A command that the sandbox's state does not allow (e.g. execute on a terminated sandbox)."""

    code = "INVALID_STATE"


# The server's name for it, kept for the modules that raise it (see the issue 34 renames).
IllegalTransition = InvalidState


class SandboxTerminatedError(InvalidState):
    """The sandbox has ended (``hutch.errors.SandboxTerminated``; the event of that name is
    ``core.events.SandboxTerminated``)."""

    code = "SANDBOX_TERMINATED"


class PayloadTooLarge(HutchError):
    status = 413
    code = "PAYLOAD_TOO_LARGE"


class UnsupportedMediaType(HutchError):
    status = 415
    code = "UNSUPPORTED_MEDIA_TYPE"


class NotSupported(HutchError):
    """The chosen backend cannot do this (see the driver's capabilities)."""

    status = 501
    code = "NOT_SUPPORTED"


class ExecutionTimedOut(HutchError):
    """An execution ran past its timeout. No HTTP status of its own: the server reports a
    timed-out execution in its result, not as a failed request."""

    status = None
    code = "EXECUTION_TIMEOUT"


class ExecutionCancelled(HutchError):
    status = None
    code = "EXECUTION_CANCELLED"


class ServerError(HutchError):
    """The server failed to handle the request, or answered in a shape the SDK cannot read."""

    status = 500
    code = "INTERNAL_ERROR"


class DriverFailure(ServerError):
    status = 502
    code = "DRIVER_ERROR"


class EndedUnadopted(DriverFailure):
    """A driver's ``adopt`` found the sandbox running, could not keep it (the nomad driver: its
    state file not written) and ended it. Any other failure of an adopt (Nomad not answering)
    says nothing of whether it still runs: nothing was ended, so nothing may be recorded so."""


class ServiceUnavailable(ServerError):
    """Something the server needs is briefly away: try again shortly."""

    status = 503
    code = "UNAVAILABLE"
    retriable = True


class LogUnavailable(ServiceUnavailable):
    code = "EVENT_LOG_UNAVAILABLE"


class LogMismatch(ServiceUnavailable):
    """The projection store and the event log part ways: the store folds another log (a new
    or recreated topic, a swapped events.db, two deployments on one database) or holds
    more than its log (the log lost records). Refused, never skipped past: a projector
    would otherwise treat the log's new events as already applied. Not retriable: it lasts
    until an operator looks."""

    code = "PROJECTION_LOG_MISMATCH"
    retriable = False


class ProjectionUnavailable(ServiceUnavailable):
    """A write reached the log but the views do not show it (the projector is stopped or
    behind): the request fails rather than acknowledge what readers cannot see."""

    code = "PROJECTION_UNAVAILABLE"


class ReplicaUnavailable(ServiceUnavailable):
    """The replica that owns the sandbox cannot be reached, or the sandbox is moving to
    another replica (a take-over in progress): try again shortly."""

    code = "REPLICA_UNAVAILABLE"


class NoCapacity(ServiceUnavailable):
    """No node can take the sandbox asked for (the node driver's placement): worth a retry
    once sandboxes end."""

    code = "NO_CAPACITY"


class NodeFull(ServiceUnavailable):
    """A node agent's own admission refused a sandbox (another API replica took the room
    first); the node driver places it elsewhere."""

    code = "NODE_FULL"


class ConnectionFailed(HutchError):
    """No HTTP response: the server is down, the URL is wrong, or the connection broke."""

    status = None
    code = "CONNECTION_FAILED"
    retriable = True


# ---------------------------------------------------------------- from a node agent's answer


def _subclasses(cls: type[HutchError]) -> list[type[HutchError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_subclasses(sub))
    return out


def from_wire(status: int, body: Any) -> HutchError:
    """The error a node agent raised (status + ``to_wire()`` body), as the very class it was:
    unlike the SDK's mapping (``error_from_response``) a DRIVER_ERROR stays a DriverFailure,
    so the service treats an agent's refusal as it treats the local driver's."""
    by_code = {c.code: c for c in reversed(_subclasses(HutchError)) if "code" in c.__dict__}
    message = body.get("message") if isinstance(body, dict) else None
    code = body.get("code") if isinstance(body, dict) else None
    field = body.get("field") if isinstance(body, dict) else None
    cls = by_code.get(code) if isinstance(code, str) else None
    if cls is None:
        return DriverFailure(f"the node agent answered HTTP {status}: {message or body!r}")
    err = cls(message if isinstance(message, str) else f"the node agent answered HTTP {status}",
              field=field if isinstance(field, str) else None)
    return err


# ---------------------------------------------------------------- from a server's answer

# What the SDK raises for a code, then for a status. Kept as the SDK has always mapped them
# (a 403 is Unauthorized, a DRIVER_ERROR a ServerError), so an ``except`` written against an
# older hutch catches what it caught.
_BY_CODE: dict[str, type[HutchError]] = {
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
    "SANDBOX_TERMINATED": SandboxTerminatedError,
    "EXECUTION_TIMEOUT": ExecutionTimedOut,
    "EXECUTION_CANCELLED": ExecutionCancelled,
    "PAYLOAD_TOO_LARGE": PayloadTooLarge,
    "NOT_SUPPORTED": NotSupported,
    "DRIVER_ERROR": ServerError,
    "INTERNAL_ERROR": ServerError,
    "EVENT_LOG_UNAVAILABLE": ServiceUnavailable,
}

_BY_STATUS: dict[int, type[HutchError]] = {
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

# The code of an answer that names none and whose status maps to no kind (a 418 from a proxy).
UNKNOWN_CODE = "SANDBOX_ERROR"

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
) -> HutchError:
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
    cls: type[HutchError] | None = _BY_CODE.get(code or "")
    if cls is None and status is not None:
        cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else HutchError)
    cls = cls or HutchError
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
        code=code or (UNKNOWN_CODE if cls is HutchError else None),
        status=status,
        field=field,
        sandbox_id=sandbox_id,
        execution_id=execution_id,
        details=details,
    )
