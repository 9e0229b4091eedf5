"""The one port a sandbox exposes, as the proxy reaches it."""

from __future__ import annotations

from hutch.drivers.roles import PortForwarding
from hutch.service.files import FileAccess


class Ports:
    def __init__(self, files: FileAccess, ports: PortForwarding) -> None:
        self._files, self._ports = files, ports

    async def target(self, sandbox_id: str) -> tuple[str, int]:
        """Where the sandbox's port answers (host, port); the sandbox is made ready first (not
        ended, a paused one woken) and the request counts as activity."""
        await self._files.ready(sandbox_id)
        return await self._ports.port_target(sandbox_id)
