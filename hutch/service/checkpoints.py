"""Disk checkpoints of a sandbox: decided in ``core.lifecycle`` and recorded through the
recorder like every lifecycle action, the driver taking, restoring or deleting the
checkpoint between the decision and the append.

Checkpoints take the host's disk outside the sandbox's own disk limit, so they are bounded:
per sandbox by count (HUTCH_MAX_CHECKPOINTS) and bytes (HUTCH_MAX_CHECKPOINT_BYTES), and per
organization by its storage quota (``snapshot_bytes``, service/quotas.py). A checkpoint's size is
known once taken: a full sandbox or organization is refused before, and one that the new
checkpoint took past a limit has it deleted again (logged) and is refused, so none stays over.

The host copies checkpoints in a few threads for the whole server: an organization has at most
``PER_ORG_AT_ONCE`` taken, restored or deleted at once (service/org_slots.py), so another
organization's waits behind at most that many of each.
"""

from __future__ import annotations

import attrs

from hutch.core import ids
from hutch.core.errors import QuotaExceeded
from hutch.core.lifecycle import (
    DeleteCheckpoint,
    RestoreCheckpoint,
    TakeCheckpoint,
    checkpoint_id_for,
)
from hutch.core.models import CheckpointState
from hutch.core.quantities import format_bytes
from hutch.drivers.roles import Checkpointing
from hutch.service.org_slots import OrgSlots
from hutch.service.quotas import Quotas
from hutch.service.reads import Reads
from hutch.service.recorder import Recorder
from hutch.service.timeouts import Reaper

PER_ORG_AT_ONCE = 2  # as many as the local driver copies at once (COPIES_AT_ONCE)


@attrs.frozen
class CheckpointLimits:
    count: int = 10  # per sandbox (HUTCH_MAX_CHECKPOINTS)
    bytes: int = 2 * 2**30  # per sandbox, on the host's disk (HUTCH_MAX_CHECKPOINT_BYTES)


class Checkpoints:
    def __init__(self, reads: Reads, recorder: Recorder, checkpointing: Checkpointing, reaper: Reaper, quotas: Quotas,
                 limits: CheckpointLimits | None = None) -> None:
        self._reads = reads
        self._recorder = recorder
        self._checkpointing = checkpointing
        self._reaper = reaper
        self._quotas = quotas
        self.limits = limits or CheckpointLimits()
        self._slots = OrgSlots(PER_ORG_AT_ONCE)

    async def create(self, sandbox_id: str, name: str) -> CheckpointState:
        sb = await self._reads.require(sandbox_id)
        org_id = sb.spec.org_id
        if len(sb.checkpoints) >= self.limits.count:
            raise QuotaExceeded(f"quota checkpoints: sandbox {sandbox_id} may keep {self.limits.count} checkpoints "
                                f"and keeps {len(sb.checkpoints)}; delete one first", quota="checkpoints",
                                limit=self.limits.count, used=len(sb.checkpoints))
        self._check_bytes(sandbox_id, await self._sizes(sandbox_id), adds=None)
        await self._quotas.storage_room(org_id)  # refuses an organization that stores its quota already
        checkpoint_id = ids.new_id("checkpoint")
        async with self._slots.slot(org_id):
            await self._recorder.act(sandbox_id, lambda _sb: TakeCheckpoint(checkpoint_id=checkpoint_id, name=name),
                                     lambda _: self._checkpointing.checkpoint(sandbox_id, checkpoint_id))
        try:
            sizes = await self._sizes(sandbox_id)
            self._check_bytes(sandbox_id, sizes, adds=checkpoint_id)
            await self._quotas.storage_room(org_id, allow_full=True)
        except QuotaExceeded:
            await self.delete(sandbox_id, checkpoint_id)  # none stays over a limit
            raise
        self._quotas.charge(org_id, sizes.get(checkpoint_id, 0))
        return next(c for c in (await self._reads.require(sandbox_id)).checkpoints if c.checkpoint_id == checkpoint_id)

    async def _sizes(self, sandbox_id: str) -> dict[str, int]:
        return await self._checkpointing.checkpoint_sizes(sandbox_id)

    def _check_bytes(self, sandbox_id: str, sizes: dict[str, int], adds: str | None) -> None:
        used, limit = sum(sizes.values()), self.limits.bytes
        over = used > limit if adds else used >= limit
        if over:
            what = f"this one took {format_bytes(sizes.get(adds, 0))}" if adds else "delete one first"
            raise QuotaExceeded(f"quota checkpoint_bytes: sandbox {sandbox_id}'s checkpoints may take "
                                f"{format_bytes(limit)}; they take {format_bytes(used)}, and {what}",
                                quota="checkpoint_bytes", limit=limit, used=used)

    async def list(self, sandbox_id: str) -> tuple[CheckpointState, ...]:
        return (await self._reads.require(sandbox_id, include_deleted=False)).checkpoints

    async def restore(self, sandbox_id: str, ref: str) -> None:
        """``ref``: the checkpoint's id or name (also for delete)."""
        org_id = (await self._reads.require(sandbox_id)).spec.org_id
        async with self._slots.slot(org_id):
            await self._recorder.act(sandbox_id, lambda sb: RestoreCheckpoint(checkpoint_id_for(sb, ref)),
                                     lambda command: self._checkpointing.restore(sandbox_id, command.checkpoint_id))
        self._reaper.touch(sandbox_id)

    async def delete(self, sandbox_id: str, ref: str) -> None:
        org_id = (await self._reads.require(sandbox_id)).spec.org_id
        async with self._slots.slot(org_id):
            await self._recorder.act(sandbox_id, lambda sb: DeleteCheckpoint(checkpoint_id_for(sb, ref)),
                                     lambda command: self._checkpointing.delete_checkpoint(sandbox_id,
                                                                                           command.checkpoint_id))
