"""What a create and an execute ask the service for, once the API has parsed and checked them
(api/parse.py builds these from a request's JSON; the SSH gateway and the Workspace build them
too)."""

from __future__ import annotations

import attrs

from hutch.core.models import SandboxSpec
from hutch.drivers.base import FileWrite
from hutch.service.output import RAW_OUTPUT, StreamOptions


@attrs.frozen
class CreateRequest:
    spec: SandboxSpec
    files: list[FileWrite]
    command: tuple[str, ...] | None
    stream: StreamOptions = RAW_OUTPUT  # for the initial command


@attrs.frozen
class ExecuteRequest:
    command: tuple[str, ...]
    files: list[FileWrite]
    timeout: float | None  # None: the sandbox's default
    stream: StreamOptions = RAW_OUTPUT
