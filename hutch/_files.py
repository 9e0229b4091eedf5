"""Files and env of sandboxes over a :class:`~hutch._connection.Connection`: small files as
JSON, streamed reads, listings, directories, env variables, and whole archives streamed either
way. (The public docs are on :class:`hutch.client.SandboxClient`, which delegates here.)"""

from __future__ import annotations

import asyncio
import contextlib
import json as jsonlib
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import IO, cast

from hutch import _transfer
from hutch._connection import Connection, items, segment
from hutch._shapes import Files, _wire_files
from hutch.errors import InvalidInput
from hutch.models import SandboxFileInfo, UploadResult, from_wire

READ_CHUNK = 256 * 1024
#: Archive formats of ``/fs/download`` and ``/fs/upload``.
ARCHIVE_FORMATS = ("tar.gz", "zip", "tar")


class SandboxFiles:
    """Files, env and archives."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    async def write_files(self, sandbox_id: str, files: Files) -> int:
        resp = await self.connection.request(
            "POST",
            f"/fs/{segment(sandbox_id)}",
            json={"files": _wire_files(files) or []},
            sandbox_id=sandbox_id,
        )
        data = resp.get("data")
        if not isinstance(data, dict):
            data = {}
        return int(data.get("filesWritten", resp.get("filesWritten", 0)))

    async def read_file(
        self, sandbox_id: str, path: str, *, chunk_size: int = READ_CHUNK
    ) -> AsyncIterator[bytes]:
        async with self.connection.raw(
            "GET", f"/fs/{segment(sandbox_id)}", params={"path": path}, sandbox_id=sandbox_id
        ) as resp:
            async for chunk in resp.content.iter_chunked(chunk_size):
                yield chunk

    async def read_bytes(self, sandbox_id: str, path: str) -> bytes:
        return b"".join([chunk async for chunk in self.read_file(sandbox_id, path)])

    async def list_files(self, sandbox_id: str, path: str | None = None) -> list[SandboxFileInfo]:
        resp = await self.connection.request(
            "GET", f"/fs/list/{segment(sandbox_id)}", params={"path": path}, sandbox_id=sandbox_id
        )
        return [from_wire(SandboxFileInfo, item) for item in items(self.connection.data(resp), "files")]

    async def mkdir(self, sandbox_id: str, path: str, *, recursive: bool = False) -> None:
        await self.connection.request(
            "POST",
            f"/fs/mkdir/{segment(sandbox_id)}",
            json={"path": path, "recursive": recursive},
            sandbox_id=sandbox_id,
        )

    async def rm_file(self, sandbox_id: str, path: str) -> bool:
        resp = await self.connection.request(
            "POST", f"/fs/rm/{segment(sandbox_id)}", json={"path": path}, sandbox_id=sandbox_id
        )
        return bool(resp.get("found", True))

    async def rm_dir(self, sandbox_id: str, path: str, *, recursive: bool = False) -> bool:
        resp = await self.connection.request(
            "POST",
            f"/fs/rmdir/{segment(sandbox_id)}",
            json={"path": path, "recursive": recursive},
            sandbox_id=sandbox_id,
        )
        return bool(resp.get("found", True))

    async def set_env(self, sandbox_id: str, env: Mapping[str, str | None]) -> dict[str, str]:
        resp = await self.connection.request(
            "PATCH", f"/sandbox/env/{segment(sandbox_id)}", json={"env": dict(env)}, sandbox_id=sandbox_id
        )
        data = self.connection.data(resp)
        return dict(data.get("env", {})) if isinstance(data, dict) else {}

    async def iter_archive(
        self, sandbox_id: str, *, path: str | None = None, format: str = "tar.gz"
    ) -> AsyncIterator[bytes]:
        if format not in ARCHIVE_FORMATS:
            raise InvalidInput(
                f"format: expected one of {', '.join(ARCHIVE_FORMATS)}, got {format!r}",
                field="format",
            )
        async with self.connection.raw(
            "GET",
            f"/fs/download/{segment(sandbox_id)}",
            params={"path": path, "format": format},
            sandbox_id=sandbox_id,
        ) as resp:
            async for chunk in resp.content.iter_chunked(READ_CHUNK):
                yield chunk

    async def download_archive(
        self,
        sandbox_id: str,
        dest: str | os.PathLike[str] | IO[bytes],
        *,
        path: str | None = None,
        format: str = "tar.gz",
    ) -> int:
        return await save_to(self.iter_archive(sandbox_id, path=path, format=format), dest)

    async def upload_archive(
        self,
        sandbox_id: str,
        source: _transfer.Source,
        *,
        path: str | None = None,
        format: str | None = None,
    ) -> UploadResult:
        if format is not None and format not in (*ARCHIVE_FORMATS, "tgz"):
            raise InvalidInput(
                f"format: expected one of {', '.join(ARCHIVE_FORMATS)}, got {format!r}",
                field="format",
            )
        async with self.connection.raw(
            "POST",
            f"/fs/upload/{segment(sandbox_id)}",
            params={"path": path, "format": format},
            data=_transfer.source_chunks(source),
            headers={"Content-Type": "application/octet-stream"},
            sandbox_id=sandbox_id,
        ) as resp:
            text = await resp.text(errors="replace")
        try:
            body = jsonlib.loads(text) if text else {}
        except ValueError:
            body = {}
        data = body.get("data") if isinstance(body, dict) else None
        data = data if isinstance(data, dict) else {}
        return UploadResult(
            files=int(data.get("files", 0)),
            directories=int(data.get("directories", 0)),
            symlinks=int(data.get("symlinks", 0)),
            bytes=int(data.get("bytes", 0)),
        )


async def save_to(chunks: AsyncIterator[bytes], dest: str | os.PathLike[str] | IO[bytes]) -> int:
    """``chunks`` into a binary file or a local path; a partial local file is removed on failure."""
    if hasattr(dest, "write"):
        return await drain_to(chunks, cast(IO[bytes], dest))
    target = Path(cast("str | os.PathLike[str]", dest))
    fh = await asyncio.to_thread(open, target, "wb")
    try:
        with fh:
            return await drain_to(chunks, fh)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(target)
        raise


async def drain_to(chunks: AsyncIterator[bytes], fh: IO[bytes]) -> int:
    size = 0
    async for chunk in chunks:
        await asyncio.to_thread(fh.write, chunk)
        size += len(chunk)
    return size
