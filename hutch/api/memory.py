"""Keeping the server's resident memory flat under glibc's allocator.

bench/soak.py found RSS growing with load although the Python heap did not: glibc keeps freed
heap in per-thread arenas (one per thread that allocated, up to 8 per core: the executor's
threads each get one; a soak's server had 5 besides the main one) and it counts in RSS until
given back. So the server process caps the arenas at 2 before it starts anything (the soak's
server then has 1 besides the main one) and asks glibc every 30 s to return free pages
(``malloc_trim(0)``). Elsewhere (musl, macOS) there is nothing to do: both are no-ops that
say so by returning False.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

M_ARENA_MAX = -8  # glibc's malloc.h
MAX_ARENAS = 2
TRIM_EVERY_S = 30.0


def _glibc() -> Any:
    """The process's C library if it is glibc (the one with these knobs), else None."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    needed = ("gnu_get_libc_version", "mallopt", "malloc_trim")
    return libc if all(hasattr(libc, name) for name in needed) else None


LIBC: Any = _glibc()


def limit_arenas(count: int = MAX_ARENAS) -> bool:
    """Cap glibc's malloc arenas at ``count`` (before the executor's threads make their own).
    True if applied; False without glibc or if glibc refused."""
    if LIBC is None:
        return False
    applied = bool(LIBC.mallopt(ctypes.c_int(M_ARENA_MAX), ctypes.c_int(count)))
    if not applied:
        log.warning("mallopt(M_ARENA_MAX, %d) was refused; malloc arenas stay uncapped", count)
    return applied


def trim() -> bool:
    """Give glibc's free heap back to the system. True if some memory was returned; False if
    none was or without glibc."""
    if LIBC is None:
        return False
    return bool(LIBC.malloc_trim(ctypes.c_size_t(0)))


async def trim_periodically(every_s: float = TRIM_EVERY_S) -> None:
    """Trim every ``every_s`` seconds until cancelled."""
    while True:
        await asyncio.sleep(every_s)
        trim()


async def trim_ctx(app: web.Application) -> AsyncIterator[None]:
    """For the server process (``run_server``): the heap trimmed while it serves."""
    if LIBC is None:
        yield  # not glibc: nothing to trim
        return
    task = asyncio.create_task(trim_periodically(TRIM_EVERY_S), name="malloc-trim")
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
