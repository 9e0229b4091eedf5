"""Runtime builds on first use, shared: one build per runtime at a time, however many
creates wait for it.

A driver that can build a catalog runtime it lacks (``Driver.build_runtime``) hands the
blocking work to ``Builds.run``: the first caller starts it in a worker thread; later
callers join it. Every caller's ``progress`` hears each line the build logs, from the
line it joined at, on the event loop. A build that fails raises its own error to every
waiter and is forgotten, so the next create tries again; the build itself leaves
nothing half-made (``drivers.local.rootfs.build`` renames a finished tree into place;
a registry tag appears only once the image's manifest is pushed).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

Progress = Callable[[str], None]
Log = Callable[[str], None]


class _Build:
    def __init__(self) -> None:
        self.listeners: list[Progress] = []
        self.task: asyncio.Task[None] | None = None


class Builds:
    def __init__(self) -> None:
        self._running: dict[str, _Build] = {}

    def building(self) -> set[str]:
        return set(self._running)

    async def run(self, name: str, progress: Progress, work: Callable[[Log], None]) -> None:
        """Run ``work(log)`` in a thread unless a build of ``name`` is under way; wait for it."""
        build = self._running.get(name)
        if build is None:
            build = self._running[name] = _Build()
            loop = asyncio.get_running_loop()

            def log(line: str) -> None:  # called from the build's thread
                loop.call_soon_threadsafe(self._tell, build, line)

            async def go() -> None:
                try:
                    await asyncio.to_thread(work, log)
                finally:
                    self._running.pop(name, None)

            build.task = asyncio.create_task(go(), name=f"build-{name}")
        build.listeners.append(progress)
        try:
            assert build.task is not None
            # shield: one waiter going away (its create was cancelled) stops no one else's build.
            await asyncio.shield(build.task)
        finally:
            with contextlib.suppress(ValueError):
                build.listeners.remove(progress)

    @staticmethod
    def _tell(build: _Build, line: str) -> None:
        for listener in list(build.listeners):
            with contextlib.suppress(Exception):
                listener(line)
