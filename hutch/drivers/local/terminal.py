"""Terminals of the local driver: a command on a pseudo-terminal of the sandbox's own devpts.

hutch-nsexec ``exec --tty-fd SOCK`` enters the sandbox like any execution (same user,
cgroup leaf, rlimits, seccomp), opens ``/dev/ptmx`` there and sends the master back over
SOCK; the peer becomes the command's controlling terminal. The server then holds the
master: what it writes is typed input (the line discipline turns 0x03 into SIGINT for the
foreground process group), what it reads is the screen, and TIOCSWINSZ on it resizes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import socket
import struct
import subprocess
import termios
from collections.abc import Awaitable, Callable, Sequence

from hutch.drivers.base import PtySession
from hutch.drivers.local.helper import set_done

_HANGUP_GRACE = 1.0  # seconds a hung-up session has to exit before its tree is killed


class StartFailed(Exception):
    """The helper ended before the terminal was made; ``args[0]`` is its status line."""


class LocalTerminal(PtySession):
    def __init__(self, proc: subprocess.Popen[bytes], pidfd: int, master: int,
                 kill: Callable[[], Awaitable[None]], release: Callable[[], None]) -> None:
        self.pid = proc.pid
        self._proc = proc
        self._pidfd = pidfd
        self._master = master
        self._kill = kill
        self._release = release
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[None] = self._loop.create_future()
        self._loop.add_reader(pidfd, self._on_exit)
        self._code: int | None = None
        self._closed = False
        os.set_blocking(master, False)

    def _on_exit(self) -> None:
        self._loop.remove_reader(self._pidfd)
        if not self._exited.done():
            self._exited.set_result(None)

    async def _ready(self, writer: bool) -> None:
        fut: asyncio.Future[None] = self._loop.create_future()
        add, remove = ((self._loop.add_writer, self._loop.remove_writer) if writer
                       else (self._loop.add_reader, self._loop.remove_reader))
        add(self._master, set_done, fut)
        try:
            await fut
        finally:
            remove(self._master)

    async def read(self) -> bytes:
        while not self._closed:
            try:
                return os.read(self._master, 65536)
            except BlockingIOError:
                await self._ready(writer=False)
            except OSError as err:  # EIO: every holder of the peer is gone
                if err.errno == errno.EIO:
                    return b""
                raise
        return b""

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self._closed:
            try:
                view = view[os.write(self._master, view):]
            except BlockingIOError:
                await self._ready(writer=True)
            except OSError:
                return  # the session ended: nobody reads input any more

    async def resize(self, rows: int, cols: int) -> None:
        if not self._closed:
            fcntl.ioctl(self._master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    async def wait(self) -> int:
        await asyncio.shield(self._exited)
        if self._code is None:
            code = self._proc.wait()
            self._code = 128 - code if code < 0 else code
        return self._code

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Closing the master hangs up the terminal: the session leader and the foreground
        # group get SIGHUP, as when an SSH connection drops.
        with contextlib.suppress(ValueError, KeyError):
            self._loop.remove_reader(self._master)
            self._loop.remove_writer(self._master)
        os.close(self._master)
        try:
            await asyncio.wait_for(asyncio.shield(self._exited), _HANGUP_GRACE)
        except TimeoutError:
            await self._kill()  # what ignores SIGHUP goes with its whole tree
            await asyncio.shield(self._exited)
        await self.wait()
        os.close(self._pidfd)
        self._release()


async def spawn(cmd: list[str], argv: Sequence[str], *, rows: int, cols: int, status_r: int, status_w: int,
                kill: Callable[[], Awaitable[None]], release: Callable[[], None],
                extra_fds: Sequence[int] = ()) -> LocalTerminal:
    """Start the helper (``cmd`` is its command line up to ``--``) and take the terminal it
    makes. A helper that fails first (no such working directory, ...) raises, with its words."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    loop = asyncio.get_running_loop()
    try:
        try:
            proc = subprocess.Popen(  # noqa: ASYNC220 - a vfork+exec of a static binary
                [*cmd, "--tty-fd", str(theirs.fileno()), "--tty-size", f"{rows}x{cols}", "--", *argv],
                env={}, pass_fds=(status_w, theirs.fileno(), *extra_fds),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            theirs.close()
            for fd in (status_w, *extra_fds):  # the helper has them now (an env memfd among them)
                os.close(fd)
        pidfd = os.pidfd_open(proc.pid)
        got: asyncio.Future[None] = loop.create_future()
        ended: asyncio.Future[None] = loop.create_future()
        ours.setblocking(False)
        loop.add_reader(ours.fileno(), set_done, got)
        loop.add_reader(pidfd, set_done, ended)
        try:
            await asyncio.wait({got, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            loop.remove_reader(ours.fileno())
            loop.remove_reader(pidfd)
        master = _receive(ours)
        if master is None:
            proc.wait()
            os.close(pidfd)
            release()
            raise StartFailed(_drain(status_r).decode(errors="replace") or "setup\tthe helper exited")
        return LocalTerminal(proc, pidfd, master, kill, release)
    finally:
        ours.close()
        os.close(status_r)


def _receive(sock: socket.socket) -> int | None:
    try:
        _msg, fds, _flags, _addr = socket.recv_fds(sock, 1, 1)
    except (BlockingIOError, ConnectionError):
        return None
    return fds[0] if fds else None


def _drain(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return b""
