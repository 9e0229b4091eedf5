"""Local temporary files on the way to and from a blob store.

Producers spool to a local temporary file before ``put`` (``spool``), so a slow database
never stalls a stream being exported from a sandbox, and a blob is put from a complete,
size-checked file (``put_file``; a store that keeps files links it into place rather than
copying it). Consumers that need a seekable, named file (tar checks, extraction) fetch one
with ``fetch``. A killed process leaves its spool files behind: ``clear_spool`` at start.

Which store keeps local files is the store's to say (``BlobStore.link_file`` and
``open_local``), so this module, the nomad driver and the engine need no adapter.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import IO

from hutch.core.blobs import CHUNK, BlobStore


async def spool(chunks: AsyncIterable[bytes], directory: Path | None = None) -> IO[bytes]:
    """``chunks`` in a temporary file (in ``directory``, which must exist), rewound; gone
    once the caller closes it."""
    tmp = tempfile.NamedTemporaryFile(dir=directory, prefix="spool-")  # noqa: SIM115 - the caller closes it
    try:
        async for chunk in chunks:
            await asyncio.to_thread(tmp.write, chunk)
        await asyncio.to_thread(tmp.flush)
        tmp.seek(0)
        return tmp
    except BaseException:
        tmp.close()
        raise


def private_dir(path: Path) -> None:
    """``path`` made if missing, for its owner only (spools hold workspaces and uploads)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def clear_spool(directory: Path, older_than: float = 3600) -> int:
    """Remove spooled files a killed process left in ``directory`` (only old ones: a
    live process may be spooling there right now); how many. Blobs' spools (``spool-``)
    and archive uploads' (``upload-``, service/archives.py)."""
    removed, cutoff = 0, time.time() - older_than
    for path in [*directory.glob("spool-*"), *directory.glob("upload-*")]:
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
    return removed


async def fetch(store: BlobStore, key: str, directory: Path | None = None) -> IO[bytes]:
    """The blob at ``key`` as a named local file, rewound; ``BlobNotFound`` if absent. A
    store that keeps files opens the blob itself (no copy); others copy it to a temporary
    file in ``directory``. Read it only: the caller closes it."""
    local = await store.open_local(key)
    if local is not None:
        return local
    async with contextlib.aclosing(store.get(key)) as chunks:
        return await spool(chunks, directory)


async def put_file(store: BlobStore, key: str, spooled: IO[bytes]) -> None:
    """A complete local file (``spool``'s) under ``key``. A store that keeps files links it
    into place when it can, so the embedded profile writes an archive once."""
    if await store.link_file(key, Path(spooled.name)):
        return
    spooled.seek(0)
    await store.put(key, read_file(spooled))


async def read_file(fh: IO[bytes]) -> AsyncIterator[bytes]:
    """An open file's remaining content, in ``CHUNK`` pieces, read off the event loop."""
    while block := await asyncio.to_thread(fh.read, CHUNK):
        yield block
