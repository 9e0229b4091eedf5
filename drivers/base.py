"""The Driver seam: make a sandbox real on some machine and run commands in it.

Shaped after Nomad's driver plugin: a small ABC, capability flags telling the layer
above what a backend cannot do, and ``NotSupported`` defaults for optional features.
Every driver passes the same conformance suite (``tests/contracts/test_driver.py``).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

import attrs

from core.errors import NotSupported

Stream = Literal["stdout", "stderr"]


@attrs.frozen
class Capabilities:
    memory_limit: bool = False
    cpu_limit: bool = False
    pids_limit: bool = False
    network: bool = False  # can give a sandbox outbound network when asked
    pause: bool = False
    files: bool = False
    kernel_isolation: bool = False  # real namespaces; False for the fake driver


@attrs.frozen
class Resources:
    memory_bytes: int | None = None
    cpu_millis: int | None = None
    disk_bytes: int | None = None
    pids: int | None = None


@attrs.frozen
class ProvisionRequest:
    sandbox_id: str
    runtime: str  # catalog name, e.g. "python:3.13"; the driver maps it to its image
    resources: Resources = Resources()
    network_enabled: bool = False
    env: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen
class ExecRequest:
    execution_id: str
    sandbox_id: str
    argv: Sequence[str]
    env: Mapping[str, str] = attrs.field(factory=dict)  # merged over the sandbox env
    cwd: str | None = None  # None = the sandbox workspace (HOME)
    timeout: float | None = None  # seconds; None = no limit
    stdin: bytes | None = None


@attrs.frozen
class ExecResult:
    exit_code: int  # 128+n when killed by signal n
    timed_out: bool = False
    cancelled: bool = False
    oom_killed: bool = False


@attrs.frozen
class FileToWrite:
    path: str  # relative paths resolve to the sandbox workspace
    content: bytes
    mode: int = 0o644


class OutputSink(Protocol):
    """Where a running command's bytes go. Called from the event loop."""

    def write(self, stream: Stream, data: bytes) -> None: ...


class Driver(abc.ABC):
    name: str
    capabilities: Capabilities

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Acquire long-lived resources (called once, before any other method)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release them. Sandboxes keep running unless the driver cannot keep them."""

    @abc.abstractmethod
    def runtimes_available(self) -> set[str]:
        """Catalog names this driver can provision right now (built / pulled)."""

    @abc.abstractmethod
    async def provision(self, req: ProvisionRequest) -> None:
        """Create the sandbox and return once commands can run in it.

        On failure nothing is left behind (no process, mount, cgroup or directory).
        """

    @abc.abstractmethod
    async def destroy(self, sandbox_id: str) -> None:
        """Kill every process and remove every mount, cgroup and file. Idempotent."""

    @abc.abstractmethod
    async def exec(self, req: ExecRequest, sink: OutputSink) -> ExecResult:
        """Run a command inside the sandbox, streaming its output into ``sink``.

        Timeout and ``cancel`` kill the whole process tree the command started,
        background children included.
        """

    @abc.abstractmethod
    async def cancel(self, execution_id: str) -> None:
        """Kill a running execution's process tree; its ``exec`` returns cancelled."""

    @abc.abstractmethod
    async def write_files(self, sandbox_id: str, files: Sequence[FileToWrite]) -> None:
        """Write files as the sandbox user, resolving paths inside the sandbox's own view."""

    @abc.abstractmethod
    async def alive(self) -> set[str]:
        """Ids of the sandboxes this driver is running now (used to recover after a restart)."""

    async def signal(self, execution_id: str, signum: int) -> None:
        """Send a signal to a running execution's whole process tree (graceful stop)."""
        raise NotSupported(f"driver {self.name} cannot signal executions")

    async def pause(self, sandbox_id: str) -> None:
        raise NotSupported(f"driver {self.name} cannot pause sandboxes")

    async def resume(self, sandbox_id: str) -> None:
        raise NotSupported(f"driver {self.name} cannot resume sandboxes")
