"""Files in a running sandbox, for the HTTP routes, archives and SFTP: the sandbox is made
ready first (creating waited out, a paused one woken) and every use counts as activity, so a
sandbox someone works in through its files does not idle out."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import IO

from hutch.core.driver_types import DirWatch
from hutch.core.errors import IllegalTransition
from hutch.core.models import SandboxState, SandboxStatus
from hutch.drivers.base import DriverRoles, FileInfo
from hutch.service import archives
from hutch.service.control import SandboxControl
from hutch.service.org_slots import OrgSlots
from hutch.service.reads import Reads
from hutch.service.spool_room import Spooled, SpoolRoom
from hutch.service.timeouts import Reaper
from hutch.storage.spool import private_dir

# A listing is held whole in the server while it is parsed and answered (up to
# core.limits.LIST_ENTRIES entries): an organization's run this many at a time, the rest
# waiting in its own queue, so that its hundreds of requests at once cannot each hold one.
LISTINGS_PER_ORG_AT_ONCE = 2


class FileAccess:
    def __init__(self, reads: Reads, control: SandboxControl, reaper: Reaper, roles: DriverRoles, *,
                 spool_bytes: int = archives.Limits().max_bytes, spool_dir: Path | None = None) -> None:
        self._reads, self._control, self._reaper, self._roles = reads, control, reaper, roles
        self._listings = OrgSlots(LISTINGS_PER_ORG_AT_ONCE)
        self._spools = SpoolRoom(spool_bytes)  # uploads and SFTP files spooled at once, per organization
        # Where they are spooled: the data directory's spool (private, cleared of a killed
        # server's leftovers at start: engine.py), as snapshots' archives are. Before, an upload
        # looked for a ``tmp`` there that nothing made, and both went to the system's /tmp,
        # which is memory where it is a tmpfs. None (tests without a data directory): /tmp.
        self._spool_dir = spool_dir

    async def spooled(self, sandbox_id: str) -> Spooled:
        """A transfer into or out of the sandbox spooled in the server's temporary files,
        counted in its organization's room (service/spool_room.py) until ``release``d."""
        sb = await self._reads.sandbox(sandbox_id)
        directory = None
        if self._spool_dir is not None:
            await asyncio.to_thread(private_dir, self._spool_dir)
            directory = str(self._spool_dir)
        return Spooled(self._spools, sb.spec.org_id if sb is not None else None, directory)

    @contextlib.asynccontextmanager
    async def spooling(self, sandbox_id: str) -> AsyncIterator[Spooled]:
        spooled = await self.spooled(sandbox_id)
        try:
            yield spooled
        finally:
            spooled.release()

    async def ready(self, sandbox_id: str) -> SandboxState:
        """A sandbox ready for file operations (and terminals, ports): waits out creating,
        wakes a paused one; scoped to the caller's organization."""
        sb = await self._reads.wait_not_creating(sandbox_id)
        if sb.status is SandboxStatus.PAUSED:
            sb = await self._control.resume(sandbox_id, auto=True)
        if sb.status not in (SandboxStatus.IDLE, SandboxStatus.RUNNING):
            raise IllegalTransition(
                f"cannot use files: sandbox {sandbox_id} is {sb.status.value}", sandbox_id=sandbox_id,
                sandbox_status=sb.status.value,
            )
        self.touch(sandbox_id)
        return sb

    def touch(self, sandbox_id: str) -> None:
        """Activity that is not an event still keeps a sandbox from idling out."""
        self._reaper.touch(sandbox_id)

    async def mkdir(self, sandbox_id: str, path: str, *, parents: bool) -> None:
        await self._roles.files.mkdir(sandbox_id, path, parents=parents)

    async def remove(self, sandbox_id: str, path: str, *, directory: bool, recursive: bool) -> bool:
        return await self._roles.files.remove(sandbox_id, path, directory=directory, recursive=recursive)

    async def list(self, sandbox_id: str, path: str) -> list[FileInfo]:
        sb = await self._reads.sandbox(sandbox_id)  # its organization's: the entries are its sandbox's
        async with self._listings.slot(sb.spec.org_id if sb is not None else None):
            return await self._roles.files.list_files(sandbox_id, path)

    def read(self, sandbox_id: str, path: str) -> AsyncIterator[bytes]:
        return self._roles.files.read_file(sandbox_id, path)

    async def write(self, sandbox_id: str, path: str, chunks: AsyncIterable[bytes], *, mode: int = 0o644,
                    parents: bool = True) -> int:
        return await self._roles.files.write_file(sandbox_id, path, chunks, mode=mode, parents=parents)

    async def symlink(self, sandbox_id: str, path: str, target: str) -> None:
        await self._roles.files.symlink(sandbox_id, path, target)

    async def rename(self, sandbox_id: str, source: str, destination: str) -> None:
        await self._roles.files.rename(sandbox_id, source, destination)

    @property
    def keeps_metadata(self) -> bool:
        return self._roles.capabilities.metadata

    async def set_metadata(self, sandbox_id: str, path: str, metadata: dict[str, str]) -> None:
        await self._roles.metadata.set_metadata(sandbox_id, path, metadata)

    async def watch(self, sandbox_id: str, path: str, *, recursive: bool) -> DirWatch:
        """The driver's watch of a directory (NotSupported naming the driver where it has none)."""
        return await self._roles.watches.watch_dir(sandbox_id, path, recursive=recursive)

    async def archive(self, sandbox_id: str, root: str, fmt: str) -> AsyncIterator[bytes]:
        """``root`` as a tar, tar.gz or zip stream; a missing ``root`` raises before any byte."""
        await self.list(sandbox_id, root)
        if fmt == "zip":
            return archives.zip_stream(self._roles, sandbox_id, root)
        return archives.tar_gz(self._roles, sandbox_id, root, compress=fmt == "tar.gz")

    async def extract(self, sandbox_id: str, dest: str, fmt: str | None, archive: IO[bytes],
                      limits: archives.Limits) -> archives.Extracted:
        done = await archives.extract(self._roles, sandbox_id, dest, fmt, archive, limits)
        self.touch(sandbox_id)
        return done
