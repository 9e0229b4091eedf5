"""The server's side of the zygote (native/zygote.h): a sandbox's pid 1 forks its commands,
so an execute skips the helper's exec, its joins of the sandbox's namespaces and its
seccomp load.

Per sandbox a SOCK_SEQPACKET socket bound at ``<sandbox dir>/zygote.sock`` (a root-only
directory on the host, outside every sandbox's root), made here and listened on by pid 1.
Per command: connect, send the request (a memfd) with the command's pipes, its status fd and
its leaf's cgroup files (opened here, as root: the kernel checks the opener, so the
unprivileged child can join that leaf and no other), then wait for "p" (about to exec; its
pid comes with it as SO_PASSCRED credentials) and "x" (its wait status, from pid 1).

``HUTCH_ZYGOTE=0`` turns it off: every command then goes through hutch-nsexec as before.
A sandbox whose pid 1 has no zygote (started before it existed, or its socket is gone)
refuses the connection and gets the helper too.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import socket
import struct
import time
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from hutch.core import phases
from hutch.core.errors import InvalidInput
from hutch.drivers import runclock
from hutch.drivers.base import OutputSink
from hutch.drivers.local import helper

SOCKET = "zygote.sock"
_UCRED = struct.Struct("iII")  # pid, uid, gid
_CMSG_SPACE = socket.CMSG_SPACE(_UCRED.size)
_SUN_PATH_MAX = 107


def enabled() -> bool:
    return os.environ.get("HUTCH_ZYGOTE", "1") != "0"


class Unavailable(Exception):
    """The sandbox's pid 1 takes no requests (no zygote, or gone): run the helper."""


def _address(d: Path) -> tuple[str, int | None]:
    """The socket's address in ``d``: its path, or for a path longer than a sockaddr holds,
    the same file through an O_PATH fd of ``d`` (which the caller closes)."""
    path = str(d / SOCKET)
    if len(path.encode()) <= _SUN_PATH_MAX:
        return path, None
    fd = os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{fd}/{SOCKET}", fd


def listen(d: Path) -> int:
    """A new listening socket at ``d``/zygote.sock (a leftover of a dead pid 1 replaced);
    returns its fd, for the launcher to hand to pid 1."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(d / SOCKET)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    address, dirfd = _address(d)
    try:
        sock.bind(address)
        os.chmod(d / SOCKET, 0o600)
        sock.listen(socket.SOMAXCONN)
    except BaseException:
        sock.close()
        raise
    finally:
        if dirfd is not None:
            os.close(dirfd)
    return sock.detach()


def forget(d: Path) -> None:
    """The sandbox is gone: its socket file goes (a spare directory is kept only bare)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(d / SOCKET)


