# ruff: noqa: ASYNC220  (short-lived `sleep`s of the test own: blocking to start them is fine here)
"""The sandbox-ended watch's thread (drivers/local/endwatch.py), on processes of the test's
own: a destroy forgets an init and kills it at once, so the thread often finds the forget
and the exit in one wake-up. It handled the request first and then met the exit of a pidfd
it had just closed: the thread died, and every destroy after it failed (2,000 idle
sandboxes, bench/idle_memory.py, left 1,992 behind)."""

from __future__ import annotations

import asyncio
import queue
import subprocess
import time
from typing import Any

from hutch.drivers.local.endwatch import EndWatch
from hutch.drivers.local.helper import start_time
from hutch.drivers.local.state import LocalSandbox


def sandbox(proc: subprocess.Popen[bytes], sid: str) -> LocalSandbox:
    return LocalSandbox(id=sid, uid=0, runtime="x", env={}, init_pid=proc.pid, init_start=start_time(proc.pid))


class SlowWhenEmpty(queue.SimpleQueue):  # type: ignore[type-arg]
    """The watch's request queue, holding the thread a while after its last request when
    ``slow``: the test forgets and kills meanwhile, so both wait for its next epoll."""

    slow = False

    def get_nowait(self):  # type: ignore[no-untyped-def]
        try:
            return super().get_nowait()
        except queue.Empty:
            if self.slow:
                self.slow = False
                time.sleep(0.3)
            raise


async def test_a_forget_and_the_exit_in_one_wake_up_leave_the_watch_working() -> None:
    ended: list[tuple[str, int]] = []

    async def on_end(sid: str, pid: int) -> None:
        ended.append((sid, pid))

    watch = EndWatch(on_end, lambda coro: asyncio.get_running_loop().create_task(coro))
    requests = SlowWhenEmpty()
    watch._requests = requests
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    gone, trigger, last = procs
    try:
        watch.watch(sandbox(gone, "gone"))
        await asyncio.sleep(0.05)  # watched by now
        requests.slow = True
        watch.watch(sandbox(trigger, "trigger"))  # the thread takes it, then is held
        await asyncio.sleep(0.05)
        watch.forget("gone")  # a destroy: forgotten, then killed
        gone.kill()
        gone.wait()
        await asyncio.sleep(0.5)
        assert ended == [], "a forgotten init's exit was reported"
        assert watch._thread is not None and watch._thread.is_alive(), "the watch thread died"
        watch.watch(sandbox(last, "last"))
        await asyncio.sleep(0.05)
        last.kill()
        last.wait()
        for _ in range(200):
            if ended:
                break
            await asyncio.sleep(0.01)
        assert ended == [("last", last.pid)]
    finally:
        watch.close()
        for proc in procs:
            proc.kill()
            proc.wait()


async def test_a_watch_thread_that_died_is_started_anew_and_watches_every_init_again() -> None:
    ended: list[tuple[str, int]] = []

    async def on_end(sid: str, pid: int) -> None:
        ended.append((sid, pid))

    watch = EndWatch(on_end, lambda coro: asyncio.get_running_loop().create_task(coro))
    proc = subprocess.Popen(["sleep", "60"])
    try:
        watch.watch(sandbox(proc, "kept"))
        await asyncio.sleep(0.05)
        first = watch._thread
        watch._send(("nonsense",))  # whatever kills the thread: it closes its pidfds as it goes
        for _ in range(200):
            if watch._thread is not first and watch._thread is not None:
                break
            await asyncio.sleep(0.01)
        assert watch._thread is not first and watch._thread is not None and watch._thread.is_alive()
        await asyncio.sleep(0.05)
        proc.kill()
        proc.wait()
        for _ in range(200):
            if ended:
                break
            await asyncio.sleep(0.01)
        assert ended == [("kept", proc.pid)]
    finally:
        watch.close()
        proc.kill()
        proc.wait()


class _StillAlive:
    """A thread that has closed its end of the wake pipe but still counts as alive: the
    moment between its ``finally`` and its end, when another request's wake-up finds no reader."""

    def __init__(self, thread: Any) -> None:
        self._thread, self._asked = thread, False

    def is_alive(self) -> bool:
        if not self._asked:
            self._asked = True
            return True
        return bool(self._thread.is_alive())

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)


async def test_a_request_that_finds_the_thread_ending_starts_it_anew() -> None:
    """The thread died (an error, said on the loop) and had closed its end of the wake pipe
    while it still counted as alive: the next request's wake-up raised BrokenPipeError, which
    failed a driver's close (`hutch sb exec` with no server exited 1). Now a close lets it go,
    and any other request goes to a new thread watching every init again."""
    ended: list[tuple[str, int]] = []

    async def on_end(sid: str, pid: int) -> None:
        ended.append((sid, pid))

    watch = EndWatch(on_end, lambda coro: asyncio.get_running_loop().create_task(coro))
    kept, late = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    try:
        watch.watch(sandbox(kept, "kept"))
        await asyncio.sleep(0.05)
        first = watch._thread
        assert first is not None
        watch._send(("nonsense",))  # kills the thread
        first.join(5)  # no loop turn: its death is not reported yet
        assert not first.is_alive()
        watch._thread = _StillAlive(first)  # type: ignore[assignment]
        watch.watch(sandbox(late, "late"))  # raised BrokenPipeError before
        assert watch._thread is not None and watch._thread.is_alive() and watch._thread is not first
        await asyncio.sleep(0.05)
        late.kill()
        late.wait()
        for _ in range(300):
            if ended:
                break
            await asyncio.sleep(0.01)
        assert ended == [("late", late.pid)]
    finally:
        watch.close()
        for proc in (kept, late):
            proc.kill()
            proc.wait()


async def test_a_close_that_finds_the_thread_ending_lets_it_go() -> None:
    async def on_end(sid: str, pid: int) -> None:
        return None

    watch = EndWatch(on_end, lambda coro: asyncio.get_running_loop().create_task(coro))
    proc = subprocess.Popen(["sleep", "60"])
    try:
        watch.watch(sandbox(proc, "kept"))
        watch.forget("kept")
        await asyncio.sleep(0.05)
        first = watch._thread
        assert first is not None
        watch._send(("nonsense",))  # kills the thread
        first.join(5)
        watch._thread = _StillAlive(first)  # type: ignore[assignment]
        watch.close()  # its "stop" found no reader: BrokenPipeError out of the driver's close before
        assert watch._thread is None
    finally:
        proc.kill()
        proc.wait()
