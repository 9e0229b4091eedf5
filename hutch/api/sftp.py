"""SFTP (and scp) into a sandbox through the driver's file primitives (the file API's).

asyncssh's ``SFTPServer`` serves the *host's* files by default, method by method; every
public method is overridden here, so nothing falls through to it (tests/api/test_ssh.py
checks that a method asyncssh adds later fails the suite instead of opening the host).
What the primitives cannot do (rename, links, locks) is refused as unsupported.

Files are whole-file operations in the driver: a file opened for reading is fetched once,
a file opened for writing is collected and written at close. Both are spooled to a
server-side temporary file past 8 MiB, so memory stays flat, and both are bounded by the
server's upload limit (``max_upload_bytes``, 4 GiB): past it, "too large". A write far past a
file's end leaves a hole in that temporary file (a ``BytesIO`` would fill the gap with zeros
in the server's memory: one byte at offset 1 GiB took 1 GiB), and one read answers at most
4 MiB whatever the client asks.
"""

from __future__ import annotations

import contextlib
import posixpath
import stat
import tempfile
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import asyncssh
from asyncssh import SFTPAttrs, SFTPName

from hutch.core.errors import FileNotFound, HutchError, NotFound, NotSupported
from hutch.core.events import acting
from hutch.drivers.base import FileInfo
from hutch.service.spool_room import Spooled

if TYPE_CHECKING:
    from hutch.service.engine import Engine

HOME = "/home/agentuity"  # where a relative path starts (the sandbox user's home)
_SPOOL = 8 << 20
_READ_MAX = asyncssh.sftp.MAX_SFTP_READ_LEN  # 4 MiB: a read request may ask for 4 GiB
_USER = "agentuity"


class _Open:
    def __init__(self, path: str, writing: bool, limit: int, room: Spooled) -> None:
        self.path = path
        self.writing = writing
        self.limit = limit
        self.room = room  # what the organization's open files and uploads spool together (bounded)
        self.data = tempfile.SpooledTemporaryFile(max_size=_SPOOL, dir=room.directory)  # noqa: SIM115 - closed in release()
        self.mode = 0o644

    def reserve(self, end: int) -> None:
        """Make room for the file to reach ``end`` bytes: refused past the limit, or past what
        its organization may spool at once; on disk past the spool's size before anything is
        written, so a far write leaves a hole, not zeros."""
        if end > self.limit:
            raise _too_large(self.path, self.limit)
        try:
            self.room.grow_to(end)
        except HutchError as err:
            raise asyncssh.SFTPFailure(f"{self.path}: {err.message}") from None
        if end > _SPOOL:
            self.data.rollover()

    def release(self) -> None:
        self.data.close()
        self.room.release()


def _too_large(path: str, limit: int) -> asyncssh.SFTPError:
    return asyncssh.SFTPFailure(f"{path}: file too large for SFTP (at most {limit} bytes); use the file API "
                                "(GET /fs, POST /fs/upload) for larger files")


def _sftp_error(err: HutchError) -> asyncssh.SFTPError:
    if isinstance(err, FileNotFound | NotFound):
        return asyncssh.SFTPNoSuchFile(err.message)
    if isinstance(err, NotSupported):
        return asyncssh.SFTPOpUnsupported(err.message)
    return asyncssh.SFTPFailure(err.message)  # too large, not empty, not a directory: in words


def _attrs(info: FileInfo) -> SFTPAttrs:
    return SFTPAttrs(type=asyncssh.FILEXFER_TYPE_DIRECTORY if info.is_dir else
                     asyncssh.FILEXFER_TYPE_SYMLINK if info.is_symlink else asyncssh.FILEXFER_TYPE_REGULAR,
                     size=info.size, permissions=info.mode, atime=int(info.mod_time), mtime=int(info.mod_time),
                     uid=0, gid=0, owner=_USER, group=_USER)


# SFTPv3 carries names only beside ids: without uid/gid, asyncssh refuses to send "/"'s attributes.
_ROOT = SFTPAttrs(type=asyncssh.FILEXFER_TYPE_DIRECTORY, size=0, permissions=stat.S_IFDIR | 0o755, uid=0, gid=0,
                  owner="root", group="root")


