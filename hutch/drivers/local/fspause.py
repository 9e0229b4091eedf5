"""A filesystem-only pause of a local sandbox (E2B's ``keep_memory=False``) and its resume.

The pause ends every process of the sandbox (its pid 1 killed: the kernel ends the rest of its
pid namespace) and releases its memory: nothing frozen holds pages, and its /dev/shm (a tmpfs of
its mount namespace) goes with the namespace. What is kept is what a restore keeps: the
directory with its upper layer (its disk image, where it has a disk limit), its cgroup with
its limits (empty), its uid. The record says ``asleep`` (state.py), so that a restarted server
adopts it rather than ending it, and every call that needs it running is refused until the
resume.

The resume is a new boot: a pid 1 started over the same upper layer, as a restore starts
one (checkpoints.py), with a fresh boot id (launch.new_boot_id), its network set up again.

Rootless the same, without a cgroup: its processes' memory goes with them (rlimits are per
process); its slirp4netns ends with the pause, and the resume starts its pid 1 with its egress
rules (as a create does) and a new slirp4netns, whose port forward is on a new host port.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import attrs

from hutch.core import runtimes
from hutch.core.errors import RuntimeNotFound, SandboxNotFound
from hutch.drivers.egress import flatten
from hutch.drivers.local import layercache, layers, slirp
from hutch.drivers.local.cgroups import Cgroups
from hutch.drivers.local.launch import Launcher
from hutch.drivers.local.sandboxnet import SandboxNetwork
from hutch.drivers.local.state import SAFE_ID, LocalSandbox, Registry
from hutch.drivers.local.teardown import Teardown


class FilesystemPause:
    """Filesystem-only pauses of the sandboxes of one driver."""

    def __init__(self, registry: Registry, cgroups: Cgroups | None, launcher: Launcher, net: SandboxNetwork,
                 teardown: Teardown, runtime_cache: Path, *, rootless: bool) -> None:
        self._registry = registry
        self._cgroups = cgroups
        self._launcher = launcher
        self._net = net
        self._teardown = teardown
        self._runtime_cache = runtime_cache
        self._layers = runtime_cache / "layers"
        self._rootless = rootless

    def is_asleep(self, sandbox_id: str) -> bool:
        sb = self._registry.load(sandbox_id) if SAFE_ID.match(sandbox_id) else None
        return sb is not None and sb.asleep

    async def pause(self, sandbox_id: str) -> None:
        """End every process, keep the files. Idempotent."""
        async with self._registry.lock(sandbox_id):
            if self.is_asleep(sandbox_id):
                return
            sb = self._registry.running(sandbox_id)
            self._registry.mark_cancelled(sb.id)  # its commands return cancelled
            # Recorded first: the end watch (endwatch.py) then takes pid 1's death for what it is.
            killed = attrs.evolve(sb, asleep=True, init_pid=0, init_start=0)
            # Its install layer is mounted nowhere while it sleeps: held, so no sweep drops it.
            layercache.asleep(self._layers, sb.layer, sb.id, holding=True)
            self._registry.write_meta(killed)
            self._registry.sandboxes[sb.id] = killed
            await self._teardown.kill_init(sb)  # thaws it first if it was frozen
            if sb.slirp_pid:  # rootless: its user-mode network served that namespace only
                self._net.stop_slirp(sb)
            # The page cache its files left charged to its cgroup: released now, not at its end.
            if self._cgroups is not None and self._cgroups.clean_cache(sb.id):
                await asyncio.to_thread(self._cgroups.release_memory, sb.id)

    async def resume(self, sandbox_id: str) -> LocalSandbox:
        """Boot it again over its files: a new pid 1, a new boot id, its network again."""
        async with self._registry.lock(sandbox_id):
            sb = self._registry.load(sandbox_id) if SAFE_ID.match(sandbox_id) else None
            if sb is None:
                raise SandboxNotFound(f"sandbox {sandbox_id} not found")
            if not sb.asleep:
                return self._registry.running(sandbox_id)
            recipe = runtimes.find(sb.runtime)
            if recipe is None:
                raise RuntimeNotFound(f"unknown runtime {sb.runtime!r}", field="runtime")
            d = self._registry.sandbox_root / sb.id
            networked = sb.network or sb.port is not None
            # Rootless: its egress rules are loaded into its new namespace by pid 1 (slirp.py).
            rules = slirp.egress_rules(outbound=sb.network, allow=flatten(sb.allow) if sb.allow else None) \
                if self._rootless and networked else None
            async with layercache.held(self._layers, sb.layer):  # not dropped until mounted
                pid, start = await self._launcher.launch(d, sb, layers.lowers(self._runtime_cache, recipe, sb.layer),
                                                         rules)
            sb.init_pid, sb.init_start, sb.asleep = pid, start, False
            if self._rootless and networked:
                await self._net.start_slirp(sb, outbound=sb.network, port=sb.port)
            self._registry.write_meta(sb)
            layercache.asleep(self._layers, sb.layer, sb.id, holding=False)  # mounted again
            self._registry.sandboxes[sb.id] = sb
            if networked and not self._rootless:
                await asyncio.to_thread(self._net.sync, sb)  # a new namespace: its veth and rules again
            return sb
