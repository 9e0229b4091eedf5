"""The sandbox-ended watch: a local sandbox whose init exits without a destroy is reported.

Pid 1 of a sandbox's pid namespace ignores whatever its own processes send it, and the OOM
killer spares it (oom_score_adj -1000, hutch-nsexec.c): an init that exits was killed on
the host (an operator's ``kill -9``, a host agent) or its sandbox was torn down behind the
driver's back. Its processes died with it, so the sandbox is over; without this watch it
stayed ``idle`` in the record until a command failed in it, and a node agent could not tell
the API its sandbox was gone.

Each live init gets a pidfd, in an epoll of the watch's own thread: the kernel makes it
readable when the process exits, so the watch costs nothing while sandboxes run (no timer,
no poll). The init is not the driver's child (hutch-nsexec launch double-forks), so the
pidfd is the only exit notice there is; its exit status is not ours to read.

The pidfds live in that thread's own fd table (``unshare(CLONE_FILES)``), not the server's:
a fork copies the server's table and the helper it starts closes every fd in it, so with a
pidfd per sandbox there each helper the server started (a launch, an exec) cost more the
more sandboxes were alive (a Popen of `true`: 1.4 ms with none, 6 ms with 10,000;
docs/idle.md). Where that unshare fails the thread shares the server's table, as before.

One fd per live sandbox; ``raise_fd_limit`` lifts the soft RLIMIT_NOFILE to the hard one
at start (the limit is the process's, whichever table). Fallback, where ``pidfd_open`` is
missing (a kernel before 5.3, a seccomp profile denying it) or fails (out of fds): that
sandbox's init is polled every ``POLL_PERIOD`` seconds (its pid and start time, as
``state.is_live``), so an end is seen within a second instead of at once.

The watch only notices; the driver decides (``LocalDriver._init_ended``): under the
sandbox's lock, a destroy (the record is gone) or a checkpoint restore (a new init, watched
in its turn) is not an end.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import logging
import os
import queue
import resource
import select
import threading
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
    """The watched inits of one driver: a pidfd each (in the watch thread's own fd table), or
    a poll where none could be had.

    The event loop's side keeps which watch is current (``_watched``: a generation per
    sandbox); the thread's side opens, waits on and closes the pidfds, in the order the
    requests came, and reports back with the generation, so an exit of an init that was
    forgotten or watched anew meanwhile is dropped."""

    def __init__(self, ended: Ended, spawn: Spawn) -> None:
        self._ended = ended
        self._spawn = spawn
        self._watched: dict[str, tuple[int, LocalSandbox]] = {}  # sandbox id -> (generation, it)
        self._generations = itertools.count(1)
        self._polled: dict[str, LocalSandbox] = {}
        self._poller: asyncio.Task[None] | None = None
        self._said = False  # a host without pidfds would otherwise log it for every sandbox
        self._requests: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._wake = -1  # write end of the thread's wake pipe, in the server's table
        self._loop: asyncio.AbstractEventLoop | None = None

    def watch(self, sb: LocalSandbox) -> None:
        """Watch the sandbox's init as it is now (after a provision, an adoption, a restore)."""
        self.forget(sb.id)
        gen = next(self._generations)
        self._watched[sb.id] = (gen, sb)
        self._send(("watch", sb.id, gen, sb.init_pid, sb.init_start))

    def forget(self, sid: str) -> None:
        """Stop watching (a destroy): an exit from here on is not reported."""
        self._polled.pop(sid, None)
        if self._watched.pop(sid, None) is not None:
            self._send(("forget", sid))

    def close(self) -> None:
        for sid in list(self._watched) + list(self._polled):
            self.forget(sid)
        if self._poller is not None:
            self._poller.cancel()
        if self._thread is not None:
            self._send(("stop",))
            self._thread = None
            os.close(self._wake)
            self._wake = -1

    def _send(self, request: tuple[Any, ...]) -> None:
        if self._thread is not None and not self._thread.is_alive():
            self._restart()
        if self._thread is None:
            if request[0] != "watch":
                return
            self._start()
        self._requests.put(request)
        try:
            with contextlib.suppress(BlockingIOError):  # full: the thread has a wake-up pending anyway
                os.write(self._wake, b"\0")
        except BrokenPipeError:
            # The thread is ending (an error it reports on the loop): it closed its end of the
            # pipe before it stopped counting as alive. A close is done with it; anything else
            # goes to a new thread, which watches every init again (this request included).
            if request[0] != "stop":
                self._restart()

    def _died(self, err: str) -> None:
        log.error("the sandbox-ended watch failed (%s); starting it anew", err)
        self._restart()

    def _restart(self) -> None:
        """A thread that died took its pidfds with it: a new one watches every init again."""
        if self._thread is None:
            return
        self._thread.join(1.0)
        if self._thread.is_alive():  # still closing its fds: it goes by itself
            return
        os.close(self._wake)
        self._thread, self._wake = None, -1
        self._requests = queue.SimpleQueue()
        for sid, (gen, sb) in list(self._watched.items()):
            self._send(("watch", sid, gen, sb.init_pid, sb.init_start))

    def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        r, w = os.pipe()
        os.set_blocking(w, False)
        started: queue.SimpleQueue[bool] = queue.SimpleQueue()
        thread = threading.Thread(target=self._run, args=(r, started), name="hutch-endwatch", daemon=True)
        thread.start()
        if started.get():  # the thread has a table of its own, with its copy of r: ours goes
            os.close(r)
        self._thread, self._wake = thread, w

    # -- the event loop's side of the thread's reports ---------------------------------------

    def _report(self, kind: str, sid: str, gen: int, pid: int, err: str = "") -> None:
        current = self._watched.get(sid)
        if current is None or current[0] != gen:  # forgotten or watched anew meanwhile
            return
        del self._watched[sid]
        if kind == "ended":
            self._fire(sid, pid)
            return
        (log.debug if self._said else log.warning)(
            "sandbox %s: no pidfd for its init (%s); polling it every %ss", sid, err, POLL_PERIOD)
        self._said = True
        self._polled[sid] = current[1]
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())

    def _fire(self, sid: str, pid: int) -> None:
        self._spawn(self._ended(sid, pid))

    async def _poll(self) -> None:
        while self._polled:
            await asyncio.sleep(POLL_PERIOD)
            for sid, sb in list(self._polled.items()):
                if not is_live(sb):
                    del self._polled[sid]
                    self._fire(sid, sb.init_pid)

    # -- the watch thread ---------------------------------------------------------------------

    def _run(self, wake: int, started: queue.SimpleQueue[bool]) -> None:
        """Nothing here may write to the server's stdio or log: fds 0-2 are the server's
        only while they are copies in this table (they are kept), and a report goes to the
        loop."""
        private = _unshare_files()
        if private:  # close the copies of the server's fds this table began with
            _close_range(3, wake - 1)
            _close_range(wake + 1, 0x7FFFFFFF)
        started.put(private)
        loop = self._loop
        assert loop is not None
        ep = select.epoll()
        ep.register(wake, select.EPOLLIN)
        by_fd: dict[int, tuple[str, int, int]] = {}  # pidfd -> (sandbox, generation, init pid)
        by_sid: dict[str, int] = {}

        def report(*args: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is left to tell
                loop.call_soon_threadsafe(self._report, *args)

        def drop(fd: int) -> None:
            sid = by_fd.pop(fd)[0]
            by_sid.pop(sid, None)
            ep.unregister(fd)
            os.close(fd)

        try:
            while True:
                ready = [fd for fd, _ in ep.poll()]
                # Exits first: the requests below close pidfds and open others, maybe under
                # the same numbers, which would make a later event of this batch stale or,
                # worse, another sandbox's.
                for fd in ready:
                    if fd != wake:
                        sid, gen, pid = by_fd[fd]
                        drop(fd)
                        report("ended", sid, gen, pid)
                if wake not in ready:
                    continue
                with contextlib.suppress(BlockingIOError):
                    os.read(wake, 4096)
                while True:
                    try:
                        req = self._requests.get_nowait()
                    except queue.Empty:
                        break
                    if req[0] == "stop":
                        return
                    if req[1] in by_sid:  # "forget", or a "watch" anew
                        drop(by_sid[req[1]])
                    if req[0] == "watch":
                        self._open(ep, req, by_fd, by_sid, report)
        except Exception as err:  # said on the loop; the next request starts the thread anew
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._died, repr(err))
        finally:
            for fd in list(by_fd):
                os.close(fd)
            ep.close()
            os.close(wake)

    @staticmethod
    def _open(ep: select.epoll, req: tuple[Any, ...], by_fd: dict[int, tuple[str, int, int]],
              by_sid: dict[str, int], report: Callable[..., None]) -> None:
        _, sid, gen, pid, init_start = req
        try:
            if _pidfd_open is None:
                raise OSError("os.pidfd_open is missing")
            fd = _pidfd_open(pid)
        except ProcessLookupError:
            report("ended", sid, gen, pid)  # already gone
            return
        except OSError as err:
            report("polled", sid, gen, pid, str(err))
            return
        if start_time(pid) != init_start:  # checked after the open: the fd is of this init or none
            os.close(fd)
            report("ended", sid, gen, pid)
            return
        by_fd[fd] = (sid, gen, pid)
        by_sid[sid] = fd
        ep.register(fd, select.EPOLLIN)


_libc = ctypes.CDLL(None, use_errno=True)
CLONE_FILES = 0x400
SYS_CLOSE_RANGE = 436  # the same number on every architecture


def _unshare_files() -> bool:
    """This thread gets a copy of the process's fd table, its own from here on."""
    return bool(_libc.unshare(CLONE_FILES) == 0)


def _close_range(first: int, last: int) -> None:
    if first <= last:
        _libc.syscall(SYS_CLOSE_RANGE, ctypes.c_uint(first), ctypes.c_uint(last), ctypes.c_uint(0))
