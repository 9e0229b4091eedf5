"""The sandbox-ended watch: a local sandbox whose init exits without a destroy is reported.

Pid 1 of a sandbox's pid namespace ignores whatever its own processes send it, and the OOM
killer spares it (oom_score_adj -1000, hutch-nsexec.c): an init that exits was killed on
the host (an operator's ``kill -9``, a host agent) or its sandbox was torn down behind the
driver's back. Its processes died with it, so the sandbox is over; without this watch it
stayed ``idle`` in the record until a command failed in it, and a node agent could not tell
the API its sandbox was gone.

Each live init gets a pidfd, registered with ``loop.add_reader``: the kernel makes it
readable when the process exits, so the watch costs nothing while sandboxes run (no timer,
no thread). The init is not the driver's child (hutch-nsexec launch double-forks), so the
pidfd is the only exit notice there is; its exit status is not ours to read.

One fd per live sandbox; ``raise_fd_limit`` lifts the soft RLIMIT_NOFILE to the hard one
at start. Fallback, where ``pidfd_open`` is missing (a kernel before 5.3, a seccomp
profile denying it) or fails (out of fds): that sandbox's init is polled every
``POLL_PERIOD`` seconds (its pid and start time, as ``state.is_live``), so an end is seen
within a second instead of at once.

The watch only notices; the driver decides (``LocalDriver._init_ended``): under the
sandbox's lock, a destroy (the record is gone) or a checkpoint restore (a new init, watched
in its turn) is not an end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
from collections.abc import Callable, Coroutine
from typing import Any

from hutch.drivers.local.helper import start_time
from hutch.drivers.local.state import LocalSandbox, is_live

log = logging.getLogger(__name__)

POLL_PERIOD = 1.0
_pidfd_open: Callable[..., int] | None = getattr(os, "pidfd_open", None)

Ended = Callable[[str, int], Coroutine[Any, Any, None]]  # (sandbox id, the init pid that exited)
Spawn = Callable[[Coroutine[Any, Any, None]], None]


def raise_fd_limit() -> None:
    """The soft fd limit up to the hard one: a pidfd per live sandbox comes on top of the
    server's sockets and pipes."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))


class EndWatch:
    """The watched inits of one driver: a pidfd each, or a poll where none could be had."""

    def __init__(self, ended: Ended, spawn: Spawn) -> None:
        self._ended = ended
        self._spawn = spawn
        self._fds: dict[str, int] = {}  # sandbox id -> pidfd of its init
        self._polled: dict[str, LocalSandbox] = {}
        self._poller: asyncio.Task[None] | None = None
        self._said = False  # a host without pidfds would otherwise log it for every sandbox

    def watch(self, sb: LocalSandbox) -> None:
        """Watch the sandbox's init as it is now (after a provision, an adoption, a restore)."""
        self.forget(sb.id)
        pid = sb.init_pid
        try:
            if _pidfd_open is None:
                raise OSError("os.pidfd_open is missing")
            fd = _pidfd_open(pid)
        except ProcessLookupError:
            self._fire(sb.id, pid)  # already gone
            return
        except OSError as err:
            (log.debug if self._said else log.warning)(
                "sandbox %s: no pidfd for its init (%s); polling it every %ss", sb.id, err, POLL_PERIOD)
            self._said = True
            self._polled[sb.id] = sb
            if self._poller is None or self._poller.done():
                self._poller = asyncio.create_task(self._poll())
            return
        if start_time(pid) != sb.init_start:  # checked after the open: the fd is of this init or none
            os.close(fd)
            self._fire(sb.id, pid)
            return
        self._fds[sb.id] = fd
        asyncio.get_running_loop().add_reader(fd, self._exited, sb.id, fd, pid)

    def forget(self, sid: str) -> None:
        """Stop watching (a destroy): an exit from here on is not reported."""
        self._polled.pop(sid, None)
        fd = self._fds.pop(sid, None)
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)

    def close(self) -> None:
        for sid in list(self._fds) + list(self._polled):
            self.forget(sid)
        if self._poller is not None:
            self._poller.cancel()

    def _exited(self, sid: str, fd: int, pid: int) -> None:
        if self._fds.get(sid) != fd:  # forgotten or watched anew meanwhile
            return
        self.forget(sid)
        self._fire(sid, pid)

    def _fire(self, sid: str, pid: int) -> None:
        self._spawn(self._ended(sid, pid))

    async def _poll(self) -> None:
        while self._polled:
            await asyncio.sleep(POLL_PERIOD)
            for sid, sb in list(self._polled.items()):
                if not is_live(sb):
                    del self._polled[sid]
                    self._fire(sid, sb.init_pid)
