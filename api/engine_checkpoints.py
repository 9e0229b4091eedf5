"""Disk checkpoints of a sandbox: decided in ``core.lifecycle`` and recorded through the
recorder like every lifecycle action, the driver taking, restoring or deleting the
checkpoint between the decision and the append."""

from __future__ import annotations

from hutch.api.reads import Reads
from hutch.api.recorder import Recorder
from hutch.api.timeouts import Reaper
from hutch.core import ids
from hutch.core.lifecycle import (
    DeleteCheckpoint,
    RestoreCheckpoint,
    TakeCheckpoint,
    checkpoint_id_for,
)
from hutch.core.models import Checkpoint
from hutch.drivers.base import Driver


class Checkpoints:
    def __init__(self, reads: Reads, recorder: Recorder, driver: Driver, reaper: Reaper) -> None:
        self._reads = reads
        self._recorder = recorder
        self._driver = driver
        self._reaper = reaper

    async def create(self, sandbox_id: str, name: str) -> Checkpoint:
        checkpoint_id = ids.new_id("checkpoint")
        await self._recorder.act(sandbox_id, lambda _sb: TakeCheckpoint(checkpoint_id=checkpoint_id, name=name),
                                 lambda _: self._driver.checkpoint(sandbox_id, checkpoint_id))
        return next(c for c in (await self._reads.require(sandbox_id)).checkpoints if c.checkpoint_id == checkpoint_id)

    async def list(self, sandbox_id: str) -> tuple[Checkpoint, ...]:
        return (await self._reads.require(sandbox_id, include_deleted=False)).checkpoints

    async def restore(self, sandbox_id: str, ref: str) -> None:
        """``ref``: the checkpoint's id or name (also for delete)."""
        await self._recorder.act(sandbox_id, lambda sb: RestoreCheckpoint(checkpoint_id_for(sb, ref)),
                                 lambda command: self._driver.restore(sandbox_id, command.checkpoint_id))
        self._reaper.touch(sandbox_id)

    async def delete(self, sandbox_id: str, ref: str) -> None:
        await self._recorder.act(sandbox_id, lambda sb: DeleteCheckpoint(checkpoint_id_for(sb, ref)),
                                 lambda command: self._driver.delete_checkpoint(sandbox_id, command.checkpoint_id))
