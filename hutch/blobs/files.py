"""The embedded profile's blob store: plain files under a root directory (the data dir).

A key is a path below the root, so ``snapshots/snp_1.tar.gz`` is where the server kept
snapshot archives before there was a blob store: old data dirs keep working as they are.

A put writes a hidden temporary file next to the final name (keys never start with a
dot, so it cannot collide with one), fsyncs it, renames it over the final name and
fsyncs the directory: readers see the old file or the new one, whole, and a crash leaves
at most a hidden temporary file, never a partial key. A reader holds its open file, so a replace or delete under it does
not disturb it.

Only one host sees these files: this is the single-server profile. The digest is not
kept: ``stat`` gives none (``put`` returns the one it computed).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import stat
import uuid
from collections.abc import AsyncGenerator, AsyncIterable
from pathlib import Path
from typing import IO

from hutch.core.blobs import CHUNK, BlobInfo, BlobNotFound, BlobStore, check_key, check_prefix


class FileBlobStore(BlobStore):
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, key: str) -> Path:
        """Where ``key`` lives on disk (this profile only: tests and debugging)."""
        return self.root / check_key(key)

    async def put(self, key: str, chunks: AsyncIterable[bytes]) -> BlobInfo:
        final = self.path(key)
        await asyncio.to_thread(_make_dirs, final.parent)
        tmp = final.parent / f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part"
        digest, size = hashlib.sha256(), 0
        try:
            fh = await asyncio.to_thread(open, tmp, "wb")
            with fh:
                async for chunk in chunks:
                    digest.update(chunk)
                    size += len(chunk)
                    await asyncio.to_thread(fh.write, chunk)
                await asyncio.to_thread(_sync, fh)
            await asyncio.to_thread(_rename_durably, tmp, final)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        return BlobInfo(key=key, size=size, sha256=digest.hexdigest(), created=final.stat().st_mtime)

    async def link_file(self, key: str, source: Path) -> bool:
        """Put a complete local file by linking it into place (no second copy); False, with
        nothing changed, when it cannot be linked (another filesystem), so the caller copies."""
        final = self.path(key)
        await asyncio.to_thread(_make_dirs, final.parent)
        tmp = final.parent / f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part"
        try:
            await asyncio.to_thread(os.link, source, tmp)
        except OSError:
            return False
        try:
            await asyncio.to_thread(_sync_path, tmp)
            await asyncio.to_thread(_rename_durably, tmp, final)
        finally:
            # Also after a rename: one over another link to the same file does nothing.
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return True

    async def open(self, key: str) -> IO[bytes]:
        """The blob's file, open for reading; ``BlobNotFound`` if absent."""
        path = self.path(key)
        try:
            return await asyncio.to_thread(open, path, "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as err:
            raise BlobNotFound(f"blob {key!r} not found", key=key) from err

    async def open_local(self, key: str) -> IO[bytes]:
        """The blob's own file (no copy): a reader keeps it whole while it is replaced."""
        return await self.open(key)

    async def get(self, key: str) -> AsyncGenerator[bytes, None]:
        fh = await self.open(key)
        with fh:
            while block := await asyncio.to_thread(fh.read, CHUNK):
                yield block

    async def stat(self, key: str) -> BlobInfo:
        try:
            st = self.path(key).stat()
        except (FileNotFoundError, NotADirectoryError) as err:
            raise BlobNotFound(f"blob {key!r} not found", key=key) from err
        if not stat.S_ISREG(st.st_mode):
            raise BlobNotFound(f"blob {key!r} not found", key=key)
        return BlobInfo(key=key, size=st.st_size, sha256=None, created=st.st_mtime)

    async def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    async def delete(self, key: str) -> bool:
        try:
            self.path(key).unlink()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return False
        return True

    async def delete_prefix(self, prefix: str) -> int:
        check_prefix(prefix)
        return await asyncio.to_thread(self._delete_prefix, prefix)

    def _delete_prefix(self, prefix: str) -> int:
        head, _, partial = prefix.rpartition("/")
        parent = self.root / head if head else self.root
        try:
            names = os.listdir(parent)
        except (FileNotFoundError, NotADirectoryError):
            return 0
        removed = 0
        if not partial:  # a whole directory: it goes too
            removed = sum(1 for _, _, files in os.walk(parent) for f in files if not f.startswith("."))
            shutil.rmtree(parent, ignore_errors=True)
            return removed
        for name in names:
            if name.startswith(".") or not name.startswith(partial):
                continue  # another key, or a put in progress (its own to clean up)
            path = parent / name
            if path.is_dir() and not path.is_symlink():
                removed += sum(1 for _, _, files in os.walk(path) for f in files if not f.startswith("."))
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed += 1
        return removed


def _make_dirs(path: Path) -> None:
    """Directories a key needs, private to the server's user (archives hold workspaces)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)


def _sync(fh: IO[bytes]) -> None:
    fh.flush()
    os.fsync(fh.fileno())


def _sync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rename_durably(tmp: Path, final: Path) -> None:
    os.replace(tmp, final)
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself survives a power loss
    finally:
        os.close(fd)
