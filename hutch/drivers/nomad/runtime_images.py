"""The nomad driver's runtime images: which catalog runtimes have an image in the registry the
Nomad clients pull from, building and pushing one on first use, and installs (apt/npm layers)
as derived images.

The trees the images are made from are built on this host as for the local driver
(``drivers.local.rootfs`` and ``layers``); ``drivers.nomad.images`` makes and pushes the images.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from hutch.core import runtimes
from hutch.core.errors import RuntimeNotFound
from hutch.core.runtimes import RuntimeRecipe
from hutch.drivers.base import ProvisionRequest
from hutch.drivers.builds import Builds
from hutch.drivers.local import layercache, layers, rootfs
from hutch.drivers.nomad import images

log = logging.getLogger(__name__)


class RuntimeImages:
    def __init__(self, registry: str, runtime_cache: Path,
                 layer_max_bytes: int = layercache.DEFAULT_MAX_BYTES) -> None:
        self.registry = registry
        self.layer_max_bytes = layer_max_bytes  # HUTCH_LAYER_CACHE_MAX: a larger install is refused
        self.runtime_cache = runtime_cache  # the trees images are made from
        # The runtimes with an image. Updated in place: the driver's warm pools hold this set.
        self.available: set[str] = set()
        self._builds = Builds()  # runtimes built and pushed on first use
        self._install_lock = asyncio.Lock()  # one layer build and push at a time

    async def probe(self) -> None:
        """Ask the registry which catalog runtimes have an image (at start)."""
        found = await asyncio.to_thread(self._probe)
        self.available.clear()
        self.available.update(found)

    def _probe(self) -> set[str]:
        return {r.name for r in runtimes.CATALOG if images.exists(r, self.registry)}

    async def build(self, name: str, progress: Callable[[str], None]) -> None:
        """First use: the runtime's tree (built here as for the local driver), then its image,
        pushed to the registry the Nomad clients pull from."""
        recipe = rootfs.lookup(name)

        def work(log: Callable[[str], None]) -> None:
            rootfs.build(recipe, self.runtime_cache, log=log)
            if not images.exists(recipe, self.registry):
                log(f"{recipe.name}: pushing its image to {self.registry}")
                started = time.monotonic()
                ref = images.push(recipe, self.registry, cache=self.runtime_cache)
                log(f"{recipe.name}: pushed {ref} in {time.monotonic() - started:.1f}s")

        await self._builds.run(recipe.name, progress, work)
        self.available.add(recipe.name)

    def building(self) -> set[str]:
        return self._builds.building()

    def info(self, name: str) -> dict[str, object]:
        return rootfs.build_info(self.runtime_cache, rootfs.lookup(name))

    def ref(self, recipe: RuntimeRecipe, layer: str | None = None) -> str:
        """The image reference of a runtime (or of one of its install layers)."""
        return images.image_ref(recipe, self.registry, layer)

    def require(self, runtime: str) -> RuntimeRecipe:
        """The recipe of a runtime a sandbox can be placed with (RuntimeNotFound if none)."""
        recipe = runtimes.find(runtime)
        if recipe is None:
            raise RuntimeNotFound(f"unknown runtime {runtime!r}", field="runtime")
        if recipe.name not in self.available:
            raise RuntimeNotFound(
                f"runtime {recipe.name} has no image in the registry {self.registry}; push it with: "
                f"python -m hutch.drivers.nomad.images push {recipe.name} --registry {self.registry}", field="runtime")
        return recipe

    async def layer(self, req: ProvisionRequest) -> str | None:
        """Installs: the install layer (built on this host, as the local driver builds it, from
        the same runtime tree) becomes a derived image in the registry, once. Its key, or None
        when the request installs nothing.

        The key is a hash of the recipe, so the registry is asked first: a layer any server of
        the deployment pushed is used as it is, on a host that never built the runtime's tree
        (another API server, or this one after its disk was lost)."""
        if not (req.dependencies or req.packages):
            return None
        recipe = runtimes.find(req.runtime)
        if recipe is None:
            raise RuntimeNotFound(f"unknown runtime {req.runtime!r}", field="runtime")
        key = layers.layer_key(recipe, req.dependencies, req.packages)
        if await asyncio.to_thread(images.exists, recipe, self.registry, key):
            return key
        cache = rootfs.default_cache()
        if not rootfs.is_built(cache, recipe):
            raise RuntimeNotFound(f"installs on the nomad driver build on this host's copy of runtime {recipe.name}, "
                                  f"which is not built; {rootfs.build_hint(recipe.name, cache)}", field="runtime")
        async with self._install_lock:
            built = await asyncio.to_thread(layers.build, recipe, cache, req.dependencies, req.packages, log=log.info,
                                            max_bytes=self.layer_max_bytes)
            assert built == key, "layers.build keys a layer by layers.layer_key"
            if not await asyncio.to_thread(images.exists, recipe, self.registry, key):
                await asyncio.to_thread(images.push, recipe, self.registry, cache=cache, layer=key)
            # Pushed, the host's tree is only a leftover (the registry is asked first next time);
            # drop leaves it if a local sandbox on this host is mounted over the same layer.
            await asyncio.to_thread(layercache.drop, cache / "layers", key)
        return key
