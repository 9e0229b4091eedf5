"""A directory watch of the local driver: one ``hutch-nsexec fs watch`` inside the sandbox
(inotify, as the sandbox user, under its seccomp filter), its events read from a pipe.

Bounded without a queue of our own: the helper writes to a pipe of at most PIPE_SIZE
bytes and blocks when nobody reads it; meanwhile the kernel queues at most
``max_queued_events`` more and then says it dropped some (an overflow), which ends the
watch with an error naming it rather than handing out an incomplete history.

``flush`` asks the helper (a byte on its stdin) for every event queued so far and reads up
to its "F" mark: a change whose call returned before the flush is in the answer, never
late. The watch ends with its helper: closed, the directory gone, or the sandbox ended
(its pid namespace takes the helper with it)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Literal, Protocol

from hutch.core.driver_types import DirWatch, WatchEnded, WatchEvent
from hutch.core.errors import DriverFailure, RateLimited


class _Helper(Protocol):
    """The running helper (fsops._Proc; the nomad driver's is drivers/nomad/helpers.py), as
    much of it as a watch uses."""

    def poll(self) -> int | None: ...

    async def read(self, n: int = ...) -> bytes: ...

    async def write(self, data: bytes | memoryview) -> bool: ...

    def kill(self) -> None: ...

_KINDS: dict[bytes, Literal["create", "write", "remove", "rename", "chmod"]] = {
    b"C": "create", b"W": "write", b"R": "remove", b"N": "rename", b"M": "chmod"}


# A name relative to the watched directory: both helpers stop 64 directories down (fileops.h's
# watch_add, exec-agent/helper.go's add), each name at most 255 bytes; a record past this is not theirs.
MAX_NAME = 1 << 16


class _Overflow(Exception):
    pass


class LocalDirWatch(DirWatch):
    def __init__(self, proc: _Helper, finish: Callable[[], None], buffered: bytes, path: str) -> None:
        self._proc, self._finish, self._buf, self._path = proc, finish, buffered, path
        self._lock = asyncio.Lock()
        self._eof = False
        self._closed = False
        self._asked = 0  # flush marks asked for and not yet read (a flush cut short leaves one)

    @property
    def ended(self) -> bool:
        return self._closed or self._eof or self._proc.poll() is not None

    def _records(self) -> list[WatchEvent]:
        """The events of the complete records buffered; each flush mark among them is counted off."""
        events: list[WatchEvent] = []
        while (nl := self._buf.find(b"\n")) >= 0:
            kind, _, size = self._buf[:nl].partition(b" ")
            n = int(size)  # ValueError: not the helper's record (below)
            if not 0 <= n <= MAX_NAME:
                raise ValueError(f"a record of {n} bytes")
            if len(self._buf) < nl + 1 + n:
                break
            name, self._buf = self._buf[nl + 1:nl + 1 + n], self._buf[nl + 1 + n:]
            if kind == b"F":
                self._asked = max(0, self._asked - 1)
            elif kind == b"O":
                raise _Overflow
            elif kind in _KINDS:
                events.append(WatchEvent(_KINDS[kind], os.fsdecode(name)))
        return events

    async def _read(self) -> None:
        data = await self._proc.read()
        if not data:
            self._eof = True
        self._buf += data

    def _gone(self) -> WatchEnded:
        if self._closed:
            return WatchEnded(f"the watch of {self._path} was stopped")
        return WatchEnded(f"the watch of {self._path} ended (the directory or its sandbox is gone)")

    async def _guarded(self, take: Callable[[], Awaitable[list[WatchEvent]]]) -> list[WatchEvent]:
        if self._closed:
            raise self._gone()
        async with self._lock:
            try:
                return await take()
            except ValueError as err:
                # Not a record the helper writes: on the nomad driver the stream passes through a
                # process the sandbox's own code can impersonate (drivers/nomad/agent.py).
                await self.close()
                raise DriverFailure(f"the watch of {self._path} was ended: its helper's stream is not "
                                    f"its records ({err})") from None
            except _Overflow:
                await self.close()
                raise RateLimited(f"the watch of {self._path} fell behind: more changes than the kernel "
                                        "queues for one watcher were waiting and some were lost; watch again, "
                                        "or take events more often") from None

    async def flush(self) -> list[WatchEvent]:
        async def take() -> list[WatchEvent]:
            events: list[WatchEvent] = []
            asked = not self._eof and await self._proc.write(b"f")
            self._asked += asked
            while True:  # up to this call's mark, or (the helper gone) to the end of what it said
                events += self._records()
                if self._eof or (asked and not self._asked):
                    break
                await self._read()
            if not events and self._eof:
                raise self._gone()
            return events
        return await self._guarded(take)

    async def next(self) -> list[WatchEvent]:
        async def take() -> list[WatchEvent]:
            while True:
                events = self._records()
                if events:
                    return events
                if self._eof:
                    raise self._gone()
                await self._read()
        return await self._guarded(take)

    async def close(self) -> None:
        """Stop the helper; a reader waiting on it sees the end, then its pipes are let go."""
        if self._closed:
            return
        self._closed = True
        self._proc.kill()
        if self._lock.locked():
            try:
                async with asyncio.timeout(5):
                    async with self._lock:
                        pass
            except TimeoutError:
                pass
        self._finish()
