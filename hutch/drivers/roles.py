"""The Driver port by role: small interfaces, one per thing a backend can be asked to do.

Every driver plays the three required roles (``SandboxLifecycle``, ``RuntimeCatalog``,
``CommandRunner``; ``drivers.base.Driver`` is them) and lists, before ``Driver`` among its
bases, the optional roles it plays::

    class NodeAgentDriver(roles.SandboxFiles, roles.Pausing, Driver): ...

A role's abstract methods are what a driver playing it must do (Python refuses to build one
that leaves any out); a default in a role is a part of it a driver may skip. For a role a
driver does not list, ``NotPlayed`` answers as the one wide Driver always did: NotSupported in
its own words, or, where a role only reports, nothing to report.

The capability flags (``Capabilities``) stay the run-time truth: a flag is set only by a
driver that plays its role, and may stay unset although it does (the local driver plays
``Pausing`` but cannot pause without a cgroup freezer). ``tests/contracts/test_driver.py``
runs each role's tests on the drivers that play it and holds every role against its flag.
The service takes what it uses from ``drivers.base.DriverRoles``.
"""

from __future__ import annotations

import abc
import socket
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Sequence

from hutch.core.driver_types import (
    Capabilities,
    DirWatch,
    ExecRequest,
    ExecResult,
    FileInfo,
    FileWrite,
    Metric,
    NodeInfo,
    OutputSink,
    ProvisionRequest,
    PtySession,
    SandboxEndedListener,
    TerminalRequest,
    Usage,
)
from hutch.core.errors import NotSupported
from hutch.core.models import SandboxState

# Foreign handles: the sandboxes other API replicas own (core/replicas.py).
ForeignHandles = Callable[[], Awaitable[list[dict[str, str]]]]
# The node the event log records for a live sandbox, None if none (NodeFleet.set_locator).
NodeLocator = Callable[[str], Awaitable[str | None]]
# A node drained outside hutch (node name, who drained it: "Nomad"), NodeFleet.set_drain_listener.
NodeDrainedListener = Callable[[str, str], Awaitable[None]]

# -- required: every driver plays these -------------------------------------------------


class SandboxLifecycle(abc.ABC):
    """Make a sandbox real on some machine, take it away, and say which ones run."""

    name: str
    capabilities: Capabilities

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Acquire long-lived resources (called once, before any other method)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release them. Sandboxes keep running unless the driver cannot keep them."""

    async def reserve(self, req: ProvisionRequest) -> None:  # noqa: B027 - optional hook
        """Choose where ``req`` will run and hold room there, before the engine records the
        sandbox; raise (NoCapacity) when no machine can take it, so nothing is recorded. A
        driver with one machine has nothing to choose, but may still have no room (the local
        driver). Idempotent: a sandbox reserved already keeps its hold."""

    def release(self, sandbox_id: str) -> None:  # noqa: B027 - optional hook
        """The create ``reserve`` held room for failed before its provision (a quota refused
        it, its install failed): the room is free again at once, not when the hold lapses.
        A refused create otherwise held room meanwhile, and a tenant sending creates its
        quota refuses could keep every other tenant's out."""

    @abc.abstractmethod
    async def provision(self, req: ProvisionRequest) -> None:
        """Create the sandbox and return once commands can run in it.

        On failure nothing is left behind (no process, mount, cgroup or directory).
        """

    def settled(self, sandbox_id: str) -> None:  # noqa: B027 - optional hook
        """``sandbox_id``'s create is recorded and launches nothing (no command came with it):
        background work the driver defers while a request is launching may go ahead (the
        local driver's warm pool refill). Not called for a create with a command: its
        command's launch says as much."""

    @abc.abstractmethod
    async def destroy(self, sandbox_id: str) -> None:
        """Kill every process and remove every mount, cgroup and file. Idempotent."""

    async def destroy_measured(self, sandbox_id: str, measure: Callable[[], Awaitable[Usage]]) -> Usage:
        """``destroy``, answering what the sandbox had used just before it went: ``measure``
        (best effort) then the destroy. A driver whose one call does both overrides it (the
        node driver: the agent measures as it ends the sandbox, one round trip, not two)."""
        used = await measure()
        await self.destroy(sandbox_id)
        return used

    @abc.abstractmethod
    async def alive(self) -> set[str]:
        """Ids of the sandboxes this driver is running now (used to recover after a restart)."""

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


