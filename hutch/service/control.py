"""Sandbox control: pause, resume, env changes and the ends of a sandbox (destroyed on
request, terminated by the engine, or found ended by the driver), each recorded through
the recorder with the driver call it stands for."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

import attrs

from hutch.core import phases
from hutch.core.driver_types import Usage
from hutch.core.errors import NotSupported, SandboxNotFound
from hutch.core.events import PAUSE_FILESYSTEM, ExecutionFinished
from hutch.core.lifecycle import (
    DESTROYED_ON_REQUEST,
    ChangeEnv,
    ChangeTimeout,
    Destroy,
    Fail,
    Pause,
    Resume,
    Terminate,
)
from hutch.core.models import SandboxState, SandboxStatus
from hutch.core.quantities import stored_duration
from hutch.core.replicas import Replicas
from hutch.drivers.roles import CommandRunner, Pausing, SandboxLifecycle, UsageReporting
from hutch.service.reads import Reads
from hutch.service.recorder import Recorder, iso

log = logging.getLogger(__name__)


class SandboxControl:
    def __init__(self, reads: Reads, recorder: Recorder, replicas: Replicas, *, lifecycle: SandboxLifecycle,
                 pausing: Pausing, commands: CommandRunner, usage: UsageReporting) -> None:
        self._reads = reads
        self._recorder = recorder
        self._lifecycle = lifecycle
        self._pausing = pausing
        self._commands = commands
        self._usage_reporting = usage
        self.replicas = replicas  # which sandboxes this replica drives (core/replicas.py)

    async def pause(self, sandbox_id: str, *, memory: bool = True,
                    precondition: Callable[[SandboxState], None] | None = None) -> SandboxState:
        """Pause it: every process frozen, memory kept; or, ``memory`` false, filesystem only:
        every process ended (its commands cancelled, saying why), its memory released, its
        files kept, and the resume a new boot. ``precondition`` sees the sandbox as it is
        under its lock, before anything is decided; what it raises refuses the pause (the
        reaper's: its timeout still due, not set anew since it read the sandbox)."""
        def command(sb: SandboxState) -> Pause:
            if precondition is not None:
                precondition(sb)
            caps = self._lifecycle.capabilities
            if not memory and not caps.pause_filesystem:
                raise NotSupported(f"memory: the {self._lifecycle.name} driver cannot pause a sandbox filesystem-only "
                                   "(mode \"filesystem\")" +
                                   ("; it pauses with the memory kept" if caps.pause else "; it cannot pause at all"),
                                   field="memory")
            if memory and sb.status is SandboxStatus.RUNNING and caps.pause and not caps.pause_running:
                # Decided here, under the sandbox's lock, as a command's start is recorded: the
                # driver's own check could miss one recorded but not yet handed to it.
                raise NotSupported(f"sandbox {sb.sandbox_id} has commands running: the {self._lifecycle.name} "
                                   "driver pauses a sandbox with none (it cannot hold a frozen command's time "
                                   "limit); cancel them or wait for them, then pause", field="state")
            limit = sb.spec.timeout.paused
            paused_for = stored_duration("timeout.paused", limit) if limit else 0.0  # past the cap (older): the cap
            deadline = iso(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=paused_for)) if paused_for else None
            return Pause(terminates_at=deadline, mode=None if memory else PAUSE_FILESYSTEM)

        await self._recorder.act(sandbox_id, command, lambda _: self._pausing.pause(sandbox_id, memory=memory))
        return await self._reads.require(sandbox_id)

    async def resume(self, sandbox_id: str, *, auto: bool = False) -> SandboxState:
        await self._recorder.act(sandbox_id, lambda _sb: Resume(auto=auto), lambda _: self._pausing.resume(sandbox_id))
        return await self._reads.require(sandbox_id)

    async def set_env(self, sandbox_id: str, changes: dict[str, str | None]) -> dict[str, str]:
        await self._reads.require(sandbox_id, include_deleted=False)
        set_ = {k: v for k, v in changes.items() if v is not None}
        unset = tuple(k for k, v in changes.items() if v is None)
        await self._recorder.command(sandbox_id, ChangeEnv(set=set_, unset=unset))
        return dict((await self._reads.require(sandbox_id)).spec.env)

    async def set_idle_timeout(self, sandbox_id: str, idle: str | None) -> SandboxState:
        """A new idle timeout from now on: the reaper reschedules on the event, and the event
        itself is the sandbox's latest activity."""
        await self._recorder.command(sandbox_id, ChangeTimeout(idle))
        return await self._reads.require(sandbox_id)

    async def destroy(self, sandbox_id: str) -> None:
        sb = await self._reads.require(sandbox_id)
        if sb.status is SandboxStatus.DELETED:
            return
        # The destroy records the end of every command still running (core.lifecycle._stopped):
        # those are the ones killed now, whatever the driver then reports of them.
        recorded = await self._recorder.command(sandbox_id, Destroy(reason=DESTROYED_ON_REQUEST))
        for event in recorded:
            if isinstance(event.data, ExecutionFinished):
                with contextlib.suppress(Exception):
                    await self._commands.cancel(event.data.execution_id)
        used = _fields(await self._lifecycle.destroy_measured(sandbox_id, lambda: self._usage(sandbox_id)))
        await self._recorder.command(sandbox_id, Terminate(reason=DESTROYED_ON_REQUEST, deleted=True, **used))
        self._recorder.forget(sandbox_id)

    async def end(self, sandbox_id: str, command: Terminate, *,
                  precondition: Callable[[SandboxState], None] | None = None) -> None:
        """End a sandbox not destroyed on request (oneshot done, reaped, restart): the driver
        lets it go, then the end is recorded with its usage. One with commands still running
        (a timeout counted busy or not, a paused one's frozen commands, one started after the
        caller read it idle) is recorded ending first, as a destroy is, their ends with it:
        their clients hear that the sandbox ended, not what its driver's kill left of them.
        Decided under the sandbox's lock, not on what the caller read; ``precondition`` sees
        it there first, and what it raises refuses the end (as ``pause``'s)."""
        ending = Destroy(reason=command.reason, if_running=True)
        with contextlib.suppress(SandboxNotFound):  # nothing recorded of it: the driver lets it go all the same
            if precondition is None:
                await self._recorder.command(sandbox_id, ending)
            else:
                def checked(sb: SandboxState) -> Destroy:
                    precondition(sb)
                    return ending
                await self._recorder.act(sandbox_id, checked, _nothing)
        try:
            with phases.span("driver: destroy, its usage read before"):
                used = await self._lifecycle.destroy_measured(sandbox_id, lambda: self._usage(sandbox_id))
            command = attrs.evolve(command, **_fields(used))
        except Exception as err:  # still record the end; the driver cleans leftovers at start
            log.exception("destroying %s failed", sandbox_id)
            await self._recorder.command(sandbox_id, Fail(reason=f"destroy failed: {err}"))
            return
        await self._recorder.command(sandbox_id, command)
        self._recorder.forget(sandbox_id)

    async def ended(self, sandbox_id: str, reason: str, failed: bool) -> None:
        """The driver saw a sandbox end on its own (a Nomad allocation lost or OOM-killed)."""
        try:
            sb = await self._reads.store.get_sandbox(sandbox_id)
            if sb is None or sb.status.is_final:
                return
            await self._recorder.command(sandbox_id, Fail(reason=reason) if failed else Terminate(reason=reason))
        except Exception:  # the driver's watcher must survive whatever happens here
            log.exception("recording the end of sandbox %s failed", sandbox_id)

    async def _usage(self, sandbox_id: str) -> Usage:
        """Best effort, just before the driver forgets the sandbox: stats want it later.
        Travels in the lifecycle:terminated event (Terminate's usage fields)."""
        with phases.span("end: usage read"):
            try:
                return await self._usage_reporting.usage(sandbox_id)
            except Exception:
                log.warning("reading the usage of %s failed", sandbox_id, exc_info=True)
                return Usage()


def _fields(used: Usage) -> dict[str, Any]:
    """Terminate's usage fields."""
    return {"cpu_seconds": round(used.cpu_seconds, 6) if used.cpu_seconds is not None else None,
            "memory_peak_bytes": used.memory_peak_bytes}


async def _nothing(_command: object) -> None:
    """The effect of a step that is only recorded (``Recorder.act`` wants one)."""
