"""Idle and paused timeouts: the reaper ends a sandbox when its deadline passes (or, where its
``timeout.on_idle`` says "pause", pauses it at its idle timeout).

A deadline is derived from the sandbox's state (its ``timeout.idle`` after the last event or
activity, or after it was set where ``timeout.since`` says "set", busy or not; its
``timeout.paused`` after it paused), so nothing about timers is logged; every
event re-arms its sandbox's timer and a restart re-arms them all from the live sandboxes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable

from hutch.core.errors import HutchError, NotSupported
from hutch.core.lifecycle import Terminate
from hutch.core.models import ON_IDLE_PAUSE, ON_IDLE_PAUSE_FILESYSTEM, SandboxState, SandboxStatus
from hutch.core.quantities import stored_duration
from hutch.projections.base import ProjectionStore, SandboxQuery
from hutch.projections.runner import Projector
from hutch.service.background import Background
from hutch.service.control import SandboxControl

log = logging.getLogger("hutch.service")


def seconds(value: str | None, field: str) -> float:
    """A stored timeout in seconds (0: none). One past the cap (quantities.MAX_DURATION_DAYS),
    recorded before the cap was, reads as the cap: a deadline 100 years away, as everywhere."""
    return stored_duration(field, value) if value else 0.0


def _unix(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


PAUSES = (ON_IDLE_PAUSE, ON_IDLE_PAUSE_FILESYSTEM)


def _said(err: Exception) -> str:
    """A failure as a sandbox's reason says it: hutch's in its words, another with its type."""
    return err.message if isinstance(err, HutchError) else f"{type(err).__name__}: {err}"


class NoLongerDue(Exception):
    """The sandbox's deadline moved (its timeout set anew, a pause) after the reaper read it."""


