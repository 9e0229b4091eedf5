"""Whole trees over a driver's file primitives: the tar a directory's walk makes, and a tar
unpacked member by member.

Two users: ``service/archives.py`` for a driver without tar streams (its downloads and the
write phase of its uploads), and a driver that plays ``roles.TreeTransfer`` by walking its
own primitives where they are cheap (the local driver: each is a helper process on this host;
through a node agent the whole tree is one request instead of a round trip per file).

Every path is the driver's to resolve inside the sandbox, as the sandbox user
(``roles.SandboxFiles``), so nothing here opens a host path. An archive reaching
``untar_into_files`` has been checked whole by the service (no absolute names, no ``..``,
no links out, no hard links or devices, within the size and entry limits); the few checks
here only keep this module from writing what the service would have refused anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import queue
import stat
import tarfile
import threading
from collections.abc import AsyncIterable, AsyncIterator
from typing import IO

import attrs

from hutch.core.driver_types import FileInfo
from hutch.core.errors import InvalidInput
from hutch.drivers.roles import SandboxFiles

CHUNK = 256 * 1024
_DEPTH = 8  # chunks in flight between the loop and the tar thread


# ---------------------------------------------------------------- a tree as a tar


@attrs.frozen
class Entry:
    rel: str  # path inside the archive
    abs: str  # path inside the sandbox
    size: int
    mode: int
    mtime: float
    is_dir: bool
    link_target: str | None


async def walk(files: SandboxFiles, sandbox_id: str, root: str) -> AsyncIterator[Entry]:
    """``root`` and everything under it, depth first in name order; links are not followed."""
    entries = await files.list_files(sandbox_id, root)
    listed_is_file = len(entries) == 1 and not entries[0].is_dir and posixpath.basename(root.rstrip("/")) == entries[0].name
    if listed_is_file:
        e = entries[0]
        yield Entry(e.name, root, e.size, e.mode, e.mod_time, False, e.link_target if e.is_symlink else None)
        return
    # Directories still to walk are kept by name and listed when their turn comes: one listing
    # held at a time, not every listing of a directory's subdirectories at once (a tenant's
    # wide tree was all in the server's memory while it was downloaded).
    items: list[FileInfo] | None = entries
    stack: list[tuple[str, str]] = [("", root)]
    while stack:
        rel_dir, abs_dir = stack.pop()
        if items is None:
            items = await files.list_files(sandbox_id, abs_dir)
        for e in sorted(items, key=lambda x: x.name):
            rel = posixpath.join(rel_dir, e.name) if rel_dir else e.name
            full = posixpath.join(abs_dir, e.name)
            if e.is_symlink:
                yield Entry(rel, full, 0, e.mode, e.mod_time, False, e.link_target or "")
            elif e.is_dir:
                yield Entry(rel, full, 0, e.mode, e.mod_time, True, None)
                stack.append((rel, full))
            else:
                yield Entry(rel, full, e.size, e.mode, e.mod_time, False, None)
        items = None


async def file_chunks(files: SandboxFiles, sandbox_id: str, entry: Entry) -> AsyncIterator[bytes]:
    """Exactly ``entry.size`` bytes: a file that changed since it was listed is cut or padded,
    because the tar header already promised its size."""
    left = entry.size
    async for chunk in files.read_file(sandbox_id, entry.abs):
        if left <= 0:
            break
        chunk = chunk[:left]
        left -= len(chunk)
        yield chunk
    if left > 0:
        yield b"\0" * left


async def tar_from_files(files: SandboxFiles, sandbox_id: str, root: str) -> AsyncIterator[bytes]:
    """The uncompressed tar (PAX) of ``root``: directories, regular files and symlinks, names
    relative to it (or the one file ``root``), ending with the two zero blocks."""
    async for entry in walk(files, sandbox_id, root):
        info = tarfile.TarInfo(entry.rel + ("/" if entry.is_dir else ""))
        info.mode = stat.S_IMODE(entry.mode)
        info.mtime = int(entry.mtime)
        if entry.is_dir:
            info.type = tarfile.DIRTYPE
        elif entry.link_target is not None:
            info.type, info.linkname = tarfile.SYMTYPE, entry.link_target
        else:
            info.size = entry.size
        yield info.tobuf(format=tarfile.PAX_FORMAT)
        if info.isreg():
            async for chunk in file_chunks(files, sandbox_id, entry):
                yield chunk
            if entry.size % 512:
                yield b"\0" * (512 - entry.size % 512)
    yield b"\0" * 1024


# ---------------------------------------------------------------- a tar into a tree


async def write_member(files: SandboxFiles, sandbox_id: str, target: str, kind: str, *, mode: int = 0o644,
                       link: str = "", chunks: AsyncIterable[bytes] | None = None) -> int:
    """One checked archive member written at ``target``: a directory (made with its parents,
    in the driver's own mode: an archive's 0644 directory would lock its contents away), a
    symlink, or a file with ``mode`` from ``chunks``. Returns the bytes written."""
    if kind == "dir":
        await files.mkdir(sandbox_id, target, parents=True)
        return 0
    if kind == "symlink":
        await files.symlink(sandbox_id, target, link)
        return 0
    assert chunks is not None
    return await files.write_file(sandbox_id, target, chunks, mode=mode, parents=True)


def _member_name(info: tarfile.TarInfo) -> str:
    parts = [p for p in info.name.split("/") if p not in ("", ".")]
    if info.name.startswith("/") or ".." in parts or "\0" in info.name:
        raise InvalidInput(f"archive: entry {info.name!r} leaves the destination; refused", field="archive")
    return "/".join(parts)


def _kind(info: tarfile.TarInfo) -> str:
    if info.isdir():
        return "dir"
    if info.issym():
        return "symlink"
    if info.isreg():
        return "file"
    raise InvalidInput(f"archive: {info.name!r} is a hard link, device, fifo or other special file; refused",
                       field="archive")


class _Feed:
    """What the tar thread reads: the archive's chunks as the loop hands them over."""

    def __init__(self, chunks: queue.Queue[bytes | None], stop: threading.Event) -> None:
        self._chunks = chunks
        self._stop = stop
        self._buf = b""
        self._pos = 0  # tar reads a few KiB at a time: slices of a chunk, not copies of its rest
        self._eof = False

    def read(self, n: int = -1) -> bytes:
        while not self._eof and (n < 0 or len(self._buf) - self._pos < n):
            try:
                item = self._chunks.get(timeout=0.1)
            except queue.Empty:
                if self._stop.is_set():
                    raise OSError("the unpacking was stopped") from None
                continue
            if item is None:
                self._eof = True
            else:
                self._buf, self._pos = self._buf[self._pos:] + item, 0
        end = len(self._buf) if n < 0 else min(self._pos + n, len(self._buf))
        out, self._pos = self._buf[self._pos:end], end
        return out


