"""The services a :class:`hutch.client.SandboxClient` is made of, over its one connection: the
client builds them once and delegates to them, and every :class:`~hutch._sandbox.Sandbox`
handle it makes holds the same ones (never the client)."""

from __future__ import annotations

import attrs

from hutch._connection import Connection
from hutch._copies import Copies
from hutch._executions import Executions
from hutch._files import SandboxFiles
from hutch._sandboxes import Sandboxes
from hutch._snapshots import Snapshots

__all__ = ["Services"]


@attrs.frozen
class Services:
    connection: Connection
    sandboxes: Sandboxes
    executions: Executions
    files: SandboxFiles
    copies: Copies
    snapshots: Snapshots

    @classmethod
    def over(cls, connection: Connection) -> Services:
        executions, files = Executions(connection), SandboxFiles(connection)
        return cls(connection=connection, sandboxes=Sandboxes(connection, executions), executions=executions,
                   files=files, copies=Copies(files), snapshots=Snapshots(connection))
