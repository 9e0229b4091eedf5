"""Streaming helpers for moving files between this machine and a sandbox.

Nothing here holds a whole file in memory: local files are read in chunks on a worker
thread, single files and directory trees are sent as a tar stream built on the fly, and
downloaded trees are spooled to a temporary file on disk before extraction.
"""

from __future__ import annotations

import asyncio
import os
import stat
import tarfile
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import IO, Protocol, TypeGuard

CHUNK = 1024 * 1024
_BLOCK = 512

#: What ``upload_archive`` accepts as a body: a local path, a binary file object, bytes,
#: or an (async) iterable of byte chunks.
Source = str | os.PathLike[str] | IO[bytes] | bytes | bytearray | AsyncIterable[bytes] | Iterable[bytes]


class _Readable(Protocol):
    """A binary file, as far as reading it in chunks goes."""

    def read(self, size: int, /) -> bytes: ...


async def file_chunks(fh: _Readable, chunk_size: int = CHUNK) -> AsyncIterator[bytes]:
    """A binary file's bytes, ``chunk_size`` at a time, read on a worker thread."""
    while chunk := await asyncio.to_thread(fh.read, chunk_size):
        yield chunk


async def path_chunks(path: str | os.PathLike[str], chunk_size: int = CHUNK) -> AsyncIterator[bytes]:
    fh = await asyncio.to_thread(open, path, "rb")
    try:
        async for chunk in file_chunks(fh, chunk_size):
            yield chunk
    finally:
        fh.close()


def _is_readable(source: object) -> TypeGuard[_Readable]:
    return hasattr(source, "read")


def _next_chunk(iterator: Iterator[bytes]) -> bytes | None:
    """The iterator's next chunk as bytes, None once it is exhausted (blocking: run on a thread)."""
    for chunk in iterator:
        return bytes(chunk)
    return None


async def source_chunks(source: Source) -> AsyncIterator[bytes]:
    """Any :data:`Source` as an async iterator of byte chunks (never read whole)."""
    if isinstance(source, (bytes, bytearray)):
        for i in range(0, len(source), CHUNK):
            yield bytes(source[i : i + CHUNK])
    elif isinstance(source, (str, os.PathLike)):
        async for chunk in path_chunks(source):
            yield chunk
    elif _is_readable(source):
        async for chunk in file_chunks(source):
            yield chunk
    elif isinstance(source, AsyncIterable):
        async for chunk in source:
            yield bytes(chunk)
    elif isinstance(source, Iterable):
        iterator = iter(source)
        while (piece := await asyncio.to_thread(_next_chunk, iterator)) is not None:
            yield piece
    else:
        raise TypeError(
            f"cannot upload a {type(source).__name__}; give a path, a binary file, bytes or an iterable of bytes"
        )


class TarStats:
    """Counts filled in while a tar stream is generated."""

    def __init__(self) -> None:
        self.files = 0
        self.directories = 0
        self.bytes = 0
        self.skipped: list[str] = []


def _header(info: tarfile.TarInfo) -> bytes:
    return info.tobuf(format=tarfile.PAX_FORMAT)


async def _regular(path: Path, info: tarfile.TarInfo, stats: TarStats) -> AsyncIterator[bytes]:
    """Header + exactly ``info.size`` bytes + padding (a file that changes while read is cut or padded)."""
    fh = await asyncio.to_thread(open, path, "rb")
    try:
        yield _header(info)
        left = info.size
        async for chunk in file_chunks(fh):
            if left <= 0:
                break
            chunk = chunk[:left]
            left -= len(chunk)
            yield chunk
        if left > 0:
            yield b"\0" * left
    finally:
        fh.close()
    if info.size % _BLOCK:
        yield b"\0" * (_BLOCK - info.size % _BLOCK)
    stats.files += 1
    stats.bytes += info.size


def _info(name: str, st: os.stat_result) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = int(st.st_mtime)
    return info


def _scan(directory: Path) -> list[os.DirEntry[str]]:
    """A directory's entries (blocking: run on a thread)."""
    return list(os.scandir(directory))


async def tar_stream(local: Path, arcname: str, stats: TarStats) -> AsyncIterator[bytes]:
    """An uncompressed tar of ``local`` (a file, or a directory tree) under ``arcname``.

    Symlinks inside a tree are stored as symlinks; sockets, fifos and devices are skipped
    (listed in ``stats.skipped``).
    """
    st = await asyncio.to_thread(os.stat, local)
    if not stat.S_ISDIR(st.st_mode):
        info = _info(arcname, st)
        info.size = st.st_size
        async for piece in _regular(local, info, stats):
            yield piece
        yield b"\0" * (2 * _BLOCK)
        return
    stack: list[tuple[Path, str]] = [(local, arcname)]
    while stack:
        directory, name = stack.pop()
        dst = await asyncio.to_thread(os.lstat, directory)
        info = _info(name + "/", dst)
        info.type = tarfile.DIRTYPE
        stats.directories += 1
        yield _header(info)
        entries = sorted(await asyncio.to_thread(_scan, directory), key=lambda e: e.name)
        subdirs: list[tuple[Path, str]] = []
        for entry in entries:
            child = Path(entry.path)
            child_name = f"{name}/{entry.name}"
            est = await asyncio.to_thread(os.lstat, child)
            if stat.S_ISLNK(est.st_mode):
                info = _info(child_name, est)
                info.type = tarfile.SYMTYPE
                info.linkname = await asyncio.to_thread(os.readlink, child)
                yield _header(info)
            elif stat.S_ISDIR(est.st_mode):
                subdirs.append((child, child_name))
            elif stat.S_ISREG(est.st_mode):
                info = _info(child_name, est)
                info.size = est.st_size
                async for piece in _regular(child, info, stats):
                    yield piece
            else:
                stats.skipped.append(str(child))
        stack.extend(reversed(subdirs))
    yield b"\0" * (2 * _BLOCK)


def extract_tree(archive: IO[bytes], target: Path) -> tuple[int, int]:
    """Extract a downloaded tar into ``target`` (created), refusing anything that would land
    outside it. Returns (files, bytes)."""
    target.mkdir(parents=True, exist_ok=True)
    files = size = 0
    with tarfile.open(fileobj=archive, mode="r:*") as tar:
        members = []
        for member in tar:
            if member.isreg():
                files += 1
                size += member.size
            members.append(member)
        tar.extractall(target, members=members, filter="data")
    return files, size

