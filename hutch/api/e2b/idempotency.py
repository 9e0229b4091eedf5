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
MAX_KEYS = 10_000
_KEY = re.compile(r"^[a-z0-9-]{1,255}$")


class IdempotentCreates:
    def __init__(self) -> None:
        self._made: OrderedDict[tuple[str, str], tuple[float, asyncio.Future[str]]] = OrderedDict()

    async def once(self, org_id: str, key: str, create: Callable[[], Awaitable[str]]) -> tuple[str, bool]:
        """The sandbox id for ``key``, made by ``create`` unless it was already; and whether it
        was made now. A create that failed leaves the key free to try again."""
        if not _KEY.match(key):
            raise InvalidInput("Idempotency-Key: 1 to 255 lowercase letters, digits and hyphens",
                               field="Idempotency-Key")
        now = time.monotonic()
        while self._made and (now - next(iter(self._made.values()))[0] > KEEP_SECONDS or len(self._made) >= MAX_KEYS):
            self._made.popitem(last=False)
        found = self._made.get((org_id, key))
        if found is not None:
            return await asyncio.shield(found[1]), False
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._made[(org_id, key)] = (now, future)
        try:
            sandbox_id = await create()
        except BaseException as err:
            self._made.pop((org_id, key), None)
            if isinstance(err, Exception):
                future.set_exception(err)
                future.exception()  # retrieved: a failure nobody else awaited is not "never retrieved"
            else:
                future.cancel()
            raise
        future.set_result(sandbox_id)
        return sandbox_id, True
