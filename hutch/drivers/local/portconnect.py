"""A connection to any port a local sandbox's process listens on, made without giving the
sandbox a network: the socket is created inside the sandbox's network namespace (by a thread
of this server that joins it for the ``socket()`` call alone), then connected to its loopback.
A socket keeps the namespace it was made in, so the sandbox gains no interface, no route and
no way out; only the server holds the connection.

Joining a network namespace needs CAP_SYS_ADMIN in this server's own user namespace: a
rootless server has none, so it reaches only the port a sandbox declared (its slirp4netns
forward). The thread that joins is a thread of its own, ended after the call: if its way back
failed, no other work would run in the sandbox's namespace."""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import threading

from hutch.core.errors import DriverFailure, NotSupported
from hutch.drivers.local.helper import start_time

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _socket_in(pidfd: int) -> socket.socket:
    """A TCP socket of the namespace ``pidfd``'s process is in, made on a thread of its own."""
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def run() -> None:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(pidfd)
            try:
                made.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            finally:
                _setns(own)  # a failure here ends with the thread
        except BaseException as err:  # handed to the caller
            failed.append(err)
        finally:
            os.close(own)

    thread = threading.Thread(target=run, name="hutch-netns", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]


def _open(sandbox_id: str, init_pid: int, init_start: int) -> socket.socket:
    try:
        pidfd = os.pidfd_open(init_pid)
    except ProcessLookupError:
        raise DriverFailure(f"sandbox {sandbox_id} is no longer running") from None
    try:
        # The pidfd names one process for good; it is the sandbox's if the pid's start time
        # still is (checked after the open, so a pid reused before it is refused).
        if start_time(init_pid) != init_start:
            raise DriverFailure(f"sandbox {sandbox_id} is no longer running")
        return _socket_in(pidfd)
    except PermissionError as err:
        raise NotSupported(f"sandbox {sandbox_id}: this server cannot enter a sandbox's network ({err.strerror}); "
                           "only the port declared at create (network.port) is reachable", field="port") from None
    finally:
        os.close(pidfd)


async def connect(sandbox_id: str, init_pid: int, init_start: int, port: int) -> socket.socket:
    """A socket connected to ``port`` on the sandbox's loopback (ConnectionRefusedError when
    nothing listens there)."""
    sock = await asyncio.to_thread(_open, sandbox_id, init_pid, init_start)
    try:
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return sock