class RuntimeCatalog(abc.ABC):
    """The catalog runtimes (core/runtimes.py) this driver can start sandboxes from."""

    name: str

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

    async def prepare(self, req: ProvisionRequest) -> None:
        """Make ready what ``provision`` of ``req`` will need and may be slow or fail for a
        reason of the request's own (installing its dependencies and packages), before the
        engine records the sandbox: a bad package name creates nothing."""
        if req.dependencies or req.packages:
            raise NotSupported(f"driver {self.name} cannot install dependencies or packages at create",
                               field="dependencies" if req.dependencies else "packages")


class CommandRunner(abc.ABC):
    """Run commands in a sandbox, streaming their output, and stop them."""

    name: str

    @abc.abstractmethod
    async def exec(self, req: ExecRequest, sink: OutputSink) -> ExecResult:
        """Run a command inside the sandbox, streaming its output into ``sink``.

        Timeout and ``cancel`` kill the whole process tree the command started,
        background children included.
        """

    @abc.abstractmethod
    async def cancel(self, execution_id: str) -> None:
        """Kill a running execution's process tree; its ``exec`` returns cancelled."""

    async def signal(self, execution_id: str, signum: int) -> None:
        """Send a signal to a running execution's whole process tree (graceful stop)."""
        raise NotSupported(f"driver {self.name} cannot signal executions")


# -- optional: a driver lists the ones it plays ----------------------------------------


class SandboxFiles(abc.ABC):
    """Files in a sandbox (capability ``files``). Every path resolves inside the sandbox's own
    view, as the sandbox user; relative paths resolve to the workspace (HOME). Missing paths
    raise FileNotFound."""

    @abc.abstractmethod
    async def write_files(self, sandbox_id: str, files: Sequence[FileWrite]) -> None:
        """Write files as the sandbox user, resolving paths inside the sandbox's own view."""

    @abc.abstractmethod
    def read_file(self, sandbox_id: str, path: str) -> AsyncIterator[bytes]:
        """The file's bytes in chunks, with backpressure: nothing is read ahead of the consumer.

        Raises FileNotFound (or InvalidInput for a directory) before yielding anything."""

    @abc.abstractmethod
    async def write_file(
        self, sandbox_id: str, path: str, chunks: AsyncIterable[bytes], *, mode: int = 0o644, parents: bool = True
    ) -> int:
        """Stream ``chunks`` into the file (replacing it); returns the bytes written.

        ``parents`` creates missing parent directories; without it a missing parent is FileNotFound."""

    @abc.abstractmethod
    async def list_files(self, sandbox_id: str, path: str) -> list[FileInfo]:
        """The entries of a directory (or the file itself), not recursive."""

    @abc.abstractmethod
    async def mkdir(self, sandbox_id: str, path: str, *, parents: bool) -> None: ...

    @abc.abstractmethod
    async def remove(self, sandbox_id: str, path: str, *, directory: bool, recursive: bool) -> bool:
        """Remove a file (or with ``directory`` an empty directory, or with ``recursive`` a tree).
        Returns whether the path existed."""

    @abc.abstractmethod
    async def symlink(self, sandbox_id: str, path: str, target: str) -> None: ...

    @abc.abstractmethod
    async def rename(self, sandbox_id: str, source: str, destination: str) -> None:
        """Move ``source`` to ``destination`` (rename(2): a file replaces a file, never a
        directory), making the destination's missing parents. A missing source is FileNotFound."""


class DirectoryWatching(abc.ABC):
    """Changes in a sandbox's directory as they happen (capability ``watches``): the kernel's
    own notifications inside the sandbox, not a comparison of listings."""

    @abc.abstractmethod
    async def watch_dir(self, sandbox_id: str, path: str, *, recursive: bool) -> DirWatch:
        """Watch the directory ``path`` (and with ``recursive`` the ones below it, those made
        later too); watching has begun when this returns. FileNotFound for a missing path,
        InvalidInput for one that is not a directory."""


class FileMetadata(abc.ABC):
    """A file's metadata: string pairs kept as its ``user.e2b.*`` extended attributes, listed
    with it (FileInfo.metadata; capability ``metadata``). They move with a rename."""

    @abc.abstractmethod
    async def set_metadata(self, sandbox_id: str, path: str, metadata: dict[str, str]) -> None:
        """The file's metadata becomes exactly ``metadata`` ({} clears it)."""


