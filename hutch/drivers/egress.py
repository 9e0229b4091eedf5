"""``network.allow`` at run time: host names resolved by the server, and kept current.

A sandbox's allow-list becomes a set of IPv4 CIDRs (``resolve``); each driver turns the
set into its firewall rules. A host name's addresses change (CDNs rotate them), so an
``AllowLists`` re-resolves every ``HUTCH_ALLOW_REFRESH`` seconds (default 60) and hands a
changed set to the driver's ``apply``. The set only grows by what the names resolve to
now and drops what they no longer do; a name that fails to resolve keeps its last
addresses (a resolver hiccup must not cut a sandbox off, nor open it up).

The sandbox's own DNS queries are allowed to its name servers only: without them no name
could be used. That is a channel (a query carries data to whoever runs the name's
authoritative server); documented in the README as the limit of an allow-list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

from hutch.core.egress import FIELD, hostnames, is_network
from hutch.core.errors import InvalidInput

log = logging.getLogger(__name__)

REFRESH_SECONDS = float(os.environ.get("HUTCH_ALLOW_REFRESH", "60"))
RESOLVE_TIMEOUT = 10.0


async def _addresses(name: str) -> set[str]:
    loop = asyncio.get_running_loop()
    infos = await asyncio.wait_for(loop.getaddrinfo(name, None, family=socket.AF_INET, type=socket.SOCK_STREAM),
                                   RESOLVE_TIMEOUT)
    return {f"{info[4][0]}/32" for info in infos}


async def resolve(entries: Sequence[str], previous: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """Each entry's CIDRs. Without ``previous`` (at create) a name that does not resolve is a
    400 naming it; with it (a refresh) the name keeps its previous addresses."""
    out: dict[str, set[str]] = {e: {e} if is_network(e) else set() for e in entries}  # in their order
    names = hostnames(entries)
    results = await asyncio.gather(*(_addresses(n) for n in names), return_exceptions=True)
    for name, got in zip(names, results, strict=True):
        if isinstance(got, BaseException) or not got:
            if previous is None:
                why = f"{got}" if isinstance(got, BaseException) else "no IPv4 address"
                raise InvalidInput(f"{FIELD}: {name!r} does not resolve ({why or type(got).__name__})", field=FIELD)
            out[name] = previous.get(name, set())
            log.warning("network.allow: %s did not resolve (%s); keeping its last addresses", name, got)
        else:
            out[name] = got
    return out


# A sandbox's list as drivers keep it (in their state files): each entry and its CIDRs,
# in the order given. The rules are the union (flatten); the entries are the keys.
Resolved = dict[str, list[str]]
Apply = Callable[[str, Resolved], Awaitable[None]]


def flatten(resolved: Mapping[str, Iterable[str]]) -> list[str]:
    return sorted(set().union(*resolved.values())) if resolved else []


class AllowLists:
    """The allow-lists of a driver's live sandboxes, re-resolved in the background."""

    def __init__(self, apply: Apply, interval: float = REFRESH_SECONDS) -> None:
        self._apply = apply
        self._interval = interval
        self._lists: dict[str, dict[str, set[str]]] = {}
        self._task: asyncio.Task[None] | None = None

    async def first(self, sandbox_id: str, entries: Sequence[str]) -> Resolved:
        """Resolve a new sandbox's list (a 400 if a name does not resolve)."""
        resolved = await resolve(entries)
        self._lists[sandbox_id] = resolved
        self._ensure_running()
        return _listed(resolved)

    def adopt(self, sandbox_id: str, resolved: Resolved) -> None:
        """A sandbox whose rules are already in place (an earlier server's)."""
        if sandbox_id not in self._lists:
            self._lists[sandbox_id] = {e: set(c) for e, c in resolved.items()}
            self._ensure_running()

    def replace(self, sandbox_id: str, resolved: dict[str, set[str]]) -> None:
        """A live sandbox's new list, its rules already in force (update_network)."""
        self._lists[sandbox_id] = {e: set(c) for e, c in resolved.items()}
        self._ensure_running()

    def forget(self, sandbox_id: str) -> None:
        self._lists.pop(sandbox_id, None)

    async def refresh(self) -> None:
        """One round: re-resolve every list, apply the changed ones."""
        for sid, old in list(self._lists.items()):
            new = await resolve(list(old), old)
            if self._lists.get(sid) is not old:
                continue  # destroyed, or its list replaced (update_network), meanwhile
            self._lists[sid] = new
            if new != old:
                try:
                    await self._apply(sid, _listed(new))
                except Exception as err:  # a sandbox on its way out; the next round tries again
                    log.warning("network.allow: updating %s failed: %s", sid, err)
                    self._lists[sid] = old

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while self._lists:
            await asyncio.sleep(self._interval)
            try:
                await self.refresh()
            except Exception:
                log.exception("network.allow: refresh failed")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def _listed(resolved: dict[str, set[str]]) -> Resolved:
    return {entry: sorted(cidrs) for entry, cidrs in resolved.items()}
