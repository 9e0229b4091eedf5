"""Ending a local sandbox, and what dead sandboxes left behind: its processes (one
SIGKILL to pid 1 ends its pid namespace), its network, its cgroups and its directory
(kept as a spare skeleton when it is exactly one, spares.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

from hutch.core import runtimes
from hutch.core.errors import DriverFailure
from hutch.drivers.local import disks, layercache, layers, uids, zygote
from hutch.drivers.local.cgroups import Cgroups
from hutch.drivers.local.helper import set_done, start_time
from hutch.drivers.local.launch import layers_key
from hutch.drivers.local.nsexec import Nsexec
from hutch.drivers.local.sandboxnet import SandboxNetwork
from hutch.drivers.local.spares import SpareDirs
from hutch.drivers.local.state import POOL_NAME, SAFE_ID, LocalSandbox, Registry, is_live
from hutch.drivers.local.trash import Trash


class Teardown:
    """Ends the sandboxes of one driver."""

    def __init__(self, registry: Registry, nsexec: Nsexec, cgroups: Cgroups | None, net: SandboxNetwork,
                 spares: SpareDirs, runtime_cache: Path, trash: Trash) -> None:
        self._registry = registry
        self._nsexec = nsexec
        self._cgroups = cgroups
        self._net = net
        self._spares = spares
        self._runtime_cache = runtime_cache
        self._trash = trash

    async def teardown(self, sid: str) -> None:
        self._registry.sandboxes.pop(sid, None)
        self._net.allow.forget(sid)
        self._nsexec.forget(sid)
        self._registry.mark_cancelled(sid)
        sb = self._registry.load(sid)
        if sb is not None:
            await self.kill_init(sb)
            await self._net.teardown(sb)
            if sb.asleep:  # paused filesystem-only: its hold on its install layer goes with it
                layercache.asleep(self._runtime_cache / "layers", sb.layer, sid, holding=False)
        elif (d := self._registry.sandbox_root / sid).is_dir():  # a torn meta.json: no record of its network
            await self._net.teardown_unaccounted(d)
        await self._remove_cgroups(sid, sb)
        self._retire_dir(sid, sb)

    async def _remove_cgroups(self, sid: str, sb: LocalSandbox | None) -> None:
        # On the loop (see Launcher.create): rmdirs of cgroups and of a dozen entries. The
        # reclaim first (cgroups.py) only where page cache is charged (an idle sandbox has
        # none), in a thread: it takes milliseconds.
        if self._cgroups is not None and self._cgroups.clean_cache(sid):
            await asyncio.to_thread(self._cgroups.release_memory, sid)
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

    def _retire_dir(self, sid: str, sb: LocalSandbox | None) -> None:
        """Keep the dead sandbox's directory as a spare skeleton if it is exactly one
        (spares.py), else delete it."""
        d = self._registry.sandbox_root / sid
        if not d.exists():
            return
        uids.release(d)
        zygote.forget(d)
        if disks.attached(d):
            disks.detach(d)  # before rmtree, which would otherwise empty the mounted disk
        recipe = runtimes.find(sb.runtime) if sb is not None else None
        if sb is not None and recipe is not None:
            key = layers_key(layers.lowers(self._runtime_cache, recipe, sb.layer))
            if self._spares.give(d, key):
                return
        self._trash.put(d)  # deleted by the trash's worker, off the loop (trash.py)

    async def kill_init(self, sb: LocalSandbox) -> None:
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
            if start_time(sb.init_pid) != sb.init_start:  # checked after the open: no reuse race
                return
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            if self._cgroups is not None and self._cgroups.is_frozen(sb.id):
                self._cgroups.freeze(sb.id, False)
            loop = asyncio.get_running_loop()
            gone: asyncio.Future[None] = loop.create_future()
            loop.add_reader(pidfd, set_done, gone)
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

    async def reap_leftovers(self) -> None:
        """Remove what sandboxes that died while we were away left behind; adopt the live ones."""
        on_disk = {p.name for p in self._registry.sandbox_root.iterdir() if p.is_dir()}
        for sid in on_disk | (self._cgroups.sandboxes() if self._cgroups else set()):
            pooled = POOL_NAME.match(sid)
            if pooled:  # a pool of a server that is gone (its own pid and start time)
                if start_time(int(pooled[1])) != int(pooled[2]):
                    await self.teardown(sid)
                continue
            if not SAFE_ID.match(sid):
                continue
            sb = self._registry.load(sid)
            if sb is not None and is_live(sb):
                self._registry.sandboxes[sid] = sb
                await self._kill_orphaned_executions(sid)
            else:
                await self.teardown(sid)

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
        # What is left (a terminal's, a file operation's) lingers: the pids guard watches it.
        self._nsexec.adopt_leaves(sid, [leaf for leaf in self._cgroups.leaves(sid) if leaf != "init"])  # v2: pid 1's