class TreeTransfer(abc.ABC):
    """Whole trees at once (capability ``tar_streams``), for drivers where each file primitive
    is a round trip. The service checks every member of an archive before import_tar sees it."""

    @abc.abstractmethod
    def export_tar(self, sandbox_id: str, path: str) -> AsyncIterator[bytes]:
        """An uncompressed tar of the directory ``path`` (names relative to it; directories,
        regular files and symlinks only) or of the one file ``path``."""

    @abc.abstractmethod
    async def import_tar(self, sandbox_id: str, dest: str, archive: AsyncIterable[bytes], *, gzipped: bool) -> None:
        """Unpack an already-checked tar (or tar.gz) at ``dest`` (created), as the sandbox user."""


class Checkpointing(abc.ABC):
    """Disk checkpoints (capability ``checkpoints``): restore points of the sandbox's writable
    filesystem."""

    @abc.abstractmethod
    async def checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        """Save the writable filesystem as it is now (cheaply: links or layers, not full copies)."""

    @abc.abstractmethod
    async def restore(self, sandbox_id: str, checkpoint_id: str) -> None:
        """Bring the writable filesystem back to exactly that state. Processes may be restarted."""

    @abc.abstractmethod
    async def delete_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None: ...

    async def checkpoint_sizes(self, sandbox_id: str) -> dict[str, int]:
        """Bytes each of the sandbox's checkpoints takes where the driver keeps it (counted
        against the organization's storage quota); {} where they take none worth counting."""
        return {}


class Pausing(abc.ABC):
    """Freeze every process of a sandbox and thaw it again (capability ``pause``); or, with
    ``memory`` false (capability ``pause_filesystem``), end every process and release its
    memory, keeping its files, and at the resume boot it again over them."""

    @abc.abstractmethod
    async def pause(self, sandbox_id: str, *, memory: bool = True) -> None: ...

    @abc.abstractmethod
    async def resume(self, sandbox_id: str) -> None:
        """Thaw it, or boot it again where it was paused filesystem-only (the driver knows which)."""


class Terminals(abc.ABC):
    """Commands on a pseudo-terminal (capability ``terminals``; service/terminals.py)."""

    @abc.abstractmethod
    async def open_terminal(self, req: TerminalRequest) -> PtySession:
        """Start ``req.argv`` on a new pseudo-terminal of a running sandbox."""


class PortForwarding(abc.ABC):
    """One exposed port of a sandbox, reachable by the server (capability ``ports``)."""

    @abc.abstractmethod
    async def port_target(self, sandbox_id: str) -> tuple[str, int]:
        """(host, port) the API connects to for the sandbox's exposed port (its reverse proxy).

        Reachable from the server only; NotSupported when the sandbox (or driver) has none."""

    async def port_connect(self, sandbox_id: str, port: int) -> socket.socket:
        """A connected socket to ``port`` of the sandbox, any port its processes listen on,
        for the server alone (the sandbox gains no network by it). OSError when nothing listens."""
        raise NotSupported(f"driver {getattr(self, 'name', type(self).__name__)} reaches only the port a sandbox "
                           f"declared at create (network.port), not port {port} of sandbox {sandbox_id}",
                           field="port")


class NetworkRules(abc.ABC):
    """A live sandbox's egress rules replaced (capability ``network_update``; E2B's update_network)."""

    @abc.abstractmethod
    async def update_network(self, sandbox_id: str, *, enabled: bool, allow: tuple[str, ...],
                             deny: tuple[str, ...]) -> None:
        """Replace the sandbox's egress rules whole, with no moment under neither the old nor the
        new ones. ``enabled`` False: nothing goes out. A sandbox made without outbound network
        gets none (NotSupported saying so): only the rules of the one it has change. A host name
        in ``allow`` that does not resolve is a 400 naming it, and nothing changes."""