_Parsed = tuple[str, str, int, str] | bytes | None | BaseException  # (kind, name, mode, link), data, end


async def untar_into_files(files: SandboxFiles, sandbox_id: str, dest: str, archive: AsyncIterable[bytes], *,
                           gzipped: bool) -> int:
    """Unpack a tar (or tar.gz) stream at ``dest`` (made with its parents) through the file
    primitives, member by member in archive order, as the sandbox user; returns the bytes of
    the files written. The tar is parsed by a thread as it arrives: memory stays flat (a few
    chunks each way) whatever the archive's size."""
    await files.mkdir(sandbox_id, dest, parents=True)
    feed: queue.Queue[bytes | None] = queue.Queue(maxsize=_DEPTH)
    # Parsed items reach the loop by call_soon_threadsafe, not by a worker thread per get:
    # an upload of 200 small files is 600 items, and a thread hop each cost ~15 % more CPU
    # than writing the members straight from the spooled archive did.
    loop = asyncio.get_running_loop()
    parsed: asyncio.Queue[_Parsed] = asyncio.Queue()
    room = threading.BoundedSemaphore(_DEPTH)  # the loop releases one per item taken
    stop = threading.Event()

    def put(q: queue.Queue[bytes | None], item: bytes | None) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def hand(item: _Parsed) -> bool:
        while not room.acquire(timeout=0.1):
            if stop.is_set():
                return False
        try:
            loop.call_soon_threadsafe(parsed.put_nowait, item)
        except RuntimeError:  # the loop is closed
            return False
        return True

    def parse() -> None:
        try:
            with tarfile.open(fileobj=_Feed(feed, stop), mode="r|gz" if gzipped else "r|") as tf:  # type: ignore[call-overload]
                for info in tf:
                    name, kind = _member_name(info), _kind(info)
                    if not name:
                        continue
                    if not hand((kind, name, stat.S_IMODE(info.mode) or 0o644, info.linkname)):
                        return
                    if kind == "file":
                        fh: IO[bytes] | None = tf.extractfile(info)
                        assert fh is not None
                        while data := fh.read(CHUNK):
                            if not hand(data):
                                return
                        if not hand(b""):  # the file's end
                            return
            hand(None)
        except BaseException as err:
            hand(err)

    source_failed: list[BaseException] = []

    async def pump() -> None:
        try:
            async for chunk in archive:
                if chunk and not await asyncio.to_thread(put, feed, bytes(chunk)):
                    return
        except Exception as err:  # the tar then ends short; the source's own error is the one to tell
            source_failed.append(err)
        await asyncio.to_thread(put, feed, None)

    async def take() -> _Parsed:
        item = await parsed.get()
        room.release()
        if isinstance(item, BaseException):
            raise source_failed[0] if source_failed else item
        return item

    async def content() -> AsyncIterator[bytes]:
        while data := await take():
            assert isinstance(data, bytes)
            yield data

    worker = threading.Thread(target=parse, name="tar-unpack", daemon=True)
    worker.start()
    feeder = asyncio.ensure_future(pump())
    written = 0
    try:
        while (item := await take()) is not None:
            assert isinstance(item, tuple)
            kind, name, mode, link = item
            written += await write_member(files, sandbox_id, posixpath.join(dest, name), kind, mode=mode, link=link,
                                          chunks=content() if kind == "file" else None)
        if source_failed:  # failed after the tar's end blocks: still not a whole upload
            raise source_failed[0]
        return written
    finally:
        stop.set()
        feeder.cancel()
        with contextlib.suppress(BaseException):
            await feeder
        close = getattr(archive, "aclose", None)  # tar stops at its end blocks: the rest is not needed
        if close is not None:
            with contextlib.suppress(BaseException):
                await close()
        await asyncio.to_thread(worker.join)  # its waits all give up within 0.1 s of ``stop``
