"""The Driver seam: make a sandbox real on some machine and run commands in it.

Shaped after Nomad's driver plugin: a small ABC, capability flags telling the layer
above what a backend cannot do, and ``NotSupported`` defaults for optional features.
The values that cross the port live in ``core/driver_types.py`` and are named here too.
Every driver passes the same conformance suite (``tests/contracts/test_driver.py``).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence

from hutch.core.driver_types import (
    DEFAULT_PIDS,
    Capabilities,
    ExecRequest,
    ExecResult,
    FileInfo,
    FileToWrite,
    Metric,
    OutputSink,
    ProvisionRequest,
    Resources,
    SandboxEndedListener,
    Stream,
    Terminal,
    TerminalRequest,
    Usage,
    check_env,
)
from hutch.core.errors import NotSupported
from hutch.core.models import Sandbox


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

    async def build_runtime(self, name: str, progress: Callable[[str], None]) -> None:
        """Make the catalog runtime ``name`` available (build it, push its image...), telling
        ``progress`` each step. Concurrent calls for one runtime share one build (see
        ``drivers.builds``); a failed build leaves nothing half-made and raises its own words."""
        raise NotSupported(f"runtime: {name} is not available and driver {self.name} cannot build runtimes",
                           field="runtime")

    def runtimes_building(self) -> set[str]:
        """Catalog names being built right now (first use or prebuild)."""
        return set()

    def runtime_info(self, name: str) -> dict[str, object]:
        """What a user needs to choose a runtime beyond ``available``: its size in bytes and when
        it was last built (ISO-8601), where this driver knows them."""
        return {}

    @abc.abstractmethod
    async def provision(self, req: ProvisionRequest) -> None:
        """Create the sandbox and return once commands can run in it.

        On failure nothing is left behind (no process, mount, cgroup or directory).
        """

    async def prepare(self, req: ProvisionRequest) -> None:
        """Make ready what ``provision`` of ``req`` will need and may be slow or fail for a
        reason of the request's own (installing its dependencies and packages), before the
        engine records the sandbox: a bad package name creates nothing."""
        if req.dependencies or req.packages:
            raise NotSupported(f"driver {self.name} cannot install dependencies or packages at create",
                               field="dependencies" if req.dependencies else "packages")

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

    # -- files: every path resolves inside the sandbox's own view, as the sandbox user.
    # Relative paths resolve to the workspace (HOME). Missing paths raise FileNotFound.

    async def read_file(self, sandbox_id: str, path: str) -> AsyncIterator[bytes]:
        """The file's bytes in chunks, with backpressure: nothing is read ahead of the consumer.

        Raises FileNotFound (or InvalidInput for a directory) before yielding anything."""
        raise NotSupported(f"driver {self.name} cannot read files")
        yield b""  # pragma: no cover - makes this an async generator

    async def write_file(
        self, sandbox_id: str, path: str, chunks: AsyncIterable[bytes], *, mode: int = 0o644, parents: bool = True
    ) -> int:
        """Stream ``chunks`` into the file (replacing it); returns the bytes written.

        ``parents`` creates missing parent directories; without it a missing parent is FileNotFound."""
        raise NotSupported(f"driver {self.name} cannot write files")

    async def list_files(self, sandbox_id: str, path: str) -> list[FileInfo]:
        """The entries of a directory (or the file itself), not recursive."""
        raise NotSupported(f"driver {self.name} cannot list files")

    async def mkdir(self, sandbox_id: str, path: str, *, parents: bool) -> None:
        raise NotSupported(f"driver {self.name} cannot make directories")

    async def remove(self, sandbox_id: str, path: str, *, directory: bool, recursive: bool) -> bool:
        """Remove a file (or with ``directory`` an empty directory, or with ``recursive`` a tree).
        Returns whether the path existed."""
        raise NotSupported(f"driver {self.name} cannot remove files")

    async def symlink(self, sandbox_id: str, path: str, target: str) -> None:
        raise NotSupported(f"driver {self.name} cannot make symlinks")

    # -- whole trees at once: optional, for drivers where each primitive is a round trip.
    # The API checks every member of an archive before import_tar sees it.

    async def export_tar(self, sandbox_id: str, path: str) -> AsyncIterator[bytes]:
        """An uncompressed tar of the directory ``path`` (names relative to it; directories,
        regular files and symlinks only) or of the one file ``path``."""
        raise NotSupported(f"driver {self.name} cannot stream trees")
        yield b""  # pragma: no cover - makes this an async generator

    async def import_tar(self, sandbox_id: str, dest: str, archive: AsyncIterable[bytes], *, gzipped: bool) -> None:
        """Unpack an already-checked tar (or tar.gz) at ``dest`` (created), as the sandbox user."""
        raise NotSupported(f"driver {self.name} cannot stream trees")

    # -- disk checkpoints: restore points of the sandbox's writable filesystem

    async def checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        """Save the writable filesystem as it is now (cheaply: links or layers, not full copies)."""
        raise NotSupported(f"driver {self.name} cannot checkpoint sandboxes")

    async def restore(self, sandbox_id: str, checkpoint_id: str) -> None:
        """Bring the writable filesystem back to exactly that state. Processes may be restarted."""
        raise NotSupported(f"driver {self.name} cannot restore checkpoints")

    async def delete_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        raise NotSupported(f"driver {self.name} cannot delete checkpoints")

    async def checkpoint_sizes(self, sandbox_id: str) -> dict[str, int]:
        """Bytes each of the sandbox's checkpoints takes where the driver keeps it (counted
        against the organization's storage quota); {} where they take none worth counting."""
        return {}

    async def open_terminal(self, req: TerminalRequest) -> Terminal:
        """Start ``req.argv`` on a new pseudo-terminal of a running sandbox."""
        raise NotSupported(f"driver {self.name} has no terminals")

    async def signal(self, execution_id: str, signum: int) -> None:
        """Send a signal to a running execution's whole process tree (graceful stop)."""
        raise NotSupported(f"driver {self.name} cannot signal executions")

    async def port_target(self, sandbox_id: str) -> tuple[str, int]:
        """(host, port) the API connects to for the sandbox's exposed port (its reverse proxy).

        Reachable from the server only; NotSupported when the sandbox (or driver) has none."""
        raise NotSupported(f"driver {self.name} cannot expose ports")

    async def usage(self, sandbox_id: str) -> Usage:
        """What the sandbox has used so far (for stats); unknown parts are None."""
        return Usage()

    def metrics(self) -> list[Metric]:
        """What the driver can tell about itself for ``GET /metrics`` (warm pools, …)."""
        return []

    async def pause(self, sandbox_id: str) -> None:
        raise NotSupported(f"driver {self.name} cannot pause sandboxes")

    async def resume(self, sandbox_id: str) -> None:
        raise NotSupported(f"driver {self.name} cannot resume sandboxes")

    # -- replicas (core/replicas.py): a sandbox placed through one API replica and driven,
    # after that replica was lost, by another's driver.

    _foreign: Callable[[], Awaitable[list[dict[str, str]]]] | None = None

    def set_foreign(self, handles: Callable[[], Awaitable[list[dict[str, str]]]] | None) -> None:
        """Called before ``start``: the handles of sandboxes other replicas own, which a driver
        recovering its own leftovers must leave alone (they may have been taken over)."""
        self._foreign = handles

    def handle(self, sandbox_id: str) -> dict[str, str] | None:
        """Where the sandbox runs, for another replica's driver to adopt; None: only this
        process can drive it (the local driver's processes die with their host)."""
        return None

    async def adopt(self, sandbox: Sandbox, handle: dict[str, str]) -> bool:
        """Drive a sandbox another replica's driver placed; False if it no longer runs (or
        this driver cannot reach it)."""
        return False

    # -- sandboxes that end on their own ---------------------------------------------
    # A backend whose sandboxes can die without being asked (a Nomad allocation lost,
    # OOM-killed or rescheduled) reports it; the engine turns it into a lifecycle event.

    _ended_listener: SandboxEndedListener | None = None

    def set_listener(self, listener: SandboxEndedListener | None) -> None:
        """Called by the engine before ``start``: where ``report_ended`` goes."""
        self._ended_listener = listener

    async def report_ended(self, sandbox_id: str, reason: str, *, failed: bool) -> None:
        """A sandbox ended without a destroy: ``failed`` (lost, killed) or merely done."""
        if self._ended_listener is not None:
            await self._ended_listener(sandbox_id, reason, failed)


__all__ = [
    "DEFAULT_PIDS",
    "Capabilities",
    "Driver",
    "ExecRequest",
    "ExecResult",
    "FileInfo",
    "FileToWrite",
    "Metric",
    "OutputSink",
    "ProvisionRequest",
    "Resources",
    "SandboxEndedListener",
    "Stream",
    "Terminal",
    "TerminalRequest",
    "Usage",
    "check_env",
]
