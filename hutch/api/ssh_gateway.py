"""The SSH gateway (``hutch serve --ssh-port PORT``): real OpenSSH clients into sandboxes.

``ssh -p PORT sbx_…@host`` opens a shell on a terminal (service/terminals.py), ``ssh … 'cmd'``
runs a command as an execution (its stdout, stderr and exit code kept apart, as ssh keeps
them; recorded like every execution), and ``scp``/``sftp`` reach the sandbox's files through
the driver's file primitives, the same as the file API (api/sftp.py): never the host's.

The user name is the sandbox id; the key must be registered for the sandbox's organization
(``/ssh-keys``, core/tenancy.py), by an API key still live (revoked or expired, its SSH
keys open nothing). Each session, and each SFTP operation that reaches the sandbox, counts
against that API key's rate limit like an HTTP request (where the session is served), and a
connection signed in is one of its organization's requests at once (api/at_once.py) until it
ends. An unknown sandbox, another organization's sandbox and an
unregistered key are refused alike, before any session: nothing is revealed. A session lives
as long as its key opens the sandbox: once the SSH key is removed, or the API key that added
it revoked or expired, the session is closed (its terminal's tree killed) with a line saying
why. The host key is made once and kept in the data dir.

With several replicas, a session for a sandbox another replica owns is relayed to that
replica's gateway (api/ssh_relay.py), as HTTP requests are (api/replication.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import asyncssh

from hutch.api.at_once import AtOnce, default_limit
from hutch.api.sftp import SandboxSftp
from hutch.api.ssh_relay import EXIT_FAILED, RELAY_USER, OwnerGateways, RelayPasses, fail, relay
from hutch.core.errors import HutchError, InvalidInput, RateLimited
from hutch.core.events import acting
from hutch.core.tenancy import Principal, Role
from hutch.service.output import StreamOptions
from hutch.service.requests import ExecuteRequest
from hutch.service.tenancy import now_utc
from hutch.service.terminals import ActiveTerminal, TerminalOptions

if TYPE_CHECKING:
    from hutch.api.replication import Replication
    from hutch.service.engine import Engine
    from hutch.service.tenancy import Tenants

log = logging.getLogger("hutch.ssh")

HOST_KEY_FILE = "ssh_host_ed25519_key"
T = TypeVar("T")
_DRAIN = 1.0  # seconds of output still taken after a terminal's command exited


def host_key(data_dir: Path) -> asyncssh.SSHKey:
    path = data_dir / HOST_KEY_FILE
    if not path.exists():
        key = asyncssh.generate_private_key("ssh-ed25519")
        path.touch(mode=0o600)
        key.write_private_key(str(path))
        log.info("ssh: made the host key %s (%s)", path, key.get_fingerprint())
    return asyncssh.read_private_key(str(path))


class SshGateway:
    def __init__(self, engine: Engine, tenants: Tenants, data_dir: Path,
                 replication: Replication | None = None, at_once: AtOnce | None = None) -> None:
        self.engine = engine
        self.tenants = tenants
        # Each organization's requests under way (api/at_once.py), shared with the API's: a
        # connection signed in holds a socket as a long-poll does, for as long as it is open.
        self.at_once = at_once if at_once is not None else AtOnce(default_limit())
        self.data_dir = data_dir
        self.port: int | None = None
        self._server: asyncssh.SSHAcceptor | None = None
        self.replication = replication if replication is not None and replication.replicas.shared else None
        self.passes = RelayPasses(engine.streams.sign)
        self.gateways = OwnerGateways()

    async def start(self, host: str, port: int) -> None:
        # Sessions are made per connection (``_Auth.session_requested``): one served here,
        # or one relayed whole to the owning replica.
        self._server = await asyncssh.listen(
            host, port, server_host_keys=[host_key(self.data_dir)], server_factory=lambda: _Auth(self),
            encoding=None, line_editor=False, agent_forwarding=False, x11_forwarding=False, allow_pty=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def owner(self, sandbox_id: str, *, relayed: bool) -> str | None:
        """The URL of the replica owning the sandbox if not this one (None: served here)."""
        if self.replication is None:
            return None
        return await self.replication.owner_url(sandbox_id, relayed=relayed)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def session(self, conn: asyncssh.SSHServerConnection) -> asyncssh.SSHServerProcess[bytes]:
        if conn.get_extra_info("hutch_refusal") is not None:
            return _WholeSession(self._refused)
        if conn.get_extra_info("hutch_owner") is not None:
            return _WholeSession(self._relayed)
        return asyncssh.SSHServerProcess(
            self._session, lambda chan: SandboxSftp(cast("asyncssh.SSHServerChannel[bytes]", chan), self.engine),
            asyncssh.sftp.MIN_SFTP_VERSION, allow_scp=True)

    async def _refused(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        """A known key and sandbox, but no replica can serve it now."""
        fail(process, process.get_extra_info("hutch_refusal"))

    async def _relayed(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        principal: Principal = process.get_extra_info("hutch_principal")
        sandbox_id: str = process.get_extra_info("hutch_sandbox")
        cut = await self._while_key_opens(process, relay(
            process, url=process.get_extra_info("hutch_owner"), sandbox_id=sandbox_id,
            password=self.passes.make(sandbox_id, principal), gateways=self.gateways))
        if cut is not None:  # the relay ends this session itself, unless the key ended first
            with contextlib.suppress(Exception):
                process.exit(cut)

    def _check(self, process: asyncssh.SSHServerProcess[bytes]) -> Callable[[], str | None]:
        """A check raising ``Unauthorized`` once the session's SSH key opens nothing: asked
        before every byte typed reaches the sandbox, so none typed after that instant does."""
        ssh_key: str | None = process.get_extra_info("hutch_ssh_key")
        tenants = self.tenants
        return (lambda: None) if ssh_key is None else (lambda: tenants.ssh_key_expiry(ssh_key))

    async def _while_key_opens(self, process: asyncssh.SSHServerProcess[bytes], work: Awaitable[T]) -> T | int:
        """``work``, cut short (EXIT_FAILED) when the session's SSH key stops opening the
        sandbox. Checked where the key was: a relayed session (the owner's side, let in by a
        pass) is ended by its front closing the relay."""
        task = asyncio.ensure_future(work)
        if process.get_extra_info("hutch_ssh_key") is None:
            return await task
        ended = asyncio.ensure_future(self.tenants.until_refused(self._check(process)))
        try:
            await asyncio.wait({task, ended}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            process.stderr.write(f"\r\nhutch: session closed: {ended.result()}\r\n".encode())
            return EXIT_FAILED
        finally:
            for t in (task, ended):
                t.cancel()
            for t in (task, ended):
                with contextlib.suppress(BaseException):
                    await t

    async def _session(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        principal: Principal = process.get_extra_info("hutch_principal")
        sandbox_id: str = process.get_extra_info("hutch_sandbox")
        code = EXIT_FAILED
        with acting(principal):
            try:
                self.tenants.throttle(principal)  # a session is a request of its key's (RateLimited: said)
                if process.get_terminal_type() is not None:
                    code = await self._while_key_opens(process, self._terminal(process, sandbox_id))
                else:
                    code = await self._while_key_opens(process, self._command(process, sandbox_id))
            except HutchError as err:
                process.stderr.write(f"hutch: {err.message}\r\n".encode())
            except (asyncssh.BreakReceived, asyncssh.SignalReceived, ConnectionError):
                pass
        with contextlib.suppress(Exception):
            process.exit(code)

    async def _terminal(self, process: asyncssh.SSHServerProcess[bytes], sandbox_id: str) -> int:
        cols, rows, _w, _h = process.get_terminal_size()
        command = ("/bin/sh", "-c", process.command) if process.command else ()
        active = await self.engine.terminals.open(sandbox_id, TerminalOptions(
            command=command, rows=rows or 24, cols=cols or 80, term=process.get_terminal_type() or "xterm-256color"))
        output = asyncio.ensure_future(_copy_out(active, process))
        typed = asyncio.ensure_future(_copy_in(process, active, self._check(process)))  # ends at the client's EOF: as sshd, go on
        exited = asyncio.ensure_future(active.wait())
        closed = asyncio.ensure_future(process.channel.wait_closed())
        try:
            await asyncio.wait({exited, closed}, return_when=asyncio.FIRST_COMPLETED)
            if not exited.done():  # the client hung up
                return EXIT_FAILED
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
            return EXIT_FAILED
        engine = self.engine
        stdin_id = engine.inputs.create("ssh")
        upload = asyncio.ensure_future(engine.inputs.upload(stdin_id, _chunks(process, self._check(process))))
        req = ExecuteRequest(command=("/bin/sh", "-c", process.command), files=[], timeout=None,
                             stream=StreamOptions(stdin=stdin_id))
        try:
            execution, _ = await engine.executions.execute(sandbox_id, req)
            await asyncio.gather(
                _copy_stream(engine, execution.execution_id, "stdout", process.stdout),
                _copy_stream(engine, execution.execution_id, "stderr", process.stderr))
            final = await engine.reads.get_execution(execution.execution_id, wait=3600)
            while not final.status.is_final:
                final = await engine.reads.get_execution(execution.execution_id, wait=3600)
        finally:
            upload.cancel()
            with contextlib.suppress(BaseException):
                await upload
        return final.exit_code if final.exit_code is not None else EXIT_FAILED


class _WholeSession(asyncssh.SSHServerProcess[bytes]):
    """A session relayed whole to the owning replica: its sftp and scp too, so they are not
    served here (no SFTP server of our own; every subsystem goes to the process)."""

    def __init__(self, process_factory: Any) -> None:
        super().__init__(process_factory, None, asyncssh.sftp.MIN_SFTP_VERSION, False)

    def subsystem_requested(self, subsystem: str) -> bool:
        return subsystem == "sftp"

    def session_started(self) -> None:
        # asyncssh's own would run an SFTP server for the sftp subsystem; here the process
        # factory gets every session (the else branch of SSHServerStreamSession.session_started;
        # ``_chan``, ``_conn`` and ``_session_factory`` are asyncssh privates).
        chan, conn = self._chan, self._conn
        assert chan is not None and conn is not None and self._session_factory is not None
        stdin = asyncssh.SSHReader[bytes](self, chan)
        handler = self._session_factory(stdin, asyncssh.SSHWriter[bytes](self, chan),
                                        asyncssh.SSHWriter[bytes](self, chan, asyncssh.EXTENDED_DATA_STDERR))
        if inspect.isawaitable(handler):
            conn.create_task(handler, stdin.logger)


class _Auth(asyncssh.SSHServer):
    """Public keys only; the key must open the sandbox named as the user. Another replica
    relaying a session here (user ``replica-relay.<sandbox>``) shows a relay pass instead."""

    def __init__(self, gateway: SshGateway) -> None:
        self.gateway = gateway
        self._conn: asyncssh.SSHServerConnection | None = None
        self._relay = False
        self._slot: contextlib.AbstractContextManager[None] | None = None  # its organization's, once signed in

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn

    def connection_lost(self, exc: Exception | None) -> None:
        if self._slot is not None:
            self._slot.__exit__(None, None, None)
            self._slot = None

    def begin_auth(self, username: str) -> bool:
        self._relay = username.startswith(RELAY_USER)
        return True

    def password_auth_supported(self) -> bool:
        return self._relay  # a person is never asked for a password

    def public_key_auth_supported(self) -> bool:
        return not self._relay

    def session_requested(self) -> asyncssh.SSHServerProcess[bytes]:
        assert self._conn is not None
        return self.gateway.session(self._conn)

    async def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        # One public key may be registered by several organizations (each its own record, live
        # while the API key that added it is): the sandbox in the user name picks the one
        # whose organization and projects hold it; the others are as if unregistered.
        for record in self.gateway.tenants.directory.ssh_keys_for(key.get_fingerprint("sha256"), now_utc()):
            principal = Principal(key_id=record.added_by or record.ssh_key_id, org_id=record.org_id,
                                  role=Role.MEMBER, projects=record.projects)
            if await self._admit(username, principal, relayed=False):
                assert self._conn is not None
                self._conn.set_extra_info(hutch_ssh_key=record.ssh_key_id)  # watched for the session's life
                return True
        return False

    async def validate_password(self, username: str, password: str) -> bool:
        sandbox_id = username.removeprefix(RELAY_USER)
        principal = self.gateway.passes.check(sandbox_id, password) if self._relay else None
        return principal is not None and await self._admit(sandbox_id, principal, relayed=True)

    async def _admit(self, sandbox_id: str, principal: Principal, *, relayed: bool) -> bool:
        with acting(principal):
            try:
                await self.gateway.engine.reads.require(sandbox_id)
            except HutchError:
                return False  # unknown, gone or another organization's: the same refusal
            owner, refusal = None, None
            try:
                owner = await self.gateway.owner(sandbox_id, relayed=relayed)
            except HutchError as err:  # its replica is being taken over; a relay that found it moved
                refusal = err.message
        assert self._conn is not None
        if self._slot is None:
            slot = self.gateway.at_once.slot(principal.org_id)
            try:
                slot.__enter__()
            except RateLimited as err:  # its organization holds its share: said, and not signed in
                self._conn.send_auth_banner(f"hutch: {err.message}\r\n")
                return False
            self._slot = slot
        self._conn.set_extra_info(hutch_principal=principal, hutch_sandbox=sandbox_id, hutch_owner=owner,
                                  hutch_refusal=refusal)
        return True


async def _copy_out(active: ActiveTerminal, process: asyncssh.SSHServerProcess[bytes]) -> None:
    while data := await active.read():
        process.stdout.write(data)


async def _copy_in(process: asyncssh.SSHServerProcess[bytes], active: ActiveTerminal,
                   check: Callable[[], object]) -> None:
    while True:
        try:
            data = await process.stdin.read(65536)
        except asyncssh.TerminalSizeChanged as change:
            try:
                await active.resize(change.height or 24, change.width or 80)
            except InvalidInput as err:  # an impossible size: said, and the terminal goes on as it was
                process.stderr.write(f"hutch: {err.message}; the terminal keeps its size\r\n".encode())
            continue
        if not data:
            return
        check()
        await active.write(data)


async def _chunks(process: asyncssh.SSHServerProcess[bytes], check: Callable[[], object]) -> AsyncIterator[bytes]:
    while data := await process.stdin.read(65536):
        check()
        yield data


async def _copy_stream(engine: Engine, execution_id: str, stream: str, out: Any) -> None:
    async for chunk in engine.sandbox_output.execution_output(execution_id, stream):
        out.write(chunk)
        await out.drain()
