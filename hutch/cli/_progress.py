"""The CLI's view of a runtime built at its first use: while a sandbox is ``creating``, the
build's steps (its ``runtime:build`` events) go to stderr as they arrive."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from hutch.client import SandboxClient
from hutch.errors import SandboxError
from hutch.models import SandboxCreated

POLL_SECONDS = 0.5
FINISH_SECONDS = 2.0  # after the command: the last steps, or give up


async def follow_build(client: SandboxClient, sandbox_id: str, note: Callable[[str], None]) -> str:
    """Print each build step of ``sandbox_id`` until it leaves ``creating``; returns its status."""
    seen: set[str] = set()
    while True:
        status = (await client.get_status(sandbox_id)).status
        newest = await client.list_events(sandbox_id, limit=100, direction="desc")  # the most the wire gives
        for event in reversed(newest):
            if event.type == "runtime:build" and event.event_id not in seen:
                seen.add(event.event_id)
                note(f"building runtime: {event.event.get('message', '')}")
        if status != "creating":
            return status
        await asyncio.sleep(POLL_SECONDS)


def follow_in_background(client: SandboxClient, note: Callable[[str], None]) -> tuple[
        Callable[[SandboxCreated], None], Callable[[], Awaitable[None]]]:
    """(on_created for ``client.run``, finish): follows the build only if the create said
    creating; ``finish`` lets the follower print the steps it has not printed yet."""
    tasks: list[asyncio.Task[str]] = []

    def on_created(created: SandboxCreated) -> None:
        if created.status == "creating":
            note("the runtime is not built on the server yet: building it first (first use)")
            tasks.append(asyncio.ensure_future(follow_build(client, created.sandbox_id, note)))

    async def finish() -> None:
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError, SandboxError):
                await asyncio.wait_for(task, FINISH_SECONDS)

    return on_created, finish
