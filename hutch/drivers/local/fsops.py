"""The local driver's file primitives: each one is a ``hutch-nsexec fs`` process.

The helper enters the sandbox exactly as a command does (setns into its mount, pid,
net, ipc and uts namespaces, its cgroup, the sandbox uid, no capabilities,
no_new_privs, the seccomp filter) and then does one operation with plain syscalls. So
every path is resolved by the kernel in the sandbox's own view with the sandbox
user's permissions: ``..``, absolute paths and symlinks (to ``/etc/shadow``,
``/proc/1/root``, ``/proc/self/cwd``...) land in the sandbox's own files or nowhere;
nothing on the host side ever opens a path a sandbox chose.

Why the helper and not the runtime's own ``cat``/``tar``/``find``: no runtime has to
ship them, nothing is parsed from tool output (names with newlines, odd bytes), and
``rm -r`` never follows a link (fd-relative, ``O_NOFOLLOW``).

Reads and writes stream through pipes: ``read_file`` reads the pipe only when its
consumer asks for the next chunk (the helper blocks on a full pipe: backpressure),
``write_file`` writes each chunk as the pipe drains. Neither holds a file in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import subprocess
import time
from collections.abc import AsyncIterable, AsyncIterator

from hutch.core import limits
from hutch.core.errors import DriverFailure, InvalidInput, SandboxNotFound
from hutch.drivers.base import FileInfo
from hutch.drivers.fserrors import from_errno, named_path
from hutch.drivers.local.helper import set_done
from hutch.drivers.local.nsexec import Nsexec
from hutch.drivers.local.state import Registry
from hutch.drivers.local.watches import LocalDirWatch

CHUNK = 1 << 20
PIPE_SIZE = 1 << 20
SIMPLE_OP_LIMIT = 300.0  # seconds; rm -r of a huge tree


def _encode(path: str) -> bytes:
    raw = os.fsencode(path)
    if not raw or b"\0" in raw or len(raw) > 4096:
        raise InvalidInput(f"path: not a usable path: {path!r}", field="path")
    return raw


class _Proc:
    """One running ``hutch-nsexec fs`` and its pipes, driven from the event loop."""

    def __init__(self, popen: subprocess.Popen[bytes], status_r: int, leaf: str) -> None:
        self.popen = popen
        self.status_r = status_r
        self.leaf = leaf
        self.loop = asyncio.get_running_loop()
        self.pidfd = os.pidfd_open(popen.pid)
        assert popen.stdout is not None
        self.out = popen.stdout.fileno()
        os.set_blocking(self.out, False)
        with contextlib.suppress(OSError):
            fcntl.fcntl(self.out, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        self.inp = popen.stdin.fileno() if popen.stdin is not None else -1
        if self.inp >= 0:
            os.set_blocking(self.inp, False)
            with contextlib.suppress(OSError):
                fcntl.fcntl(self.inp, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        self.code: int | None = None

    async def _ready(self, fd: int, write: bool) -> None:
        fut: asyncio.Future[None] = self.loop.create_future()
        add, remove = (self.loop.add_writer, self.loop.remove_writer) if write else (self.loop.add_reader, self.loop.remove_reader)
        add(fd, set_done, fut)
        try:
            await fut
        finally:
            remove(fd)

    async def read(self, n: int = CHUNK) -> bytes:
        """Up to ``n`` bytes of stdout; b"" at EOF. Reads nothing ahead of the caller."""
        while True:
            try:
                return os.read(self.out, n)
            except BlockingIOError:
                await self._ready(self.out, False)

    async def read_all(self) -> bytes:
        parts = []
        while data := await self.read():
            parts.append(data)
        return b"".join(parts)

    async def write(self, data: bytes | memoryview) -> bool:
        """Write all of ``data`` to stdin as the pipe drains; False if the helper stopped reading."""
        view = memoryview(data)
        while view:
            try:
                sent = os.write(self.inp, view)
            except BlockingIOError:
                await self._ready(self.inp, True)
                continue
            except (BrokenPipeError, ConnectionResetError):
                return False
            view = view[sent:]
        return True

    def poll(self) -> int | None:
        return self.popen.poll()

    def close_stdin(self) -> None:
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            self.popen.stdin.close()

    async def wait(self) -> int:
        if self.code is None:
            if self.popen.poll() is None:
                await self._ready(self.pidfd, False)
            code = self.popen.wait()
            self.code = 128 - code if code < 0 else code
        return self.code

    def status(self) -> str:
        os.set_blocking(self.status_r, False)
        try:
            return os.read(self.status_r, 65536).decode(errors="replace")
        except BlockingIOError:
            return ""

    def kill(self) -> None:
        """Stop it (a consumer that went away): the host side dies, the sandbox side gets EPIPE."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()

    def close(self) -> None:
        self.kill()
        for pipe in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()
        for fd in (self.pidfd, self.status_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(Exception):
            self.popen.wait(timeout=1)


class Files:
    """The file primitives of the local driver's sandboxes (see the module docstring)."""

    def __init__(self, registry: Registry, nsexec: Nsexec) -> None:
        self._registry = registry
        self._nsexec = nsexec

    def _spawn_fs(self, sandbox_id: str, args: list[bytes], *, stdin: bool) -> _Proc:
        sb = self._registry.running(sandbox_id)
        self._registry.check_not_paused(sb)
        leaf = f"f-{os.getpid()}-{time.monotonic_ns()}"
        status_r, status_w = os.pipe()
        try:
            cmd: list[str | bytes] = [*self._nsexec.command("fs", sb, leaf, cwd=sb.home, env=None,
                                                            status_w=status_w), "--", *args]
            popen = subprocess.Popen(
                cmd, env={}, pass_fds=(status_w,), bufsize=0,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        except BaseException:
            os.close(status_r)
            self._nsexec.drop_leaf(sb.id, leaf)
            raise
        finally:
            os.close(status_w)
        try:
            return _Proc(popen, status_r, leaf)
        except BaseException:
            popen.kill()
            popen.wait()
            os.close(status_r)
            self._nsexec.drop_leaf(sb.id, leaf)
            raise

    def _finish(self, sandbox_id: str, proc: _Proc) -> None:
        proc.close()
        self._nsexec.drop_leaf(sandbox_id, proc.leaf)

    def _fs_error(self, sandbox_id: str, op: str, path: str, status: str, code: int | None) -> Exception:
        kind, _, rest = status.strip().partition("\t")
        if kind == "errno":
            num_text, _, message = rest.partition("\t")
            num = int(num_text) if num_text.isdigit() else 0
            return from_errno(op, named_path(message, num, path) if op == "mv" else path, num, message, sandbox_id)
        if kind == "cwd":
            return InvalidInput(f"the sandbox's home directory is gone ({rest})", field="path")
        if self._registry.load(sandbox_id) is None:
            return SandboxNotFound(f"sandbox {sandbox_id} was destroyed")
        return DriverFailure(f"sandbox {sandbox_id}: file operation {op} failed: {rest or status or f'exit {code}'}")

    async def _simple(self, sandbox_id: str, op: str, path: str, *args: bytes) -> bytes:
        proc = self._spawn_fs(sandbox_id, [op.encode(), _encode(path), *args], stdin=False)
        try:
            code, data = await asyncio.wait_for(self._collect(proc), SIMPLE_OP_LIMIT)
            if code != 0:
                raise self._fs_error(sandbox_id, op, path, proc.status(), code)
        except TimeoutError:
            raise DriverFailure(f"sandbox {sandbox_id}: file operation {op} took longer than {SIMPLE_OP_LIMIT:.0f}s") from None
        finally:
            self._finish(sandbox_id, proc)
        return data

    @staticmethod
    async def _collect(proc: _Proc) -> tuple[int, bytes]:
        data = await proc.read_all()
        return await proc.wait(), data

    async def _opened(self, sandbox_id: str, op: str, path: str, proc: _Proc) -> bytes:
        """Wait for the helper's "ok" line; returns bytes read past it. Raises its failure."""
        got = b""
        while len(got) < 3:
            data = await proc.read(CHUNK)
            if not data:
                break
            got += data
        if got[:3] != b"ok\n":
            code = await proc.wait()
            raise self._fs_error(sandbox_id, op, path, proc.status(), code)
        return got[3:]

    # -- the Driver primitives ------------------------------------------------------

    async def read_file(self, sandbox_id: str, path: str) -> AsyncIterator[bytes]:
        proc = self._spawn_fs(sandbox_id, [b"read", _encode(path)], stdin=False)
        try:
            rest = await self._opened(sandbox_id, "read", path, proc)
            if rest:
                yield rest
            while data := await proc.read(CHUNK):
                yield data
            code = await proc.wait()
            if code != 0:
                raise self._fs_error(sandbox_id, "read", path, proc.status(), code)
        finally:
            self._finish(sandbox_id, proc)

    async def write_file(
        self, sandbox_id: str, path: str, chunks: AsyncIterable[bytes], *, mode: int = 0o644, parents: bool = True
    ) -> int:
        args = [b"write", _encode(path), b"%o" % (mode & 0o777), b"1" if parents else b"0"]
        proc = self._spawn_fs(sandbox_id, args, stdin=True)
        total = 0
        try:
            await self._opened(sandbox_id, "write", path, proc)
            async for chunk in chunks:
                if not await proc.write(chunk):
                    break  # the helper failed: its status says why
                total += len(chunk)
            proc.close_stdin()
            code = await proc.wait()
            if code != 0:
                raise self._fs_error(sandbox_id, "write", path, proc.status(), code)
        finally:
            self._finish(sandbox_id, proc)
        return total

    async def list_files(self, sandbox_id: str, path: str) -> list[FileInfo]:
        """The entries of ``path`` (or ``path`` itself, a file), at most ``limits.LIST_ENTRIES``
        of them: the helper's answer is read up to ``limits.LIST_BYTES`` and parsed in a thread,
        since a sandbox makes entries far cheaper than the server holds and parses them."""
        proc = self._spawn_fs(sandbox_id, [b"list", _encode(path)], stdin=False)
        try:
            out = await asyncio.wait_for(self._listing(proc, path), SIMPLE_OP_LIMIT)
            code = await proc.wait()
            if code != 0:
                raise self._fs_error(sandbox_id, "list", path, proc.status(), code)
        except TimeoutError:
            raise DriverFailure(f"sandbox {sandbox_id}: file operation list took longer than {SIMPLE_OP_LIMIT:.0f}s") from None
        finally:
            self._finish(sandbox_id, proc)
        return await asyncio.to_thread(_parse_listing, out, path, limits.LIST_ENTRIES)

    @staticmethod
    async def _listing(proc: _Proc, path: str) -> bytes:
        parts, size = [], 0
        while data := await proc.read():
            size += len(data)
            if size > limits.LIST_BYTES:
                raise limits.too_many_entries(path)  # _finish kills the helper mid-way
            parts.append(data)
        return b"".join(parts)

    async def mkdir(self, sandbox_id: str, path: str, *, parents: bool) -> None:
        await self._simple(sandbox_id, "mkdir", path, b"1" if parents else b"0")

    async def remove(self, sandbox_id: str, path: str, *, directory: bool, recursive: bool) -> bool:
        out = await self._simple(sandbox_id, "rm", path, b"1" if directory else b"0", b"1" if recursive else b"0")
        return out.startswith(b"removed")

    async def symlink(self, sandbox_id: str, path: str, target: str) -> None:
        await self._simple(sandbox_id, "symlink", path, _encode(target))

    async def rename(self, sandbox_id: str, source: str, destination: str) -> None:
        await self._simple(sandbox_id, "mv", source, _encode(destination))

    async def set_metadata(self, sandbox_id: str, path: str, metadata: dict[str, str]) -> None:
        pairs = [os.fsencode(part) for item in metadata.items() for part in item]
        await self._simple(sandbox_id, "meta", path, *pairs)

    async def watch_dir(self, sandbox_id: str, path: str, *, recursive: bool) -> LocalDirWatch:
        proc = self._spawn_fs(sandbox_id, [b"watch", _encode(path), b"1" if recursive else b"0"], stdin=True)
        try:
            rest = await asyncio.wait_for(self._opened(sandbox_id, "watch", path, proc), SIMPLE_OP_LIMIT)
        except BaseException:
            self._finish(sandbox_id, proc)
            raise
        return LocalDirWatch(proc, lambda: self._finish(sandbox_id, proc), rest, path)


def _parse_listing(out: bytes, path: str, most: int) -> list[FileInfo]:
    """The helper's ``list`` answer: per entry a line of numbers, then its name, link target
    and metadata (NUL-separated pairs) of the lengths that line gives."""
    entries: list[FileInfo] = []
    pos = 0
    while pos < len(out):
        if len(entries) >= most:
            raise limits.too_many_entries(path)
        nl = out.index(b"\n", pos)
        mode_s, size_s, sec_s, nsec_s, nlen_s, llen_s, owner, group, mlen_s = out[pos:nl].split()
        nlen, llen, mlen = int(nlen_s), int(llen_s), int(mlen_s)
        name = out[nl + 1 : nl + 1 + nlen]
        link = out[nl + 1 + nlen : nl + 1 + nlen + llen]
        pairs = out[nl + 1 + nlen + llen : nl + 1 + nlen + llen + mlen].split(b"\0")
        pos = nl + 1 + nlen + llen + mlen
        mode = int(mode_s, 8)
        is_link = (mode & 0o170000) == 0o120000
        entries.append(FileInfo(
            name=os.fsdecode(name), size=int(size_s), is_dir=(mode & 0o170000) == 0o040000, mode=mode,
            mod_time=int(sec_s) + int(nsec_s) / 1e9, is_symlink=is_link,
            link_target=os.fsdecode(link) if is_link else None, owner=os.fsdecode(owner),
            group=os.fsdecode(group),
            metadata={os.fsdecode(k): os.fsdecode(v) for k, v in zip(pairs[0:-1:2], pairs[1:-1:2], strict=True)}))
    entries.sort(key=lambda e: e.name)
    return entries
