"""The nomad driver's pause and resume (a mixin of :class:`drivers.nomad.driver.NomadDriver`).

A pause is containerd's freeze of the whole task (the plugin's freeze verb): the exec agent and
the commands it forked are frozen with the rest, and their time limits and the agent's
heartbeat watch count on the sandbox's run clock (``drivers.runclock``), which stands still
while it is frozen. A command run as its own alloc exec is not frozen mid-way (a runc exec
frozen while it starts holds the resume): a pause while one runs is refused, and one that
would start while paused waits for the resume (``_alloc_exec_turn``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from hutch.core.errors import IllegalTransition, NotSupported
from hutch.drivers.nomad.agents import ExecAgents
from hutch.drivers.nomad.executions import RunningCommand
from hutch.drivers.nomad.state import NomadSandbox


class NomadPausing:
    name: str
    _agents: ExecAgents
    _executions: dict[str, RunningCommand]
    _paused: set[str]
    # Paused or pausing: no alloc exec of a command starts (it waits on the event, set at the resume).
    _pausing: dict[str, asyncio.Event]

    if TYPE_CHECKING:  # provided by NomadDriver; a stub here would shadow it in the MRO
        def running(self, sid: str) -> NomadSandbox: ...
        def _lock(self, sid: str) -> asyncio.Lock: ...
        async def _verb(self, sb: NomadSandbox, verb: dict[str, Any]) -> None: ...

    async def pause(self, sandbox_id: str, *, memory: bool = True) -> None:
        """Freeze every process of the sandbox (containerd's pause: the cgroup freezer), the
        exec agent and the commands it runs with the rest. Idempotent. Their time limits and
        the agent's silence count on the sandbox's run clock, stopped from here to the resume.

        An exec agent starting (a runc exec) is let finish first (``ExecAgents.hold``); a
        command running as its own alloc exec (no agent) refuses the pause: one frozen while
        runc starts it holds the resume, and so none is frozen. One about to start as an alloc
        exec waits for the resume (``_alloc_exec_turn``). No filesystem-only pause: its task would
        have to start again over its kept rootfs, which the containerd driver's allocation does
        not do (the service refuses it first, from the capabilities; this is the driver's own
        word, not a quiet pause with the memory kept)."""
        if not memory:
            raise NotSupported(f"memory: the {self.name} driver cannot pause a sandbox filesystem-only (mode "
                               "\"filesystem\"); it pauses with the memory kept", field="memory")
        sb = self.running(sandbox_id)
        async with self._lock(sb.id):
            if sb.id in self._paused:
                return
            apart = sorted(eid for eid, ex in self._executions.items() if ex.sandbox_id == sb.id and ex.alloc_exec)
            if apart:
                raise NotSupported(f"sandbox {sb.id} has a command running as its own alloc exec, outside its exec "
                                   f"agent (execution {apart[0]}): the nomad driver freezes only the commands its "
                                   "exec agent runs; cancel it or wait for it, then pause", field="state")
            self._pausing.setdefault(sb.id, asyncio.Event())  # at once: no alloc exec starts from here
            clock = self._agents.clock(sb.id)
            try:
                await self._agents.hold(sb.id)
                clock.freeze()  # first: a limit running out meanwhile would kill a command being frozen
                await self._verb(sb, {"freeze": True})
            except BaseException:
                clock.thaw()
                self._agents.release(sb.id)
                self._wake(sb.id)
                raise
            self._paused.add(sb.id)

    async def resume(self, sandbox_id: str) -> None:
        sb = self.running(sandbox_id)
        async with self._lock(sb.id):
            await self._verb(sb, {"freeze": False})
            self._paused.discard(sb.id)
            self._agents.clock(sb.id).thaw()
            self._agents.release(sb.id)
            self._wake(sb.id)

    def _found_paused(self, sandbox_id: str) -> None:
        """A sandbox adopted paused: as after a pause (no agent start, no alloc exec of a
        command, its run clock stopped) until it resumes."""
        self._paused.add(sandbox_id)
        self._pausing.setdefault(sandbox_id, asyncio.Event())
        self._agents.held(sandbox_id)

    def _wake(self, sandbox_id: str) -> None:
        """The sandbox is no longer paused (resumed, or gone): alloc execs waiting start (or end)."""
        event = self._pausing.pop(sandbox_id, None)
        if event is not None:
            event.set()

    async def _alloc_exec_turn(self, sb: NomadSandbox, execution: RunningCommand) -> bool:
        """Before a command starts as its own alloc exec: in a paused sandbox it waits for the
        resume, frozen as the others are (its time limit on the run clock stands still too);
        False if it was stopped meanwhile (a cancel, a destroy). Marked from then on: a pause
        refuses it (``pause``)."""
        while (event := self._pausing.get(sb.id)) is not None and not execution.stop.is_set():
            waits = {asyncio.ensure_future(execution.stop.wait()), asyncio.ensure_future(event.wait())}
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
        if execution.stop.is_set():
            return False
        execution.alloc_exec = True
        return True

    def check_not_paused(self, sb: NomadSandbox) -> None:
        if sb.id in self._paused:
            raise IllegalTransition(f"sandbox {sb.id} is paused; resume it first")
