"""The local driver: sandboxes on this host with real kernel isolation.

A sandbox is
- an overlay: the shared, read-only runtime rootfs below a per-sandbox upper layer
  (``<data_dir>/sandboxes/<id>/upper``). It is mounted only inside the sandbox's own
  mount namespace, so the host never carries a sandbox mount that could leak.
- a long-lived pid 1 started by ``hutch-nsexec launch`` with new mount, pid, ipc, uts
  and net namespaces (net: loopback only), ``/proc``, a minimal ``/dev``, running as the
  sandbox user: a host uid from a dedicated range (``UID_BASE``..), never host root.
- a cgroup ``hutch/<id>`` with the memory / cpu / pids limits, and one leaf per
  execution so a timeout or cancel kills precisely that execution's process tree.

Commands and file writes go through ``hutch-nsexec`` (native/hutch-nsexec.c), which
setns()es into the sandbox, joins the execution's cgroup, drops every privilege,
loads the seccomp filter and execs.

Exit codes: a signal n gives 128+n; a timeout gives 124 (``timed_out``); a cancel
gives 137 (``cancelled``, the tree was SIGKILLed); an unknown command 127.

An execution returns when its command exits, even if background children it started
still hold stdout (they keep running: processes persist between executions like
files do; only a timeout, a cancel or destroy kills them). ``pause`` freezes the
sandbox's cgroup, running commands included; their limits count on its run clock
(drivers/runclock.py), which stands still while it is frozen. A filesystem-only pause ends every
process and keeps the files; its resume boots the sandbox again (fspause.py). Each boot has
a boot id of its own (/proc/sys/kernel/random/boot_id; launch.new_boot_id). Network (on request) and an exposed port: a routed veth
per sandbox with NAT out and nothing in (network.py).

Warm pool: idle sandboxes started ahead of time and claimed by ``provision`` (pool.py).

Rootless mode (a server that is not root): each sandbox gets a user namespace of its
own mapping the sandbox user to the server's uid; rlimits stand in for cgroups and a
session for an execution's cgroup leaf; what needs root is refused by name. See the
README ("Rootless mode").

Where each part lives: state.py (sandbox records, executions, locks), nsexec.py (the
hutch-nsexec protocol), executions.py (commands, terminals, signals, pause), launch.py
(directories, upper layer, cgroups and pid 1), pool.py (the warm pool), provisioning.py,
teardown.py, sandboxnet.py (veth or slirp4netns, ports, allow-lists), fsops.py (file
primitives), checkpoints.py. ``LocalDriver`` below is the facade implementing
drivers/base.py by delegating to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from pathlib import Path

from hutch.core import runtimes
from hutch.core.driver_types import DirWatch
from hutch.core.errors import DriverFailure, NotSupported, SandboxNotFound
from hutch.drivers import roles, trees
from hutch.drivers.base import (
    Capabilities,
    Driver,
    ExecRequest,
    ExecResult,
    FileInfo,
    FileWrite,
    OutputSink,
    ProvisionRequest,
    PtySession,
    ResourceLimits,
    TerminalRequest,
    Usage,
)
from hutch.drivers.builds import Builds
from hutch.drivers.bytecode import forget_bytecode
from hutch.drivers.local import cgroups_detect, pidstotal, portconnect, rootfs
from hutch.drivers.local.admission import HostAdmission, HostLimits
from hutch.drivers.local.cgroups import CgroupV1
from hutch.drivers.local.checkpoints import LocalCheckpoints
from hutch.drivers.local.endwatch import EndWatch, raise_fd_limit
from hutch.drivers.local.executions import LocalExecutions
from hutch.drivers.local.fsops import Files
from hutch.drivers.local.fspause import FilesystemPause
from hutch.drivers.local.launch import MOUNT_POINT, ROOTLESS_TMP, Launcher
from hutch.drivers.local.layercache import LayerLimits, LayerSweeper
from hutch.drivers.local.native import ensure_helper
from hutch.drivers.local.nsexec import Nsexec
from hutch.drivers.local.pool import PoolRefill, SpareRoom, WarmPool
from hutch.drivers.local.provisioning import Provisioner
from hutch.drivers.local.quiet import SETTLED_GRACE, Quiet
from hutch.drivers.local.sandboxnet import SandboxNetwork
from hutch.drivers.local.spares import SpareDirs
from hutch.drivers.local.state import SAFE_ID, Registry, is_live
from hutch.drivers.local.teardown import Teardown
from hutch.drivers.local.trash import Trash
from hutch.drivers.local.uids import UID_BASE
from hutch.drivers.local.usage import measure

__all__ = ["UID_BASE", "LocalDriver"]  # UID_BASE: the tests find sandbox uids by it

log = logging.getLogger(__name__)

HOME = rootfs.SANDBOX_HOME


class LocalDriver(roles.SandboxFiles, roles.DirectoryWatching, roles.FileMetadata, roles.TreeTransfer, roles.Checkpointing,
                  roles.Pausing, roles.Terminals, roles.PortForwarding, roles.NetworkRules, roles.UsageReporting,
                  Driver):
    name = "local"

    def __init__(self, data_dir: Path, runtime_cache: Path, layer_limits: LayerLimits | None = None, *,
                 pool_memory: int | None = None, host_limits: HostLimits | None = None,
                 pids_total: int | None = None, org_pids: int | None = None) -> None:
        """``pool_memory``: the memory limit the warm pool is filled for (the server's default;
        None: the latest asked, pool.py). ``host_limits``: what the host takes in sandboxes, a
        create past it refused (admission.py); None: no check here (a node agent, whose own
        admission checks the same before it asks, and counts the pool: ``count_spares``). ``pids_total``: the pids all its sandboxes hold
        together (pidstotal.py); None: the host's pid_max less a reserve. ``org_pids``: the pids
        each organization's sandboxes hold together (pidstotal.py); None: half of ``pids_total``."""
        self._pids_total = pidstotal.default() if pids_total is None else pids_total
        self._org_pids = pidstotal.org_default(self._pids_total) if org_pids is None else org_pids
        try:  # refused here, before anything is started: the setting named
            pidstotal.check_share(self._org_pids, self._pids_total)
        except ValueError as err:
            raise DriverFailure(str(err)) from None
        self.data_dir = Path(data_dir)
        self._admission = None if host_limits is None else HostAdmission(host_limits, busy=self._busy)
        self._preparing: set[str] = set()  # creates whose install layer is being built (``prepare``)
        self._pool_memory = pool_memory
        self.runtime_cache = Path(runtime_cache)
        # Install layers: the server's cache, bounded and swept (layercache.py).
        self.layers = LayerSweeper(self.runtime_cache / "layers", layer_limits or LayerLimits())
        self.sandbox_root = self.data_dir / "sandboxes"
        # Two data dirs (two servers, or tests) on one host keep separate cgroup trees.
        instance = hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()[:12]
        # Rootless: a server that is not root still isolates with namespaces, a user
        # namespace among them, and limits with rlimits instead of cgroups (see start()).
        self.rootless = os.geteuid() != 0
        self._cgroups = None if self.rootless else cgroups_detect.detect(instance)
        self.capabilities = self._capabilities()
        self._guard: asyncio.Task[None] | None = None  # pidsguard.py: fork bombs left behind
        self._available: set[str] = set()
        self._available_at = -1e9
        self._builds = Builds()  # runtimes built on first use
        self._trash = Trash(self.sandbox_root)  # dead sandboxes' directories, deleted off the loop
        self._spares = SpareDirs(self.sandbox_root, [HOME, rootfs.WORKSPACE, *(ROOTLESS_TMP if self.rootless else ())],
                                 xattr_prefix="user.overlay." if self.rootless else "trusted.overlay.")
        self._wire()

    def _capabilities(self) -> Capabilities:
        controllers = self._cgroups.controllers if self._cgroups else frozenset()
        return Capabilities(
            memory_limit=self.rootless or "memory" in controllers,  # rootless: per process (RLIMIT_DATA)
            cpu_limit="cpu" in controllers,
            pids_limit=self.rootless or "pids" in controllers,  # rootless: RLIMIT_NPROC per sandbox
            network=True,  # rootless: slirp4netns (slirp.py) instead of a veth and NAT
            pause=self._cgroups is not None,  # the freezer
            pause_running=self._cgroups is not None,  # and the run clock (drivers/runclock.py)
            pause_filesystem=True,  # fspause.py: its pid 1 ended, no freezer needed (rootless too)
            files=True,
            tar_streams=True,  # trees.py over the file primitives: one call for a node agent, not one a file
            checkpoints=not self.rootless,  # consistent copies need the freezer
            ports=True,  # rootless: a slirp4netns forward on the host's loopback
            installs=not self.rootless,  # install layers build in a chroot as root
            kernel_isolation=True,
            egress_allow=True,  # root: host chains (network.py); rootless: in its namespace (slirp.py)
            egress_deny=not self.rootless,  # the same host chains (network.rules_chain)
            network_update=not self.rootless,  # the chain swapped in one commit (sandboxnet.update)
            terminals=True,  # terminal.py
            named_user=True,  # launch.populate_upper writes the account's passwd entry and home
            watches=True,  # inotify inside the sandbox (watches.py)
            metadata=True,  # user.e2b.* xattrs, set and listed inside the sandbox (fsops.py)
        )

    def _wire(self) -> None:
        """The collaborators, each given what it needs (see the module docstring)."""
        cg, cache, rootless = self._cgroups, self.runtime_cache, self.rootless
        self._registry = Registry(self.sandbox_root, cg)
        self._nsexec = Nsexec(self._registry, cg)
        self._network = SandboxNetwork(self._registry, self._nsexec, rootless)
        self._quiet = Quiet()  # requests launching; the pool's refill waits for none (quiet.py)
        self._executions = LocalExecutions(self._registry, self._nsexec, cg, self._quiet)
        self._launcher = Launcher(self._registry, self._nsexec, cg, self._network, self._spares, rootless=rootless)
        self._teardown = Teardown(self._registry, self._nsexec, cg, self._network, self._spares, cache, self._trash)
        self._background = PoolRefill()  # pool fills, destroys: close() waits for them
        self._pool = WarmPool(self._registry, cg, self._launcher, self._teardown, self._background, cache,
                              self._quiet, memory=self._pool_memory, room=self._admission)
        self._provisioner = Provisioner(self._registry, cg, self._launcher, self._pool, self._network,
                                        self._teardown, runtime_cache=cache, rootless=rootless,
                                        layer_limits=self.layers.limits, quiet=self._quiet,
                                        on_built=self.layers.wake)
        self._files = Files(self._registry, self._nsexec)
        self._checkpoints = LocalCheckpoints(self._registry, cg, self._launcher, self._network, self._teardown, cache)
        self._fspause = FilesystemPause(self._registry, cg, self._launcher, self._network, self._teardown, cache,
                                        rootless=rootless)
        self._ended = EndWatch(self._init_ended, self._background.spawn)  # endwatch.py

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        if self.rootless:
            # No cgroups, no uid range, no pool (adopting one needs cgroup renames): every
            # sandbox is made by the launcher in a user namespace of its own.
            self._pool.size = 0
            self._nsexec.path = await asyncio.to_thread(self._prepare)
            await self._teardown.reap_leftovers()
            self._watch_adopted()
            return
        if self._cgroups is None:
            raise DriverFailure("no usable cgroup hierarchy found (need a v1 freezer or cgroup v2)")
        self._nsexec.path = await asyncio.to_thread(self._prepare)
        self._cgroups.setup(self._pids_total, self._org_pids)
        if not isinstance(self._cgroups, CgroupV1):
            self._pool.size = 0
        self._pool.start()
        await self._teardown.reap_leftovers()
        self._watch_adopted()
        self.layers.start()  # after adopting: sandboxes that outlived the last server keep theirs
        self._guard = asyncio.create_task(self._executions.guard_pids(lambda: self._pool.closed))

    def _watch_adopted(self) -> None:
        raise_fd_limit()
        for sb in list(self._registry.sandboxes.values()):
            if not sb.asleep:  # paused filesystem-only: no init to watch until its resume
                self._ended.watch(sb)

    def _prepare(self) -> Path:
        self.sandbox_root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.sandbox_root, 0o700)  # upper layers: only root (the overlay's mounter) needs in
        (self.sandbox_root / MOUNT_POINT).mkdir(mode=0o700, exist_ok=True)  # every pid 1's (launch.py)
        self._spares.reset()
        self._trash.reset()
        # Shared per host next to the runtimes (compiled once), else per data dir.
        try:
            return ensure_helper(self.runtime_cache / "bin")
        except OSError:
            return ensure_helper(self.data_dir / "bin")

    async def close(self) -> None:
        self._pool.closed = True  # no more fills, and the pids guard stops
        self._ended.close()  # the sandboxes run on; the next start watches them again
        await self.layers.close()
        await self._network.allow.close()
        if self._guard is not None:
            self._guard.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._guard
        # Not cancelled: a fill in progress finishes in its thread, sees the pool closed and
        # destroys what it made; a destroy in progress completes.
        await self._background.drain()
        self._provisioner.close()
        self._checkpoints.close()
        await self._pool.close()
        await self._trash.drain()
        if self._cgroups is not None:
            self._cgroups.remove_instance()  # only when no sandbox is left in it

    async def build_runtime(self, name: str, progress: Callable[[str], None]) -> None:
        recipe = rootfs.lookup(name)
        if self.rootless:
            raise NotSupported(f"runtime: {recipe.name} is not built, and a server without root cannot build "
                               f"runtimes (mmdebstrap needs root); build it as root: sudo "
                               f"{rootfs.build_hint(recipe.name, self.runtime_cache)}", field="runtime")

        def build(log: Callable[[str], None]) -> None:
            rootfs.build(recipe, self.runtime_cache, log=log)

        try:
            await self._builds.run(recipe.name, progress, build)
        finally:
            if self._admission is not None:  # the creates that waited for it: their holds count from now
                self._admission.renew(runtime=recipe.name)
        self._available_at = -1e9  # look again at the next create

    def runtimes_building(self) -> set[str]:
        return self._builds.building()

    def runtime_info(self, name: str) -> dict[str, object]:
        return rootfs.build_info(self.runtime_cache, rootfs.lookup(name))

    def runtimes_available(self) -> set[str]:
        # Asked on every create: a second-old answer saves a stat per catalog entry.
        now = time.monotonic()
        if now - self._available_at > 1.0:
            self._available = {r.name for r in runtimes.CATALOG if rootfs.is_built(self.runtime_cache, r)}
            self._available_at = now
        return set(self._available)

    async def alive(self) -> set[str]:
        # No await in here: no create or end lands between the list and the admission's count.
        found: dict[str, ResourceLimits] = {}
        if self.sandbox_root.is_dir():
            for path in self.sandbox_root.iterdir():
                if not SAFE_ID.match(path.name):  # pooled sandboxes, stray files
                    continue
                sb = self._registry.load(path.name)
                if sb is not None and is_live(sb):
                    found[sb.id] = ResourceLimits(memory_bytes=sb.memory_bytes)
                    if sb.allow:  # an earlier server's: its rules stand; keep its names current
                        self._network.allow.adopt(sb.id, sb.allow)
        if self._admission is not None:
            self._admission.count(found)
        return set(found)

    def is_alive(self, sandbox_id: str) -> bool:
        """What ``alive()`` says of one sandbox, without reading every sandbox's init: a node
        agent asks at each create whether that one runs already (a retried create)."""
        sb = self._registry.load(sandbox_id) if SAFE_ID.match(sandbox_id) else None
        return sb is not None and is_live(sb)

    # -- sandboxes -------------------------------------------------------------

    async def reserve(self, req: ProvisionRequest) -> None:
        """Room on this host held for ``req`` before the engine records it, or NoCapacity
        naming what is short (admission.py)."""
        if self._admission is None:
            return
        if not self._admission.counted:
            await self.alive()  # counts the sandboxes an earlier server left running
        recipe = runtimes.find(req.runtime)
        self._admission.reserve(req.sandbox_id, req.resources, recipe.name if recipe else req.runtime)

    def _busy(self, sandbox_id: str, runtime: str) -> bool:
        """A create still waiting on a long step: its runtime's build, its install layer's. Its
        hold stays (admission.py); else a host filled meanwhile failed it, recorded already."""
        return sandbox_id in self._preparing or runtime in self._builds.building()

    def release(self, sandbox_id: str) -> None:
        if self._admission is not None:
            self._admission.release(sandbox_id)

    async def provision(self, req: ProvisionRequest) -> None:
        # Held already (the engine's reserve; kept through its runtime's build and its install:
        # ``_busy``), or checked now: a hold that lapsed all the same, a caller that does not
        # reserve (a test).
        await self.reserve(req)
        try:
            await self._provisioner.provision(req)
        except BaseException:
            self.release(req.sandbox_id)
            raise
        self._ended.watch(self._registry.sandboxes[req.sandbox_id])
        if self._admission is not None:
            self._admission.made(req.sandbox_id, req.resources)
        # Made from scratch beside the pool's spares, it may have taken the host past its
        # bounds with them: the spares go, not the sandbox (admission.py; a node agent's own).
        self._pool.trim()

    def count_spares(self, room: SpareRoom) -> None:
        """A node agent's admission counts the warm pool's spares, as the host's does here
        where ``host_limits`` is given (pool.SpareRoom): before ``start``, and only without it."""
        if self._admission is not None:
            raise ValueError("the spares are counted by this driver's own admission already")
        self._pool.count_in(room)

    async def prepare(self, req: ProvisionRequest) -> None:
        """Build (or find) the install layer the request needs; the slow and fallible part."""
        self._preparing.add(req.sandbox_id)
        try:
            await self._provisioner.prepare(req)
        finally:
            self._preparing.discard(req.sandbox_id)
            if self._admission is not None:
                self._admission.renew(sandbox_id=req.sandbox_id)

    def settled(self, sandbox_id: str) -> None:
        # Its create's hold: nothing of it launches now; a prompt execute holds in turn.
        self._quiet.shorten(sandbox_id, SETTLED_GRACE)

    async def destroy(self, sandbox_id: str) -> None:
        if not SAFE_ID.match(sandbox_id):
            return
        self._ended.forget(sandbox_id)
        # Shielded and tracked: a caller cancelled half way (a server shutting down)
        # must not leave a killed sandbox's cgroups and files behind; close() waits.
        task = asyncio.ensure_future(self._destroy(sandbox_id))
        self._background.track(task)
        await asyncio.shield(task)

    async def _destroy(self, sandbox_id: str) -> None:
        self.release(sandbox_id)  # a create under way that is destroyed holds no room
        async with self._registry.lock(sandbox_id):
            await self._teardown.teardown(sandbox_id)
        self._registry.drop_lock(sandbox_id)
        if self._admission is not None:
            self._admission.ended(sandbox_id)  # after the teardown: its memory is the host's again

    async def _init_ended(self, sandbox_id: str, init_pid: int) -> None:
        """A watched init exited (endwatch.py). Unless a destroy (the record is gone) or a
        restore (a new init) did it, the sandbox is over: torn down as a destroy would, then
        reported failed, as the nomad driver reports a lost allocation."""
        async with self._registry.lock(sandbox_id):
            sb = self._registry.sandboxes.get(sandbox_id)
            if sb is None or sb.init_pid != init_pid or is_live(sb):
                return
            log.warning("sandbox %s: its init (pid %d) ended without a destroy; ending the sandbox",
                        sandbox_id, init_pid)
            try:
                await self._teardown.teardown(sandbox_id)
            except Exception:  # reported all the same: the sandbox is gone either way
                log.exception("tearing down sandbox %s after its init ended", sandbox_id)
        self._registry.drop_lock(sandbox_id)
        if self._admission is not None:
            self._admission.ended(sandbox_id)
        await self.report_ended(sandbox_id, f"the sandbox's init process (pid {init_pid}) ended without a destroy: "
                                "killed on the host (processes inside cannot kill it)", failed=True)

    def limits(self, sandbox_id: str) -> ResourceLimits:
        """The memory, cpu and disk limits the sandbox was given, read back from its meta.json
        after a restart too: the capacity a node agent has committed to it (pids are not
        kept). None where it had no limit or was made before limits were kept."""
        sb = self._registry.load(sandbox_id) if SAFE_ID.match(sandbox_id) else None
        if sb is None:
            raise SandboxNotFound(f"sandbox {sandbox_id} not found")
        return ResourceLimits(memory_bytes=sb.memory_bytes, cpu_millis=sb.cpu_millis, disk_bytes=sb.disk_bytes)

    async def usage(self, sandbox_id: str, *, disk: bool = False) -> Usage:
        sb = self._registry.load(sandbox_id) if SAFE_ID.match(sandbox_id) else None
        if sb is None:
            return Usage()
        d = self._registry.sandbox_root / sandbox_id
        if not disk:
            # A few small cgroup files (~0.1 ms): on the loop. In a worker thread the read cost
            # 1.2-6 ms of GIL hand-offs, paid by whatever else waited on the loop: a one-shot's
            # end reads it while the next one-shot's request is on its way (docs/benchmarks.md).
            return measure(d, sb, self._cgroups, disk=False)
        return await asyncio.to_thread(measure, d, sb, self._cgroups, disk=True)

    async def port_target(self, sandbox_id: str) -> tuple[str, int]:
        return self._network.port_target(sandbox_id)

    async def update_network(self, sandbox_id: str, *, enabled: bool, allow: tuple[str, ...],
                             deny: tuple[str, ...]) -> None:
        await self._network.update(sandbox_id, enabled=enabled, allow=allow, deny=deny)

    async def port_connect(self, sandbox_id: str, port: int) -> socket.socket:
        sb = self._registry.running(sandbox_id)
        if self.rootless:  # entering a network namespace needs CAP_SYS_ADMIN (portconnect.py)
            raise NotSupported(f"sandbox {sandbox_id}: a rootless server reaches only the port a sandbox declared at "
                               f"create (network.port), not port {port}", field="port")
        return await portconnect.connect(sandbox_id, sb.init_pid, sb.init_start, port)

    async def pause(self, sandbox_id: str, *, memory: bool = True) -> None:
        if memory:
            await self._executions.pause(sandbox_id)
            return
        self._ended.forget(sandbox_id)  # its pid 1 is about to end, and that is no failure
        try:
            await self._fspause.pause(sandbox_id)
        except BaseException:
            if not self._fspause.is_asleep(sandbox_id):
                with contextlib.suppress(Exception):
                    self._ended.watch(self._registry.running(sandbox_id))
            raise

    async def resume(self, sandbox_id: str) -> None:
        if self._fspause.is_asleep(sandbox_id):
            self._ended.watch(await self._fspause.resume(sandbox_id))  # its new init
            return
        await self._executions.resume(sandbox_id)

    # -- executions ------------------------------------------------------------

    async def exec(self, req: ExecRequest, sink: OutputSink) -> ExecResult:
        return await self._executions.exec(req, sink)

    async def open_terminal(self, req: TerminalRequest) -> PtySession:
        return await self._executions.open_terminal(req)

    async def cancel(self, execution_id: str) -> None:
        await self._executions.cancel(execution_id)

    async def signal(self, execution_id: str, signum: int) -> None:
        await self._executions.signal(execution_id, signum)

    async def write_files(self, sandbox_id: str, files: Sequence[FileWrite]) -> None:
        await self._executions.write_files(sandbox_id, files)
        await forget_bytecode(self.list_files, self.remove, sandbox_id, [f.path for f in files])

    # -- files (fsops.py) ------------------------------------------------------

    def read_file(self, sandbox_id: str, path: str) -> AsyncIterator[bytes]:
        # Fsops' own generator, not one wrapped around it: closing it closes the helper.
        return self._files.read_file(sandbox_id, path)

    async def write_file(
        self, sandbox_id: str, path: str, chunks: AsyncIterable[bytes], *, mode: int = 0o644, parents: bool = True
    ) -> int:
        written = await self._files.write_file(sandbox_id, path, chunks, mode=mode, parents=parents)
        await forget_bytecode(self.list_files, self.remove, sandbox_id, [path])
        return written

    async def list_files(self, sandbox_id: str, path: str) -> list[FileInfo]:
        return await self._files.list_files(sandbox_id, path)

    async def mkdir(self, sandbox_id: str, path: str, *, parents: bool) -> None:
        await self._files.mkdir(sandbox_id, path, parents=parents)

    async def remove(self, sandbox_id: str, path: str, *, directory: bool, recursive: bool) -> bool:
        return await self._files.remove(sandbox_id, path, directory=directory, recursive=recursive)

    async def symlink(self, sandbox_id: str, path: str, target: str) -> None:
        await self._files.symlink(sandbox_id, path, target)

    async def rename(self, sandbox_id: str, source: str, destination: str) -> None:
        await self._files.rename(sandbox_id, source, destination)

    async def watch_dir(self, sandbox_id: str, path: str, *, recursive: bool) -> DirWatch:
        return await self._files.watch_dir(sandbox_id, path, recursive=recursive)

    async def set_metadata(self, sandbox_id: str, path: str, metadata: dict[str, str]) -> None:
        await self._files.set_metadata(sandbox_id, path, metadata)

    # -- whole trees (drivers/trees.py over the primitives above) --------------

    def export_tar(self, sandbox_id: str, path: str) -> AsyncIterator[bytes]:
        return trees.tar_from_files(self, sandbox_id, path)

    async def import_tar(self, sandbox_id: str, dest: str, archive: AsyncIterable[bytes], *, gzipped: bool) -> None:
        await trees.untar_into_files(self, sandbox_id, dest, archive, gzipped=gzipped)

    # -- checkpoints (checkpoints.py) ------------------------------------------

    async def checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        await self._checkpoints.checkpoint(sandbox_id, checkpoint_id)

    async def restore(self, sandbox_id: str, checkpoint_id: str) -> None:
        await self._checkpoints.restore(sandbox_id, checkpoint_id)
        self._ended.watch(self._registry.running(sandbox_id))  # its new init

    async def checkpoint_sizes(self, sandbox_id: str) -> dict[str, int]:
        return await asyncio.to_thread(self._checkpoints.sizes, sandbox_id)

    async def delete_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        await self._checkpoints.delete_checkpoint(sandbox_id, checkpoint_id)
