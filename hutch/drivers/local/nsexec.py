"""The local driver's side of the ``hutch-nsexec`` protocol (native/hutch-nsexec.c).

Every command, file write and file operation in a sandbox is one hutch-nsexec process
in a cgroup leaf of its own (rootless: a session of its own), so that precisely its
process tree can be killed. This module makes its command line, runs it (helper.py),
kills and signals a leaf's tree, removes leaves once empty (or later, while background
processes still hold one: "lingering"), and turns the helper's status message into
the driver's errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from pathlib import Path

from hutch.core.errors import DriverFailure, InvalidInput, SandboxNotFound
from hutch.drivers.base import OutputSink
from hutch.drivers.local import helper, zygote
from hutch.drivers.local.cgroups import Cgroups
from hutch.drivers.local.state import LocalSandbox, Registry


def env_fd(env: Mapping[str, str]) -> int:
    """A memfd holding ``env`` as NUL-terminated KEY=VALUE entries, read from its start by
    hutch-nsexec (--env-fd). Only the server (root) and the helper it starts hold it."""
    fd = os.memfd_create("hutch-env", os.MFD_CLOEXEC)
    try:
        data = memoryview(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
        while data:
            data = data[os.write(fd, data):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def rlimit_args(sb: LocalSandbox) -> list[str]:
    """Rlimits every process of a rootless sandbox gets (none when cgroups limit it)."""
    args = []
    if sb.rlimit_data:
        args += ["--rlimit-data", str(sb.rlimit_data)]
    if sb.rlimit_nproc:
        args += ["--rlimit-nproc", str(sb.rlimit_nproc)]
    return args


class Nsexec:
    """Runs hutch-nsexec in sandboxes and keeps track of the leaves it runs in."""

    def __init__(self, registry: Registry, cgroups: Cgroups | None) -> None:
        self.path: Path | None = None  # the helper binary, once the driver has started
        self._registry = registry
        self._cgroups = cgroups
        self._lingering: dict[str, set[str]] = {}  # leaves kept alive by background processes
        self._leaves: dict[str, set[str]] = {}  # every leaf made and not removed yet: in use or lingering
        self._pids: dict[str, int] = {}  # leaf -> pid of the helper running it (rootless kills)
        self._leaders: dict[str, int] = {}  # leaf -> pid of the command the zygote forked (the same)
        self.zygote_runs = 0  # commands pid 1 forked (zygote.py), for tests and benchmarks

    def command(self, mode: str, sb: LocalSandbox, leaf: str, *, cwd: str, env: Mapping[str, str] | None,
                status_w: int, pass_fds: list[int] | None = None) -> list[str]:
        """hutch-nsexec's command line up to the ``--`` before the argv; makes the leaf cgroup.
        An ``env`` goes in a memfd added to ``pass_fds`` (the caller passes it on and closes it):
        a tenant's variables are secrets, and a command line is readable by every host user."""
        assert self.path is not None
        assert env is None or pass_fds is not None
        procs = self._make_leaf(sb, leaf)
        cmd = [str(self.path), mode, "--pid", str(sb.init_pid), "--uid", str(sb.uid), "--gid", str(sb.uid),
               "--cwd", cwd, "--status-fd", str(status_w), *rlimit_args(sb)]
        for p in procs:
            cmd += ["--cgroup-procs", str(p)]
        if env is not None and pass_fds is not None:
            fd = env_fd(env)
            pass_fds.append(fd)
            cmd += ["--env-fd", str(fd)]
        return cmd

    async def run(
        self,
        mode: str,
        sb: LocalSandbox,
        leaf: str,
        *,
        cwd: str,
        argv: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        stdin: bytes | AsyncIterable[bytes] | None,
        sink: OutputSink | None,
        limit: float | None,
        launched: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> tuple[int, bool, str]:
        """Run hutch-nsexec in the sandbox (helper.py), or a command through the sandbox's
        pid 1 (zygote.py) where it takes requests; (exit code, timed out, status message).
        ``launched`` is called once the helper is started (the request sent); ``limit`` counts
        on ``clock`` (the sandbox's run clock, drivers/runclock.py)."""
        if mode == "exec" and zygote.enabled():
            procs = self._make_leaf(sb, leaf)

            def leader(pid: int) -> None:
                self._leaders[leaf] = pid

            try:
                result = await zygote.run(
                    self._registry.sandbox_root / sb.id, cwd=cwd, argv=argv, env=env or {}, cgroup_files=procs,
                    stdin=stdin, sink=sink, limit=limit, kill=lambda: self.kill_leaf(sb.id, leaf),
                    sent=launched, started=leader, clock=clock)
            except zygote.Unavailable:
                pass  # nothing started: the helper does it
            else:
                self.zygote_runs += 1
                return result
            finally:
                self._leaders.pop(leaf, None)
        status_r, status_w = os.pipe()
        fds: list[int] = []
        try:
            cmd = self.command(mode, sb, leaf, cwd=cwd, env=env, status_w=status_w, pass_fds=fds)
        except BaseException:
            for fd in (status_r, status_w, *fds):
                os.close(fd)
            raise

        def started(pid: int) -> None:
            self._pids[leaf] = pid
            launched()

        try:
            return await helper.run(cmd, argv, status_r=status_r, status_w=status_w, extra_fds=fds, stdin=stdin, sink=sink,
                                    limit=limit, kill=lambda: self.kill_leaf(sb.id, leaf), started=started,
                                    clock=clock)
        finally:
            self._pids.pop(leaf, None)

    def started(self, leaf: str, pid: int) -> None:
        """A helper the caller started itself (a terminal) runs ``leaf``."""
        self._pids[leaf] = pid

    def ended(self, leaf: str) -> None:
        self._pids.pop(leaf, None)

    async def kill_leaf(self, sid: str, leaf: str) -> None:
        """Kill the process tree of one execution (or file operation): its cgroup leaf,
        or rootless, its session (helper.kill_session)."""
        if self._cgroups is not None:
            await self._cgroups.kill(sid, leaf)
        elif leaf in self._leaders:
            await asyncio.to_thread(helper.kill_session_of, self._leaders[leaf], signal.SIGKILL)
        elif leaf in self._pids:
            await asyncio.to_thread(helper.kill_session, self._pids[leaf], signal.SIGKILL)

    async def signal_leaf(self, sid: str, leaf: str, signum: int) -> None:
        """Send ``signum`` to every process of the leaf (frozen meanwhile so none escapes
        by forking), or rootless, once to its session."""
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.signal, sid, leaf, signum)
        elif leaf in self._leaders:
            await asyncio.to_thread(helper.kill_session_of, self._leaders[leaf], signum, once=True)
        elif leaf in self._pids:
            await asyncio.to_thread(helper.kill_session, self._pids[leaf], signum, once=True)

    def _make_leaf(self, sb: LocalSandbox, leaf: str) -> list[Path]:
        if self._cgroups is None:  # rootless: no leaves
            return []
        self._cgroups.apply_cpu(sb.id, sb.cpu_millis)  # not written at the create (cgroups.py)
        self._cgroups.apply_memory(sb.id, sb.memory_bytes)  # v1: not made at the create (cgroups.py)
        procs = self._cgroups.create_leaf(sb.id, leaf)
        self._leaves.setdefault(sb.id, set()).add(leaf)
        return procs

    def _removed(self, sid: str, leaf: str) -> None:
        leaves = self._leaves.get(sid)
        if leaves is not None:
            leaves.discard(leaf)
            if not leaves:
                del self._leaves[sid]

    def drop_leaf(self, sid: str, leaf: str) -> None:
        if self._cgroups is None:  # rootless: no leaves
            return
        with contextlib.suppress(OSError):
            if self._cgroups.remove(sid, leaf):
                self._removed(sid, leaf)
                return
        self._lingering.setdefault(sid, set()).add(leaf)

    def gc_leaves(self, sid: str) -> None:
        if self._cgroups is None:
            return
        leaves = self._lingering.get(sid)
        if leaves:
            for leaf in list(leaves):
                if self._cgroups.remove(sid, leaf):
                    leaves.discard(leaf)
                    self._removed(sid, leaf)

    def adopt_leaves(self, sid: str, leaves: Iterable[str]) -> None:
        """Leaves an earlier server left in an adopted sandbox: lingering from here on."""
        for leaf in leaves:
            self._leaves.setdefault(sid, set()).add(leaf)
            self._lingering.setdefault(sid, set()).add(leaf)

    def with_leaves(self) -> set[str]:
        """The sandboxes that have a leaf besides pid 1's: a command, file operation or
        terminal in progress, or one that ended and left processes behind. Only these can
        hold a leaf the pids guard would end; an idle sandbox has none (pidsguard.py)."""
        return set(self._leaves)

    def forget(self, sid: str) -> None:
        """The sandbox is being torn down: its lingering leaves go with its cgroup."""
        self._lingering.pop(sid, None)
        self._leaves.pop(sid, None)

    def raise_status(self, status: str, sid: str) -> None:
        """Raise what the helper's status message says went wrong, if anything."""
        if not status:
            return
        kind, _, message = status.strip().partition("\t")
        if kind == "cwd":
            raise InvalidInput(f"working directory {message}", field="cwd")
        if kind == "file":
            raise InvalidInput(f"cannot write {message}", field="path")
        if self._registry.load(sid) is None:
            raise SandboxNotFound(f"sandbox {sid} was destroyed")
        raise DriverFailure(f"sandbox {sid}: {message or status}")
