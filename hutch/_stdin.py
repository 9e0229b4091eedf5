"""stdin for a command, sent as Agentuity's stream service takes it: ``POST /streams`` makes a
stream, ``PUT /streams/{id}`` streams the bytes (paced by the command's reading: flat memory
for any size), and the create or execute names the stream in ``stream.stdin``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import sys
from collections.abc import AsyncIterable, AsyncIterator
from typing import IO, Union

from hutch._connection import Connection

#: What a command's stdin may be: bytes or text, a binary file (read as it is sent), or an
#: async iterable of byte chunks.
Stdin = Union[bytes, str, IO[bytes], AsyncIterable[bytes]]  # noqa: UP007 (a runtime alias)

_CHUNK = 64 * 1024


async def _chunks(data: Stdin) -> AsyncIterator[bytes]:
    if isinstance(data, str):
        data = data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        for start in range(0, len(data), _CHUNK):
            yield bytes(data[start:start + _CHUNK])
        return
    if isinstance(data, AsyncIterable):
        async for chunk in data:
            yield chunk
        return
    while chunk := await asyncio.to_thread(data.read, _CHUNK):  # a file: read as it is sent
        yield chunk


class StdinUpload:
    """A stdin stream on the server and the task sending it."""

    def __init__(self, stream_id: str, task: asyncio.Task[None]) -> None:
        self.stream_id = stream_id
        self.task = task

    @classmethod
    async def open(cls, connection: Connection, data: Stdin) -> StdinUpload:
        made = await connection.request("POST", "/streams", json={"name": "hutch-sdk-stdin"})
        stream_id = str(made.get("id") or (made.get("data") or {}).get("id"))

        async def send() -> None:
            async with connection.raw("PUT", f"/streams/{stream_id}", data=_chunks(data)) as resp:
                await resp.read()

        # Sent at once: the server holds the first chunks until the command reads them.
        return cls(stream_id, asyncio.create_task(send(), name=f"stdin-{stream_id}"))

    async def finish(self) -> None:
        """Wait for the upload to end (the command read it, or no longer wants it)."""
        await self.task

    async def cancel(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task


def piped_stdin() -> IO[bytes] | None:
    """This process's stdin when something was piped or redirected into it (``echo hi | hutch
    run -- cat``, ``< file``); None for a terminal, /dev/null or no stdin at all."""
    stream = sys.stdin
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (AttributeError, OSError, ValueError):
        return None
    if not (stat.S_ISFIFO(mode) or stat.S_ISREG(mode) or stat.S_ISSOCK(mode)):
        return None
    return stream.buffer
