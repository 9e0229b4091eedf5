"""How the Python SDK's friendly arguments become the wire's shapes: durations ("30s" or
seconds), resources, network, timeouts, files and query strings. Pure functions, shared by
the async client and its blocking twin."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hutch.core.quantities import parse_duration
from hutch.errors import InvalidInput
from hutch.models import FileToWrite, Network, Resources, Timeouts, coerce_files, to_wire

#: A duration as the wire writes it ("30s", "5m", "1h30m") or a number of seconds.
Duration = str | int | float
#: Files to write: ``{"path": b"content"}`` or an iterable of :class:`FileToWrite`.
Files = Mapping[str, bytes | str] | Iterable[FileToWrite]


def _duration(field: str, value: Duration | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidInput(
            f"{field}: expected a duration such as '30s' or a number of seconds", field=field
        )
    if isinstance(value, str):
        return value
    seconds = float(value)
    if seconds < 0:
        raise InvalidInput(f"{field}: a duration cannot be negative", field=field)
    return f"{int(seconds)}s" if seconds == int(seconds) else f"{round(seconds * 1000)}ms"


def _seconds(value: Duration) -> float:
    return float(value) if isinstance(value, (int, float)) else parse_duration("wait", value)


def _query(params: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, (list, tuple)):
            out[key] = ",".join(str(v) for v in value)
        else:
            out[key] = str(value)
    return out


def _resources(value: Resources | Mapping[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, Resources):
        return to_wire(value)
    return {k: v for k, v in dict(value).items() if v is not None}


def _network(value: bool | Network | Mapping[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return {"enabled": value}
    if isinstance(value, Network):
        return to_wire(value)
    return {k: v for k, v in dict(value).items() if v is not None}


def _timeouts(value: Duration | Timeouts | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A bare duration is the execution timeout; a Timeouts/mapping may set idle and paused too."""
    if value is None:
        return None
    if isinstance(value, (str, int, float)):
        return {"execution": _duration("timeout", value)}
    if isinstance(value, Timeouts):
        return to_wire(value)
    return {k: _duration(f"timeout.{k}", v) for k, v in dict(value).items() if v is not None}


def _wire_files(files: Files | None) -> list[dict[str, str]] | None:
    coerced = coerce_files(files)
    return [f.to_wire() for f in coerced] if coerced else None
