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
sandbox's cgroup. Network (on request) and an exposed port: a routed veth
per sandbox with NAT out and nothing in (network.py).

Warm pool: for each runtime it has provisioned, the driver keeps ``HUTCH_WARM_POOL``
(default 2; 0 turns it off) idle sandboxes started ahead of time, refilled in the
background one at a time. ``provision`` claims one when it can: the sandbox's directory
and cgroups are renamed to the requested id (same parent, so nothing moves), the
requested limits are written to its cgroup, the uid claim and ``meta.json`` follow the
new id. No command has ever run in a pooled sandbox, so a claimed one is
indistinguishable from a freshly started one. Pooled sandboxes are named
``_pool-<server pid>-<its start time>-...`` (never a valid sandbox id): ``alive()`` does
not see them, ``close()`` destroys them, and a later start reaps those of a server
that is gone. Needs cgroup v1 (v2 cannot rename cgroups): on v2 the pool stays off.

Rootless mode (a server that is not root): each sandbox gets a user namespace of its
own mapping the sandbox user to the server's uid; rlimits stand in for cgroups and a
session for an execution's cgroup leaf; what needs root is refused by name. See the
README ("Rootless mode").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import os
import posixpath
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterable, Callable, Mapping, Sequence
from pathlib import Path

import attrs

from core import runtimes
from core.errors import (
    DriverFailure,
    IllegalTransition,
    InvalidInput,
    NotSupported,
    RuntimeNotFound,
    SandboxNotFound,
)
from drivers.base import (
    DEFAULT_PIDS,
    Capabilities,
    Driver,
    ExecRequest,
    ExecResult,
    FileToWrite,
    OutputSink,
    ProvisionRequest,
    Terminal,
    TerminalRequest,
    Usage,
    check_env,
)
from drivers.builds import Builds
from drivers.egress import AllowLists, flatten
from drivers.local import disks, helper, layers, network, pidsguard, rootfs, slirp, terminal, uids
from drivers.local.cgroups import Cgroups, CgroupV1
from drivers.local.checkpoints import SAFE_ID, CheckpointsMixin
from drivers.local.fsops import FilesMixin
from drivers.local.helper import start_time as _start_time
from drivers.local.native import ensure_helper
from drivers.local.pidsguard import PidsGuard
from drivers.local.smallfiles import get as _get
from drivers.local.smallfiles import put as _put
from drivers.local.spares import SpareDirs
from drivers.local.uids import UID_BASE

# Rootless mode: the sandbox user's uid inside its user namespace (mapped to the server's).
ROOTLESS_UID = 1000
ROOTLESS_TMP = ("/tmp", "/var/tmp")  # made writable in the upper layer (see _populate_upper)
HOME = rootfs.SANDBOX_HOME
USER = rootfs.SANDBOX_USER
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
EXIT_TIMEOUT = 124
EXIT_CANCELLED = 128 + signal.SIGKILL
READY_TIMEOUT = 15.0
_ID = SAFE_ID
POOL_PREFIX = "_pool-"
_POOL_NAME = re.compile(r"^_pool-(\d+)-(\d+)-[0-9a-f]+-\d+$")

log = logging.getLogger(__name__)


def _pool_size() -> int:
    try:
        return max(0, int(os.environ.get("HUTCH_WARM_POOL", "2")))
    except ValueError:
        return 2


@attrs.define
class _Sandbox:
    id: str
    uid: int
    runtime: str
    env: dict[str, str]
    init_pid: int
    init_start: int
    network: bool = False  # outbound network (veth + NAT); see network.py
    port: int | None = None  # the one exposed port, reached through port_target()
    layer: str | None = None  # its install layer (drivers/local/layers.py), if it asked for installs
    # Rootless mode only (no cgroups): the rlimits every process of the sandbox gets.
    rlimit_data: int | None = None
    rlimit_nproc: int | None = None
    # Rootless network: its slirp4netns (pid and start time; see slirp.py).
    slirp_pid: int | None = None
    slirp_start: int | None = None
    host_port: int | None = None  # rootless port: slirp4netns forwards 127.0.0.1:host_port to it
    allow: dict[str, list[str]] = attrs.field(factory=dict)  # network.allow: each entry's CIDRs (egress.py)


@attrs.define
class _Execution:
    sandbox_id: str
    leaf: str
    cancelled: bool = False


