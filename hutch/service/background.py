"""The engine's background tasks: work that outlives the request that started it (runtime
builds, executions, reaps, the timeouts watch), kept so that closing the engine ends them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Coroutine
from typing import Any

from hutch.core.errors import HutchError

log = logging.getLogger(__name__)


class Background:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, object], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        """Cancel every task still running and wait for each to end."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def quietly(work: Awaitable[object]) -> None:
    """Background work whose failure is already recorded (or has no one to tell): logged."""
    try:
        await work
    except HutchError as err:
        log.warning("background step failed: %s", err.message)
    except Exception:
        log.exception("background step failed")
