"""One error hierarchy (core/errors.py) for the server and the SDK: ``hutch.errors`` names the
same classes, a server's error keeps its kind's status and code, and an answer read back by the
SDK is a class an ``except`` written against the SDK catches."""

from __future__ import annotations

import pytest

from hutch import errors as sdk
from hutch.core import errors as core
from hutch.core.blobs import BlobUnavailable
from hutch.core.events import SandboxTerminated as SandboxTerminatedEvent


def test_every_sdk_error_is_the_core_class() -> None:
    for name in sdk.__all__:
        if name == "error_from_response":
            assert sdk.error_from_response is core.error_from_response
            continue
        face = getattr(sdk, name)
        assert issubclass(face, core.HutchError), name
        assert face is getattr(core, name, face), f"hutch.errors.{name} is not core's {name}"
    assert sdk.SandboxError is core.HutchError
    assert sdk.SandboxTerminated is core.SandboxTerminatedError
    assert sdk.SandboxTerminated is not SandboxTerminatedEvent
    assert core.IllegalTransition is core.InvalidState


@pytest.mark.parametrize(
    ("raised", "caught_as"),
    [
        (core.SandboxNotFound, sdk.NotFound),
        (core.IllegalTransition, sdk.Conflict),
        (core.DriverFailure, sdk.ServerError),
        (core.LogUnavailable, sdk.ServiceUnavailable),
        (core.ProjectionUnavailable, sdk.ServiceUnavailable),
        (core.ReplicaUnavailable, sdk.ServiceUnavailable),
        (core.LogMismatch, sdk.ServerError),
        (BlobUnavailable, sdk.ServiceUnavailable),
        (core.Forbidden, sdk.SandboxError),
    ],
)
def test_a_server_error_is_caught_by_the_sdk_name_of_its_kind(raised: type[core.HutchError],
                                                               caught_as: type[Exception]) -> None:
    with pytest.raises(caught_as):
        raise raised("m")


def test_a_server_error_keeps_its_kinds_status_code_and_retry() -> None:
    busy = core.LogUnavailable("the event log is down")
    assert (busy.status, busy.code, busy.retriable) == (503, "EVENT_LOG_UNAVAILABLE", True)
    stuck = core.LogMismatch("the store folds another log")
    assert (stuck.status, stuck.code, stuck.retriable) == (503, "PROJECTION_LOG_MISMATCH", False)
    state = core.IllegalTransition("cannot pause", sandbox_id="sbx_1", sandbox_status="running")
    assert (state.status, state.code, state.sandbox_id) == (409, "INVALID_STATE", "sbx_1")
    assert state.context == {"sandbox_status": "running"}
    assert state.to_wire() == {"success": False, "message": "cannot pause", "code": "INVALID_STATE"}
    assert (core.DriverFailure("x").status, core.DriverFailure("x").code) == (502, "DRIVER_ERROR")
    assert core.ConnectionFailed("down").status is None and core.ConnectionFailed("down").retriable


def test_status_is_an_http_status() -> None:
    with pytest.raises(TypeError, match="sandbox_status"):
        core.IllegalTransition("cannot pause", status="running")  # type: ignore[arg-type]  # the mistake refused


@pytest.mark.parametrize(
    ("raised", "read_as", "retriable"),
    [
        (core.SandboxNotFound("sandbox not found"), sdk.SandboxNotFound, False),
        (core.IllegalTransition("cannot execute"), sdk.InvalidState, False),
        (core.DriverFailure("the backend failed"), sdk.ServerError, True),
        (core.LogUnavailable("the log is down"), sdk.ServiceUnavailable, True),
        (core.LogMismatch("parted ways"), sdk.ServiceUnavailable, True),  # by its 503, as always
        (core.InvalidInput("resources.memory: bad", field="resources.memory"), sdk.InvalidInput, False),
        (core.QuotaExceeded("quota", quota="sandboxes", limit=1, used=1), sdk.Unauthorized, False),
    ],
)
def test_an_answer_reads_back_as_the_sdk_has_always_mapped_it(
    raised: core.HutchError, read_as: type[core.HutchError], retriable: bool
) -> None:
    assert raised.status is not None
    err = sdk.error_from_response(raised.status, raised.to_wire())
    assert type(err) is read_as
    assert (err.message, err.code, err.status, err.field) == (raised.message, raised.code, raised.status, raised.field)
    assert err.retriable is retriable


def test_an_answer_without_a_code_or_a_known_status() -> None:
    err = sdk.error_from_response(418, {})
    assert type(err) is sdk.SandboxError
    assert (err.code, err.status, err.message) == ("SANDBOX_ERROR", 418, "request failed (HTTP 418)")
    assert repr(err) == "HutchError('request failed (HTTP 418)', code='SANDBOX_ERROR', status=418)"
    assert str(err) == "request failed (HTTP 418)"
    assert type(sdk.error_from_response(404, {}, sandbox_id="sbx_1")) is sdk.SandboxNotFound
    assert type(sdk.error_from_response(404, {}, execution_id="exe_1")) is sdk.ExecutionNotFound


def test_an_sdk_error_raised_without_an_answer_has_its_kinds_defaults() -> None:
    err = sdk.InvalidInput("source 'x' is not a regular file", field="source")
    assert (err.code, err.status, err.retriable, err.field) == ("INVALID_INPUT", 400, False, "source")
    shape = sdk.ServerError("unexpected response shape", code="BAD_RESPONSE")
    assert (shape.code, shape.retriable) == ("BAD_RESPONSE", False)
