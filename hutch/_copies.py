"""Copies between the local disk and a sandbox (``copy_to``/``copy_from``, as ``hutch cp``
does), over the file service: whole files and trees streamed as tar, with the missing parent
directories created on the receiving side unless ``strict``. (The public docs are on
:class:`hutch.client.SandboxClient`, which delegates here.)"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import stat
import tarfile
import tempfile
from pathlib import Path

from hutch import _transfer
from hutch._files import SandboxFiles, drain_to
from hutch.errors import FileNotFound, InvalidInput, ServerError
from hutch.models import CopyResult


class Copies:
    """Local <-> sandbox copies, built on the file calls."""

    def __init__(self, files: SandboxFiles) -> None:
        self.files = files

    async def _remote_kind(self, sandbox_id: str, path: str) -> str | None:
        """"dir", "file" (symlinks count as files) or None when nothing is there."""
        p = path.rstrip("/")
        if p in ("", "."):
            return "dir"
        parent, name = posixpath.split(p)
        try:
            entries = await self.files.list_files(sandbox_id, parent or ".")
        except (FileNotFound, InvalidInput):
            return None
        for entry in entries:
            if entry.path == name:
                return "dir" if entry.is_dir else "file"
        return None

    async def _missing_dirs(self, sandbox_id: str, directory: str) -> list[str]:
        """The ancestors of ``directory`` (itself included) that do not exist, outermost first."""
        missing: list[str] = []
        d = directory.rstrip("/")
        while d not in ("", ".", "/"):
            try:
                await self.files.list_files(sandbox_id, d)
                break
            except FileNotFound:
                missing.append(d)
                d = posixpath.dirname(d)
        return missing[::-1]

    async def copy_to(
        self,
        sandbox_id: str,
        local: str | os.PathLike[str],
        dest: str,
        *,
        recursive: bool = False,
        strict: bool = False,
    ) -> CopyResult:
        src = _local_path(local)
        try:
            st = await asyncio.to_thread(os.stat, src)
        except OSError as err:
            raise InvalidInput(f"source {str(local)!r}: {err.strerror or err}", field="source") from err
        if stat.S_ISDIR(st.st_mode):
            if not recursive:
                raise InvalidInput(
                    f"source {str(local)!r} is a directory; copy it recursively (-r)",
                    field="recursive",
                )
        elif not stat.S_ISREG(st.st_mode):
            raise InvalidInput(f"source {str(local)!r} is not a regular file", field="source")
        name = src.name or (await asyncio.to_thread(src.resolve)).name
        target = dest
        if dest in ("", ".") or dest.endswith("/") or await self._remote_kind(sandbox_id, dest) == "dir":
            target = posixpath.join(dest or ".", name)
        target = target.rstrip("/")
        if not posixpath.basename(target):
            raise InvalidInput(f"destination {dest!r}: cannot replace the root directory", field="destination")
        parent = posixpath.dirname(target) or "."
        missing = await self._missing_dirs(sandbox_id, parent)
        if missing and strict:
            raise FileNotFound(
                f"directory {parent!r} does not exist in sandbox {sandbox_id} (strict: not creating it)",
                field="strict",
                sandbox_id=sandbox_id,
            )
        stats = _transfer.TarStats()
        result = await self.files.upload_archive(
            sandbox_id,
            _transfer.tar_stream(src, posixpath.basename(target), stats),
            path=parent,
            format="tar",
        )
        return CopyResult(
            source=str(local),
            destination=f"{sandbox_id}:{dest}",
            bytes_transferred=result.bytes or stats.bytes,
            files_transferred=result.files or stats.files,
            directories_created=missing,
        )

    async def copy_from(
        self,
        sandbox_id: str,
        source: str,
        local: str | os.PathLike[str],
        *,
        recursive: bool = False,
        strict: bool = False,
    ) -> CopyResult:
        kind = await self._remote_kind(sandbox_id, source)
        if kind is None:
            raise FileNotFound(
                f"{sandbox_id}:{source}: no such file or directory",
                field="source",
                sandbox_id=sandbox_id,
            )
        if kind == "dir" and not recursive:
            raise InvalidInput(
                f"{sandbox_id}:{source} is a directory; copy it recursively (-r)", field="recursive"
            )
        dest = _local_path(local)
        name = posixpath.basename(source.rstrip("/")) or sandbox_id
        if name == ".":
            name = sandbox_id
        local_text = os.fspath(local)
        into = local_text.endswith(os.sep) or await asyncio.to_thread(dest.is_dir)
        target = dest / name if into else dest
        parent = target.parent
        missing: list[Path] = []
        p = parent
        while not p.exists():
            missing.append(p)
            p = p.parent
        if missing and strict:
            raise InvalidInput(
                f"local directory {str(parent)!r} does not exist (strict: not creating it)",
                field="strict",
            )
        for d in reversed(missing):
            d.mkdir()
        if kind == "file":
            size = await self._receive_file(sandbox_id, source, target)
            files = 1
        else:
            if target.exists() and not target.is_dir():
                raise InvalidInput(
                    f"destination {str(target)!r} exists and is not a directory", field="destination"
                )
            files, size = await self._receive_tree(sandbox_id, source, target)
        return CopyResult(
            source=f"{sandbox_id}:{source}",
            destination=local_text,
            bytes_transferred=size,
            files_transferred=files,
            directories_created=[str(d) for d in reversed(missing)],
        )

    async def _receive_file(self, sandbox_id: str, source: str, target: Path) -> int:
        """The remote file into ``target`` through a temporary sibling (renamed when whole)."""
        tmp = tempfile.NamedTemporaryFile(  # noqa: SIM115 - renamed or removed below
            dir=target.parent, prefix=f".{target.name}.", suffix=".part", delete=False
        )
        try:
            with tmp:
                size = await drain_to(self.files.read_file(sandbox_id, source), tmp)
            os.replace(tmp.name, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp.name)
            raise
        return size

    async def _receive_tree(self, sandbox_id: str, source: str, target: Path) -> tuple[int, int]:
        """The remote directory unpacked into ``target``: (files, bytes)."""
        with tempfile.TemporaryFile(prefix="hutch-download-") as spool:
            await drain_to(self.files.iter_archive(sandbox_id, path=source, format="tar"), spool)
            await asyncio.to_thread(spool.seek, 0)
            try:
                return await asyncio.to_thread(_transfer.extract_tree, spool, target)
            except (tarfile.TarError, OSError) as err:
                raise ServerError(
                    f"could not unpack the archive of {sandbox_id}:{source}: {err}",
                    code="BAD_RESPONSE",
                ) from err


def _local_path(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.expanduser(path))
