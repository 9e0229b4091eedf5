"""envd's PTY processes on hutch's terminals (service/terminals.py): a Start with ``pty``
opens a terminal in the sandbox that lives on its own, as envd's do, until its command exits,
it is killed, or its sandbox ends. Each stream following it (Start's, then any Connect) gets
what it writes from then on; SendInput writes to it, Update resizes it."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from hutch.service.engine import Engine
from hutch.service.terminals import ActiveTerminal, TerminalOptions

log = logging.getLogger("hutch.api.e2b")
FOLLOWER_CHUNKS = 256  # what a slow stream may fall behind by before it is cut off

# An event for a follower: ("pty", bytes) or ("end", exit code).
Event = tuple[str, bytes | int]


class PtyProcess:
    def __init__(self, terminal: ActiveTerminal) -> None:
        self.terminal = terminal
        self.exit_code: int | None = None
        self._followers: set[asyncio.Queue[Event | None]] = set()
        self._pump: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, engine: Engine, sandbox_id: str, argv: tuple[str, ...], *, rows: int, cols: int,
                   cwd: str | None, env: dict[str, str]) -> PtyProcess:
        term = env.get("TERM", "xterm-256color")
        terminal = await engine.terminals.open(sandbox_id, TerminalOptions(command=argv, rows=rows, cols=cols,
                                                                          cwd=cwd, term=term), env=env)
        proc = cls(terminal)
        proc._pump = engine.background.spawn(proc._run(), f"e2b-pty-{sandbox_id}")
        return proc

    @property
    def running(self) -> bool:
        return self.exit_code is None

    def follow(self) -> asyncio.Queue[Event | None]:
        queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize=FOLLOWER_CHUNKS)
        if self.exit_code is not None:
            queue.put_nowait(("end", self.exit_code))
        else:
            self._followers.add(queue)
        return queue

    def leave(self, queue: asyncio.Queue[Event | None]) -> None:
        self._followers.discard(queue)

    def _send(self, event: Event) -> None:
        for queue in list(self._followers):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:  # a follower that does not read is let go, not waited for
                self._followers.discard(queue)
                with contextlib.suppress(asyncio.QueueFull):
                    queue.get_nowait()
                    queue.put_nowait(None)

    async def _run(self) -> None:
        code = -1
        try:
            while data := await self.terminal.read():
                self._send(("pty", data))
            code = await self.terminal.wait()
        except Exception:
            log.exception("an E2B terminal failed")
        finally:
            self.exit_code = code
            self._send(("end", code))
            with contextlib.suppress(Exception):
                await self.terminal.close()

    async def kill(self) -> None:
        await self.terminal.close()
