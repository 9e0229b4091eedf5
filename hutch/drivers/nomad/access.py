"""What the nomad driver's collaborators (``files.NomadFiles``, ``terminal.NomadTerminals``) see
of it: the few driver operations they run commands in a sandbox through.

Kept apart from ``drivers.nomad.driver`` so those modules depend on this small seam, not on
the driver that builds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from hutch.drivers.nomad.client import NomadClient
from hutch.drivers.nomad.state import NomadSandbox


class SandboxAccess(Protocol):
    """The driver, as its file and terminal collaborators use it."""

    @property
    def client(self) -> NomadClient:
        """The Nomad API, for alloc execs."""
        ...

    def running(self, sandbox_id: str) -> NomadSandbox:
        """The live sandbox (SandboxNotFound if it is not, or is being destroyed)."""
        ...

    def gone(self, sandbox_id: str) -> bool:
        """Whether the sandbox has ended (or been destroyed) since it was looked up."""
        ...

    def check_not_paused(self, sb: NomadSandbox) -> None:
        """IllegalTransition if the sandbox is paused."""
        ...

    def command_env(self, sb: NomadSandbox, extra: Mapping[str, str]) -> list[str]:
        """The environment a command in the sandbox runs with, as KEY=VALUE strings."""
        ...

    async def kill_tagged(self, sb: NomadSandbox, tag: str) -> None:
        """Kill everything the exec carrying ``tag`` started."""
        ...
