"""The output store: stdout/stderr bytes of executions, which are not events.

Each stream is an append-only file under ``<data_dir>/output/`` with a byte cap; past
the cap bytes are dropped and the stream is marked truncated. Readers get the bytes
written so far and then follow the stream until it closes, so a stream URL works
while the command runs and gives the same bytes afterwards. A stream is open exactly
while this process holds its writer: after a restart every stream is closed (its
writer died with the old server), so no "closed" marker is ever written — file
creation is the expensive part of a short command's I/O here.

For the same reason a stream's file is made at its first byte: a stream that never
got one (most stderrs, every ``true``) has no file at all. Whether such a stream
exists is then the stream id's to say: ids are MACs the server derives from the
execution (``verify``), so a well-formed id the server issued reads as empty.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import attrs

_CHUNK = 64 * 1024


def new_stream_id() -> str:
    # A capability: the stream URL carries no auth header (the client fetches it bare),
    # so the id itself must be unguessable.
    return "stm_" + secrets.token_hex(16)


class OutputStream:
    def __init__(self, path: Path, cap: int) -> None:
        self.path = path
        self.cap = cap
        self.size = 0
        self.truncated = False
        self.closed = False
        self._fd: int | None = None  # made at the first byte (see the module docstring)
        self._changed = asyncio.Event()

    def write(self, data: bytes) -> None:
        if self.closed or not data:
            return
        room = self.cap - self.size
        if len(data) > room:
            data = data[: max(room, 0)]
            self.truncated = True
        if data:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.write(self._fd, data)
            self.size += len(data)
        self._wake()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._fd is not None:
            os.close(self._fd)
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    @property
    def changed(self) -> asyncio.Event:
        """Set at the next write or close; take it *before* reading to miss nothing."""
        return self._changed


class OutputStore:
    def __init__(self, root: Path, cap_bytes: int, verify: Callable[[str], bool] = lambda _id: False) -> None:
        self.root = root
        self.cap = cap_bytes
        self.verify = verify  # True for a stream id this server issued
        self._open: dict[str, OutputStream] = {}

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, stream_id: str) -> Path:
        if not stream_id.startswith("stm_") or not stream_id[4:].isalnum():
            raise KeyError(stream_id)
        return self.root / stream_id

    def create(self, stream_id: str) -> OutputStream:
        """Open the stream (the one already open under this id, if any: a command queued
        behind its runtime's build has its streams opened at create)."""
        stream = self._open.get(stream_id)
        if stream is None:
            stream = self._open[stream_id] = OutputStream(self._path(stream_id), self.cap)
        return stream

    def close(self, stream_id: str) -> None:
        stream = self._open.pop(stream_id, None)
        if stream is not None:
            stream.close()

    def is_open(self, stream_id: str) -> bool:
        return stream_id in self._open

    def exists(self, stream_id: str) -> bool:
        try:
            return stream_id in self._open or self._path(stream_id).exists() or self.verify(stream_id)
        except KeyError:
            return False

    async def read(self, stream_id: str) -> AsyncIterator[bytes]:
        """Everything written so far, then new bytes until the stream closes."""
        path = self._path(stream_id)
        fh = None
        try:
            while True:
                live = self._open.get(stream_id)
                changed = live.changed if live is not None else None
                if fh is None:
                    try:
                        # Plain reads: the file is local and read in 64 KiB chunks from the page cache.
                        fh = open(path, "rb")  # noqa: ASYNC230, SIM115
                    except FileNotFoundError:
                        if live is None or live.closed:
                            return  # closed before its first byte: an empty stream
                        assert changed is not None
                        await changed.wait()
                        continue
                chunk = fh.read(_CHUNK)
                if chunk:
                    yield chunk
                    continue
                if live is None or live.closed:
                    # Closed: drain anything written between our read and the close.
                    rest = fh.read()
                    if rest:
                        yield rest
                    return
                assert changed is not None
                await changed.wait()
        finally:
            if fh is not None:
                fh.close()


@attrs.frozen
class StreamOptions:
    """What ``stream`` in a create (its initial command) or an execute asks of the output."""

    timestamps: bool = False  # each line prefixed with the UTC time its first byte arrived
    ignore: frozenset[str] = frozenset()  # "stdout" / "stderr" given as "ignore": discarded
    stdin: str | None = None  # a stdin stream (api/input_streams.py) to read the command's input from


RAW_OUTPUT = StreamOptions()  # no stream options: the bytes as the command wrote them


class ExecutionSink:
    """Where a running command's bytes go: its two output streams, as ``StreamOptions`` say."""

    def __init__(self, stdout: OutputStream, stderr: OutputStream, options: StreamOptions = RAW_OUTPUT) -> None:
        self.streams = {"stdout": stdout, "stderr": stderr}
        self.options = options
        self._line_start = {"stdout": True, "stderr": True}

    def write(self, stream: str, data: bytes) -> None:
        if stream in self.options.ignore:
            return
        if self.options.timestamps:
            data = self._stamped(stream, data)
        self.streams[stream].write(data)

    def _stamped(self, stream: str, data: bytes) -> bytes:
        now = time.time()
        stamp = (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z ").encode()
        out = bytearray()
        for piece in data.splitlines(keepends=True):
            if self._line_start[stream]:
                out += stamp
            out += piece
            self._line_start[stream] = piece.endswith((b"\n", b"\r"))
        return bytes(out)