class LocalDriver(FilesMixin, CheckpointsMixin, Driver):
    name = "local"
    _home = HOME

    def __init__(self, data_dir: Path, runtime_cache: Path) -> None:
        self.data_dir = Path(data_dir)
        self.runtime_cache = Path(runtime_cache)
        self.sandbox_root = self.data_dir / "sandboxes"
        # Two data dirs (two servers, or tests) on one host keep separate cgroup trees.
        instance = hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()[:12]
        # Rootless: a server that is not root still isolates with namespaces, a user
        # namespace among them, and limits with rlimits instead of cgroups (see start()).
        self.rootless = os.geteuid() != 0
        self._cgroups = None if self.rootless else Cgroups.detect(instance)
        controllers = self._cgroups.controllers if self._cgroups else frozenset()
        self.capabilities = Capabilities(
            memory_limit=self.rootless or "memory" in controllers,  # rootless: per process (RLIMIT_DATA)
            cpu_limit="cpu" in controllers,
            pids_limit=self.rootless or "pids" in controllers,  # rootless: RLIMIT_NPROC per sandbox
            network=True,  # rootless: slirp4netns (slirp.py) instead of a veth and NAT
            pause=self._cgroups is not None,  # the freezer
            files=True,
            checkpoints=not self.rootless,  # consistent copies need the freezer
            ports=True,  # rootless: a slirp4netns forward on the host's loopback
            installs=not self.rootless,  # install layers build in a chroot as root
            kernel_isolation=True,
            egress_allow=True,  # root: host chains (network.py); rootless: in its namespace (slirp.py)
            terminals=True,  # terminal.py
        )
        self._allow = AllowLists(self._apply_allow)  # network.allow, kept current (drivers/egress.py)
        self._guard: asyncio.Task[None] | None = None  # pidsguard.py: fork bombs left behind
        self._helper: Path | None = None
        self._sandboxes: dict[str, _Sandbox] = {}
        self._executions: dict[str, _Execution] = {}
        self._lingering: dict[str, set[str]] = {}  # leaves kept alive by background processes
        self._helpers: dict[str, int] = {}  # leaf -> pid of the helper running it (rootless kills)
        self._slirps: dict[str, subprocess.Popen[bytes]] = {}  # rootless network, to reap
        self._slirp_dir: Path | None = None  # rootless ports: slirp4netns API sockets
        self._locks: dict[str, asyncio.Lock] = {}
        # The warm pool (see the module docstring).
        self._pool_size = _pool_size()
        self._pool: dict[str, list[_Sandbox]] = {}  # runtime -> idle pooled sandboxes
        self._background: set[asyncio.Future[None]] = set()  # pool fills, destroys
        self._pool_filling: set[str] = set()
        self._pool_fill_slots = asyncio.Semaphore(1)
        self._pool_seq = itertools.count()
        self._pool_tag = ""
        self._closed = False
        self._available: set[str] = set()
        self._available_at = -1e9
        self._builds = Builds()  # runtimes built on first use
        self._spares = SpareDirs(self.sandbox_root, [HOME, rootfs.WORKSPACE, *(ROOTLESS_TMP if self.rootless else ())],
                                 xattr_prefix="user.overlay." if self.rootless else "trusted.overlay.")

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        if self.rootless:
            # No cgroups, no uid range, no pool (adopting one needs cgroup renames): every
            # sandbox is made by the launcher in a user namespace of its own.
            self._pool_size = 0
            self._helper = await asyncio.to_thread(self._prepare)
            await self._reap_leftovers()
            return
        if self._cgroups is None:
            raise DriverFailure("no usable cgroup hierarchy found (need a v1 freezer or cgroup v2)")
        self._helper = await asyncio.to_thread(self._prepare)
        self._cgroups.setup()
        if not isinstance(self._cgroups, CgroupV1):
            self._pool_size = 0
        me = os.getpid()
        self._pool_tag = f"{POOL_PREFIX}{me}-{_start_time(me)}-{secrets.token_hex(4)}"
        await self._reap_leftovers()
        self._guard = asyncio.create_task(self._guard_pids())

    def _prepare(self) -> Path:
        self.sandbox_root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.sandbox_root, 0o700)  # upper layers: only root (the overlay's mounter) needs in
        self._spares.reset()
        # Shared per host next to the runtimes (compiled once), else per data dir.
        try:
            return ensure_helper(self.runtime_cache / "bin")
        except OSError:
            return ensure_helper(self.data_dir / "bin")

    async def _reap_leftovers(self) -> None:
        """Remove what sandboxes that died while we were away left behind."""
        on_disk = {p.name for p in self.sandbox_root.iterdir() if p.is_dir()}
        for sid in on_disk | (self._cgroups.sandboxes() if self._cgroups else set()):
            pooled = _POOL_NAME.match(sid)
            if pooled:  # a pool of a server that is gone (its own pid and start time)
                if _start_time(int(pooled[1])) != int(pooled[2]):
                    await self._teardown(sid)
                continue
            if not _ID.match(sid):
                continue
            sb = self._load(sid)
            if sb is not None and _start_time(sb.init_pid) == sb.init_start:
                self._sandboxes[sid] = sb
                await self._kill_orphaned_executions(sid)
            else:
                await self._teardown(sid)

    async def _kill_orphaned_executions(self, sid: str) -> None:
        """An adopted sandbox's running executions lost their watcher with the old server
        (the Engine reports them failed): end their process trees rather than let them run
        on unaccounted. Background processes started by finished executions live in the
        sandbox's own cgroup and are left alone. (Rootless: nothing tells an orphaned
        execution's processes from background ones, so all are left alone.)"""
        if self._cgroups is None:
            return
        sandbox_dir = self._cgroups.paths(sid)[0]
        with contextlib.suppress(OSError):
            for leaf in [p.name for p in sandbox_dir.iterdir() if p.is_dir() and p.name.startswith(("x-", "w-"))]:
                await self._cgroups.kill(sid, leaf)
                self._cgroups.remove(sid, leaf)

    async def close(self) -> None:
        self._closed = True
        await self._allow.close()
        if self._guard is not None:
            self._guard.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._guard
        # Not cancelled: a fill in progress finishes in its thread, sees _closed and
        # destroys what it made; a destroy in progress completes.
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        for sandboxes in self._pool.values():
            while sandboxes:
                with contextlib.suppress(Exception):
                    await self._teardown(sandboxes.pop().id)
        if self._cgroups is not None:
            self._cgroups.remove_instance()  # only when no sandbox is left in it

    async def build_runtime(self, name: str, progress: Callable[[str], None]) -> None:
        recipe = rootfs.lookup(name)
        if self.rootless:
            raise NotSupported(f"runtime: {recipe.name} is not built, and a server without root cannot build "
                               f"runtimes (mmdebstrap needs root); build it as root: sudo "
                               f"{rootfs.build_hint(recipe.name, self.runtime_cache)}", field="runtime")
        await self._builds.run(recipe.name, progress, lambda log: rootfs.build(recipe, self.runtime_cache, log=log))
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
        found = set()
        if not self.sandbox_root.is_dir():
            return found
        for path in self.sandbox_root.iterdir():
            if not _ID.match(path.name):  # pooled sandboxes, stray files
                continue
            sb = self._load(path.name)
            if sb is not None and _start_time(sb.init_pid) == sb.init_start:
                found.add(sb.id)
                if sb.allow:  # an earlier server's: its rules stand; keep its names current
                    self._allow.adopt(sb.id, sb.allow)
        return found

    def _lock(self, sid: str) -> asyncio.Lock:
        return self._locks.setdefault(sid, asyncio.Lock())

    # -- provision -------------------------------------------------------------

    async def provision(self, req: ProvisionRequest) -> None:
        if not _ID.match(req.sandbox_id):
            raise InvalidInput(f"invalid sandbox id {req.sandbox_id!r}", field="sandbox_id")
        recipe = runtimes.find(req.runtime)
        if recipe is None:
            raise RuntimeNotFound(f"unknown runtime {req.runtime!r}", field="runtime")
        if not rootfs.is_built(self.runtime_cache, recipe):
            raise RuntimeNotFound(
                f"runtime {recipe.name} is not built on this host; build it with: "
                f"{rootfs.build_hint(recipe.name, self.runtime_cache)}", field="runtime")
        if req.port is not None and not 1024 <= req.port <= 65535:
            raise InvalidInput(f"network.port: {req.port} is outside 1024-65535", field="network.port")
        check_env(req.env, "env")
        if self.rootless:
            self._check_rootless(req)
        async with self._lock(req.sandbox_id):
            old = self._load(req.sandbox_id)
            if old is not None and _start_time(old.init_pid) == old.init_start:
                raise IllegalTransition(f"sandbox {req.sandbox_id} already exists")
            leftover_cgroup = self._cgroups is not None and self._cgroups.paths(req.sandbox_id)[0].exists()
            if (self.sandbox_root / req.sandbox_id).exists() or leftover_cgroup:
                await self._teardown(req.sandbox_id)  # a dead one's remains
            layer = await self._layer(recipe, req)
            # A pooled sandbox has its layer on the host's disk and no allow-list (its network is
            # made after the claim): a disk limit or network.allow is made from scratch.
            poolable = layer is None and not req.resources.disk_bytes and not req.network_allow
            sb = await self._claim_pooled(req) if poolable else None
            if sb is None:
                try:
                    sb = await self._provision_new(req, layers.lowers(self.runtime_cache, recipe, layer), layer)
                except BaseException:
                    await self._teardown(req.sandbox_id)
                    raise
            if (req.network_enabled or req.port is not None) and not self.rootless:  # rootless: at launch
                sb.network, sb.port = req.network_enabled, req.port
                try:
                    await asyncio.to_thread(self._network_sync, sb)
                except BaseException:
                    await self._teardown(sb.id)
                    raise
            self._sandboxes[sb.id] = sb
        self._refill(recipe.name)

    @staticmethod
    def _check_rootless(req: ProvisionRequest) -> None:
        """What a server that is not root cannot give, refused by name rather than
        silently not given: network and ports without slirp4netns, and cpu limits (the
        engine refuses installs, from the capabilities)."""
        if req.network_enabled or req.port is not None:
            slirp.check_available("network.enabled" if req.network_enabled else "network.port")
        if req.resources.cpu_millis:
            raise NotSupported("resources.cpu: a cpu limit needs cgroups; this server runs without root "
                               "(rootless mode), so it cannot limit cpu", field="resources.cpu")
        if req.resources.disk_bytes:
            raise NotSupported("resources.disk: a disk limit needs a loop-mounted file system; this server runs "
                               "without root (rootless mode), so it cannot limit disk (leave resources.disk and "
                               "HUTCH_DEFAULT_DISK unset)", field="resources.disk")

    async def prepare(self, req: ProvisionRequest) -> None:
        """Build (or find) the install layer the request needs; the slow and fallible part."""
        if req.dependencies or req.packages:
            recipe = runtimes.find(req.runtime)
            if recipe is None:
                raise RuntimeNotFound(f"unknown runtime {req.runtime!r}", field="runtime")
            await self._layer(recipe, req)

    async def _layer(self, recipe: runtimes.RuntimeRecipe, req: ProvisionRequest) -> str | None:
        if not (req.dependencies or req.packages):
            return None
        if not rootfs.is_built(self.runtime_cache, recipe):
            raise RuntimeNotFound(
                f"runtime {recipe.name} is not built on this host; build it with: "
                f"{rootfs.build_hint(recipe.name, self.runtime_cache)}", field="runtime")
        return await asyncio.to_thread(layers.build, recipe, self.runtime_cache, req.dependencies, req.packages,
                                       log=log.info)

    def _network_sync(self, sb: _Sandbox) -> None:
        """The sandbox's veth (network or a port) and its allow-list, before the veth: see network.py."""
        if sb.allow:
            network.set_allowed(sb.uid - UID_BASE, flatten(sb.allow))
        network.setup(sb.init_pid, sb.uid - UID_BASE, outbound=sb.network)
        self._write_meta(self.sandbox_root / sb.id, sb)

    async def usage(self, sandbox_id: str) -> Usage:
        if self._cgroups is None or not _ID.match(sandbox_id):
            return Usage()
        cpu, memory = self._cgroups.usage(sandbox_id)  # a few small cgroup files
        return Usage(cpu_seconds=cpu, memory_peak_bytes=memory)

    async def port_target(self, sandbox_id: str) -> tuple[str, int]:
        sb = self._running(sandbox_id)
        if sb.port is None:
            raise NotSupported(f"sandbox {sandbox_id} exposes no port", field="network.port")
        if sb.host_port is not None:  # rootless: slirp4netns's forward
            return "127.0.0.1", sb.host_port
        return str(network.address(sb.uid - UID_BASE)), sb.port

    # -- warm pool -------------------------------------------------------------

    async def _claim_pooled(self, req: ProvisionRequest) -> _Sandbox | None:
        """Turn an idle pooled sandbox into ``req``'s; None when none is left."""
        pool = self._pool.get(req.runtime)
        while pool:
            pooled = pool.pop()
            try:
                return self._adopt(pooled, req)
            except Exception as err:  # e.g. reaped by another server on this data dir
                log.warning("pooled sandbox %s unusable (%s); destroying it", pooled.id, err)
                await self._teardown(pooled.id)
                await self._teardown(req.sandbox_id)  # if the rename went through
        return None

    def _adopt(self, pooled: _Sandbox, req: ProvisionRequest) -> _Sandbox:
        """Renames and a few small writes, done on the event loop (see _provision_new)."""
        assert self._cgroups is not None
        if _start_time(pooled.init_pid) != pooled.init_start:
            raise DriverFailure("its init is gone")
        sid = req.sandbox_id
        old_dir, new_dir = self.sandbox_root / pooled.id, self.sandbox_root / sid
        self._cgroups.rename(pooled.id, sid)
        try:
            os.rename(old_dir, new_dir)
        except BaseException:
            with contextlib.suppress(OSError):
                self._cgroups.rename(sid, pooled.id)
            raise
        # From here on the sandbox is ``sid``'s: on failure the caller tears ``sid`` down.
        uids.move_claim(pooled.uid, old_dir, new_dir)
        res = req.resources
        self._cgroups.set_limits(sid, memory=res.memory_bytes, cpu_millis=res.cpu_millis, pids=res.pids or DEFAULT_PIDS)
        sb = _Sandbox(id=sid, uid=pooled.uid, runtime=req.runtime, env=dict(req.env),
                      init_pid=pooled.init_pid, init_start=pooled.init_start)
        self._write_meta(new_dir, sb)
        return sb

    def _refill(self, runtime: str) -> None:
        if self._pool_size <= 0 or self._closed or runtime in self._pool_filling:
            return
        if len(self._pool.get(runtime, ())) >= self._pool_size:
            return
        self._pool_filling.add(runtime)
        self._spawn(self._fill(runtime))

    def _spawn(self, coro) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _fill(self, runtime: str) -> None:
        recipe = runtimes.find(runtime)
        assert recipe is not None
        lower = rootfs.rootfs_path(self.runtime_cache, recipe)
        pool = self._pool.setdefault(runtime, [])
        try:
            while not self._closed and len(pool) < self._pool_size:
                async with self._pool_fill_slots:  # one sandbox started at a time, across runtimes
                    name = f"{self._pool_tag}-{next(self._pool_seq)}"
                    try:
                        sb = await self._provision_new(ProvisionRequest(sandbox_id=name, runtime=runtime), [lower], None)
                    except Exception as err:
                        log.warning("warm pool: starting a %s sandbox failed: %s", runtime, err)
                        await self._teardown(name)
                        return
                    if self._closed:
                        await self._teardown(name)
                        return
                    pool.append(sb)
        finally:
            self._pool_filling.discard(runtime)

    async def _provision_new(self, req: ProvisionRequest, lower: list[Path], layer: str | None) -> _Sandbox:
        """Start a sandbox from scratch.

        On the event loop, not in worker threads: the file and cgroup work is ~1 ms of
        small syscalls, and a worker thread doing it fights the loop for the GIL at every
        one of them (measured: ~130 context switches per handed-off job, most of the
        server's system time under load). The launcher's wait is awaited, not blocked on.
        """
        sid = req.sandbox_id
        d = self.sandbox_root / sid
        disk = req.resources.disk_bytes
        # A skeleton of an earlier sandbox (spares.py); never for a disk limit (disks.py).
        spare = not disk and self._spares.take(_layers_key(lower), d)
        if not spare:
            d.mkdir(mode=0o700)
            if disk:
                disks.attach(d, disk)  # upper and work: symlinks into the limited file system
            for p in ((d / "merged",) if disk else (d / "upper", d / "work", d / "merged")):
                p.mkdir()
        uid = ROOTLESS_UID if self.rootless else uids.claim(d)
        _put(d / "uid", str(uid).encode())
        upper = d / "upper"
        slirp_net = self.rootless and (req.network_enabled or req.port is not None)
        self._populate_upper(lower, upper, uid, self.rootless,
                             slirp.resolv_conf() if slirp_net and req.network_enabled else None)
        res = req.resources
        sb = _Sandbox(id=sid, uid=uid, runtime=req.runtime, env=dict(req.env), init_pid=0, init_start=0, layer=layer)
        if self._cgroups is not None:
            self._cgroups.create_sandbox(sid, memory=res.memory_bytes, cpu_millis=res.cpu_millis, pids=res.pids or DEFAULT_PIDS)
        else:
            sb.rlimit_data, sb.rlimit_nproc = res.memory_bytes, res.pids or DEFAULT_PIDS
        if req.network_allow:  # resolved first: a name that does not resolve makes nothing
            sb.allow = await self._allow.first(sid, req.network_allow)
        rules = slirp.egress_rules(outbound=req.network_enabled, allow=flatten(sb.allow) if sb.allow else None) \
            if slirp_net else None
        sb.init_pid, sb.init_start = await self._launch(d, sb, lower, rules)
        if slirp_net:
            api = self._slirp_socket(sid) if req.port is not None else None
            proc = await asyncio.to_thread(slirp.start, sb.init_pid, api)
            self._slirps[sid] = proc
            sb.network, sb.slirp_pid, sb.slirp_start = req.network_enabled, proc.pid, _start_time(proc.pid)
            if api is not None and req.port is not None:
                sb.port, sb.host_port = req.port, await asyncio.to_thread(slirp.forward, api, req.port)
        self._write_meta(d, sb)
        return sb

    async def _apply_allow(self, sid: str, resolved: dict[str, list[str]]) -> None:
        """A refreshed allow-list (AllowLists): the sandbox's rules replaced whole."""
        cidrs = flatten(resolved)
        async with self._lock(sid):
            sb = self._running(sid)
            if self.rootless:
                assert self._helper is not None
                await asyncio.to_thread(slirp.set_allowed, self._helper, sb.init_pid, cidrs)
            else:
                await asyncio.to_thread(network.set_allowed, sb.uid - UID_BASE, cidrs)
            sb.allow = resolved
            self._write_meta(self.sandbox_root / sid, sb)

    def _slirp_socket(self, sid: str) -> Path:
        """Where a rootless sandbox's slirp4netns takes port forwards: a directory only we
        can enter (whoever reaches the socket could expose the sandbox's ports), with a
        short path (unix sockets allow 107 bytes)."""
        if self._slirp_dir is None:
            runtime = os.environ.get("XDG_RUNTIME_DIR")
            if runtime and os.path.isdir(runtime) and os.stat(runtime).st_uid == os.geteuid():
                self._slirp_dir = Path(runtime) / f"hutch-{os.getpid()}"
                self._slirp_dir.mkdir(mode=0o700, exist_ok=True)
            else:
                self._slirp_dir = Path(tempfile.mkdtemp(prefix="hutch-slirp-"))  # 0700, ours
        path = self._slirp_socket_path(sid)
        assert path is not None
        path.unlink(missing_ok=True)
        return path

    def _slirp_socket_path(self, sid: str) -> Path | None:
        if self._slirp_dir is None:
            return None
        return self._slirp_dir / f"{hashlib.sha256(sid.encode()).hexdigest()[:16]}.sock"

    async def _launch(self, d: Path, sb: _Sandbox, lower: list[Path], netfilter: bytes | None = None) -> tuple[int, int]:
        """Start the sandbox's pid 1 over ``d``'s upper layer; returns its (pid, start time).

        The launcher forks pid 1, prints its host pid and exits; pid 1 says "ready" on
        another pipe once it is the sandbox user. Both are awaited on the loop.
        """
        assert self._helper is not None
        sid, uid = sb.id, sb.uid
        upper, work, merged = d / "upper", d / "work", d / "merged"
        procs = self._cgroups.create_leaf(sid, "init") if self._cgroups is not None else []
        loop = asyncio.get_running_loop()
        ready_r, ready_w = os.pipe()
        info_r, info_w = os.pipe()
        err_r, err_w = os.pipe()
        cmd = [str(self._helper), "launch", "--uid", str(uid), "--gid", str(uid),
               "--ready-fd", str(ready_w), "--info-fd", str(info_w), *self._rootless_args(sb)]
        pass_fds = [ready_w, info_w]
        if netfilter is not None:  # rootless network: rules for its own namespace (slirp.py)
            rules_r, rules_w = os.pipe()
            os.write(rules_w, netfilter)  # a few hundred bytes: well within a pipe's buffer
            os.close(rules_w)
            cmd += ["--netfilter-fd", str(rules_r)]
            pass_fds.append(rules_r)
        for p in procs:
            cmd += ["--cgroup-procs", str(p)]
        cmd += ["--ov-lower", ":".join(str(p) for p in lower), "--ov-upper", str(upper), "--ov-work", str(work),
                "--ov-target", str(merged)]
        try:
            try:
                # A vfork+exec of a static binary: well under a millisecond.
                launcher = subprocess.Popen(  # noqa: ASYNC220
                    cmd, env={}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err_w,
                    pass_fds=pass_fds)
            finally:
                for fd in (*pass_fds, err_w):
                    os.close(fd)
            # pid 1 closes its inherited stderr once set up, so EOF on it means "set up or
            # failed"; the ready line then tells which.
            async with asyncio.timeout(READY_TIMEOUT):
                stderr, info, ready = await helper.read_to_eof(loop, (err_r, 8192), (info_r, 64), (ready_r, 64))
        except TimeoutError:
            raise DriverFailure(f"sandbox {sid} did not come up within {READY_TIMEOUT:g}s") from None
        finally:
            for fd in (err_r, info_r, ready_r):
                os.close(fd)
        code = launcher.wait()  # it exited before closing its pipes: no real wait
        if code != 0 or ready != b"ready\n":
            raise DriverFailure(f"starting sandbox {sid} failed: {_text(stderr)}")
        try:
            pid = int(info)
        except ValueError as err:
            raise DriverFailure(f"the launcher gave no pid for sandbox {sid}: {info!r}") from err
        start = _start_time(pid)
        if start is None:
            raise DriverFailure(f"sandbox {sid} died at start: {_text(stderr)}")
        return pid, start

    def _rootless_args(self, sb: _Sandbox) -> list[str]:
        """The launcher's flags for rootless mode: the user namespace and the rlimits that
        stand in for cgroups."""
        return ["--userns", *self._rlimit_args(sb)] if self.rootless else []

    @staticmethod
    def _rlimit_args(sb: _Sandbox) -> list[str]:
        """Rlimits every process of a rootless sandbox gets (none when cgroups limit it)."""
        args = []
        if sb.rlimit_data:
            args += ["--rlimit-data", str(sb.rlimit_data)]
        if sb.rlimit_nproc:
            args += ["--rlimit-nproc", str(sb.rlimit_nproc)]
        return args

    @staticmethod
    def _write_meta(d: Path, sb: _Sandbox) -> None:
        # In place (see _put). A server killed in the middle of this write leaves a torn
        # meta.json: the next start then treats the sandbox as dead and ends it (with a
        # lifecycle event), as it does any sandbox it cannot account for.
        _put(d / "meta.json", json.dumps(attrs.asdict(sb)).encode())

    @staticmethod
    def _populate_upper(lower: list[Path], upper: Path, uid: int, rootless: bool = False,
                        resolv: str | None = None) -> None:
        """The sandbox user's passwd entry, home and workspace, in this sandbox's layer only.
        ``lower``: the read-only layers, top first (an install layer may have added users).
        Over a spare skeleton (spares.py) the same calls rewrite what is there.

        Rootless, what we make here is ours, i.e. the sandbox user's inside (no chown
        needed or possible), and the world-writable directories of the runtime are made
        here too: overlayfs in a user namespace cannot copy up a directory whose owner
        (host root) has no uid inside, so /tmp would not be writable otherwise."""
        etc = upper / "etc"
        etc.mkdir(exist_ok=True)
        st = os.stat(layers.find_in_lowers(lower, "etc"))
        os.chmod(etc, st.st_mode & 0o7777)
        passwd = _lower_text(lower, "etc/passwd")
        _put(etc / "passwd", (passwd + f"{USER}:x:{uid}:{uid}:{USER}:{HOME}:/bin/bash\n").encode(), 0o644)
        group = _lower_text(lower, "etc/group")
        _put(etc / "group", (group + f"{USER}:x:{uid}:\n").encode(), 0o644)
        # Used only when the sandbox has network; harmless (unreachable) otherwise.
        _put(etc / "resolv.conf", (resolv or network.resolv_conf()).encode(), 0o644)
        for name in ("passwd", "group", "resolv.conf"):
            os.chmod(etc / name, 0o644)
        for rel, mode in [(HOME, 0o755), (rootfs.WORKSPACE, 0o755)] + [(t, 0o1777) for t in ROOTLESS_TMP if rootless]:
            path = upper / rel.lstrip("/")
            parent = path.parent
            if parent != upper and not parent.exists():
                parent.mkdir(parents=True)
                os.chmod(parent, os.stat(layers.find_in_lowers(lower, str(parent.relative_to(upper)))).st_mode & 0o7777)
            path.mkdir(exist_ok=True)
            if not rootless:
                os.chown(path, uid, uid)
            os.chmod(path, mode)

    # -- destroy ---------------------------------------------------------------

    async def destroy(self, sandbox_id: str) -> None:
        if not _ID.match(sandbox_id):
            return
        # Shielded and tracked: a caller cancelled half way (a server shutting down)
        # must not leave a killed sandbox's cgroups and files behind; close() waits.
        task = asyncio.ensure_future(self._destroy(sandbox_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        await asyncio.shield(task)

    async def _destroy(self, sandbox_id: str) -> None:
        async with self._lock(sandbox_id):
            await self._teardown(sandbox_id)
        self._locks.pop(sandbox_id, None)

    async def _teardown(self, sid: str) -> None:
        self._sandboxes.pop(sid, None)
        self._allow.forget(sid)
        self._lingering.pop(sid, None)
        for ex in self._executions.values():
            if ex.sandbox_id == sid:
                ex.cancelled = True
        sb = self._load(sid)
        if sb is not None:
            await self._kill_init(sb)
            if sb.slirp_pid:
                self._stop_slirp(sb)
            elif sb.network or sb.port is not None:
                await asyncio.to_thread(network.teardown, sb.uid - UID_BASE)
        # On the loop (see _provision_new): rmdirs of cgroups and of a dozen entries.
        start = time.monotonic()
        pause = 0.0002
        while self._cgroups is not None and not self._cgroups.remove(sid):
            if time.monotonic() - start > 5:
                raise DriverFailure(f"could not remove the cgroups of sandbox {sid}")
            if sb is not None and time.monotonic() - start < 0.2:
                # With init gone no process of the sandbox's pid namespace is left; what
                # the cgroup may still hold is a helper on its way out (an exec helper's
                # host-side parent, exiting now that its child died): a plain SIGKILL.
                for pid in self._cgroups.pids(sid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            else:  # remains of a dead sandbox: the freezer kill loop
                await self._cgroups.kill(sid)
            await asyncio.sleep(pause)  # killed processes still have to exit
            pause = min(pause * 2, 0.01)
        self._retire_dir(sid, sb)

    def _stop_slirp(self, sb: _Sandbox) -> None:
        sock = self._slirp_socket_path(sb.id)
        if sock is not None:
            sock.unlink(missing_ok=True)
        proc = self._slirps.pop(sb.id, None)
        if proc is not None:  # ours: kill and reap
            proc.kill()
            proc.wait()
        elif sb.slirp_pid and _start_time(sb.slirp_pid) == sb.slirp_start:  # an earlier server's
            with contextlib.suppress(ProcessLookupError):
                os.kill(sb.slirp_pid, signal.SIGKILL)

    def _retire_dir(self, sid: str, sb: _Sandbox | None) -> None:
        """Keep the dead sandbox's directory as a spare skeleton if it is exactly one
        (spares.py), else delete it."""
        d = self.sandbox_root / sid
        if not d.exists():
            return
        uids.release(d)
        if disks.attached(d):
            disks.detach(d)  # before rmtree, which would otherwise empty the mounted disk
        recipe = runtimes.find(sb.runtime) if sb is not None else None
        if recipe is not None:
            key = _layers_key(layers.lowers(self.runtime_cache, recipe, sb.layer))  # type: ignore[union-attr]
            if self._spares.give(d, key):
                return
        shutil.rmtree(d, onerror=_rm_unreadable)

    async def _kill_init(self, sb: _Sandbox) -> None:
        """SIGKILL the sandbox's pid 1 and wait until it is gone.

        The kernel then kills every process of the sandbox's pid namespace and lets no
        new one start in it (a fork bomb cannot outrun it), and init only exits once
        they are all reaped: one signal instead of freezing the cgroup. A frozen
        (paused) sandbox is thawed so the killed processes can die.
        """
        try:
            pidfd = os.pidfd_open(sb.init_pid)
        except (ProcessLookupError, OSError):
            return
        try:
            if _start_time(sb.init_pid) != sb.init_start:  # checked after the open: no reuse race
                return
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            if self._cgroups is not None and self._cgroups.is_frozen(sb.id):
                self._cgroups.freeze(sb.id, False)
            loop = asyncio.get_running_loop()
            gone = loop.create_future()
            loop.add_reader(pidfd, lambda: gone.done() or gone.set_result(None))
            try:
                await asyncio.wait_for(gone, 5)
            except TimeoutError:
                pass  # the cgroup kill below still applies
            finally:
                loop.remove_reader(pidfd)
        except ProcessLookupError:
            pass
        finally:
            os.close(pidfd)

    def _load(self, sid: str) -> _Sandbox | None:
        sb = self._sandboxes.get(sid)
        if sb is not None:
            return sb
        try:
            data = json.loads(_get(self.sandbox_root / sid / "meta.json"))
            data["id"] = sid  # a claimed pooled sandbox renamed before its meta was rewritten
            return _Sandbox(**data)
        except (OSError, ValueError, TypeError):
            return None

    def _running(self, sid: str) -> _Sandbox:
        sb = self._load(sid) if _ID.match(sid) else None
        if sb is None:
            raise SandboxNotFound(f"sandbox {sid} not found")
        if _start_time(sb.init_pid) != sb.init_start:
            raise DriverFailure(f"sandbox {sid} is no longer running")
        self._sandboxes[sid] = sb
        return sb

    # -- pause -----------------------------------------------------------------

    async def pause(self, sandbox_id: str) -> None:
        """Freeze every process of the sandbox (the cgroup freezer). Idempotent.

        Refused while an execution runs: its timeout could not be enforced on frozen
        processes. Background processes are frozen with the rest.
        """
        sb = self._running(sandbox_id)
        if self._cgroups is None:
            raise NotSupported("pause needs the cgroup freezer; this server runs without root (rootless mode)")
        async with self._lock(sb.id):
            if any(ex.sandbox_id == sb.id for ex in self._executions.values()):
                raise IllegalTransition(f"sandbox {sb.id} has running executions; wait for them or cancel them")
            await asyncio.to_thread(self._cgroups.freeze, sb.id, True)  # polls until frozen

    async def resume(self, sandbox_id: str) -> None:
        sb = self._running(sandbox_id)
        if self._cgroups is None:
            raise NotSupported("pause needs the cgroup freezer; this server runs without root (rootless mode)")
        async with self._lock(sb.id):
            self._cgroups.freeze(sb.id, False)

    def _check_not_paused(self, sb: _Sandbox) -> None:
        if self._cgroups is not None and self._cgroups.is_frozen(sb.id):
            raise IllegalTransition(f"sandbox {sb.id} is paused; resume it first")

    # -- exec ------------------------------------------------------------------

    def _env(self, sb: _Sandbox, extra: Mapping[str, str]) -> dict[str, str]:
        check_env(extra, "env")
        env = {"PATH": DEFAULT_PATH, "HOME": HOME, "USER": USER, "LOGNAME": USER,
               "SHELL": "/bin/bash", "LANG": "C.UTF-8", "HOSTNAME": "sandbox"}
        env.update(sb.env)
        env.update(extra)
        return env

    def _gc_leaves(self, sid: str) -> None:
        if self._cgroups is None:
            return
        leaves = self._lingering.get(sid)
        if leaves:
            for leaf in list(leaves):
                if self._cgroups.remove(sid, leaf):
                    leaves.discard(leaf)

    def _helper_cmd(self, mode: str, sb: _Sandbox, leaf: str, *, cwd: str, env: Mapping[str, str] | None,
                    status_w: int) -> list[str]:
        """hutch-nsexec's command line up to the ``--`` before the argv; makes the leaf cgroup."""
        assert self._helper is not None
        procs = self._cgroups.create_leaf(sb.id, leaf) if self._cgroups is not None else []
        cmd = [str(self._helper), mode, "--pid", str(sb.init_pid), "--uid", str(sb.uid), "--gid", str(sb.uid),
               "--cwd", cwd, "--status-fd", str(status_w), *self._rlimit_args(sb)]
        for p in procs:
            cmd += ["--cgroup-procs", str(p)]
        for key, value in (env or {}).items():
            cmd += ["-e", f"{key}={value}"]
        return cmd

    async def _run_helper(
        self,
        mode: str,
        sb: _Sandbox,
        leaf: str,
        *,
        cwd: str,
        argv: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        stdin: bytes | AsyncIterable[bytes] | None,
        sink: OutputSink | None,
        limit: float | None,
    ) -> tuple[int, bool, str]:
        """Run hutch-nsexec in the sandbox (helper.py); (exit code, timed out, status message)."""
        status_r, status_w = os.pipe()
        cmd = self._helper_cmd(mode, sb, leaf, cwd=cwd, env=env, status_w=status_w)
        try:
            return await helper.run(cmd, argv, status_r=status_r, status_w=status_w, stdin=stdin, sink=sink,
                                    limit=limit, kill=lambda: self._kill_leaf(sb.id, leaf),
                                    started=lambda pid: self._helpers.__setitem__(leaf, pid))
        finally:
            self._helpers.pop(leaf, None)

    async def exec(self, req: ExecRequest, sink: OutputSink) -> ExecResult:
        sb = self._running(req.sandbox_id)
        if not req.argv:
            raise InvalidInput("command must not be empty", field="command")
        if req.execution_id in self._executions:
            raise IllegalTransition(f"execution {req.execution_id} is already running")
        env = self._env(sb, req.env)
        cwd = posixpath.normpath(posixpath.join(HOME, req.cwd)) if req.cwd else HOME
        leaf = "x-" + re.sub(r"[^A-Za-z0-9_.-]", "_", req.execution_id)[:100]
        self._check_not_paused(sb)
        execution = _Execution(sandbox_id=sb.id, leaf=leaf)
        self._executions[req.execution_id] = execution
        self._gc_leaves(sb.id)
        try:
            code, timed_out, status = await self._run_helper(
                "exec", sb, leaf, cwd=cwd, argv=req.argv, env=env, stdin=req.stdin,
                sink=sink, limit=req.timeout)
        finally:
            self._executions.pop(req.execution_id, None)
        # Rootless: no memory cgroup, so no OOM kill either (allocations past the rlimit fail).
        oom = self._cgroups is not None and self._cgroups.oom_kills(sb.id, leaf) > 0
        self._drop_leaf(sb.id, leaf)
        self._raise_status(status, sb.id)
        if execution.cancelled:
            return ExecResult(exit_code=EXIT_CANCELLED, cancelled=True, oom_killed=oom)
        if timed_out:
            return ExecResult(exit_code=EXIT_TIMEOUT, timed_out=True, oom_killed=oom)
        return ExecResult(exit_code=code, oom_killed=oom)

    async def open_terminal(self, req: TerminalRequest) -> Terminal:
        sb = self._running(req.sandbox_id)
        if not req.argv:
            raise InvalidInput("command must not be empty", field="command")
        env = self._env(sb, req.env)
        cwd = posixpath.normpath(posixpath.join(HOME, req.cwd)) if req.cwd else HOME
        self._check_not_paused(sb)
        leaf = "t-" + secrets.token_hex(8)
        self._gc_leaves(sb.id)
        status_r, status_w = os.pipe()
        cmd = self._helper_cmd("exec", sb, leaf, cwd=cwd, env=env, status_w=status_w)

        def release() -> None:
            self._helpers.pop(leaf, None)
            self._drop_leaf(sb.id, leaf)

        try:
            term = await terminal.spawn(cmd, req.argv, rows=req.rows, cols=req.cols, status_r=status_r,
                                        status_w=status_w, kill=lambda: self._kill_leaf(sb.id, leaf), release=release)
        except terminal.StartFailed as failed:
            self._raise_status(str(failed), sb.id)
            raise DriverFailure(f"sandbox {sb.id}: the terminal did not start") from None
        self._helpers[leaf] = term.pid
        return term

    def _raise_status(self, status: str, sid: str) -> None:
        if not status:
            return
        kind, _, message = status.strip().partition("\t")
        if kind == "cwd":
            raise InvalidInput(f"working directory {message}", field="cwd")
        if kind == "file":
            raise InvalidInput(f"cannot write {message}", field="path")
        if self._load(sid) is None:
            raise SandboxNotFound(f"sandbox {sid} was destroyed")
        raise DriverFailure(f"sandbox {sid}: {message or status}")

    async def cancel(self, execution_id: str) -> None:
        """Kill the execution's tree. Unknown or already finished executions are a no-op."""
        execution = self._executions.get(execution_id)
        if execution is None:
            return
        execution.cancelled = True
        await self._kill_leaf(execution.sandbox_id, execution.leaf)

    async def _guard_pids(self) -> None:
        """Every second: the leaves of sandboxes held at their pids limit (pidsguard.py)."""
        assert self._cgroups is not None
        guard = PidsGuard(self._cgroups)

        def running(sid: str) -> set[str]:
            return {ex.leaf for ex in self._executions.values() if ex.sandbox_id == sid}

        while not self._closed:
            await asyncio.sleep(pidsguard.PERIOD)
            for sid, leaf in guard.check(list(self._sandboxes), running):
                with contextlib.suppress(Exception):  # gone meanwhile
                    await self._kill_leaf(sid, leaf)

    async def _kill_leaf(self, sid: str, leaf: str) -> None:
        """Kill the process tree of one execution (or file operation): its cgroup leaf,
        or rootless, its session (see _kill_session)."""
        if self._cgroups is not None:
            await self._cgroups.kill(sid, leaf)
        elif leaf in self._helpers:
            await asyncio.to_thread(helper.kill_session, self._helpers[leaf], signal.SIGKILL)

    async def signal(self, execution_id: str, signum: int) -> None:
        """Send ``signum`` to every process of the execution's tree (its cgroup leaf,
        background children included), frozen meanwhile so none escapes by forking.
        Unknown or finished executions are a no-op."""
        execution = self._executions.get(execution_id)
        if execution is None:
            return
        if not 0 < signum < signal.NSIG:
            raise InvalidInput(f"signal: {signum} is not a signal", field="signal")
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.signal, execution.sandbox_id, execution.leaf, signum)
        elif execution.leaf in self._helpers:
            await asyncio.to_thread(helper.kill_session, self._helpers[execution.leaf], signum, once=True)

    # -- files -----------------------------------------------------------------

    async def write_files(self, sandbox_id: str, files: Sequence[FileToWrite]) -> None:
        sb = self._running(sandbox_id)
        if not files:
            return
        self._check_not_paused(sb)
        payload = bytearray()
        for f in files:
            path = f.path.encode()
            if not path or b"\0" in path or len(path) > 4096:
                raise InvalidInput(f"invalid path {f.path!r}", field="path")
            payload += b"%o %d %d\n" % (f.mode & 0o777, len(path), len(f.content))
            payload += path + f.content
        leaf = f"w-{os.getpid()}-{time.monotonic_ns()}"
        code, timed_out, status = await self._run_helper(
            "write", sb, leaf, cwd=HOME, stdin=bytes(payload), sink=None, limit=120)
        self._drop_leaf(sb.id, leaf)
        self._raise_status(status, sb.id)
        if timed_out or code != 0:
            raise DriverFailure(f"writing files into sandbox {sandbox_id} failed (exit {code})")


def _rm_unreadable(func, path: str, exc_info) -> None:  # type: ignore[no-untyped-def]
    """rmtree's error handler: overlayfs leaves its ``work/work`` at mode 000, which only
    root can enter; rootless, we own it and may open it up first."""
    err = exc_info[1]
    if isinstance(err, FileNotFoundError):
        return
    if not isinstance(err, PermissionError):
        raise err
    os.chmod(os.path.dirname(path), 0o700)
    with contextlib.suppress(FileNotFoundError):
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
            shutil.rmtree(path, onerror=_rm_unreadable)
        else:
            os.unlink(path)


def _layers_key(lower: list[Path]) -> str:
    return ":".join(map(str, lower))


_LOWER_TEXT: dict[str, tuple[float, str]] = {}


def _lower_text(lower: list[Path], rel: str) -> str:
    """A file of the read-only layers, read once per change (layers never change in
    place, but a rebuilt runtime may replace one)."""
    path = layers.find_in_lowers(lower, rel)
    mtime = os.stat(path).st_mtime
    key = str(path)
    hit = _LOWER_TEXT.get(key)
    if hit is None or hit[0] != mtime:
        hit = (mtime, path.read_text())
        _LOWER_TEXT[key] = hit
    return hit[1]


def _text(raw: bytes) -> str:
    return raw.decode(errors="replace").strip()[-2000:] or "(no output)"
