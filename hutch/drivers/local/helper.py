"""Running hutch-nsexec (native/hutch-nsexec.c) and carrying its pipes: the one way the
local driver runs anything in a sandbox (executions, file writes), and the pipe helpers
the sandbox launcher shares."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import AsyncIterable, Awaitable, Callable, Sequence
from typing import IO, Literal

from hutch.core import phases
from hutch.drivers import runclock
from hutch.drivers.base import OutputSink
from hutch.drivers.local.smallfiles import get as _get

# After the command exits, background children may still hold stdout open; we stop
# reading after this grace instead of waiting for them.
DRAIN_GRACE = 0.2


def set_done(fut: asyncio.Future[None]) -> None:
    """A loop reader's or writer's callback: wake whoever awaits ``fut`` (once)."""
    if not fut.done():
        fut.set_result(None)


async def run(
    cmd: list[str],
    argv: Sequence[str],
    *,
    status_r: int,
    status_w: int,
    extra_fds: Sequence[int] = (),
    stdin: bytes | AsyncIterable[bytes] | None,
    sink: OutputSink | None,
    limit: float | None,
    kill: Callable[[], Awaitable[None]],
    started: Callable[[int], None],
    clock: Callable[[], float] = time.monotonic,
) -> tuple[int, bool, str]:
    """Run hutch-nsexec (``cmd``: its command line up to ``--``); returns (exit code, timed
    out, status-fd message). ``kill`` kills the command's whole tree (on a timeout or a
    cancel); ``started`` gets the helper's pid. ``status_w`` and ``extra_fds`` (an env
    memfd) are handed to the helper and closed here.

    Not asyncio's subprocess API: its ``wait()`` (3.11) only returns once every
    pipe is closed, and a background child holding stdout would make an execution
    last as long as that child. We watch the helper's pidfd for the exit instead.
    """
    t0 = phases.start()
    try:
        # Blocking, but a vfork+exec of a static binary: well under a millisecond.
        proc = subprocess.Popen(  # noqa: ASYNC220
            [*cmd, "--", *argv], env={}, pass_fds=(status_w, *extra_fds), bufsize=0,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except BaseException:
        os.close(status_r)
        raise
    finally:
        for fd in (status_w, *extra_fds):
            os.close(fd)
    phases.end("helper: fork/exec (Popen)", t0)
    started(proc.pid)
    assert proc.stdout is not None
    assert proc.stderr is not None
    pipes = Pipes(proc.stdin, proc.stdout, proc.stderr, sink)
    pidfd = os.pidfd_open(proc.pid)
    try:
        with phases.span("helper: runs to exit (its setup, the command, the pipes)"):
            exited = pipes.watch(pidfd)
            try:
                timed_out = await pipes.carry(stdin, limit, kill, exited, clock)
            finally:
                if not exited.done():  # only on unexpected errors
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                code = proc.wait()
                await pipes.drain()
    finally:
        await pipes.close()
        os.close(pidfd)
        status = read_available(status_r).decode(errors="replace")
        os.close(status_r)
    if code < 0:
        code = 128 - code
    return code, timed_out, status


class Pipes:
    """One command's pipes, carried on the event loop until it exits: stdout and stderr
    pumped into the sink, stdin fed whole or streamed, everything unhooked by close() (which
    closes the pipes)."""

    def __init__(self, stdin: IO[bytes] | None, stdout: IO[bytes], stderr: IO[bytes], sink: OutputSink | None) -> None:
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.sink = sink
        self.loop = asyncio.get_running_loop()
        self.watched: list[tuple[int, bool]] = []  # (fd, is_writer)
        self.feeder: asyncio.Future[None] | None = None
        self.eofs: list[asyncio.Future[None]] = []

    async def carry(self, stdin: bytes | AsyncIterable[bytes] | None, limit: float | None,
                    kill: Callable[[], Awaitable[None]], exited: asyncio.Future[None],
                    clock: Callable[[], float] = time.monotonic) -> bool:
        """Until ``exited`` (killing the tree after ``limit`` seconds of ``clock``, the
        sandbox's run clock, or on a cancel); returns whether it timed out. Then the caller
        collects the exit and calls drain()."""
        self.eofs = [self.pump(self.stdout.fileno(), "stdout"), self.pump(self.stderr.fileno(), "stderr")]
        if self.stdin is not None and stdin is not None:
            if isinstance(stdin, (bytes, bytearray)):
                self.feed(self.stdin.fileno(), stdin)
            else:
                self.feeder = asyncio.ensure_future(self.feed_stream(self.stdin.fileno(), stdin))
        timed_out = False
        try:
            if not await runclock.within(exited, limit, clock):
                timed_out = True
                await kill()
                await exited
        except asyncio.CancelledError:
            await kill()
            await asyncio.shield(exited)
            raise
        return timed_out

    async def drain(self) -> None:
        # Output already written is in the pipes; a background child may keep
        # them open for ever, so stop after a short grace.
        if self.eofs:
            await asyncio.wait(self.eofs, timeout=DRAIN_GRACE)

    def watch(self, fd: int) -> asyncio.Future[None]:
        """A future set once ``fd`` (a pidfd) is readable."""
        fut: asyncio.Future[None] = self.loop.create_future()
        self.loop.add_reader(fd, set_done, fut)
        self.watched.append((fd, False))
        return fut

    def pump(self, fd: int, stream: Literal["stdout", "stderr"]) -> asyncio.Future[None]:
        eof: asyncio.Future[None] = self.loop.create_future()
        os.set_blocking(fd, False)

        def readable() -> None:
            data = read_chunk(fd)
            if data is None:
                return
            if not data:
                self.loop.remove_reader(fd)
                if not eof.done():
                    eof.set_result(None)
            elif self.sink is not None:
                self.sink.write(stream, data)

        self.loop.add_reader(fd, readable)
        self.watched.append((fd, False))
        return eof

    async def feed_stream(self, fd: int, chunks: AsyncIterable[bytes]) -> None:
        """Streamed stdin: one chunk at a time, each written as the pipe takes it (the
        command's reading paces the sender: flat memory for any size)."""
        os.set_blocking(fd, False)
        assert self.stdin is not None
        try:
            async for chunk in chunks:
                view = memoryview(chunk)
                while view:
                    try:
                        view = view[os.write(fd, view):]
                    except BlockingIOError:
                        ready: asyncio.Future[None] = self.loop.create_future()
                        self.loop.add_writer(fd, set_done, ready)
                        try:
                            await ready
                        finally:
                            self.loop.remove_writer(fd)
        except OSError:
            pass  # the command closed its stdin: the rest is not wanted
        finally:
            self.stdin.close()

    def feed(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        os.set_blocking(fd, False)
        sent = 0

        def writable() -> None:
            nonlocal sent
            try:
                sent += os.write(fd, view[sent:sent + 65536])
            except BlockingIOError:
                return
            except OSError:  # the command closed its stdin: fine
                sent = len(view)
            if sent >= len(view):
                self.loop.remove_writer(fd)
                assert self.stdin is not None
                self.stdin.close()

        self.loop.add_writer(fd, writable)
        self.watched.append((fd, True))

    async def close(self) -> None:
        if self.feeder is not None:
            self.feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.feeder
        for fd, is_writer in self.watched:
            (self.loop.remove_writer if is_writer else self.loop.remove_reader)(fd)
        for pipe in (self.stdin, self.stdout, self.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()


def kill_session(helper: int, signum: int, *, once: bool = False) -> None:
    """Rootless stand-in for killing a cgroup leaf: signal every process of the session
    the helper's child started (every command runs as a session leader), repeated until
    none is left, since a process may fork while we look. Orphans keep their session when
    the sandbox's pid 1 adopts them, so background children are found too; a process
    that starts a session of its own escapes (destroying the sandbox still ends it).
    Blocking: walks /proc."""
    try:
        children = _get(f"/proc/{helper}/task/{helper}/children").split()
    except (FileNotFoundError, ProcessLookupError):
        return
    for leader in map(int, children):
        kill_session_of(leader, signum, once=once)


def kill_session_of(leader: int, signum: int, *, once: bool = False) -> None:
    """kill_session for a session leader known by its own pid (a command the zygote forked)."""
    for _ in range(1 if once else 200):
        found = False
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            fields = live_stat(int(name))  # zombies are dead already: killed, not yet reaped
            if fields is not None and int(fields[3]) == leader:
                found = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(name), signum)
        if not found:
            break
        time.sleep(0.001)


def read_chunk(fd: int) -> bytes | None:
    """One read from a non-blocking pipe: None if nothing is there yet, b"" at EOF (a
    read error counts as EOF: the writer is gone either way)."""
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""


async def read_to_eof(loop: asyncio.AbstractEventLoop, *pipes: tuple[int, int]) -> list[bytes]:
    """Everything written to each pipe (fd, at most limit bytes) until its last writer
    closes it. One future for all of them: no task per pipe (each costs loop turns, and
    the launcher is on every sandbox's path)."""
    outs = [bytearray() for _ in pipes]
    open_fds = {fd for fd, _ in pipes}
    done: asyncio.Future[None] = loop.create_future()

    def reader(fd: int, out: bytearray, limit: int) -> Callable[[], None]:
        def readable() -> None:
            data = read_chunk(fd)
            if data is None:
                return
            if data:
                if len(out) < limit:
                    out.extend(data[: limit - len(out)])
                return
            loop.remove_reader(fd)
            open_fds.discard(fd)
            if not open_fds and not done.done():
                done.set_result(None)
        return readable

    for (fd, limit), out in zip(pipes, outs, strict=True):
        os.set_blocking(fd, False)
        loop.add_reader(fd, reader(fd, out, limit))
    try:
        await done
    finally:
        for fd in open_fds:
            loop.remove_reader(fd)
    return [bytes(out) for out in outs]


def read_available(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return b""


def live_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), as the host
    sees them; None if ``pid`` is gone or a zombie."""
    try:
        fields = _get(f"/proc/{pid}/stat").decode().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] == "Z" else fields


def start_time(pid: int) -> int | None:
    """Kernel start time of ``pid`` (guards against pid reuse)."""
    fields = live_stat(pid)
    return None if fields is None else int(fields[19])