class Reaper:
    def __init__(self, store: ProjectionStore, projector: Projector, background: Background,
                 control: SandboxControl, *,
                 read: Callable[[str], Awaitable[SandboxState | None]] | None = None) -> None:
        self._store = store
        # Re-armed on every event: ``read`` (Reads.sandbox) answers this process's own live
        # sandboxes without a store round trip, which was six reads per one-shot.
        self._read = read or store.get_sandbox
        self._projector = projector
        self._background = background
        self._control = control
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._activity: dict[str, float] = {}
        self._unschedulable: dict[str, str] = {}  # sandbox id -> why its deadline failed (said once)
        self._retries: dict[str, int] = {}  # sandbox id -> reads failed in a row (its retry's backoff)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()

    def deadline(self, sb: SandboxState) -> tuple[float, str] | None:
        """(unix time, reason) at which the reaper ends this sandbox, if ever."""
        if sb.status is SandboxStatus.PAUSED:
            limit = seconds(sb.spec.timeout.paused, "timeout.paused")
            if limit and sb.paused_at:
                return _unix(sb.paused_at) + limit, f"paused timeout ({sb.spec.timeout.paused}) reached"
        elif sb.spec.timeout.since == "set" and sb.status in (SandboxStatus.IDLE, SandboxStatus.RUNNING):
            # E2B's timeout: from when it was set, whatever runs or happens meanwhile.
            limit = seconds(sb.spec.timeout.idle, "timeout.idle")
            if limit:
                return _unix(sb.timeout_set_at or sb.created_at) + limit, f"timeout ({sb.spec.timeout.idle}) reached"
        elif sb.status is SandboxStatus.IDLE:
            limit = seconds(sb.spec.timeout.idle, "timeout.idle")
            if limit:
                last = max(_unix(sb.updated_at), self._activity.get(sb.sandbox_id, 0.0))
                return last + limit, f"idle timeout ({sb.spec.timeout.idle}) reached"
        return None

    def touch(self, sandbox_id: str) -> None:
        """Activity that is not an event (file operations) still keeps a sandbox from idling out."""
        self._activity[sandbox_id] = time.time()

    async def schedule(self, sandbox_id: str, sb: SandboxState | None = None) -> None:
        """Arm its timer (``sb``: as listed, else read). Only the read raises: a deadline this
        sandbox's state cannot give is logged and none is kept (see ``_deadline``)."""
        timer = self._timers.pop(sandbox_id, None)
        if timer is not None:
            timer.cancel()
        if sb is None:
            sb = await self._read(sandbox_id)
        if sb is None or sb.status.is_final:
            self._activity.pop(sandbox_id, None)
            self._unschedulable.pop(sandbox_id, None)
            return
        found = self._deadline(sb)
        if found is None:
            return
        at, _reason = found
        loop = asyncio.get_running_loop()
        self._timers[sandbox_id] = loop.call_later(max(0.0, at - time.time()), self._spawn_reap, sandbox_id)

    def _spawn_reap(self, sandbox_id: str, tries: int = 0) -> None:
        self._timers.pop(sandbox_id, None)
        self._background.spawn(self._reap_or_retry(sandbox_id, tries), f"reap-{sandbox_id}")

    async def _reap_or_retry(self, sandbox_id: str, tries: int) -> None:
        """``_reap``, tried again while it fails (its read with the store away, the end itself):
        a reap that died left the sandbox past its timeout, its timer spent, until an event of
        its own came. Backing off 0.5 → 30 s; said once. A timer armed meanwhile (an event
        rescheduled it) takes over."""
        try:
            await self._reap(sandbox_id)
        except Exception as err:  # any: a limit must not end with one failure
            if sandbox_id in self._timers:
                return
            if tries == 0:
                log.warning("timeouts: ending or pausing %s at its timeout failed (%s); retrying", sandbox_id, err)
            self._timers[sandbox_id] = asyncio.get_running_loop().call_later(
                min(0.5 * 2 ** tries, 30.0), self._spawn_reap, sandbox_id, tries + 1)

    def _deadline(self, sb: SandboxState) -> tuple[float, str] | None:
        """``deadline``, or None where this sandbox's own state cannot give one (one an older
        server recorded, as a timeout past the cap once raised here): it keeps no timer, as one
        without a timeout, rather than being ended for the server's failing (its tenant's
        sandbox) or holding the reaper on it (every tenant's timeouts). Said once per sandbox
        and reason; its next event tries again. Any exception: it is this sandbox's data, not
        the store's (already read), and the reaper is every tenant's."""
        try:
            found = self.deadline(sb)
        except Exception as err:  # any: see above
            why = f"{type(err).__name__}: {err}"
            if self._unschedulable.get(sb.sandbox_id) != why:
                self._unschedulable[sb.sandbox_id] = why
                log.warning("timeouts: %s keeps no timeout, its state gives no deadline (%s)", sb.sandbox_id, why)
            return None
        self._unschedulable.pop(sb.sandbox_id, None)
        return found

    async def _reap(self, sandbox_id: str) -> None:
        sb = await self._read(sandbox_id)
        found = self._deadline(sb) if sb is not None else None
        if found is None:
            return
        at, reason = found
        if at > time.time() + 0.001:  # activity moved the deadline
            await self.schedule(sandbox_id)
            return
        if not await self._control.replicas.mine(sandbox_id):
            return  # another replica's: its own reaper ends it
        on_idle = sb.spec.timeout.on_idle if sb is not None else None
        if sb is not None and sb.status in (SandboxStatus.IDLE, SandboxStatus.RUNNING) and on_idle in PAUSES:
            # Only E2B's timeout (counted from when it was set) is reached with commands running:
            # they are frozen with the sandbox, as E2B's, where the driver can (pause_running);
            # a filesystem-only pause ends them.
            log.info("pausing %s (%s): %s", sandbox_id, on_idle, reason)
            try:
                await self._control.pause(sandbox_id, memory=on_idle == ON_IDLE_PAUSE, precondition=self._due)
                return
            except NoLongerDue:
                await self.schedule(sandbox_id)
                return
            except NotSupported as err:
                # A driver that cannot freeze (rootless) or freeze a running command: its timeout
                # still holds. Waiting for the commands to end kept a never-ending one running
                # past it for ever. Its files are kept where the driver can pause them alone (its
                # commands ended, saying why); else it is ended, as a sandbox without autoPause.
                reason = f"{reason}; pausing it with its memory failed: {err.message}" \
                    if on_idle == ON_IDLE_PAUSE else f"{reason}; pausing it failed: {err.message}"
                if on_idle == ON_IDLE_PAUSE:
                    log.info("pausing %s at its timeout kept no memory (%s); pausing it filesystem-only",
                             sandbox_id, err)
                    try:
                        await self._control.pause(sandbox_id, memory=False, precondition=self._due)
                        return
                    except NoLongerDue:  # set anew as the first was refused: it waits for its new time
                        await self.schedule(sandbox_id)
                        return
                    except Exception as again:  # any, as below
                        reason = f"{reason}; pausing it filesystem-only failed: {_said(again)}"
                log.warning("%s cannot be paused at its timeout; ending it: %s", sandbox_id, reason)
            except Exception as err:  # any: a sandbox that cannot be kept is ended, as any other would be
                # (one not hutch's, a driver's own, retried the reap for ever: _reap_or_retry)
                log.warning("pausing %s at its idle timeout failed (%s); ending it", sandbox_id, err)
                reason = f"{reason}; pausing it failed: {_said(err)}"
        log.info("reaping %s: %s", sandbox_id, reason)
        try:  # its running commands ended first; decided on it as it is then (a pause may have taken seconds)
            await self._control.end(sandbox_id, Terminate(reason=reason), precondition=self._due)
        except NoLongerDue:  # set anew meanwhile: it waits for its new time
            await self.schedule(sandbox_id)

    def _due(self, sb: SandboxState) -> None:
        """A pause's precondition (decided under the sandbox's lock): its deadline is still
        the one passed, not moved by what came after the reaper read it (a timeout set anew
        as a pause was refused, before the fallback acted on the old one)."""
        found = self._deadline(sb)
        if found is None or found[0] > time.time() + 0.001:
            raise NoLongerDue(sb.sandbox_id)

    async def watch(self) -> None:
        queue = self._projector.listen()
        loop = asyncio.get_running_loop()
        try:
            while True:  # a store outage (PostgreSQL restarting) must not end the watch
                try:
                    live, _ = await self._store.list_sandboxes(SandboxQuery(live=True, limit=10**9))
                    break
                except Exception as err:  # any: one not hutch's (a store's untranslated) ended the watch
                    log.warning("timeouts: cannot list live sandboxes (%s); retrying", err)
                    await asyncio.sleep(1)
            for sb in live:  # as listed: no read to fail, and a deadline that fails is its own
                await self.schedule(sb.sandbox_id, sb)
            while True:
                event = await queue.get()
                try:
                    await self.schedule(event.sandbox_id)
                    self._retries.pop(event.sandbox_id, None)
                except Exception as err:  # any: one not hutch's (a store's untranslated) ended the watch
                    # Its read failed (the store away): retried later, backing off, while every
                    # other sandbox's events go on (a sleep here held them all).
                    tries = self._retries[event.sandbox_id] = self._retries.get(event.sandbox_id, 0) + 1
                    if tries == 1:
                        log.warning("timeouts: cannot schedule %s (%s); retrying", event.sandbox_id, err)
                    loop.call_later(min(0.5 * 2 ** (tries - 1), 30.0), queue.put_nowait, event)
        finally:
            self._projector.unlisten(queue)
