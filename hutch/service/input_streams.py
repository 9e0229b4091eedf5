"""stdin for commands, as Agentuity's stream service carries it: ``POST /streams`` makes a
stream (``{"id": …}``), ``PUT /streams/{id}`` sends its bytes (a streamed body), and a create
or execute naming it in ``stream.stdin`` gets those bytes as the command's standard input.

The real client's ``run({…}, {stdin})`` does exactly that when ``AGENTUITY_STREAM_URL`` points
at ``{hutch}/streams``. The bytes pass through a small bounded queue from the upload to the
command: an upload waits while the command has not read what came before, so a stdin of any
size costs the server a few chunks of memory, and a command that exits without reading it
all ends the upload (its answer still 200: the command had what it wanted). A stream is
read by one command, once; one never used is dropped after ``UNUSED_SECONDS``, one its
command is done with after ``DONE_SECONDS`` (kept that long so that a late upload is told 0
bytes were taken). Of the streams not done with, each of which may hold an upload's queue,
the server keeps ``MAX_STREAMS`` and an organization ``MAX_STREAMS_PER_ORG``: one tenant
cannot take them all from the others.

With several API replicas (api/replication.py) a stream lives in the replica that made it,
whose id ends in ``.<replica id>``: an upload reaching another replica is relayed there, and
a command run elsewhere reads the bytes from it over HTTP (``GET /streams/{id}/stdin``).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterable, Callable

from hutch.core.errors import IllegalTransition, InvalidInput, PayloadTooLarge
from hutch.core.tenancy import scoped_org, visible_org

QUEUE_CHUNKS = 16  # chunks of up to 64 KiB in flight between an upload and its command
MAX_STREAMS = 1000  # open streams per server
MAX_STREAMS_PER_ORG = 100  # of them, per organization
UNUSED_SECONDS = 600.0
DONE_SECONDS = 60.0


class _Stream:
    def __init__(self, name: str, org_id: str | None) -> None:
        self.name = name
        self.org_id = org_id  # made by a key of this organization: only its keys use it
        self.created = time.monotonic()
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=QUEUE_CHUNKS)
        self.uploading = False
        self.reading = False
        self.reader_gone = False  # the command ended: an upload still sending stops
        self.done_at = 0.0  # when it did (monotonic)


# (holder replica, stream id) -> the stream's bytes read from that replica (api/replication.py)
RemoteOpener = Callable[[str, str], AsyncGenerator[bytes, None]]


class InputStreams:
    def __init__(self) -> None:
        self._streams: dict[str, _Stream] = {}
        self.holder: str | None = None  # this replica's id, when there are several
        self.remote: RemoteOpener | None = None

    def holder_of(self, stream_id: str) -> str | None:
        """The other replica a stream lives in; None if here (or unknown: refused here)."""
        _, dot, holder = stream_id.partition(".")
        return holder if dot and holder != self.holder and self.remote is not None else None

    def create(self, name: str) -> str:
        self._expire()
        # Streams a command is done with hold no bytes (their queue is drained): not counted.
        held = [s for s in self._streams.values() if not s.reader_gone]
        if len(held) >= MAX_STREAMS:
            raise PayloadTooLarge(f"too many open stdin streams ({MAX_STREAMS}); use or let go of some first")
        org_id = scoped_org()
        if org_id is not None and sum(s.org_id == org_id for s in held) >= MAX_STREAMS_PER_ORG:
            raise PayloadTooLarge(f"organization {org_id} has {MAX_STREAMS_PER_ORG} open stdin streams, as many as "
                                  f"one may; use or let go of some first (one never read goes after "
                                  f"{UNUSED_SECONDS:g} s)")
        stream_id = "stin_" + secrets.token_hex(16) + (f".{self.holder}" if self.holder else "")
        self._streams[stream_id] = _Stream(name, org_id)
        return stream_id

    def _get(self, stream_id: str, field: str = "stream") -> _Stream:
        stream = self._streams.get(stream_id)
        if stream is None or not (stream.org_id is None or visible_org(stream.org_id)):
            raise InvalidInput(f"{field}: no stdin stream {stream_id!r} (make one with POST /streams; each is "
                               f"read once)", field=field)
        return stream

    def check(self, stream_id: str) -> None:
        """Refuse a create or execute naming a stream that is not there, or already taken
        (another replica's: checked there when the command reads it)."""
        if self.holder_of(stream_id):
            return
        if self._get(stream_id, "stream.stdin").reading:
            raise InvalidInput(f"stream.stdin: stream {stream_id} is already another command's stdin (each is read "
                               f"once; make another with POST /streams)", field="stream.stdin")

    async def upload(self, stream_id: str, chunks: AsyncIterable[bytes]) -> int:
        """Send an upload's chunks to the stream's command; returns the bytes it took."""
        stream = self._get(stream_id)
        if stream.uploading:
            raise IllegalTransition(f"stream {stream_id} is already being uploaded")
        stream.uploading = True
        sent = 0
        try:
            async for chunk in chunks:
                if stream.reader_gone:
                    break
                await self._put(stream_id, stream, chunk)
                sent += len(chunk)
            if not stream.reader_gone:
                await self._put(stream_id, stream, None)  # end of input
        finally:
            stream.uploading = False
        return sent

    @staticmethod
    async def _put(stream_id: str, stream: _Stream, item: bytes | None) -> None:
        if stream.reading:
            await stream.queue.put(item)
            return
        try:  # no command reads it yet: wait, but not for ever
            async with asyncio.timeout(UNUSED_SECONDS):
                await stream.queue.put(item)
        except TimeoutError:
            raise IllegalTransition(f"stream {stream_id}: no command read it within {UNUSED_SECONDS:g} s; name it "
                                    f"in stream.stdin of a create or execute") from None

    def reader(self, stream_id: str) -> _Reader | AsyncGenerator[bytes, None]:
        """The stream's bytes for one command, until the upload ends; ``aclose`` when the command
        is done with it (read or not), which ends an upload still sending."""
        if (holder := self.holder_of(stream_id)) and self.remote is not None:
            return self.remote(holder, stream_id)
        stream = self._get(stream_id, "stream.stdin")
        stream.reading = True
        return _Reader(stream)

    def _expire(self) -> None:
        now = time.monotonic()
        for stream_id, stream in list(self._streams.items()):
            if (stream.reader_gone and now - stream.done_at > DONE_SECONDS) or (
                    not stream.reading and now - stream.created > UNUSED_SECONDS):
                del self._streams[stream_id]


class _Reader:
    def __init__(self, stream: _Stream) -> None:
        self._stream = stream

    def __aiter__(self) -> _Reader:
        return self

    async def __anext__(self) -> bytes:
        if self._stream.reader_gone:
            raise StopAsyncIteration
        chunk = await self._stream.queue.get()
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        stream = self._stream
        stream.reader_gone = True  # kept a while: an upload arriving late is told 0 bytes were taken
        stream.done_at = time.monotonic()
        with contextlib.suppress(asyncio.QueueEmpty):  # an upload waiting on a full queue moves on
            while True:
                stream.queue.get_nowait()

