"""The Engine's checkpoint operations (a mixin of ``api.service.Engine``): disk checkpoints of
a sandbox, decided in ``core.lifecycle`` and recorded in the log like every lifecycle action."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core import ids
from core.lifecycle import (
    DeleteCheckpoint,
    RestoreCheckpoint,
    TakeCheckpoint,
    checkpoint_id_for,
    decide,
)
from core.models import Checkpoint

if TYPE_CHECKING:
    from api.service import Engine


class CheckpointOps:
    async def create_checkpoint(self: Engine, sandbox_id: str, name: str) -> Checkpoint:
        checkpoint_id = ids.new_id("checkpoint")
        async with self._lock(sandbox_id):
            sb = await self._require(sandbox_id, include_deleted=False)
            events = decide(sb, TakeCheckpoint(checkpoint_id=checkpoint_id, name=name))  # checks before any work
            await self.driver.checkpoint(sandbox_id, checkpoint_id)
            await self._append(sandbox_id, events)
        return next(c for c in (await self._require(sandbox_id)).checkpoints if c.checkpoint_id == checkpoint_id)

    async def list_checkpoints(self: Engine, sandbox_id: str) -> tuple[Checkpoint, ...]:
        return (await self._require(sandbox_id, include_deleted=False)).checkpoints

    async def restore_checkpoint(self: Engine, sandbox_id: str, ref: str) -> None:
        """``ref``: the checkpoint's id or name (also for delete)."""
        async with self._lock(sandbox_id):
            sb = await self._require(sandbox_id, include_deleted=False)
            events = decide(sb, RestoreCheckpoint(checkpoint_id := checkpoint_id_for(sb, ref)))
            await self.driver.restore(sandbox_id, checkpoint_id)
            await self._append(sandbox_id, events)
        self.touch(sandbox_id)

    async def delete_checkpoint(self: Engine, sandbox_id: str, ref: str) -> None:
        async with self._lock(sandbox_id):
            sb = await self._require(sandbox_id, include_deleted=False)
            events = decide(sb, DeleteCheckpoint(checkpoint_id := checkpoint_id_for(sb, ref)))
            await self.driver.delete_checkpoint(sandbox_id, checkpoint_id)
            await self._append(sandbox_id, events)
