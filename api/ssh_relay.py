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

import base64
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
_EXIT_FAILED = 255


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
        if not mac or not hmac.compare_digest(mac, self._sign("ssh-relay:" + body)):
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
                gateways: OwnerGateways) -> int:
    """Run the session on the owner's gateway, joined end to end to this one; its exit status."""
    try:
        host, port = await gateways.address(url)
        conn = await asyncssh.connect(host, port, username=RELAY_USER + sandbox_id, password=password,
                                      known_hosts=None, client_keys=None, agent_path=None,
                                      preferred_auth="password", connect_timeout=10)
    except (OSError, asyncssh.Error, ReplicaUnavailable) as err:
        gateways.forget(url)
        why = err.message if isinstance(err, ReplicaUnavailable) else f"{err.__class__.__name__}: {err}"
        process.stderr.write(f"hutch: the replica owning {sandbox_id} ({url}) does not answer: {why}\r\n".encode())
        return _EXIT_FAILED
    try:
        term_type = process.term_type
        upstream = await conn.create_process(
            process.command, subsystem=process.subsystem, term_type=term_type,
            term_size=process.term_size if term_type else None, encoding=None)
        await process.redirect(stdin=upstream.stdin, stdout=upstream.stdout, stderr=upstream.stderr)
        done = await upstream.wait()
        await process.stdout.drain()
    finally:
        conn.close()
        await conn.wait_closed()
    return done.exit_status if done.exit_status is not None else _EXIT_FAILED
