"""One root error. Every subclass knows its HTTP status and a stable machine code.

Foreign errors are translated at the boundary with ``raise ... from err`` so a user
sees what was wrong (and which field), never a traceback.
"""

from __future__ import annotations

from typing import Any, ClassVar


class HutchError(Exception):
    status: ClassVar[int] = 500
    code: ClassVar[str] = "INTERNAL_ERROR"
    retriable: ClassVar[bool] = False

    def __init__(self, message: str, *, field: str | None = None, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.context = context

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
    code = "FILE_NOT_FOUND"


class IllegalTransition(HutchError):
    """A command that the current state does not allow (e.g. execute on a terminated sandbox)."""

    status = 409
    code = "INVALID_STATE"


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


class DriverFailure(HutchError):
    status = 502
    code = "DRIVER_ERROR"


class LogUnavailable(HutchError):
    status = 503
    code = "EVENT_LOG_UNAVAILABLE"
    retriable = True


class LogMismatch(HutchError):
    """The projection store and the event log part ways: the store folds another log (a new
    or recreated topic, a swapped events.db, two deployments on one database) or holds
    more than its log (the log lost records). Refused, never skipped past: a projector
    would otherwise treat the log's new events as already applied."""

    status = 503
    code = "PROJECTION_LOG_MISMATCH"


class ProjectionUnavailable(HutchError):
    """A write reached the log but the views do not show it (the projector is stopped or
    behind): the request fails rather than acknowledge what readers cannot see."""

    status = 503
    code = "PROJECTION_UNAVAILABLE"
    retriable = True


class ReplicaUnavailable(HutchError):
    """The replica that owns the sandbox cannot be reached, or the sandbox is moving to
    another replica (a take-over in progress): try again shortly."""

    status = 503
    code = "REPLICA_UNAVAILABLE"
    retriable = True
