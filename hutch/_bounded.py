"""What one call brings into this process from a sandbox, bounded: a file read whole, a
command's output, the names of an archive's files. A process serving many clients (``hutch mcp
--http``, every organization's sessions) holds what each of them asks for at once, and a
sandbox holds whatever its code wrote: a 200 MiB file read whole and answered as JSON took
that server to 14.6 GiB."""

from __future__ import annotations

import asyncio
import contextlib
import io
import queue
import tarfile
from collections.abc import AsyncIterator


class Kept:
    """An output sink (``execute(stdout=…)``) keeping the first ``limit`` bytes, counting the rest."""

    def __init__(self, limit: int) -> None:
        self.limit, self.data, self.dropped = limit, bytearray(), 0

    def __call__(self, chunk: bytes) -> None:
        room = max(0, self.limit - len(self.data))
        self.data += chunk[:room]
        self.dropped += max(0, len(chunk) - room)

    def text(self, what: str) -> str:
        """The kept bytes as text, and a line saying how much was not kept, if any. A cut that
        falls inside a UTF-8 character cuts before it (decoded, its first bytes read as a
        U+FFFD the command never wrote)."""
        data, dropped = bytes(self.data), self.dropped
        if dropped:
            part = _partial_character(data)
            data, dropped = data[:len(data) - part], dropped + part
        text = data.decode(errors="replace")
        if dropped:
            text += f"{'' if text.endswith(chr(10)) or not text else chr(10)}[hutch: {dropped} more bytes of " \
                    f"{what} not kept]\n"
        return text


def _partial_character(data: bytes) -> int:
    """How many bytes at the end of ``data`` begin a UTF-8 character that they do not finish."""
    for back in range(1, min(4, len(data) + 1)):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: its lead is further back
            continue
        length = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
        return back if length > back else 0
    return 0


async def read_at_most(chunks: AsyncIterator[bytes], limit: int) -> bytes | None:
    """The whole of ``chunks`` when it is at most ``limit`` bytes; None, read no further, when larger."""
    data = bytearray()
    async with contextlib.aclosing(chunks):  # type: ignore[type-var]
        async for chunk in chunks:
            data += chunk
            if len(data) > limit:
                return None
    return bytes(data)


class _Feed(io.RawIOBase):
    """A readable file over chunks put in a queue (None: the end), for tarfile in a thread."""

    def __init__(self, chunks: queue.Queue[bytes | None]) -> None:
        self.chunks, self.buf, self.ended = chunks, b"", False

    def readable(self) -> bool:
        return True

    def readinto(self, into: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self.buf and not self.ended:
            chunk = self.chunks.get()
            self.ended, self.buf = chunk is None, chunk or b""
        n = min(len(into), len(self.buf))
        into[:n] = self.buf[:n]
        self.buf = self.buf[n:]
        return n

    def drain(self) -> None:
        while not self.ended:
            self.ended = self.chunks.get() is None


def _names(feed: _Feed, most: int) -> tuple[list[str], int]:
    names: list[str] = []
    files = 0
    try:
        with tarfile.open(fileobj=io.BufferedReader(feed), mode="r|") as tar:  # a stream: no member held
            for member in tar:
                if member.isfile():
                    files += 1
                    if len(names) < most:
                        names.append(member.name.removeprefix("./"))
    finally:
        feed.drain()  # whatever happened, the sender is never left waiting on a full queue
    return names, files


async def archive_names(chunks: AsyncIterator[bytes], most: int) -> tuple[list[str], int]:
    """The names of the first ``most`` regular files of a tar archive, and how many it has: read
    as it arrives, its contents never held (a few chunks at a time)."""
    feed_queue: queue.Queue[bytes | None] = queue.Queue(maxsize=4)
    reading = asyncio.create_task(asyncio.to_thread(_names, _Feed(feed_queue), most))
    try:
        async with contextlib.aclosing(chunks):  # type: ignore[type-var]
            async for chunk in chunks:
                if reading.done():
                    break  # the reader failed: its error is told below
                await asyncio.to_thread(feed_queue.put, chunk)
    finally:
        await asyncio.to_thread(feed_queue.put, None)
    return await reading