class SandboxSftp(asyncssh.SFTPServer):
    """One SFTP session in the sandbox the login named (api/ssh_gateway.py: ``hutch_sandbox``)."""

    def __init__(self, chan: asyncssh.SSHServerChannel[bytes], engine: Engine) -> None:
        super().__init__(chan)
        self.engine = engine
        self.sandbox_id: str = chan.get_extra_info("hutch_sandbox")  # a relay's user name is not it
        self.principal = chan.get_extra_info("hutch_principal")
        self.ssh_key: str | None = chan.get_extra_info("hutch_ssh_key")  # None: a relay's (its front checks)
        self.limit = engine.snapshots.limits.max_bytes  # the server's max_upload_bytes

    # ------------------------------------------------------------ plumbing

    def _path(self, raw: bytes) -> str:
        path = raw.decode("utf-8", errors="strict") if raw else "."
        if "\x00" in path:
            raise asyncssh.SFTPBadMessage("a path with a NUL byte")
        return posixpath.normpath(posixpath.join(HOME, path))

    async def _call(self, work: Any) -> Any:
        """Run one driver call as the key's organization, with its errors in SFTP's words."""

        with acting(self.principal):
            try:
                tenants = self.engine.reads.tenants
                if tenants is not None:  # each operation is a request of the key's
                    if self.ssh_key is not None:  # a session outlives no key (removed, revoked, expired)
                        tenants.ssh_key_expiry(self.ssh_key)
                    tenants.throttle(self.principal)
                await self.engine.files.ready(self.sandbox_id)  # scoped; wakes a paused sandbox
                return await work()
            except HutchError as err:
                raise _sftp_error(err) from None

    async def _info(self, path: str) -> SFTPAttrs:
        if path == "/":
            return _ROOT
        parent, name = posixpath.split(path)
        entries = await self._call(lambda: self.engine.files.list(self.sandbox_id, parent))
        for entry in entries:
            if entry.name == name:
                return _attrs(entry)
        raise asyncssh.SFTPNoSuchFile(f"{path} does not exist")

    # ------------------------------------------------------------ names and attributes

    def format_user(self, uid: int | None) -> str:
        return _USER  # never a name from the host's user database

    def format_group(self, gid: int | None) -> str:
        return _USER

    def map_path(self, path: bytes) -> bytes:
        return path

    def reverse_map_path(self, path: bytes) -> bytes:
        return path

    async def realpath(self, path: bytes) -> bytes:
        return self._path(path).encode()

    async def stat(self, path: bytes) -> SFTPAttrs:
        return await self._info(self._path(path))

    async def lstat(self, path: bytes) -> SFTPAttrs:
        return await self._info(self._path(path))

    async def fstat(self, file_obj: object) -> SFTPAttrs:
        assert isinstance(file_obj, _Open)
        if file_obj.writing:
            size = file_obj.data.seek(0, 2)
            return SFTPAttrs(type=asyncssh.FILEXFER_TYPE_REGULAR, size=size, permissions=stat.S_IFREG | file_obj.mode)
        return await self._info(file_obj.path)

    async def setstat(self, path: bytes, attrs: SFTPAttrs) -> None:
        return None  # modes and times are the sandbox's business: accepted, not applied (scp -p)

    async def lsetstat(self, path: bytes, attrs: SFTPAttrs) -> None:
        return None

    async def fsetstat(self, file_obj: object, attrs: SFTPAttrs) -> None:
        if isinstance(file_obj, _Open) and attrs.permissions is not None:
            file_obj.mode = attrs.permissions & 0o777
        return None

    async def scandir(self, path: bytes) -> AsyncIterator[SFTPName]:
        where = self._path(path)
        entries = await self._call(lambda: self.engine.files.list(self.sandbox_id, where))
        yield SFTPName(b".", attrs=await self._info(where))
        yield SFTPName(b"..", attrs=await self._info(posixpath.dirname(where)))
        for entry in entries:
            yield SFTPName(entry.name.encode(), attrs=_attrs(entry))

    async def statvfs(self, path: bytes) -> Any:
        raise asyncssh.SFTPOpUnsupported("statvfs is not available in sandboxes")

    async def fstatvfs(self, file_obj: object) -> Any:
        raise asyncssh.SFTPOpUnsupported("statvfs is not available in sandboxes")

    # ------------------------------------------------------------ files

    async def open(self, path: bytes, pflags: int, attrs: SFTPAttrs) -> object:
        where = self._path(path)
        writing = bool(pflags & (asyncssh.FXF_WRITE | asyncssh.FXF_CREAT | asyncssh.FXF_TRUNC | asyncssh.FXF_APPEND))
        handle = _Open(where, writing, self.limit, await self.engine.files.spooled(self.sandbox_id))
        if attrs.permissions is not None:
            handle.mode = attrs.permissions & 0o777
        keep = writing and not pflags & asyncssh.FXF_TRUNC  # an update in place starts from the file
        if not writing or keep:
            try:
                size = (await self._info(where)).size or 0
                if size > self.limit:  # a sparse terabyte: refused at once
                    raise _too_large(where, self.limit)
                handle.reserve(size)  # the organization's room for it, before a byte is fetched
                await self._call(lambda: self._fetch(where, handle))
            except asyncssh.SFTPNoSuchFile:
                if not writing:
                    handle.release()
                    raise
            except BaseException:
                handle.release()
                raise
        return handle

    async def open56(self, path: bytes, desired_access: int, flags: int, attrs: SFTPAttrs) -> object:
        raise asyncssh.SFTPOpUnsupported("SFTP version 5/6 opens are not supported")

    async def _fetch(self, path: str, handle: _Open) -> None:
        got = 0
        async for chunk in self.engine.files.read(self.sandbox_id, path):
            got += len(chunk)
            handle.reserve(got)  # a link to a bigger file, /dev/zero: stopped at the limit
            handle.data.write(chunk)

    async def read(self, file_obj: object, offset: int, size: int) -> bytes:
        assert isinstance(file_obj, _Open)
        file_obj.data.seek(offset)
        return file_obj.data.read(min(size, _READ_MAX))

    async def write(self, file_obj: object, offset: int, data: bytes) -> int:
        assert isinstance(file_obj, _Open)
        if not file_obj.writing:
            raise asyncssh.SFTPPermissionDenied("the file was opened for reading")
        file_obj.reserve(offset + len(data))
        file_obj.data.seek(offset)
        return file_obj.data.write(data)

    async def close(self, file_obj: object) -> None:
        assert isinstance(file_obj, _Open)
        try:
            if file_obj.writing:
                file_obj.data.seek(0)
                await self._call(lambda: self.engine.files.write(
                    self.sandbox_id, file_obj.path, _chunks(file_obj), mode=file_obj.mode, parents=False))
        finally:
            file_obj.release()

    async def fsync(self, file_obj: object) -> None:
        return None  # written at close

    # ------------------------------------------------------------ directories and the rest

    async def mkdir(self, path: bytes, attrs: SFTPAttrs) -> None:
        where = self._path(path)
        await self._call(lambda: self.engine.files.mkdir(self.sandbox_id, where, parents=False))

    async def rmdir(self, path: bytes) -> None:
        where = self._path(path)
        if not await self._call(lambda: self.engine.files.remove(self.sandbox_id, where, directory=True,
                                                                   recursive=False)):
            raise asyncssh.SFTPNoSuchFile(f"{where} does not exist")

    async def remove(self, path: bytes) -> None:
        where = self._path(path)
        if not await self._call(lambda: self.engine.files.remove(self.sandbox_id, where, directory=False,
                                                                   recursive=False)):
            raise asyncssh.SFTPNoSuchFile(f"{where} does not exist")

    async def rename(self, oldpath: bytes, newpath: bytes) -> None:
        raise asyncssh.SFTPOpUnsupported("rename is not supported: copy and remove")

    async def posix_rename(self, oldpath: bytes, newpath: bytes) -> None:
        raise asyncssh.SFTPOpUnsupported("rename is not supported: copy and remove")

    async def readlink(self, path: bytes) -> bytes:
        where = self._path(path)
        parent, name = posixpath.split(where)
        entries = await self._call(lambda: self.engine.files.list(self.sandbox_id, parent))
        for entry in entries:
            if entry.name == name and entry.is_symlink and entry.link_target is not None:
                return entry.link_target.encode()
        raise asyncssh.SFTPNoSuchFile(f"{where} is not a symbolic link")

    async def symlink(self, oldpath: bytes, newpath: bytes) -> None:
        target, where = oldpath.decode(), self._path(newpath)
        await self._call(lambda: self.engine.files.symlink(self.sandbox_id, where, target))

    async def link(self, oldpath: bytes, newpath: bytes) -> None:
        raise asyncssh.SFTPOpUnsupported("hard links are not supported")

    async def lock(self, file_obj: object, offset: int, length: int, flags: int) -> None:
        raise asyncssh.SFTPOpUnsupported("locks are not supported")

    async def unlock(self, file_obj: object, offset: int, length: int) -> None:
        raise asyncssh.SFTPOpUnsupported("locks are not supported")

    def exit(self) -> None:
        # asyncssh closes an SFTP channel without an exit status, which scp reports as a
        # failure (exit 1) after a transfer that worked: say 0, as OpenSSH's sftp-server does.
        with contextlib.suppress(Exception):
            self.channel.exit(0)


async def _chunks(handle: _Open) -> AsyncIterator[bytes]:
    while chunk := handle.data.read(1 << 20):
        yield chunk

