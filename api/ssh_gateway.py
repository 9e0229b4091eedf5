"""The SSH gateway (``hutch serve --ssh-port PORT``): real OpenSSH clients into sandboxes.

``ssh -p PORT sbx_…@host`` opens a shell on a terminal (api/terminals.py), ``ssh … 'cmd'``
runs a command as an execution (its stdout, stderr and exit code kept apart, as ssh keeps
them; recorded like every execution), and ``scp``/``sftp`` reach the sandbox's files through
the driver's file primitives, the same as the file API (api/sftp.py): never the host's.

The user name is the sandbox id; the key must be registered for the sandbox's organization
(``/ssh-keys``, core/tenancy.py). An unknown sandbox, another organization's sandbox and an
unregistered key are refused alike, before any session: nothing is revealed. The host key
is made once and kept in the data dir.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncssh

from hutch.api import sandbox_streams
from hutch.api.output import StreamOptions
from hutch.api.sftp import SandboxSftp
from hutch.api.terminals import ActiveTerminal, TerminalOptions, open_terminal
from hutch.api.wire import ExecuteRequest
from hutch.core.errors import HutchError
from hutch.core.events import ACTOR
from hutch.core.tenancy import SCOPE, Principal, Role, Scope

if TYPE_CHECKING:
    from hutch.api.service import Engine
    from hutch.api.tenancy import Tenants

log = logging.getLogger("hutch.ssh")

HOST_KEY_FILE = "ssh_host_ed25519_key"
_DRAIN = 1.0  # seconds of output still taken after a terminal's command exited
_EXIT_FAILED = 255  # what ssh reports when the remote side could not run the command


@contextlib.contextmanager
def acting(principal: Principal) -> Iterator[None]:
    """Engine calls below see what the key's organization may see, and record who acted."""
    actor, scope = ACTOR.set(principal.key_id), SCOPE.set(Scope(principal.org_id, principal.projects))
    try:
        yield
    finally:
        SCOPE.reset(scope)
        ACTOR.reset(actor)


def host_key(data_dir: Path) -> asyncssh.SSHKey:
    path = data_dir / HOST_KEY_FILE
    if not path.exists():
        key = asyncssh.generate_private_key("ssh-ed25519")
        path.touch(mode=0o600)
        key.write_private_key(str(path))
        log.info("ssh: made the host key %s (%s)", path, key.get_fingerprint())
    return asyncssh.read_private_key(str(path))


class SshGateway:
    def __init__(self, engine: Engine, tenants: Tenants, data_dir: Path) -> None:
        self.engine = engine
        self.tenants = tenants
        self.data_dir = data_dir
        self.port: int | None = None
        self._server: asyncssh.SSHAcceptor | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncssh.listen(
            host, port, server_host_keys=[host_key(self.data_dir)], server_factory=lambda: _Auth(self),
            process_factory=self._session, sftp_factory=lambda chan: SandboxSftp(chan, self.engine),
            allow_scp=True, encoding=None, line_editor=False, agent_forwarding=False,
            x11_forwarding=False, allow_pty=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _session(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        principal: Principal = process.get_extra_info("hutch_principal")
        sandbox_id = process.get_extra_info("username")
        code = _EXIT_FAILED
        with acting(principal):
            try:
                if process.get_terminal_type() is not None:
                    code = await self._terminal(process, sandbox_id)
                else:
                    code = await self._command(process, sandbox_id)
            except HutchError as err:
                process.stderr.write(f"hutch: {err.message}\r\n".encode())
            except (asyncssh.BreakReceived, asyncssh.SignalReceived, ConnectionError):
                pass
        with contextlib.suppress(Exception):
            process.exit(code)

    async def _terminal(self, process: asyncssh.SSHServerProcess[bytes], sandbox_id: str) -> int:
        cols, rows, _w, _h = process.get_terminal_size()
        command = ("/bin/sh", "-c", process.command) if process.command else ()
        active = await open_terminal(self.engine, sandbox_id, TerminalOptions(
            command=command, rows=rows or 24, cols=cols or 80, term=process.get_terminal_type() or "xterm-256color"))
        output = asyncio.ensure_future(_copy_out(active, process))
        typed = asyncio.ensure_future(_copy_in(process, active))  # ends at the client's EOF: as sshd, go on
        exited = asyncio.ensure_future(active.wait())
        closed = asyncio.ensure_future(process.channel.wait_closed())
        try:
            await asyncio.wait({exited, closed}, return_when=asyncio.FIRST_COMPLETED)
            if not exited.done():  # the client hung up
                return _EXIT_FAILED
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(output), _DRAIN)
            return exited.result()
        finally:
            for task in (output, typed, exited, closed):
                task.cancel()
            await active.close()

    async def _command(self, process: asyncssh.SSHServerProcess[bytes], sandbox_id: str) -> int:
        """``ssh host 'cmd'`` without a terminal: an execution, output kept apart, stdin piped."""
        if not process.command:
            process.stderr.write(b"hutch: no command; ask for a terminal (ssh -t) for a shell\r\n")
            return _EXIT_FAILED
        engine = self.engine
        stdin_id = engine.inputs.create("ssh")
        upload = asyncio.ensure_future(engine.inputs.upload(stdin_id, _chunks(process)))
        req = ExecuteRequest(command=("/bin/sh", "-c", process.command), files=[], timeout=None,
                             stream=StreamOptions(stdin=stdin_id))
        try:
            execution, _ = await engine.execute(sandbox_id, req)
            await asyncio.gather(
                _copy_stream(engine, execution.execution_id, "stdout", process.stdout),
                _copy_stream(engine, execution.execution_id, "stderr", process.stderr))
            final = await engine.get_execution(execution.execution_id, wait=3600)
            while not final.status.is_final:
                final = await engine.get_execution(execution.execution_id, wait=3600)
        finally:
            upload.cancel()
            with contextlib.suppress(BaseException):
                await upload
        return final.exit_code if final.exit_code is not None else _EXIT_FAILED


class _Auth(asyncssh.SSHServer):
    """Public keys only; the key must open the sandbox named as the user."""

    def __init__(self, gateway: SshGateway) -> None:
        self.gateway = gateway
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    async def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        record = self.gateway.tenants.directory.ssh_key_for(key.get_fingerprint("sha256"))
        if record is None:
            return False
        principal = Principal(key_id=record.added_by or record.ssh_key_id, org_id=record.org_id,
                              role=Role.MEMBER, projects=record.projects)
        with acting(principal):
            try:
                await self.gateway.engine.get(username)
            except HutchError:
                return False  # unknown, gone or another organization's: the same refusal
        assert self._conn is not None
        self._conn.set_extra_info(hutch_principal=principal)
        return True


async def _copy_out(active: ActiveTerminal, process: asyncssh.SSHServerProcess[bytes]) -> None:
    while data := await active.read():
        process.stdout.write(data)


async def _copy_in(process: asyncssh.SSHServerProcess[bytes], active: ActiveTerminal) -> None:
    while True:
        try:
            data = await process.stdin.read(65536)
        except asyncssh.TerminalSizeChanged as change:
            await active.resize(change.height or 24, change.width or 80)
            continue
        if not data:
            return
        await active.write(data)


async def _chunks(process: asyncssh.SSHServerProcess[bytes]) -> AsyncIterator[bytes]:
    while data := await process.stdin.read(65536):
        yield data


async def _copy_stream(engine: Engine, execution_id: str, stream: str, out: Any) -> None:
    async for chunk in sandbox_streams.execution_output(engine, execution_id, stream):
        out.write(chunk)
        await out.drain()