def _connect(d: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    try:
        address, dirfd = _address(d)
    except OSError as err:
        sock.close()
        raise Unavailable(str(err)) from None
    try:
        sock.connect(address)
    except OSError as err:
        sock.close()
        # No socket, no listener, or its backlog full: nothing was started.
        raise Unavailable(str(err)) from None
    finally:
        if dirfd is not None:
            os.close(dirfd)
    return sock


def _request(cwd: str, argv: Sequence[str], env: Mapping[str, str]) -> int:
    """The memfd zygote.h reads: "<argc> <envc>\\n", then cwd, argv and env, each NUL-ended."""
    parts = [cwd.encode(), *(a.encode() for a in argv), *(f"{k}={v}".encode() for k, v in env.items())]
    for part in parts:
        if b"\0" in part:
            raise InvalidInput("a command, its environment and its working directory may not contain NUL bytes",
                               field="command")
    data = memoryview(b"%d %d\n" % (len(argv), len(env)) + b"\0".join(parts) + b"\0")
    fd = os.memfd_create("hutch-request", os.MFD_CLOEXEC)
    try:
        while data:
            data = data[os.write(fd, data):]
    except BaseException:
        os.close(fd)
        raise
    return fd


async def run(
    d: Path,
    *,
    cwd: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    cgroup_files: Sequence[Path],
    stdin: bytes | AsyncIterable[bytes] | None,
    sink: OutputSink | None,
    limit: float | None,
    kill: Callable[[], Awaitable[None]],
    sent: Callable[[], None],
    started: Callable[[int], None],
    clock: Callable[[], float] = time.monotonic,
) -> tuple[int, bool, str]:
    """Run one command through the sandbox's pid 1 (``d``: its directory); returns (exit
    code, timed out, status-fd message) as helper.run does. Raises Unavailable, having
    started nothing, when the sandbox takes no requests. ``sent`` is called once the request
    is on its way, ``started`` with the command's host pid once it is about to exec."""
    t0 = phases.start()
    sock = _connect(d)
    theirs: list[int] = []
    ours: list[int] = []
    try:
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        ours.append(status_r)
        theirs.append(status_w)
        if stdin:
            in_r, in_w = os.pipe2(os.O_CLOEXEC)
            ours.append(in_w)
        else:
            in_r, in_w = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1
        theirs.append(in_r)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        ours.append(out_r)
        theirs.append(out_w)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        ours.append(err_r)
        theirs.append(err_w)
        theirs.append(_request(cwd, argv, env))
        for path in cgroup_files:
            theirs.append(os.open(path, os.O_WRONLY | os.O_CLOEXEC))
        # Order as zygote.h takes them: request, stdin, stdout, stderr, status, cgroups.
        fds = [theirs[4], in_r, out_w, err_w, status_w, *theirs[5:]]
        try:
            sock.sendmsg([b"r"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        except OSError as err:  # pid 1 went away between connect and send: nothing started
            raise Unavailable(str(err)) from None
    except BaseException:
        sock.close()
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    replies = _Replies(sock, started)
    try:
        # Until the child is set up (or has failed): if pid 1 could not fork, nothing ran and
        # nothing was read of stdin yet, so the helper can still do it all. The limit holds
        # here too: the sandbox's own processes may stop the child (same uid) before it is in
        # its leaf, where no kill reaches it.
        # On the sandbox's run clock: a request sent to a frozen pid 1 waits for the resume.
        if not await runclock.within(replies.first, limit, clock):
            raise TimeoutError
        replies.first.result()  # Unavailable if pid 1 refused
    except BaseException as err:
        if isinstance(err, (asyncio.CancelledError, TimeoutError)):
            await kill()  # the child may be about to exec, with nobody left to carry it
        replies.close()
        for fd in ours:
            os.close(fd)
        if isinstance(err, TimeoutError):
            return 128 + 9, True, ""
        raise
    phases.end("zygote: request to the command's exec", t0)
    sent()
    pipes = helper.Pipes(_file(in_w, "wb") if in_w >= 0 else None, _file(out_r, "rb"), _file(err_r, "rb"), sink)
    try:
        with phases.span("zygote: runs to exit (the child's setup, the command, the pipes)"):
            try:
                timed_out = await pipes.carry(stdin, limit, kill, replies.exited, clock)
            finally:
                if not replies.exited.done():  # only on unexpected errors
                    await kill()
                    await asyncio.wait({replies.exited}, timeout=5)
                await pipes.drain()
    finally:
        replies.close()
        await pipes.close()
        status = helper.read_available(status_r).decode(errors="replace")
        os.close(status_r)
    return replies.code(), timed_out, status


def _file(fd: int, mode: str) -> IO[bytes]:
    """A pipe end as the file object helper.Pipes carries (and closes)."""
    return open(fd, mode, buffering=0)


class _Replies:
    """The connection's messages: "p" (the child's pid in its credentials), then "x" and the
    wait status; the end of the connection without "x" is pid 1's end (the sandbox's)."""

    def __init__(self, sock: socket.socket, started: Callable[[int], None]) -> None:
        self.sock = sock
        self.started = started
        self.status: int | None = None
        self.loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[None] = self.loop.create_future()
        self.first: asyncio.Future[None] = self.loop.create_future()  # Unavailable if pid 1 refused
        self.loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            data, ancdata, _flags, _addr = self.sock.recvmsg(8, _CMSG_SPACE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data == b"p":
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= _UCRED.size:
                    self.started(_UCRED.unpack_from(payload)[0])
            helper.set_done(self.first)
            return
        self.loop.remove_reader(self.sock.fileno())
        if len(data) == 5 and data[:1] == b"x":
            self.status = int.from_bytes(data[1:], "little", signed=True)
        elif not self.first.done():  # "n", or the end before anything: nothing was started
            self.first.set_exception(Unavailable("the sandbox's pid 1 started nothing"))
        helper.set_done(self.first)
        helper.set_done(self.exited)

    def code(self) -> int:
        """The command's exit code as the helper would give it (128 + a killing signal)."""
        status = self.status
        if status is None:
            return 128 + 9  # pid 1 is gone, and with it every process of the sandbox
        if os.WIFEXITED(status):
            return os.WEXITSTATUS(status)
        if os.WIFSIGNALED(status):
            return 128 + os.WTERMSIG(status)
        return 128 + 9

    def close(self) -> None:
        if not self.exited.done():
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