class UsageReporting(abc.ABC):
    """What sandboxes have used and how the driver fares, for stats and ``GET /metrics``."""

    @abc.abstractmethod
    async def usage(self, sandbox_id: str, *, disk: bool = False) -> Usage:
        """What the sandbox has used so far (for stats) and holds now; unknown parts are None.
        ``disk``: measure its disk too, which may walk every file it wrote: only where asked
        (E2B's metrics), not for every stats read."""

    def metrics(self) -> list[Metric]:
        """What the driver can tell about itself for ``GET /metrics`` (warm pools, …)."""
        return []


class Adoption(abc.ABC):
    """Replicas (core/replicas.py): a sandbox placed through one API replica and driven, after
    that replica was lost, by another's driver."""

    _foreign: ForeignHandles | None = None
    _owner_check: Callable[[str], Awaitable[bool]] | None = None
    _replica_id: str | None = None
    _deployment: str | None = None
    _taken_over: bool = False

    def set_replica(self, replica_id: str | None, deployment: str | None = None, *,
                    taken_over: bool = False) -> None:
        """Called before ``start``: this replica's id, which a driver marks what it places
        ahead of any sandbox with (the nomad driver's warm pool jobs), so a survivor can end
        what a lost replica left of those (``lost_leftovers``); and its deployment's tag (the
        same for every replica sharing its database: api/replication.py), marked with it, as
        a replica id is unique only within its deployment, and a backend (one Nomad cluster)
        may serve several. ``taken_over`` (Replicas.taken_over): this replica's previous run
        was claimed by a survivor, which ends what that run placed ahead; a driver leaves those
        to it and never hands one out (the survivor stops it regardless)."""
        self._replica_id, self._deployment, self._taken_over = replica_id, deployment, taken_over

    def set_foreign(self, handles: ForeignHandles | None) -> None:
        """Called before ``start``: the handles of sandboxes other replicas own, which a driver
        recovering its own leftovers must leave alone (they may have been taken over)."""
        self._foreign = handles

    def set_owner_check(self, mine: Callable[[str], Awaitable[bool]] | None) -> None:
        """Called before ``start``: whether this replica drives a sandbox (its owner). A driver
        whose backend every replica watches whole (the node agents) reports an end, and ends a
        sandbox left on a node that comes back, only where the sandbox is driven."""
        self._owner_check = mine

    async def drives(self, sandbox_id: str) -> bool:
        return self._owner_check is None or await self._owner_check(sandbox_id)

    @abc.abstractmethod
    def handle(self, sandbox_id: str) -> dict[str, str] | None:
        """Where the sandbox runs, for another replica's driver to adopt; None: only this
        process can drive it."""

    @abc.abstractmethod
    async def adopt(self, sandbox: SandboxState, handle: dict[str, str]) -> bool:
        """Drive a sandbox another replica's driver placed; False if it no longer runs (or
        this driver cannot reach it)."""

    async def lost_leftovers(self, replica_id: str) -> list[str]:
        """What a lost replica of this deployment placed ahead of any sandbox (the nomad
        driver's warm pool jobs, idle or claimed by a create it never recorded), listed now,
        right after its take-over was claimed (before it can return and place more): ended by
        ``discard_leftovers``. Never another deployment's, whatever its replicas are named."""
        return []

    async def discard_leftovers(self, leftovers: list[str], keep: list[dict[str, str]]) -> None:  # noqa: B027
        """End ``leftovers`` (``lost_leftovers``) but what a recorded handle names: called
        once the take-over recorded every unrecorded sandbox of the lost replica ended."""

    async def discard_unrecorded(self, sandbox_id: str, handle: dict[str, str]) -> None:  # noqa: B027 - optional
        """End a sandbox a lost replica had this driver's backend make but never recorded (it
        died between the make and the append): no event says where it runs, so a driver
        whose machines every replica reaches (the node agents) asks each; one that answers
        not ends it when it answers. Nothing when none runs it. A driver whose sandboxes only
        their own replica's process reaches has nothing to do here: that replica's restart
        ends them (service/recovery.py)."""


