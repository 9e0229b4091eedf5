"""The runtime catalog as this server's driver has it: which runtimes are ready, which are
being built, what each one's image holds, and building one on request."""

from __future__ import annotations

from collections.abc import Callable

from hutch.drivers.roles import RuntimeCatalog


class Runtimes:
    def __init__(self, catalog: RuntimeCatalog) -> None:
        self._catalog = catalog

    def available(self) -> set[str]:
        return self._catalog.runtimes_available()

    def building(self) -> set[str]:
        return self._catalog.runtimes_building()

    def info(self, name: str) -> dict[str, object]:
        return self._catalog.runtime_info(name)

    async def build(self, name: str, progress: Callable[[str], None]) -> None:
        await self._catalog.build_runtime(name, progress)
