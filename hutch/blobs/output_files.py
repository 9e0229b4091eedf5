"""The embedded profile's output streams (the port is ``core.output``): one append-only
file per stream under ``<data_dir>/output/``.

A stream is open exactly while this process holds its writer: after a restart every
stream is closed (its writer died with the old server), so no "closed" marker is ever
written — file creation is the expensive part of a short command's I/O here. For the same
reason a stream's file is made at its first byte: a stream that never got one (most
stderrs, every ``true``) has no file at all, and reads as empty.

The stream-id secret is a file beside the output (``<data_dir>/stream-secret``), made
once: a restarted server issues and accepts the same ids.

A stream with an owner is made as ``output/owned/<org>/<sandbox>/<stream>`` and linked to its
reading name ``output/<stream>`` (two names, one file): the file system is the index of whose
output is whose, with nothing else to keep in step after a crash. Each organization's total is
counted once at start (a walk of ``owned/``) and kept in memory after: the embedded profile has
one server process. Files without an owner (one link) were written before streams had owners.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from hutch.core.errors import InvalidInput
from hutch.core.output import (
    CHUNK,
    OutputStreams,
    OutputWriter,
    StreamOwner,
    check_offset,
    check_stream_id,
)

OWNED = "owned"  # output/owned/<org>/<sandbox>/<stream>: the owned streams' second names


class FileOutputWriter(OutputWriter):
    def __init__(self, store: FileOutputStreams, stream_id: str, path: Path, cap: int,
                 owner: StreamOwner | None) -> None:
        super().__init__(stream_id, cap, owner)
        self._store = store
        self.path = path
        self._fd: int | None = None  # made at the first byte (see the module docstring)
        self._changed = asyncio.Event()

    def _save(self, data: bytes) -> None:
        if self._fd is None:
            self._fd = self._store._create(self.path, self.owner)
        written = os.write(self._fd, data)
        if self.owner is not None:
            self._store._count(self.owner.org_id, written)
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
        self._stored: dict[str, int] = {}  # org -> bytes of its streams (counted at start)
        self._dirs: set[Path] = set()  # owned/<org>/<sandbox> directories known to exist

    async def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._stored = await asyncio.to_thread(self._count_owned)

    def _count_owned(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for owner, files in self._walk():
            totals[owner.org_id] = totals.get(owner.org_id, 0) + sum(size for _path, size in files)
        return totals

    def _walk(self, only: StreamOwner | None = None) -> list[tuple[StreamOwner, list[tuple[Path, int]]]]:
        """Each owner's files under ``owned/`` and their sizes."""
        found = []
        for owner in [only] if only is not None else self._owners():
            folder = self.root / OWNED / owner.org_id / owner.sandbox_id
            files = []
            for name in _names(folder):
                with contextlib.suppress(FileNotFoundError):
                    files.append((folder / name, (folder / name).stat().st_size))
            found.append((owner, files))
        return found

    def _create(self, path: Path, owner: StreamOwner | None) -> int:
        """A stream's file at its first byte: under its owner's directory, linked to its reading
        name (a reader waiting for it looks there)."""
        if owner is None:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        folder = self.root / OWNED / owner.org_id / owner.sandbox_id
        if folder not in self._dirs:
            folder.mkdir(parents=True, exist_ok=True)
            self._dirs.add(folder)
        owned = folder / path.name
        fd = os.open(owned, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with contextlib.suppress(FileExistsError):
            os.link(owned, path)
        return fd

    def _count(self, org_id: str, size: int) -> None:
        self._stored[org_id] = self._stored.get(org_id, 0) + size

    async def stored(self, org_id: str) -> int:
        return self._stored.get(org_id, 0)

    async def kept(self) -> list[StreamOwner]:
        return await asyncio.to_thread(self._owners)

    def _owners(self) -> list[StreamOwner]:
        """A sandbox's directory is made at its first stream's first byte and removed as it is
        dropped: the directories are the owners."""
        found = []
        for org in _names(self.root / OWNED):
            for sandbox in _names(self.root / OWNED / org):
                with contextlib.suppress(InvalidInput):
                    found.append(StreamOwner(org, sandbox))
        return found

    async def drop(self, owner: StreamOwner) -> int:
        freed = await asyncio.to_thread(self._unlink, owner)
        self._dirs.discard(self.root / OWNED / owner.org_id / owner.sandbox_id)
        left = self._stored.get(owner.org_id, 0) - freed
        if left > 0:
            self._stored[owner.org_id] = left
        else:
            self._stored.pop(owner.org_id, None)
        return freed

    def _unlink(self, owner: StreamOwner) -> int:
        freed = 0
        for _owner, files in self._walk(owner):
            for path, size in files:
                if path.name in self._open:
                    continue  # still written (not an ended sandbox's): left alone
                with contextlib.suppress(FileNotFoundError):
                    (self.root / path.name).unlink()  # the reading name first: no reader finds it now
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    freed += size
        with contextlib.suppress(OSError):  # gone, or not empty (a stream still written)
            (self.root / OWNED / owner.org_id / owner.sandbox_id).rmdir()
        return freed  # the organization's directory stays: its next sandbox's first byte may be on the way

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

    async def open(self, stream_id: str, owner: StreamOwner | None = None) -> FileOutputWriter:
        writer = self._open.get(stream_id)
        if writer is None:
            writer = self._open[stream_id] = FileOutputWriter(self, stream_id, self._path(stream_id), self.cap, owner)
        elif writer.owner is None and writer.size == 0:
            writer.owner = owner
        return writer

    async def close(self, stream_id: str) -> None:
        check_stream_id(stream_id)
        writer = self._open.pop(stream_id, None)
        if writer is not None:
            writer.finish()

    async def open_all(self, stream_ids: Sequence[str], owner: StreamOwner | None = None) -> list[OutputWriter]:
        # One after the other: neither suspends (no file until the first byte), so the caller
        # gets no loop turn where gather would give one, and a one-shot on its way to its launch
        # does not wait there behind the previous one-shot's teardown (docs/benchmarks.md).
        return [await self.open(stream_id, owner) for stream_id in stream_ids]

    async def close_all(self, stream_ids: Sequence[str]) -> None:
        for stream_id in stream_ids:  # as open_all: a close here does not suspend either
            await self.close(stream_id)

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


def _names(folder: Path) -> list[str]:
    try:
        return os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
