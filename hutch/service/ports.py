"""The one port a sandbox exposes, as the proxy reaches it, and any other its processes open."""

from __future__ import annotations

import socket

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

    async def connect(self, sandbox_id: str, port: int) -> socket.socket:
        """A connection to ``port`` of the sandbox, whichever its processes listen on (not only
        the one it declared), made ready first as ``target``'s."""
        await self._files.ready(sandbox_id)
        return await self._ports.port_connect(sandbox_id, port)
