"""envd names a process by a pid (and an optional tag); hutch names a command by its
execution id. This is the table between them, per sandbox, on the server that started the
command: enough for envd's List, Connect and SendSignal of the commands started over the E2B
wire. It is not kept across a restart (the commands themselves are: they are executions)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping

import attrs

from hutch.api.e2b.connect import RpcError
from hutch.api.e2b.terminals import PtyProcess


@attrs.frozen
class Process:
    pid: int
    execution_id: str | None  # None: a terminal (``pty``), not an execution
    cmd: str
    args: tuple[str, ...]
    envs: dict[str, str]
    cwd: str | None
    tag: str | None
    # What SendInput sends to the command's stdin (None: closed, CloseStdin); None when it was
    # started without stdin.
    stdin: asyncio.Queue[bytes | None] | None = attrs.field(default=None, eq=False)
    pty: PtyProcess | None = attrs.field(default=None, eq=False)
    kept: int = 0  # kept_bytes() of its config: what this table holds of it while it lives


# Live commands and terminals per sandbox started over the wire. Each holds server-side file
# descriptors (a terminal 2, a command's output pipes 4, measured): bounded by the sandbox's
# pids alone (1024 by default), a few sandboxes' worth would use up the server's descriptors,
# every organization's connections with them.
MAX_LIVE = 256
# Streams following one command or terminal at once (Start's and Connects). A follower that
# does not read holds what it fell behind by (a terminal's 256 chunks, a command's 64) until
# its connection dies: unbounded, a few thousand idle connections would hold gigabytes.
MAX_FOLLOWERS = 16
# What the table keeps of its live commands' configs (argv, env, cwd, tag: List answers them),
# per sandbox. One Start's message is up to 4 MiB: 256 live commands' worth was a GiB of the
# server's memory per sandbox (16 tags of 4 MiB held 150 MiB).
MAX_KEPT_BYTES = 16 * 2**20
MAX_TAG = 1024  # characters; envd's tags are names a client picks for its commands
_PER_STRING = 64  # what Python spends on a string besides its text, about


def kept_bytes(cmd: str, args: Iterable[str], envs: Mapping[str, str], cwd: str | None, tag: str | None) -> int:
    """About what keeping a command's config costs this server's memory."""
    strings = [cmd, *args, *envs.keys(), *envs.values(), cwd or "", tag or ""]
    return sum(len(s.encode("utf-8", "surrogatepass")) + _PER_STRING for s in strings)


class Processes:
    FIRST_PID = 1000  # below it: what a real init and its daemons would hold

    def __init__(self) -> None:
        self._by_sandbox: dict[str, dict[int, Process]] = {}
        self._last_pid: dict[str, int] = {}  # never given again in its sandbox
        self._followers: dict[int, int] = {}  # id(Process) -> streams following it now
        self._starting: dict[str, tuple[int, int]] = {}  # sandbox -> (commands, kept bytes) being started

    def add(self, sandbox_id: str, execution_id: str | None, *, cmd: str, args: tuple[str, ...],
            envs: dict[str, str], cwd: str | None, tag: str | None, stdin: asyncio.Queue[bytes | None] | None = None,
            pty: PtyProcess | None = None) -> Process:
        table = self._by_sandbox.setdefault(sandbox_id, {})
        pid = self._last_pid[sandbox_id] = self._last_pid.get(sandbox_id, self.FIRST_PID - 1) + 1
        table[pid] = proc = Process(pid, execution_id, cmd, args, envs, cwd, tag, stdin, pty,
                                    kept_bytes(cmd, args, envs, cwd, tag))
        return proc

    @contextlib.contextmanager
    def following(self, proc: Process) -> Iterator[None]:
        """While a stream follows ``proc``; refused past ``MAX_FOLLOWERS`` of them."""
        if self._followers.get(id(proc), 0) >= MAX_FOLLOWERS:
            raise RpcError("resource_exhausted", f"process {proc.pid} has {MAX_FOLLOWERS} streams following it, "
                           "the most the E2B wire keeps; close one before connecting again")
        self._followers[id(proc)] = self._followers.get(id(proc), 0) + 1
        try:
            yield
        finally:
            self._followers[id(proc)] -= 1
            if not self._followers[id(proc)]:
                del self._followers[id(proc)]

    @contextlib.contextmanager
    def room(self, sandbox_id: str, kept: int) -> Iterator[None]:
        """Room for one more command or terminal keeping ``kept`` bytes (after ``prune``), held
        while it starts and until it is ``add``ed: Starts that arrive together are each counted
        before any of them has started. Refused past ``MAX_LIVE`` or ``MAX_KEPT_BYTES``."""
        live = self._by_sandbox.get(sandbox_id, {})
        starting, starting_bytes = self._starting.get(sandbox_id, (0, 0))
        if len(live) + starting >= MAX_LIVE:
            raise RpcError("resource_exhausted", f"sandbox {sandbox_id} has {MAX_LIVE} commands and terminals "
                           "running, the most the E2B wire keeps; end one (SendSignal) before starting another")
        held = sum(p.kept for p in live.values()) + starting_bytes
        if held + kept > MAX_KEPT_BYTES:
            raise RpcError("resource_exhausted", f"sandbox {sandbox_id}'s running commands and terminals hold "
                           f"{held} bytes of arguments, environment and tags, and this one {kept}: the E2B wire "
                           f"keeps at most {MAX_KEPT_BYTES} a sandbox; end one (SendSignal) before starting another")
        self._starting[sandbox_id] = (starting + 1, starting_bytes + kept)
        try:
            yield
        finally:
            count, size = self._starting[sandbox_id]
            if count == 1:
                del self._starting[sandbox_id]
            else:
                self._starting[sandbox_id] = (count - 1, size - kept)

    def prune(self, running: Callable[[Process], bool]) -> None:
        """Forget the processes that ended. (A sandbox's last pid stays, one number, so that a
        handle to an ended process never reaches a new one.)"""
        for sandbox_id, table in list(self._by_sandbox.items()):
            for pid in [pid for pid, proc in table.items() if not running(proc)]:
                del table[pid]
            if not table:
                del self._by_sandbox[sandbox_id]

    def of(self, sandbox_id: str) -> list[Process]:
        return list(self._by_sandbox.get(sandbox_id, {}).values())

    def find(self, sandbox_id: str, *, pid: int | None = None, tag: str | None = None) -> Process | None:
        for proc in self.of(sandbox_id):
            if (pid is not None and proc.pid == pid) or (tag is not None and proc.tag == tag):
                return proc
        return None
