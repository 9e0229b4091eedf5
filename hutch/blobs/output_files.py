"""The embedded profile's output streams (the port is ``core.output``): one append-only
file per stream under ``<data_dir>/output/``.

A stream is open exactly while this process holds its writer: after a restart every
stream is closed (its writer died with the old server), so no "closed" marker is ever
written — file creation is the expensive part of a short command's I/O here. For the same
reason a stream's file is made at its first byte: a stream that never got one (most
stderrs, every ``true``) has no file at all, and reads as empty.

The stream-id secret is a file beside the output (``<data_dir>/stream-secret``), made
once: a restarted server issues and accepts the same ids.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from hutch.core.output import CHUNK, OutputStreams, OutputWriter, check_offset, check_stream_id


class FileOutputWriter(OutputWriter):
    def __init__(self, stream_id: str, path: Path, cap: int) -> None:
        super().__init__(stream_id, cap)
        self.path = path
        self._fd: int | None = None  # made at the first byte (see the module docstring)
        self._changed = asyncio.Event()

    def _save(self, data: bytes) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.write(self._fd, data)
        self._wake()

    def finish(self) -> None:
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


class FileOutputStreams(OutputStreams):
    def __init__(self, data_dir: Path, cap_bytes: int, verify: Callable[[str], bool] = lambda _id: False) -> None:
        super().__init__(cap_bytes, verify)
        self.data_dir = data_dir
        self.root = data_dir / "output"
        self._open: dict[str, FileOutputWriter] = {}

    async def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    async def close_store(self) -> None:
        for stream_id in list(self._open):
            await self.close(stream_id)

    async def secret(self) -> bytes:
        path = self.data_dir / "stream-secret"
        if not path.exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32))
        return bytes.fromhex(path.read_text().strip())

    def _path(self, stream_id: str) -> Path:
        return self.root / check_stream_id(stream_id)

    async def open(self, stream_id: str) -> FileOutputWriter:
        writer = self._open.get(stream_id)
        if writer is None:
            writer = self._open[stream_id] = FileOutputWriter(stream_id, self._path(stream_id), self.cap)
        return writer

    async def close(self, stream_id: str) -> None:
        check_stream_id(stream_id)
        writer = self._open.pop(stream_id, None)
        if writer is not None:
            writer.finish()

    async def is_open(self, stream_id: str) -> bool:
        return check_stream_id(stream_id) in self._open

    async def size(self, stream_id: str) -> int:
        writer = self._open.get(check_stream_id(stream_id))
        if writer is not None:
            return writer.size
        try:
            return self._path(stream_id).stat().st_size
        except FileNotFoundError:
            return 0

    async def read(self, stream_id: str, offset: int = 0) -> AsyncIterator[bytes]:
        path = self._path(stream_id)
        check_offset(stream_id, offset)
        fh = None
        try:
            while True:
                live = self._open.get(stream_id)
                changed = live.changed if live is not None else None
                if fh is None:
                    try:
                        # Plain reads: the file is local and read in 64 KiB chunks from the page cache.
                        fh = open(path, "rb")  # noqa: ASYNC230, SIM115
                        fh.seek(offset)
                    except FileNotFoundError:
                        if live is None or live.closed:
                            return  # closed before its first byte: an empty stream
                        assert changed is not None
                        await changed.wait()
                        continue
                chunk = fh.read(CHUNK)
                if chunk:
                    yield chunk
                    continue
                if live is None or live.closed:
                    # Closed: drain anything written between our read and the close.
                    while rest := fh.read(CHUNK):
                        yield rest
                    return
                assert changed is not None
                await changed.wait()
        finally:
            if fh is not None:
                fh.close()
