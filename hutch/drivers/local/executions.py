"""Executions in the local driver's sandboxes: commands, terminals, batch file writes,
their cancel and signals, pause/resume (the freezer) and the pids guard.

Each runs as a hutch-nsexec process in a cgroup leaf of its own (nsexec.py). Exit codes:
a timeout gives 124 (``timed_out``); a cancel gives 137 (``cancelled``, the tree was
SIGKILLed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import re
import secrets
import signal
import time
from collections.abc import Callable, Mapping, Sequence

from hutch.core import phases
from hutch.core.errors import DriverFailure, IllegalTransition, InvalidInput, NotSupported
from hutch.drivers import trust
from hutch.drivers.base import (
    ExecRequest,
    ExecResult,
    FileWrite,
    OutputSink,
    PtySession,
    TerminalRequest,
    check_env,
)
from hutch.drivers.local import pidsguard, terminal
from hutch.drivers.local.cgroups import Cgroups
from hutch.drivers.local.nsexec import Nsexec
from hutch.drivers.local.pidsguard import PidsGuard
from hutch.drivers.local.quiet import Quiet
from hutch.drivers.local.state import LocalExecution, LocalSandbox, Registry

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
EXIT_TIMEOUT = 124
EXIT_CANCELLED = 128 + signal.SIGKILL
NO_FREEZER = "pause needs the cgroup freezer; this server runs without root (rootless mode)"
FROZEN_KILL_WAIT = 5.0  # seconds a paused sandbox is thawed at most for a command's kill


class LocalExecutions:
    """Runs and controls what executes in the sandboxes of one driver."""

    def __init__(self, registry: Registry, nsexec: Nsexec, cgroups: Cgroups | None, quiet: Quiet) -> None:
        self._registry = registry
        self._nsexec = nsexec
        self._cgroups = cgroups
        self._quiet = quiet  # held from an exec's start to its helper's (quiet.py)

    @staticmethod
    def _env(sb: LocalSandbox, extra: Mapping[str, str]) -> dict[str, str]:
        check_env(extra, "env")
        env = {"PATH": DEFAULT_PATH, "HOME": sb.home, "USER": sb.user_name, "LOGNAME": sb.user_name,
               "SHELL": "/bin/bash", "LANG": "C.UTF-8", "HOSTNAME": "sandbox", **trust.sandbox_env()}
        env.update(sb.env)
        env.update(extra)
        return env

    async def exec(self, req: ExecRequest, sink: OutputSink) -> ExecResult:
        self._quiet.hold(req.execution_id)
        try:
            return await self._exec(req, sink)
        finally:
            self._quiet.release(req.execution_id, req.sandbox_id)

    async def _exec(self, req: ExecRequest, sink: OutputSink) -> ExecResult:
        t0 = phases.start()
        sb = self._registry.running(req.sandbox_id)
        if not req.argv:
            raise InvalidInput("command must not be empty", field="command")
        executions = self._registry.executions
        if req.execution_id in executions:
            raise IllegalTransition(f"execution {req.execution_id} is already running")
        env = self._env(sb, req.env)
        cwd = posixpath.normpath(posixpath.join(sb.home, req.cwd)) if req.cwd else sb.home
        leaf = "x-" + re.sub(r"[^A-Za-z0-9_.-]", "_", req.execution_id)[:100]
        # Not refused in a paused sandbox: a pause that lands between the command's recorded
        # start and this call freezes it with the rest (its time stands still until the resume).
        execution = LocalExecution(sandbox_id=sb.id, leaf=leaf)
        executions[req.execution_id] = execution
        self._nsexec.gc_leaves(sb.id)
        phases.end("driver: exec, before the helper", t0)
        try:
            code, timed_out, status = await self._nsexec.run(
                "exec", sb, leaf, cwd=cwd, argv=req.argv, env=env, stdin=req.stdin,
                sink=sink, limit=req.timeout, clock=self._registry.clock(sb.id),
                launched=lambda: self._quiet.release(req.execution_id, req.sandbox_id))  # its create's hold too
        finally:
            executions.pop(req.execution_id, None)
            execution.ended.set()
        t0 = phases.start()
        # Rootless: no memory cgroup, so no OOM kill either (allocations past the rlimit fail).
        oom = self._cgroups is not None and self._cgroups.oom_kills(sb.id, leaf) > 0
        self._nsexec.drop_leaf(sb.id, leaf)
        phases.end("driver: exec, after the helper (OOM count, leaf dropped)", t0)
        self._nsexec.raise_status(status, sb.id)
        if execution.cancelled:
            return ExecResult(exit_code=EXIT_CANCELLED, cancelled=True, oom_killed=oom)
        if timed_out:
            return ExecResult(exit_code=EXIT_TIMEOUT, timed_out=True, oom_killed=oom)
        return ExecResult(exit_code=code, oom_killed=oom)

    async def open_terminal(self, req: TerminalRequest) -> PtySession:
        sb = self._registry.running(req.sandbox_id)
        if not req.argv:
            raise InvalidInput("command must not be empty", field="command")
        env = self._env(sb, req.env)
        cwd = posixpath.normpath(posixpath.join(sb.home, req.cwd)) if req.cwd else sb.home
        self._registry.check_not_paused(sb)
        leaf = "t-" + secrets.token_hex(8)
        nsexec = self._nsexec
        nsexec.gc_leaves(sb.id)
        status_r, status_w = os.pipe()
        fds: list[int] = []
        try:
            cmd = nsexec.command("exec", sb, leaf, cwd=cwd, env=env, status_w=status_w, pass_fds=fds)
        except BaseException:
            for fd in (status_r, status_w, *fds):
                os.close(fd)
            raise

        def release() -> None:
            nsexec.ended(leaf)
            nsexec.drop_leaf(sb.id, leaf)

        try:
            term = await terminal.spawn(cmd, req.argv, rows=req.rows, cols=req.cols, status_r=status_r,
                                        status_w=status_w, extra_fds=fds, kill=lambda: nsexec.kill_leaf(sb.id, leaf),
                                        release=release)
        except terminal.StartFailed as failed:
            nsexec.raise_status(str(failed), sb.id)
            raise DriverFailure(f"sandbox {sb.id}: the terminal did not start") from None
        nsexec.started(leaf, term.pid)
        return term

    async def cancel(self, execution_id: str) -> None:
        """Kill the execution's tree. Unknown or already finished executions are a no-op."""
        execution = self._registry.executions.get(execution_id)
        if execution is None:
            return
        execution.cancelled = True
        if self._cgroups is not None and self._cgroups.is_frozen(execution.sandbox_id):
            await self._kill_frozen(execution)
            return
        await self._nsexec.kill_leaf(execution.sandbox_id, execution.leaf)

    async def _kill_frozen(self, execution: LocalExecution) -> None:
        """A command of a paused sandbox killed (a thaw-kill): every leaf frozen on its own,
        the sandbox thawed for as long as its pid 1 takes to report the command's end, then
        frozen again. The killed processes die as they thaw, running nothing more (a SIGKILL
        is taken before the return to user space); the other commands stay frozen throughout;
        pid 1 (hutch's) runs those milliseconds. On cgroup v1 a frozen process dies only once
        thawed, and the command's end is reported by pid 1: hence the thaw."""
        cgroups, sid = self._cgroups, execution.sandbox_id
        assert cgroups is not None
        async with self._registry.lock(sid):
            if not cgroups.is_frozen(sid):  # resumed meanwhile
                await self._nsexec.kill_leaf(sid, execution.leaf)
                return
            leaves = await asyncio.to_thread(cgroups.freeze_leaves, sid, True)
            try:
                cgroups.freeze(sid, False)
                await self._nsexec.kill_leaf(sid, execution.leaf)
                with contextlib.suppress(TimeoutError):  # its exec returns once pid 1 reported the end
                    await asyncio.wait_for(execution.ended.wait(), FROZEN_KILL_WAIT)
            finally:
                await asyncio.to_thread(cgroups.freeze, sid, True)  # polls until frozen
                await asyncio.to_thread(cgroups.freeze_leaves, sid, False, leaves)

    async def signal(self, execution_id: str, signum: int) -> None:
        """Send ``signum`` to every process of the execution's tree (its cgroup leaf,
        background children included), frozen meanwhile so none escapes by forking.
        Unknown or finished executions are a no-op. In a paused sandbox a SIGKILL ends the
        command at once (as a cancel); any other signal is taken when the sandbox resumes."""
        execution = self._registry.executions.get(execution_id)
        if execution is None:
            return
        if not 0 < signum < signal.NSIG:
            raise InvalidInput(f"signal: {signum} is not a signal", field="signal")
        if signum == signal.SIGKILL and self._cgroups is not None and self._cgroups.is_frozen(execution.sandbox_id):
            await self._kill_frozen(execution)
            return
        # Any other: cgroups.signal's freeze and thaw of the leaf leave it frozen under its sandbox.
        await self._nsexec.signal_leaf(execution.sandbox_id, execution.leaf, signum)

    async def write_files(self, sandbox_id: str, files: Sequence[FileWrite]) -> None:
        sb = self._registry.running(sandbox_id)
        if not files:
            return
        self._registry.check_not_paused(sb)
        payload = bytearray()
        for f in files:
            path = f.path.encode()
            if not path or b"\0" in path or len(path) > 4096:
                raise InvalidInput(f"invalid path {f.path!r}", field="path")
            payload += b"%o %d %d\n" % (f.mode & 0o777, len(path), len(f.content))
            payload += path + f.content
        leaf = f"w-{os.getpid()}-{time.monotonic_ns()}"
        code, timed_out, status = await self._nsexec.run(
            "write", sb, leaf, cwd=sb.home, stdin=bytes(payload), sink=None, limit=120)
        self._nsexec.drop_leaf(sb.id, leaf)
        self._nsexec.raise_status(status, sb.id)
        if timed_out or code != 0:
            raise DriverFailure(f"writing files into sandbox {sandbox_id} failed (exit {code})")

    async def pause(self, sandbox_id: str) -> None:
        """Freeze every process of the sandbox (the cgroup freezer), its running commands and
        background processes with the rest. Idempotent. A command's time limit counts on the
        sandbox's run clock, stopped from here to the resume: frozen time is not its.
        """
        sb = self._registry.running(sandbox_id)
        if self._cgroups is None:
            raise NotSupported(NO_FREEZER)
        async with self._registry.lock(sb.id):
            clock = self._registry.clock(sb.id)
            clock.freeze()  # first: a limit running out meanwhile would kill a command being frozen
            try:
                await asyncio.to_thread(self._cgroups.freeze, sb.id, True)  # polls until frozen
            except BaseException:
                if not self._cgroups.is_frozen(sb.id):
                    clock.thaw()
                raise

    async def resume(self, sandbox_id: str) -> None:
        sb = self._registry.running(sandbox_id)
        if self._cgroups is None:
            raise NotSupported(NO_FREEZER)
        async with self._registry.lock(sb.id):
            self._cgroups.freeze(sb.id, False)
            self._registry.clock(sb.id).thaw()

    async def guard_pids(self, closed: Callable[[], bool]) -> None:
        """Every second until ``closed()``: the leaves of sandboxes held at their pids
        limit (pidsguard.py). Only sandboxes with a leaf are read: reading every live one's
        pids.events each second took 16 % of the server's time with 1,700 idle (py-spy),
        and creates slowed as they piled up (docs/idle.md)."""
        assert self._cgroups is not None
        guard = PidsGuard(self._cgroups)
        while not closed():
            await asyncio.sleep(pidsguard.PERIOD)
            self._cgroups.drop_stale_spares()  # a spare memory leaf is a memory cgroup (cgroups.py)
            live = self._registry.sandboxes
            for sid, leaf in guard.check([s for s in self._nsexec.with_leaves() if s in live],
                                         self._registry.execution_leaves):
                with contextlib.suppress(Exception):  # gone meanwhile
                    await self._nsexec.kill_leaf(sid, leaf)