class NodeFleet(abc.ABC):
    """Several machines, each running sandboxes (the node driver): which one a sandbox is on.
    The event log records it (``lifecycle:started``'s ``node``); the driver is told it back
    after a restart instead of asking every machine."""

    _locator: NodeLocator | None = None
    _drained_listener: NodeDrainedListener | None = None

    def set_locator(self, locator: NodeLocator | None) -> None:
        """Called before ``start``: where the log says a sandbox runs, for one this driver did
        not place or recall (another API replica's, whose usage a read here shows)."""
        self._locator = locator

    def set_drain_listener(self, listener: NodeDrainedListener | None) -> None:
        """Where a drain the orchestrator was asked for (``nomad node drain``) goes, once per
        drain: the service moves the node's idle sandboxes. The listener returns at once (the
        moves run in the service's background): the driver's reads of its nodes go on."""
        self._drained_listener = listener

    @abc.abstractmethod
    def node_of(self, sandbox_id: str) -> str | None:
        """The node the sandbox was placed on, to be recorded; None if not placed here."""

    @abc.abstractmethod
    def recall(self, placements: Mapping[str, str]) -> None:
        """The log's word on where live sandboxes run (sandbox -> node), before ``alive``
        after a restart: a node that does not answer then is lost with exactly these."""

    @abc.abstractmethod
    async def nodes(self) -> list[NodeInfo]:
        """Every node known, as last seen."""

    @abc.abstractmethod
    async def drain(self, node: str, draining: bool) -> NodeInfo:
        """Stop placing new sandboxes on ``node`` (or place there again); the node keeps the
        flag across its own restart and reports it. Those it runs keep running."""

    @abc.abstractmethod
    async def move_target(self, req: ProvisionRequest) -> str:
        """Another node with room for the sandbox ``req`` makes again (not the one it is on),
        held for the ``move`` that follows; NoCapacity when there is none."""

    @abc.abstractmethod
    async def move(self, req: ProvisionRequest, to: str, workspace: AsyncIterable[bytes]) -> None:
        """Make the sandbox again on ``to`` from ``req``, unpack ``workspace`` (a checked tar)
        in its workspace there, then end it where it was. Nothing of it is left on the old node;
        if the new copy fails, the old one stays as it was."""


OPTIONAL_ROLES: tuple[type, ...] = (SandboxFiles, DirectoryWatching, FileMetadata, TreeTransfer, Checkpointing, Pausing,
                                    Terminals, PortForwarding, NetworkRules, UsageReporting, Adoption, NodeFleet)


