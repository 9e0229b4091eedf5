"""At most a few operations of one organization under way at once; what it asks beyond waits
in a queue of its own. Where the host does an operation in a small pool shared by every
organization (checkpoint copies: drivers/local/checkpoints.py), one organization asking for
many at once would otherwise fill the pool's queue, and another's one request would wait
behind all of them; so it waits behind at most ``per_org`` of each other organization's."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class OrgSlots:
    def __init__(self, per_org: int) -> None:
        self.per_org = per_org
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._users: dict[str, int] = {}  # holders and waiters: an idle organization's semaphore goes

    @contextlib.asynccontextmanager
    async def slot(self, org_id: str | None) -> AsyncIterator[None]:
        key = org_id or ""
        gate = self._slots.setdefault(key, asyncio.Semaphore(self.per_org))
        self._users[key] = self._users.get(key, 0) + 1
        try:
            async with gate:
                yield
        finally:
            self._users[key] -= 1
            if not self._users[key]:
                del self._users[key], self._slots[key]
