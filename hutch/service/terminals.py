"""Terminals: a shell (or any command) on a pseudo-terminal in a sandbox, carried over a
websocket (api/routes/terminals.py), the SSH gateway (api/ssh_gateway.py) and ``hutch ssh``.

The driver makes the terminal (its ``terminals`` role, ``Terminals.open_terminal``);
``TerminalSessions`` decides what runs on it and keeps the sandbox awake while it is used: a
paused sandbox resumes for it, and input or output counts as activity for the idle timeout,
as file operations do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from hutch.core.errors import InvalidInput, NotSupported
from hutch.drivers.base import PtySession, TerminalRequest
from hutch.drivers.roles import SandboxLifecycle, Terminals
from hutch.service.files import FileAccess

# What runs when the user names no command: the sandbox user's login shell (bash in every
# runtime hutch builds; sh in a snapshot's runtime without it).
LOGIN_SHELL = ("/bin/sh", "-c", "if command -v bash >/dev/null; then exec bash -l; else exec sh -l; fi")
MAX_SIZE = 1000  # rows or columns: what a terminal that large would mean is a typo


@attrs.frozen
class TerminalOptions:
    command: tuple[str, ...] = ()  # empty: LOGIN_SHELL
    rows: int = 24
    cols: int = 80
    cwd: str | None = None
    term: str = "xterm-256color"  # TERM inside; the client's own when it says


def check_size(rows: int, cols: int) -> None:
    for name, value in (("rows", rows), ("cols", cols)):
        if not 1 <= value <= MAX_SIZE:
            raise InvalidInput(f"{name}: {value} is not a terminal size (1..{MAX_SIZE})", field=name)


def check_term(term: str) -> None:
    if not term or len(term) > 64 or any(not (c.isalnum() or c in "-_.+") for c in term):
        raise InvalidInput(f"term: {term!r} is not a terminal type", field="term")


class TerminalSessions:
    """``lifecycle`` says whether the driver has terminals and its name; ``files`` makes the
    sandbox ready and counts the terminal's bytes as activity."""

    def __init__(self, terminals: Terminals, lifecycle: SandboxLifecycle, files: FileAccess) -> None:
        self._terminals, self._lifecycle, self._files = terminals, lifecycle, files

    def check_supported(self) -> None:
        """Refuse before a websocket upgrade when this server's driver has no terminals."""
        if not self._lifecycle.capabilities.terminals:
            raise NotSupported(f"driver {self._lifecycle.name} has no terminals")

    async def open(self, sandbox_id: str, opts: TerminalOptions,
                   env: Mapping[str, str] | None = None) -> ActiveTerminal:
        """Open a terminal in a sandbox the caller may use (404 otherwise, as every route)."""
        check_size(opts.rows, opts.cols)
        check_term(opts.term)
        sb = await self._files.ready(sandbox_id)  # waits out creating, resumes a paused one
        argv: Sequence[str] = opts.command or LOGIN_SHELL
        term = await self._terminals.open_terminal(TerminalRequest(
            sandbox_id=sb.sandbox_id, argv=tuple(argv), env={**sb.spec.env, "TERM": opts.term, **(env or {})},
            cwd=opts.cwd, rows=opts.rows, cols=opts.cols))
        return ActiveTerminal(self._files, sb.sandbox_id, term)


class ActiveTerminal:
    """A driver terminal that marks its sandbox active while bytes move."""

    def __init__(self, files: FileAccess, sandbox_id: str, term: PtySession) -> None:
        self._files = files
        self.sandbox_id = sandbox_id
        self.term = term

    def _touch(self) -> None:
        self._files.touch(self.sandbox_id)  # a dict write: cheap enough for every chunk

    async def read(self) -> bytes:
        data = await self.term.read()
        if data:
            self._touch()
        return data

    async def write(self, data: bytes) -> None:
        self._touch()
        await self.term.write(data)

    async def resize(self, rows: int, cols: int) -> None:
        check_size(rows, cols)
        await self.term.resize(rows, cols)

    async def wait(self) -> int:
        return await self.term.wait()

    async def close(self) -> None:
        await self.term.close()
