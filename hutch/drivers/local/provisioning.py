"""Provisioning a local sandbox: checking the request, building its install layer, then
claiming a pooled sandbox (pool.py) or starting a new one (launch.py), and its network.

On failure nothing is left behind: what was made is torn down (teardown.py).

At most ``STARTS_PER_CORE`` sandboxes per core are being started at once; more creates wait
their turn. Uncapped, 200 clients creating at once on a slow (shared, 2-core) machine slow
every start by all the others until the slowest run past their deadlines: a soak run
(bench/soak.py) had 45 creates fail with 502. With the cap, its runs have had none fail.

Install layers are built by threads of their own, at most ``BUILDS_AT_ONCE`` at a time, and one
build of a layer serves every create asking for it meanwhile. A build runs apt-get or npm for as
long as the mirror takes (up to 30 minutes): in the event loop's default executor (6 threads on
2 cores), 20 creates of one tenant whose install did not end (a registry that never answered)
took every thread the server's other work waits for, and another tenant's create with a
network (set up in a thread) hung until they ended.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hutch.core import phases, runtimes
from hutch.core.errors import IllegalTransition, InvalidInput, NotSupported, RuntimeNotFound
from hutch.drivers.base import ProvisionRequest, check_env
from hutch.drivers.local import layercache, layers, rootfs, slirp
from hutch.drivers.local.cgroups import Cgroups, check_org
from hutch.drivers.local.launch import Launcher
from hutch.drivers.local.pool import WarmPool
from hutch.drivers.local.quiet import Quiet
from hutch.drivers.local.sandboxnet import SandboxNetwork
from hutch.drivers.local.state import SAFE_ID, LocalSandbox, Registry, is_live
from hutch.drivers.local.teardown import Teardown

log = logging.getLogger(__name__)

STARTS_PER_CORE = 8
BUILDS_AT_ONCE = 4  # install layers built at once (each mostly waits for apt-get or npm)


class Provisioner:
    """Makes the sandboxes of one driver."""

    def __init__(self, registry: Registry, cgroups: Cgroups | None, launcher: Launcher, pool: WarmPool,
                 net: SandboxNetwork, teardown: Teardown, *, runtime_cache: Path, rootless: bool,
                 layer_limits: layercache.LayerLimits, quiet: Quiet, on_built: Callable[[], None] = lambda: None) -> None:
        self._registry = registry
        self._cgroups = cgroups
        self._launcher = launcher
        self._pool = pool
        self._net = net
        self._teardown = teardown
        self._runtime_cache = runtime_cache
        self._rootless = rootless
        self._layer_limits = layer_limits
        self._on_built = on_built  # the layer cache may be over its bound now: sweep it
        self._quiet = quiet  # held until the sandbox's first command is launched (quiet.py)
        self.max_starting = STARTS_PER_CORE * (os.cpu_count() or 1)
        self._starting = asyncio.Semaphore(self.max_starting)
        self._builds = ThreadPoolExecutor(BUILDS_AT_ONCE, thread_name_prefix="hutch-layer-build")
        self._building: dict[str, asyncio.Future[str]] = {}  # layer key -> its build under way

    def _built(self, key: str, build: asyncio.Future[str]) -> None:
        self._building.pop(key, None)
        if not build.cancelled():
            build.exception()  # its waiters have it; none left (all gone meanwhile) is no error to log

    def close(self) -> None:
        """Builds not started yet are dropped; one under way ends in its thread."""
        self._builds.shutdown(wait=False, cancel_futures=True)

    def _recipe(self, req: ProvisionRequest) -> runtimes.RuntimeRecipe:
        if not SAFE_ID.match(req.sandbox_id):
            raise InvalidInput(f"invalid sandbox id {req.sandbox_id!r}", field="sandbox_id")
        recipe = runtimes.find(req.runtime)
        if recipe is None:
            raise RuntimeNotFound(f"unknown runtime {req.runtime!r}", field="runtime")
        self._check_built(recipe)
        if req.port is not None and not 1024 <= req.port <= 65535:
            raise InvalidInput(f"network.port: {req.port} is outside 1024-65535", field="network.port")
        check_env(req.env, "env")
        if self._rootless:
            _check_rootless(req)
        return recipe

    def _check_built(self, recipe: runtimes.RuntimeRecipe) -> None:
        if not rootfs.is_built(self._runtime_cache, recipe):
            raise RuntimeNotFound(
                f"runtime {recipe.name} is not built on this host; build it with: "
                f"{rootfs.build_hint(recipe.name, self._runtime_cache)}", field="runtime")

    async def provision(self, req: ProvisionRequest) -> None:
        recipe = self._recipe(req)
        check_org(req.org_id)  # before a pooled sandbox is taken for it: its cgroup's name
        self._quiet.hold(req.sandbox_id)
        try:
            await self._provision(recipe, req)
        except BaseException:
            self._quiet.release(req.sandbox_id)
            raise
        self._pool.refill(recipe.name, req.resources.memory_bytes)

    async def _provision(self, recipe: runtimes.RuntimeRecipe, req: ProvisionRequest) -> None:
        t0 = phases.start()
        async with self._starting, self._registry.lock(req.sandbox_id):
            phases.end("provision: start slot and lock wait", t0)
            old = self._registry.load(req.sandbox_id)
            if old is not None and is_live(old):
                raise IllegalTransition(f"sandbox {req.sandbox_id} already exists")
            leftover_cgroup = self._cgroups is not None and self._cgroups.paths(req.sandbox_id)[0].exists()
            if (self._registry.sandbox_root / req.sandbox_id).exists() or leftover_cgroup:
                await self._teardown.teardown(req.sandbox_id)  # a dead one's remains
            sb = await self._make(recipe, req)
            if (req.network_enabled or req.port is not None) and not self._rootless:  # rootless: at launch
                sb.network, sb.port, sb.making = req.network_enabled, req.port, True
                # meta.json says "making" first. A cancelled create (a server closing) does not
                # stop the thread: its teardown waits for it, or the thread would make the veth
                # and rules after the teardown undid them, and no one would undo them again.
                made = asyncio.ensure_future(asyncio.to_thread(self._net.sync, sb))
                try:
                    await asyncio.shield(made)
                    sb.making = False
                    self._registry.write_meta(sb)  # failing (a full disk), it is undone as the rest
                except BaseException:
                    await asyncio.wait([made])
                    await self._teardown.teardown(sb.id)
                    raise
            self._registry.sandboxes[sb.id] = sb

    async def _make(self, recipe: runtimes.RuntimeRecipe, req: ProvisionRequest) -> LocalSandbox:
        """A pooled sandbox claimed for ``req``, or a new one."""
        wanted = layers.layer_key(recipe, req.dependencies, req.packages) if req.dependencies or req.packages else None
        async with layercache.held(self._runtime_cache / "layers", wanted):  # no sweep drops it until mounted
            layer = await self.layer(recipe, req)
            # A pooled sandbox has its layer on the host's disk and no allow-list (its network is
            # made after the claim) and agentuity's account: a disk limit, network.allow or .deny or another
            # user is made from scratch.
            poolable = (layer is None and not req.resources.disk_bytes and not req.network_allow and not req.network_deny
                        and req.user is None)
            with phases.span("provision: pool claim"):
                sb = await self._pool.claim(req) if poolable else None
            if sb is None:
                try:
                    with phases.span("provision: made from scratch (the pool had none)"):
                        sb = await self._launcher.create(req, layers.lowers(self._runtime_cache, recipe, layer), layer)
                except BaseException:
                    await self._teardown.teardown(req.sandbox_id)
                    raise
        return sb

    async def prepare(self, req: ProvisionRequest) -> None:
        """Build (or find) the install layer the request needs; the slow and fallible part."""
        if req.dependencies or req.packages:
            recipe = runtimes.find(req.runtime)
            if recipe is None:
                raise RuntimeNotFound(f"unknown runtime {req.runtime!r}", field="runtime")
            await self.layer(recipe, req)

    async def layer(self, recipe: runtimes.RuntimeRecipe, req: ProvisionRequest) -> str | None:
        """The install layer ``req`` asks for (built on first use), or None."""
        if not (req.dependencies or req.packages):
            return None
        self._check_built(recipe)
        built = not layers.layer_path(self._runtime_cache, layers.layer_key(recipe, req.dependencies,
                                                                           req.packages)).is_dir()
        key = layers.layer_key(recipe, req.dependencies, req.packages)
        build = self._building.get(key)
        if build is None:
            build = asyncio.get_running_loop().run_in_executor(self._builds, functools.partial(
                layers.build, recipe, self._runtime_cache, req.dependencies, req.packages,
                log=log.info, max_bytes=self._layer_limits.max_bytes))
            self._building[key] = build
            build.add_done_callback(functools.partial(self._built, key))
        key = await asyncio.shield(build)  # one waiter leaving ends no one else's wait
        if built:
            self._on_built()
        return key


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
