"""SSH sessions relayed between replicas (api/replication.py does the same for HTTP).

A sandbox's commands, terminals and files are served by the replica that owns it. A user's
``ssh sbx_…@host`` may reach any replica's gateway; one that does not own the sandbox checks
the user's key as usual, then opens its own SSH connection to the owner's gateway and joins
the two sessions end to end (exec, terminal with its resizes, scp, sftp: bytes both ways, the
exit status back). The user's key never leaves the first replica, so the hop authenticates
with a *relay pass* instead: user ``replica-relay.<sandbox id>`` and, as the password, who the
user is (key, organization, projects), the sandbox and an expiry, signed with the replicas'
shared secret. Only relay users may use a password; a user's own connection is offered public
keys alone, as before.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import logging
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import aiohttp
import asyncssh

from hutch.core.errors import ReplicaUnavailable
from hutch.core.tenancy import Principal, Role

log = logging.getLogger("hutch.ssh")

RELAY_USER = "replica-relay."  # + the sandbox id
PASS_SECONDS = 60  # a pass opens one connection, made at once; it need not live long
EXIT_FAILED = 255  # what ssh reports when the remote side could not run the command


class RelayPasses:
    """Make and check relay passes under the replicas' shared secret (``sign``: an HMAC)."""

    def __init__(self, sign: Callable[[str], str]) -> None:
        self._sign = sign

    def make(self, sandbox_id: str, principal: Principal, now: float | None = None) -> str:
        claims = {"s": sandbox_id, "k": principal.key_id, "o": principal.org_id, "r": principal.role.value,
                  "p": list(principal.projects),
                  "e": int((now if now is not None else time.time()) + PASS_SECONDS)}
        body = base64.urlsafe_b64encode(json.dumps(claims, separators=(",", ":")).encode()).decode()
        return f"{body}.{self._sign('ssh-relay:' + body)}"

    def check(self, sandbox_id: str, password: str, now: float | None = None) -> Principal | None:
        """The user the pass speaks for; None if it is forged, expired or for another sandbox."""
        body, _, mac = password.partition(".")
        # Bytes: compare_digest refuses a str with characters outside ASCII (anyone can send one).
        if not mac or not hmac.compare_digest(mac.encode(errors="replace"),
                                              self._sign("ssh-relay:" + body).encode()):
            return None
        try:
            claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(body.encode()))
            if claims["s"] != sandbox_id or claims["e"] < (now if now is not None else time.time()):
                return None
            return Principal(key_id=claims["k"], org_id=claims["o"], role=Role(claims["r"]),
                             projects=tuple(str(p) for p in claims["p"]))
        except (ValueError, KeyError, TypeError):
            return None


class OwnerGateways:
    """Where each replica's SSH gateway listens: its URL's host, the port its ``/healthz``
    gives (asked once per replica URL, then kept)."""

    def __init__(self) -> None:
        self._ports: dict[str, int] = {}

    async def address(self, url: str) -> tuple[str, int]:
        host = urllib.parse.urlsplit(url).hostname or "127.0.0.1"
        if url not in self._ports:
            timeout = aiohttp.ClientTimeout(total=10)
            try:
                async with aiohttp.ClientSession(timeout=timeout) as session, \
                        session.get(url.rstrip("/") + "/healthz") as resp:
                    body = await resp.json(content_type=None)
                port = body["data"]["ssh"]["port"]
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as err:
                raise ReplicaUnavailable(f"the replica at {url} owning this sandbox has no SSH gateway that "
                                         f"answers ({err.__class__.__name__}); try again") from err
            self._ports[url] = int(port)
        return host, self._ports[url]

    def forget(self, url: str) -> None:
        self._ports.pop(url, None)


async def relay(process: asyncssh.SSHServerProcess[bytes], *, url: str, sandbox_id: str, password: str,
                gateways: OwnerGateways) -> None:
    """Run the session on the owner's gateway, joined end to end to this one, and end this
    one as that one ended (its exit status or signal). The user hanging up ends the far
    session too (asyncssh alone would leave it running, a shell or a ``cat`` waiting for
    input that never comes); a failure says why on stderr and exits 255."""
    try:
        host, port = await gateways.address(url)
        conn = await asyncssh.connect(host, port, username=RELAY_USER + sandbox_id, password=password,
                                      known_hosts=None, client_keys=None, agent_path=None, config=None,
                                      preferred_auth="password", connect_timeout=10)
    except (OSError, asyncssh.Error, ReplicaUnavailable) as err:
        gateways.forget(url)
        why = err.message if isinstance(err, ReplicaUnavailable) else f"{err.__class__.__name__}: {err}"
        fail(process, f"the replica owning {sandbox_id} ({url}) does not answer: {why}")
        return
    try:
        await _join(process, conn, sandbox_id)
    finally:
        conn.close()
        with contextlib.suppress(Exception):
            await conn.wait_closed()


async def _join(process: asyncssh.SSHServerProcess[bytes], conn: asyncssh.SSHClientConnection,
                sandbox_id: str) -> None:
    term_type = process.term_type
    try:
        upstream = await conn.create_process(
            process.command, subsystem=process.subsystem, term_type=term_type,
            term_size=process.term_size if term_type else None, encoding=None)
    except (OSError, asyncssh.Error) as err:
        fail(process, f"the replica owning {sandbox_id} refused the session: {err}")
        return
    await process.redirect(stdin=upstream.stdin, stdout=upstream.stdout, stderr=upstream.stderr)
    finished = asyncio.ensure_future(upstream.wait())
    hung_up = asyncio.ensure_future(process.channel.wait_closed())
    try:
        await asyncio.wait({finished, hung_up}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        hung_up.cancel()
        if not finished.done():  # the user went away: so does the far session
            finished.cancel()
            upstream.close()
    if finished.cancelled():
        return
    try:
        done = finished.result()
        await process.stdout.drain()
    except (OSError, asyncssh.Error) as err:
        fail(process, f"the replica owning {sandbox_id} dropped the session: {err}")
        return
    with contextlib.suppress(OSError, asyncssh.Error):
        if done.exit_signal is not None:
            signal_name, core_dumped, message, lang = done.exit_signal
            process.exit_with_signal(signal_name, core_dumped, message, lang)
        else:
            process.exit(done.exit_status if done.exit_status is not None else EXIT_FAILED)


def fail(process: asyncssh.SSHServerProcess[bytes], message: str) -> None:
    """End the session with 255 and say why on stderr (not a bare failure, which would send
    the user looking at their keys or their command)."""
    with contextlib.suppress(OSError, asyncssh.Error):
        process.stderr.write(f"hutch: {message}\r\n".encode())
        process.exit(EXIT_FAILED)
