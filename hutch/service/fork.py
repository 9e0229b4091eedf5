"""Fork: N new sandboxes whose files and env are a sandbox's at one instant, for agents that
explore alternatives in parallel.

The instant is a snapshot (service/snapshots.py: the workspace archive, the env), named
``fork-…`` and kept as the record of what the copies started from; each copy is a create from
it with the parent's spec (runtime, resources, network, timeouts, installs, project), so the
log's create events name the snapshot and ``metadata.forkedFrom`` the parent. Processes are
not carried: a copy starts with no process of the parent running (CRIU does not work on these
kernels, and a copy of a running process would share its sockets anyway).

Room for every copy is held before the snapshot is taken (``Provisioning.reserve``): a host
or cluster that cannot take them all answers 503 NO_CAPACITY with nothing recorded, not a
snapshot and the copies that happened to fit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import attrs

from hutch.core import ids
from hutch.core.errors import InvalidInput, SnapshotNotFound
from hutch.core.models import SnapshotState
from hutch.core.snapshots import FORK_OF
from hutch.service.control import SandboxControl
from hutch.service.provisioning import Created, Provisioning
from hutch.service.quotas import Quotas
from hutch.service.reads import Reads
from hutch.service.requests import CreateRequest
from hutch.service.snapshots import Snapshots

MAX_COPIES = 20
log = logging.getLogger(__name__)


class Forks:
    def __init__(self, reads: Reads, quotas: Quotas, snapshots: Snapshots, provisioning: Provisioning,
                 control: SandboxControl) -> None:
        self._reads, self._quotas, self._snapshots, self._provisioning = reads, quotas, snapshots, provisioning
        self._control = control  # undoes the copies of a fork that failed

    async def fork(self, sandbox_id: str, count: object, *, api_key_id: str | None,
                   idle_timeout: str | None = None) -> tuple[SnapshotState, list[Created]]:
        """``idle_timeout``: the copies' own (E2B's fork gives its forks one); else the parent's."""
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_COPIES:
            raise InvalidInput(f"count: expected an integer from 1 to {MAX_COPIES}, got {count!r}", field="count")
        parent = await self._reads.require(sandbox_id)
        # All the copies fit in the organization's quota, or none is made (nor the snapshot).
        await self._quotas.check_sandbox(parent.spec.org_id, parent.spec, count)
        copies = [ids.new_id("sandbox") for _ in range(count)]
        try:
            for copy in copies:  # one at a time: each sees the room the ones before it hold
                await self._provisioning.reserve(copy, parent.spec)
            snap = await self._snapshots.take(sandbox_id, name=f"fork-{sandbox_id.removeprefix('sbx_')[-12:]}",
                                              description=f"the instant {sandbox_id} was forked", tag=None,
                                              public=False, api_key_id=api_key_id, metadata={FORK_OF: sandbox_id})
        except BaseException:
            for copy in copies:
                self._provisioning.release(copy)
            raise
        base = attrs.evolve(
            parent.spec, snapshot_id=snap.snapshot_id, env=dict(snap.env), command=None,
            metadata={**(parent.spec.metadata or {}), "forkedFrom": sandbox_id},
            dependencies=snap.dependencies, packages=snap.packages)
        if idle_timeout is not None:
            base = attrs.evolve(base, timeout=attrs.evolve(base.timeout, idle=idle_timeout))

        async def one(i: int) -> Created:
            name = f"{parent.spec.name}-{i + 1}" if parent.spec.name else None
            return await self._provisioning.create(
                CreateRequest(spec=attrs.evolve(base, name=name), files=[], command=None), api_key_id=api_key_id,
                sandbox_id=copies[i])

        # The quota's check above is not held while the copies are made (each create checks
        # again under the organization's lock): another create or fork can take the last slots
        # meanwhile. A fork is all its copies or nothing, so one refused (or failed) undoes the
        # ones made and the instant's snapshot, and the fork answers with the first refusal.
        results = await asyncio.gather(*(one(i) for i in range(count)), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        made = [r for r in results if isinstance(r, Created)]
        if failed:
            await self._undo(snap, made)
            raise failed[0]
        return snap, made

    async def _undo(self, snap: SnapshotState, made: list[Created]) -> None:
        for created in made:
            try:
                await self._control.destroy(created.sandbox.sandbox_id)
            except Exception:  # logged; the other copies and the snapshot still go
                log.exception("fork of %s: could not destroy its copy %s", snap.source_sandbox_id,
                              created.sandbox.sandbox_id)
        with contextlib.suppress(SnapshotNotFound):
            await self._snapshots.delete(snap.snapshot_id)
