"""E2B's ``Idempotency-Key`` on a create: the same key from the same organization, within an
hour, answers with the sandbox the first request made instead of making another (a client
retrying a create whose answer it lost). Kept in this server's memory, bounded: a restart or
another replica does not know the key."""

from __future__ import annotations

import asyncio
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from hutch.core.errors import InvalidInput

KEEP_SECONDS = 3600.0
# Per organization: one making keys by the thousand forgets its own oldest, never another's
# (one global table let 10,000 keys of B evict A's, and A's retry made a second sandbox).
MAX_KEYS_PER_ORG = 1_000
_KEY = re.compile(r"^[a-z0-9-]{1,255}$")

_Made = OrderedDict[str, tuple[float, "asyncio.Future[str]"]]


class IdempotentCreates:
    def __init__(self) -> None:
        self._made: dict[str, _Made] = {}

    def size(self, org_id: str) -> int:
        return len(self._made.get(org_id, ()))

    async def once(self, org_id: str, key: str, create: Callable[[], Awaitable[str]]) -> tuple[str, bool]:
        """The sandbox id for ``key``, made by ``create`` unless it was already; and whether it
        was made now. A create that failed leaves the key free to try again."""
        if not _KEY.match(key):
            raise InvalidInput("Idempotency-Key: 1 to 255 lowercase letters, digits and hyphens",
                               field="Idempotency-Key")
        now = time.monotonic()
        made = self._made.setdefault(org_id, OrderedDict())
        while made and (now - next(iter(made.values()))[0] > KEEP_SECONDS or len(made) >= MAX_KEYS_PER_ORG):
            made.popitem(last=False)
        found = made.get(key)
        if found is not None:
            return await asyncio.shield(found[1]), False
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        made[key] = (now, future)
        try:
            sandbox_id = await create()
        except BaseException as err:
            made.pop(key, None)
            if isinstance(err, Exception):
                future.set_exception(err)
                future.exception()  # retrieved: a failure nobody else awaited is not "never retrieved"
            else:
                future.cancel()
            raise
        future.set_result(sandbox_id)
        return sandbox_id, True