class NotPlayed:
    """What a driver answers for an optional role it does not play: NotSupported in the words
    the wide Driver always used, or, for the roles that only report, nothing to report.

    ``Driver`` ends with it, so code holding a whole driver may call any role's method (the
    API's routes do, until they go through the service); ``DriverRoles`` stands it in for
    each role a driver does not list."""

    name: str

    # SandboxFiles

    async def write_files(self, sandbox_id: str, files: Sequence[FileWrite]) -> None:
        raise NotSupported(f"driver {self.name} cannot write files")

    async def read_file(self, sandbox_id: str, path: str) -> AsyncIterator[bytes]:
        raise NotSupported(f"driver {self.name} cannot read files")
        yield b""  # pragma: no cover - makes this an async generator

    async def write_file(
        self, sandbox_id: str, path: str, chunks: AsyncIterable[bytes], *, mode: int = 0o644, parents: bool = True
    ) -> int:
        raise NotSupported(f"driver {self.name} cannot write files")

    async def list_files(self, sandbox_id: str, path: str) -> list[FileInfo]:
        raise NotSupported(f"driver {self.name} cannot list files")

    async def mkdir(self, sandbox_id: str, path: str, *, parents: bool) -> None:
        raise NotSupported(f"driver {self.name} cannot make directories")

    async def remove(self, sandbox_id: str, path: str, *, directory: bool, recursive: bool) -> bool:
        raise NotSupported(f"driver {self.name} cannot remove files")

    async def symlink(self, sandbox_id: str, path: str, target: str) -> None:
        raise NotSupported(f"driver {self.name} cannot make symlinks")

    async def rename(self, sandbox_id: str, source: str, destination: str) -> None:
        raise NotSupported(f"driver {self.name} cannot rename files")

    # DirectoryWatching

    async def watch_dir(self, sandbox_id: str, path: str, *, recursive: bool) -> DirWatch:
        raise NotSupported(f"driver {self.name} cannot watch directories")

    # FileMetadata

    async def set_metadata(self, sandbox_id: str, path: str, metadata: dict[str, str]) -> None:
        raise NotSupported(f"driver {self.name} cannot keep file metadata")

    # TreeTransfer

    async def export_tar(self, sandbox_id: str, path: str) -> AsyncIterator[bytes]:
        raise NotSupported(f"driver {self.name} cannot stream trees")
        yield b""  # pragma: no cover - makes this an async generator

    async def import_tar(self, sandbox_id: str, dest: str, archive: AsyncIterable[bytes], *, gzipped: bool) -> None:
        raise NotSupported(f"driver {self.name} cannot stream trees")

    # Checkpointing

    async def checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        raise NotSupported(f"driver {self.name} cannot checkpoint sandboxes")

    async def restore(self, sandbox_id: str, checkpoint_id: str) -> None:
        raise NotSupported(f"driver {self.name} cannot restore checkpoints")

    async def delete_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        raise NotSupported(f"driver {self.name} cannot delete checkpoints")

    async def checkpoint_sizes(self, sandbox_id: str) -> dict[str, int]:
        return {}

    # NetworkRules

    async def update_network(self, sandbox_id: str, *, enabled: bool, allow: tuple[str, ...],
                             deny: tuple[str, ...]) -> None:
        raise NotSupported(f"network: driver {self.name} cannot change a running sandbox's egress rules",
                           field="network")

    # Pausing

    async def pause(self, sandbox_id: str, *, memory: bool = True) -> None:
        raise NotSupported(f"driver {self.name} cannot pause sandboxes")

    async def resume(self, sandbox_id: str) -> None:
        raise NotSupported(f"driver {self.name} cannot resume sandboxes")

    # Terminals

    async def open_terminal(self, req: TerminalRequest) -> PtySession:
        raise NotSupported(f"driver {self.name} has no terminals")

    # PortForwarding

    async def port_target(self, sandbox_id: str) -> tuple[str, int]:
        raise NotSupported(f"driver {self.name} cannot expose ports")

    async def port_connect(self, sandbox_id: str, port: int) -> socket.socket:
        raise NotSupported(f"driver {self.name} cannot expose ports (port {port} of sandbox {sandbox_id})",
                           field="port")

    # UsageReporting: nothing measured

    async def usage(self, sandbox_id: str, *, disk: bool = False) -> Usage:
        return Usage()

    def metrics(self) -> list[Metric]:
        return []

    # Adoption: nothing of another replica's to leave alone, nothing to hand over or take

    def set_foreign(self, handles: ForeignHandles | None) -> None:
        pass

    def set_owner_check(self, mine: Callable[[str], Awaitable[bool]] | None) -> None:
        pass

    def set_replica(self, replica_id: str | None, deployment: str | None = None, *,
                    taken_over: bool = False) -> None:
        pass

    async def drives(self, sandbox_id: str) -> bool:
        return True

    def handle(self, sandbox_id: str) -> dict[str, str] | None:
        return None

    async def adopt(self, sandbox: SandboxState, handle: dict[str, str]) -> bool:
        return False

    async def discard_unrecorded(self, sandbox_id: str, handle: dict[str, str]) -> None:
        pass

    async def lost_leftovers(self, replica_id: str) -> list[str]:
        return []

    async def discard_leftovers(self, leftovers: list[str], keep: list[dict[str, str]]) -> None:
        pass

    # NodeFleet: one machine, nothing to record or recall

    def set_locator(self, locator: NodeLocator | None) -> None:
        pass

    def set_drain_listener(self, listener: NodeDrainedListener | None) -> None:
        pass

    def node_of(self, sandbox_id: str) -> str | None:
        return None

    def recall(self, placements: Mapping[str, str]) -> None:
        pass

    async def nodes(self) -> list[NodeInfo]:
        raise NotSupported(f"driver {self.name} has no nodes: it runs sandboxes on this machine "
                           "(nodes are the node driver's, HUTCH_DRIVER=node)")

    async def drain(self, node: str, draining: bool) -> NodeInfo:
        raise NotSupported(f"driver {self.name} has no nodes to drain: it runs sandboxes on this machine "
                           "(nodes are the node driver's, HUTCH_DRIVER=node)")

    async def move_target(self, req: ProvisionRequest) -> str:
        raise NotSupported(f"driver {self.name} has no other node to move a sandbox to")

    async def move(self, req: ProvisionRequest, to: str, workspace: AsyncIterable[bytes]) -> None:
        raise NotSupported(f"driver {self.name} has no other node to move a sandbox to")
