"""The nomad driver: a sandbox is a Nomad job whose one task runs in containerd.

- **Job**: ``hutch-<instance>-<sandbox id>``, one group, one task on the
  ``hutch-containerd`` task driver (scripts/services.d/nomad/containerd-driver) from the
  runtime's OCI image (``drivers.nomad.images``): an idle shell as pid 1 that reaps
  orphans, running as the unprivileged sandbox uid with no capabilities, no_new_privs,
  containerd's seccomp profile narrowed to the local driver's floor (socket families,
  io_uring: the plugin's seccomp.go) and a network namespace with only loopback. No restarts,
  no rescheduling: a sandbox that dies is over, and says so (below). Placing and stopping
  jobs is ``drivers.nomad.placement``; the images and installs, ``drivers.nomad.runtime_images``.
- **Resources**: memory -> the task's MemoryMB (a hard limit, swap and /dev/shm inside it),
  cpu millicores -> a CFS quota, pids -> the container's pids limit; a sandbox that names
  no memory or CPU gets the service's defaults (``jobs.default_resources``), never none.
  Nomad's CPU reservation is kept small so a node is not "full" of idle sandboxes.
- **Nothing of Nomad's** is in a sandbox: no task dirs, no /secrets (the Task API socket),
  no NOMAD_* environment; its stdout goes nowhere; its exec agent is not dumpable. With a
  network: no IPv6, and the ranges of ``jobs.egress_denied`` (private ones by default)
  refused, DNS to its name servers aside; its allow-list and rule updates are
  ``drivers.nomad.network_rules``.
- **Workspace**: a host directory per allocation (``workspace_root/<alloc id>`` on the
  client) bind-mounted at /home/agentuity, owned by the sandbox uid.
- **Exec**: through the sandbox's exec agent (``drivers.nomad.agent``: one alloc exec that
  forks the commands), else an alloc exec whose argv starts with an envelope the plugin
  understands (``hutch-exec:v1`` + JSON env/cwd/tag). Timeout and cancel kill the command's
  process group and every process carrying its tag. A command's time limit is kept here, on
  the sandbox's run clock (``drivers.runclock``). The driver's part: ``drivers.nomad.executions``.
- **Pause**: containerd's freeze of the whole task, the exec agent and the commands it forked
  with the rest; their time limits and the agent's heartbeat watch count on the run clock,
  which stands still while it is frozen. A command run as its own alloc exec is not frozen
  mid-way (a runc exec frozen while it starts holds the resume): a pause while one runs is
  refused (501 naming it), and one that would start while paused waits for the resume
  (``drivers.nomad.pausing``).
- **Files**: create-time files are a tar stream unpacked by ``tar`` inside the sandbox, as
  the sandbox user; the file primitives and disk checkpoints are ``drivers.nomad.files``
  and terminals ``drivers.nomad.terminal``: collaborators that reach the driver only
  through ``drivers.nomad.access.SandboxAccess``.
- **Warm pools** (``pool_sizes``): idle allocations placed ahead of time per runtime,
  with the default resources; a create that asks for nothing else claims one (no
  scheduling on the request path) and a background task refills the pool.
- **Failures**: a watcher follows every allocation with Nomad's blocking queries; an
  allocation of a live sandbox that fails, is lost, is OOM-killed or completes on its
  own is reported through ``Driver.set_listener`` so the engine can end the sandbox with
  a lifecycle event (``drivers.nomad.allocation_watch``).
- **Restart**: what the driver knows of a sandbox (job, allocation, runtime, env) is a
  small JSON file under ``<data dir>/nomad`` (``drivers.nomad.state``); ``alive()`` and
  recovery read those files and ask Nomad which allocations still run.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import socket
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from hutch.core.blobs import BlobStore
from hutch.core.driver_types import DirWatch
from hutch.core.errors import (
    DriverFailure,
    IllegalTransition,
    InvalidInput,
    NotSupported,
    SandboxNotFound,
)
from hutch.core.runtimes import RuntimeRecipe
from hutch.drivers import roles
from hutch.drivers.base import (
    Capabilities,
    Driver,
    FileInfo,
    FileWrite,
    Metric,
    ProvisionRequest,
    PtySession,
    TerminalRequest,
    Usage,
    check_env,
)
from hutch.drivers.bytecode import forget_bytecode
from hutch.drivers.egress import AllowLists, flatten
from hutch.drivers.local import rootfs
from hutch.drivers.local.layercache import DEFAULT_MAX_BYTES
from hutch.drivers.nomad import agents, commands, placement
from hutch.drivers.nomad.adoption import NomadAdoption
from hutch.drivers.nomad.allocation_watch import AllocationWatch
from hutch.drivers.nomad.client import NomadClient, NomadNotFound
from hutch.drivers.nomad.execs import plugin_verb
from hutch.drivers.nomad.executions import NomadExecutions, RunningCommand
from hutch.drivers.nomad.files import NomadFiles
from hutch.drivers.nomad.helpers import AgentHelpers
from hutch.drivers.nomad.jobs import (
    PLUGIN,
    PORT_LABEL,
    TASK,
    default_resources,
    egress_denied,
    job_spec,
)
from hutch.drivers.nomad.network_rules import NomadNetworkRules
from hutch.drivers.nomad.pausing import NomadPausing
from hutch.drivers.nomad.pools import (
    PoolSizing,
    WarmPools,
    fixed_sizes,
    pool_sizing_from_env,
)
from hutch.drivers.nomad.portconnect import PortConnections
from hutch.drivers.nomad.runtime_images import RuntimeImages
from hutch.drivers.nomad.state import NomadSandbox, StateFiles
from hutch.drivers.nomad.terminal import NomadTerminals
from hutch.drivers.nomad.usage import NowReadings
from hutch.storage.spool import clear_spool

log = logging.getLogger(__name__)

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,100}\Z")
# Seconds a destroy waits for its commands' execs to return (killed: a second or two at most), so
# each command's end is reported before the sandbox's, as the local driver's destroy does.
DESTROY_WAIT = 10.0


# The mixins (one module each) are the parts of the driver that share its state. The new ones name
# what they use of the others under TYPE_CHECKING only; NomadAdoption and WarmPools have real stubs,
# so whatever those stub must come from the class itself or a mixin before them (_found_paused:
# NomadPausing).
class NomadDriver(NomadPausing, NomadExecutions, NomadNetworkRules, AllocationWatch, NomadAdoption, WarmPools,
                  roles.Adoption, roles.SandboxFiles, roles.DirectoryWatching,
                  roles.FileMetadata, roles.TreeTransfer, roles.Checkpointing, roles.Pausing, roles.Terminals,
                  roles.PortForwarding, roles.UsageReporting, roles.NetworkRules, Driver):
    name = "nomad"

    def __init__(
        self,
        *,
        address: str,
        data_dir: Path,
        registry: str = "127.0.0.1:5000",
        token: str | None = None,
        namespace: str | None = None,
        datacenters: Sequence[str] = ("*",),
        pool_sizes: Mapping[str, int] | None = None,
        pool_sizing: PoolSizing | None = None,
        runtime_cache: Path | None = None,
        layer_max_bytes: int = DEFAULT_MAX_BYTES,  # HUTCH_LAYER_CACHE_MAX: the largest install
        blobs: BlobStore,  # disk checkpoints: the server's blob store
        exec_mode: str = "agent",  # HUTCH_NOMAD_EXEC: "agent" or "alloc" (drivers.nomad.agents)
        # HUTCH_MAX_CHECKPOINT_BYTES: what one sandbox's checkpoints may take in the blob store;
        # a checkpoint is stopped the moment it passes what is left (None: not bounded here).
        max_checkpoint_bytes: int | None = None,
    ) -> None:
        self.address = address
        self.max_checkpoint_bytes = max_checkpoint_bytes
        self.registry = registry
        self.runtime_cache = runtime_cache or rootfs.default_cache()  # the trees images are made from
        self._images = RuntimeImages(registry, self.runtime_cache, layer_max_bytes)
        self.datacenters = list(datacenters)
        self.state_dir = Path(data_dir) / "nomad"
        # Two servers (or tests) on one Nomad keep apart: jobs are named per data dir.
        self.instance = hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:8]
        self.capabilities = Capabilities(
            memory_limit=True, cpu_limit=True, pids_limit=True, network=True, ports=True, terminals=True,
            pause=True, pause_running=True,  # frozen with the agent, limits on the run clock (pause)
            files=True, checkpoints=True, installs=True, tar_streams=True, kernel_isolation=True,
            egress_allow=True,  # the plugin's egress.go, kept current through its allow verb
            egress_deny=True, network_update=True,  # the plugin's egress verb (update_network)
            # inotify and user.e2b.* xattrs: the exec agent's own helpers (helpers.py)
            watches=exec_mode == "agent", metadata=exec_mode == "agent")
        self._allow = AllowLists(self._apply_allow)
        default_resources()  # a bad HUTCH_DEFAULT_MEMORY / HUTCH_DEFAULT_CPU is said now, not at a create
        self._egress_denied = egress_denied()  # HUTCH_SANDBOX_EGRESS_PERMIT / _DENY
        # Warm pools (pools.py): fixed sizes, or adaptive sizing (HUTCH_NOMAD_POOL=auto).
        self._init_pools(pool_sizing or fixed_sizes(pool_sizes))
        self._client = NomadClient(address, token=token, namespace=namespace)
        self._agents = agents.ExecAgents(self._client, exec_mode)
        self._connections = PortConnections(self._client)  # any port of a sandbox (portconnect.py)
        self._available = self._images.available  # the same set, kept current by RuntimeImages
        self._states = StateFiles(self.state_dir)
        # Disk checkpoints: in ``blobs`` (files under the data dir, as they always were, or PostgreSQL).
        self._files = NomadFiles(self, self.state_dir, blobs)
        self._terminals = NomadTerminals(self)
        self._helpers = AgentHelpers(self, self._agents)
        self._readings = NowReadings(self._client, self._helpers)
        self._sandboxes: dict[str, NomadSandbox] = {}
        self._executions: dict[str, RunningCommand] = {}
        self._destroying: set[str] = set()
        self._paused: set[str] = set()
        # Paused or pausing: no alloc exec of a command starts (it waits on the event, set at the resume).
        self._pausing: dict[str, asyncio.Event] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._locks: dict[str, asyncio.Lock] = {}

    # -- lifecycle -------------------------------------------------------------------

    def _job_prefix(self) -> str:
        return f"hutch-{self.instance}-"

    async def start(self) -> None:
        await self._client.start()
        nodes = await self._client.nodes()
        ready = [n for n in nodes if n.get("Status") == "ready"
                 and (n.get("Drivers") or {}).get(PLUGIN, {}).get("Healthy")]
        if not ready:
            raise DriverFailure(
                f"nomad at {self.address} has no ready client node with the {PLUGIN} task driver; "
                "start it with: ./scripts/services start nomad")
        await self._images.probe()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(clear_spool, self._files.spool_dir)  # checkpoints a kill cut short
        left = await self._recover()
        await self._agents.load()
        if not self._agents.available:  # no agent binary (no Go to build it): no helpers either
            self.capabilities = attrs.evolve(self.capabilities, watches=False, metadata=False)
        self._spawn(self._watch(), "nomad-watch")
        self._rejoin_pools(left)
        self._start_pools()

    async def close(self) -> None:
        await self._allow.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._drain_pools()
        await self._connections.close()
        await self._agents.close()
        await self._client.close()

    def runtimes_available(self) -> set[str]:
        return set(self._available)

    async def build_runtime(self, name: str, progress: Callable[[str], None]) -> None:
        """First use: the runtime's tree and image (RuntimeImages), then its warm pool."""
        await self._images.build(name, progress)
        self._start_pools()

    def runtimes_building(self) -> set[str]:
        return self._images.building()

    def runtime_info(self, name: str) -> dict[str, object]:
        return self._images.info(name)

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _lock(self, sid: str) -> asyncio.Lock:
        return self._locks.setdefault(sid, asyncio.Lock())

    async def alive(self) -> set[str]:
        return {sid for sid in self._sandboxes if sid not in self._destroying}

    # -- jobs ------------------------------------------------------------------------

    def _image(self, recipe: RuntimeRecipe, layer: str | None = None) -> str:
        return self._images.ref(recipe, layer)

    async def prepare(self, req: ProvisionRequest) -> None:
        """Installs: the install layer becomes a derived image in the registry, once."""
        await self._images.layer(req)

    async def _place(self, job: dict[str, Any]) -> str:
        """Register ``job`` and wait until its allocation runs (placement.py)."""
        return await placement.place(self._client, job)

    async def _stop_job(self, job_id: str, alloc_id: str | None, *, node_lost: bool = False) -> None:
        """Stop the job and purge it once its task is gone (placement.py)."""
        await placement.stop_job(self._client, job_id, alloc_id, node_lost=node_lost)

    # -- provision ----------------------------------------------------------------------

    async def provision(self, req: ProvisionRequest) -> None:
        if not _ID.match(req.sandbox_id):
            raise InvalidInput(f"invalid sandbox id {req.sandbox_id!r}", field="sandbox_id")
        recipe = self._images.require(req.runtime)
        check_env(req.env, "env")
        async with self._lock(req.sandbox_id):
            if req.sandbox_id in self._sandboxes:
                raise IllegalTransition(f"sandbox {req.sandbox_id} already exists")
            layer = await self._images.layer(req)
            plain = layer is None and not req.network_enabled and req.port is None
            allow = await self._allow.first(req.sandbox_id, req.network_allow) if req.network_allow else None
            # Claimed last: from here on what fails takes the claimed (or placed) job down (_unmake).
            entry = self._claim(recipe.name, req.resources) if plain else None
            if entry is not None:
                sb = NomadSandbox(req.sandbox_id, entry.job_id, entry.alloc_id, recipe.name, dict(req.env))
                self._agents.hand_over(entry.job_id, sb)
            else:
                job_id = self._job_prefix() + req.sandbox_id
                meta = {"hutch.sandbox": req.sandbox_id, "hutch.runtime": recipe.name, **self._marks()}
                job = job_spec(job_id, self._image(recipe, layer), self.datacenters, req.resources, meta,
                               network=req.network_enabled, port=req.port,
                               allow=flatten(allow) if allow is not None else None, deny=req.network_deny,
                               denied=self._egress_denied)
                try:
                    alloc_id = await self._place(job)
                except BaseException:
                    self._allow.forget(req.sandbox_id)
                    with contextlib.suppress(Exception):
                        await asyncio.shield(self._stop_job(job_id, None))
                    raise
                sb = NomadSandbox(req.sandbox_id, job_id, alloc_id, recipe.name, dict(req.env))
            if allow is not None:
                sb.allow = allow
            try:
                await asyncio.to_thread(self._states.save, sb)
            except BaseException as err:
                await self._unmake(sb)
                if isinstance(err, OSError):  # a full disk, a read-only one: said, not "internal error"
                    # The host path and the Nomad job go to the log, not to the tenant (security.md).
                    log.error("sandbox %s: writing its state file %s failed (%s); its Nomad job %s was stopped "
                              "and purged", sb.id, self._states.path(sb.id), err, sb.job_id)
                    raise DriverFailure(f"sandbox {sb.id}: the server could not record it on its own disk, writing "
                                        f"its state file ({err.strerror or err}); it was ended, nothing of it runs",
                                        sandbox_id=sb.id) from err
                raise
            self._sandboxes[sb.id] = sb
            self._agents.ensure(sb)  # started now, so the first commands find it running

    async def _unmake(self, sb: NomadSandbox) -> None:
        """A create that failed once its job was claimed from a warm pool or placed (its state
        file not written: a full disk): the job is stopped and purged before the error is
        answered, its agent's session ended. Not given back to the pool: what failed may have
        been half-way through anything, a fresh entry is clean for sure, and the refill loop
        places one in the background (a create's failure is rare; a refill is ~1 s of Nomad's).
        Left running, it was in no pool and recorded nowhere: only a restart found it. A
        take-over whose state file is not written ends the adopted sandbox the same way (adopt)."""
        self._allow.forget(sb.id)
        self._states.forget(sb.id)
        with contextlib.suppress(Exception):
            await asyncio.shield(self._agents.drop(sb.id))
        with contextlib.suppress(Exception):
            await asyncio.shield(self._stop_job(sb.job_id, sb.alloc_id))
        self._refill_wakeup.set()

    def metrics(self) -> list[Metric]:
        return [*self._pool_metric_list(),
                Metric("hutch_nomad_sandboxes", len(self._sandboxes), "gauge", "sandboxes this driver runs")]

    # -- destroy -------------------------------------------------------------------------

    async def destroy(self, sandbox_id: str) -> None:
        if not _ID.match(sandbox_id):
            return
        async with self._lock(sandbox_id):
            sb = self._sandboxes.get(sandbox_id)
            if sb is None:
                self._states.forget(sandbox_id)
                return
            self._destroying.add(sandbox_id)
            try:
                ending = [ex for ex in self._executions.values() if ex.sandbox_id == sandbox_id]
                for ex in ending:
                    ex.cancelled = True
                    ex.stop.set()
                self._spawn(self._agents.drop(sandbox_id), f"exec-agent-drop-{sandbox_id}")  # not waited for
                # The client kills the task within a second of the stop; its status reaches
                # the server seconds later, so the purge and GC finish in the background.
                with contextlib.suppress(NomadNotFound):
                    await self._client.deregister(sb.job_id, purge=False)
                if ending:  # a paused sandbox's too: the kill verb ends them frozen, the stop thaws them
                    waits = [asyncio.ensure_future(ex.ended.wait()) for ex in ending]
                    await asyncio.wait(waits, timeout=DESTROY_WAIT)
                    for waiting in waits:
                        waiting.cancel()
                self._sandboxes.pop(sandbox_id, None)
                self._allow.forget(sandbox_id)
                self._readings.forget(sandbox_id)
                self._paused.discard(sandbox_id)
                self._wake(sandbox_id)
                self._states.forget(sandbox_id)
                await self._files.drop_checkpoints(sandbox_id)
                self._spawn(self._stop_job(sb.job_id, sb.alloc_id), f"nomad-reap-{sb.job_id}")
            finally:
                self._destroying.discard(sandbox_id)
        self._locks.pop(sandbox_id, None)

    async def port_target(self, sandbox_id: str) -> tuple[str, int]:
        """Where Nomad mapped the sandbox's port: (client address, host port)."""
        sb = self.running(sandbox_id)
        if sb.port_target is None:
            alloc = await self._client.allocation(sb.alloc_id)
            ports = ((alloc.get("AllocatedResources") or {}).get("Shared") or {}).get("Ports") or []
            found = [p for p in ports if p.get("Label") == PORT_LABEL]
            if not found:
                raise NotSupported(f"sandbox {sandbox_id} has no port", field="network.port")
            sb.port_target = (found[0].get("HostIP") or "127.0.0.1", int(found[0]["Value"]))
        return sb.port_target

    async def port_connect(self, sandbox_id: str, port: int) -> socket.socket:
        """Any port the sandbox's processes listen on, through the plugin's connect verb."""
        sb = self.running(sandbox_id)
        return await self._connections.connect(sb.alloc_id, TASK, sandbox_id, port)

    def running(self, sid: str) -> NomadSandbox:
        sb = self._sandboxes.get(sid)
        if sb is None or sid in self._destroying:
            raise SandboxNotFound(f"sandbox {sid} not found")
        return sb

    # -- plugin verbs and usage ------------------------------------------------------------

    async def _verb(self, sb: NomadSandbox, verb: dict[str, Any]) -> None:
        """A plugin verb (freeze, kill, allow) that must succeed (``execs.plugin_verb``)."""
        code, out = await plugin_verb(self._client, sb.alloc_id, TASK, verb)
        if code != 0:
            raise DriverFailure(f"sandbox {sb.id}: {verb} failed (exit {code}): {out[:300]!r}")

    async def usage(self, sandbox_id: str, *, disk: bool = False) -> Usage:
        """What the sandbox uses and holds now, each figure from where usage.py says."""
        sb = self._sandboxes.get(sandbox_id)
        if sb is None:
            return Usage()
        return await self._readings.usage(sb, disk=disk)

    # -- files and terminals: NomadFiles and NomadTerminals, through SandboxAccess (access.py)

    @property
    def client(self) -> NomadClient:
        return self._client

    def gone(self, sandbox_id: str) -> bool:
        return sandbox_id not in self._sandboxes

    def read_file(self, sandbox_id: str, path: str) -> AsyncIterator[bytes]:
        return self._files.read_file(sandbox_id, path)

    async def write_file(
        self, sandbox_id: str, path: str, chunks: AsyncIterable[bytes], *, mode: int = 0o644, parents: bool = True
    ) -> int:
        written = await self._files.write_file(sandbox_id, path, chunks, mode=mode, parents=parents)
        await forget_bytecode(self._files.list_files, self.remove, sandbox_id, [path])
        return written

    async def list_files(self, sandbox_id: str, path: str) -> list[FileInfo]:
        """The entries of ``path`` with their metadata. A write's stale-bytecode look
        (forget_bytecode) takes the plain listing: names are all it needs, and a write must
        not wait on the exec agent (CI's POST /fs once waited 300 s on this helper)."""
        if not self.capabilities.metadata:
            return await self._files.list_files(sandbox_id, path)
        # Side by side: the xattrs helper (a fork in the agent) hides behind the listing's alloc exec.
        entries, found = await asyncio.gather(self._files.list_files(sandbox_id, path),
                                              self._helpers.metadata_of(self.running(sandbox_id), path),
                                              return_exceptions=True)
        if isinstance(entries, BaseException):  # the listing's failure names the path's trouble
            raise entries
        if isinstance(found, BaseException):
            raise found
        return [attrs.evolve(e, metadata=found[e.name]) if e.name in found and not e.is_symlink else e
                for e in entries]

    async def set_metadata(self, sandbox_id: str, path: str, metadata: dict[str, str]) -> None:
        await self._helpers.set_metadata(sandbox_id, path, metadata)

    async def watch_dir(self, sandbox_id: str, path: str, *, recursive: bool) -> DirWatch:
        return await self._helpers.watch_dir(sandbox_id, path, recursive=recursive)

    async def mkdir(self, sandbox_id: str, path: str, *, parents: bool) -> None:
        await self._files.mkdir(sandbox_id, path, parents=parents)

    async def remove(self, sandbox_id: str, path: str, *, directory: bool, recursive: bool) -> bool:
        return await self._files.remove(sandbox_id, path, directory=directory, recursive=recursive)

    async def symlink(self, sandbox_id: str, path: str, target: str) -> None:
        await self._files.symlink(sandbox_id, path, target)

    async def rename(self, sandbox_id: str, source: str, destination: str) -> None:
        await self._files.rename(sandbox_id, source, destination)

    def export_tar(self, sandbox_id: str, path: str) -> AsyncIterator[bytes]:
        return self._files.export_tar(sandbox_id, path)

    async def import_tar(self, sandbox_id: str, dest: str, archive: AsyncIterable[bytes], *, gzipped: bool) -> None:
        await self._files.import_tar(sandbox_id, dest, archive, gzipped=gzipped)

    async def checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        sb = self.running(sandbox_id)
        sb.checkpoints[checkpoint_id] = await self._files.checkpoint(
            sandbox_id, checkpoint_id, limit=self.max_checkpoint_bytes, used=sum(sb.checkpoints.values()))
        await asyncio.to_thread(self._states.save, sb)

    async def checkpoint_sizes(self, sandbox_id: str) -> dict[str, int]:
        """What each checkpoint takes in the blob store (the API counts it against the sandbox's
        limit and the organization's storage quota)."""
        sb = self._sandboxes.get(sandbox_id)
        return dict(sb.checkpoints) if sb is not None else {}

    async def restore(self, sandbox_id: str, checkpoint_id: str) -> None:
        await self._files.restore(sandbox_id, checkpoint_id)

    async def delete_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        await self._files.delete_checkpoint(sandbox_id, checkpoint_id)
        sb = self._sandboxes.get(sandbox_id)
        if sb is not None and sb.checkpoints.pop(checkpoint_id, None) is not None:
            await asyncio.to_thread(self._states.save, sb)

    async def open_terminal(self, req: TerminalRequest) -> PtySession:
        return await self._terminals.open_terminal(req)

    async def write_files(self, sandbox_id: str, files: Sequence[FileWrite]) -> None:
        self.check_not_paused(self.running(sandbox_id))
        await commands.write_files(self, sandbox_id, files)
        await forget_bytecode(self._files.list_files, self.remove, sandbox_id, [f.path for f in files])


__all__ = ["NomadDriver", "PoolSizing", "pool_sizing_from_env"]
