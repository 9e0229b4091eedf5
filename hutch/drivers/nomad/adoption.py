"""The nomad driver's recovery (a mixin of :class:`drivers.nomad.driver.NomadDriver`): what a
previous run of this data dir left is adopted at start, and a sandbox another API replica
placed is adopted when this replica takes it over (core/replicas.py, api/replication.py)."""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from hutch.core.errors import EndedUnadopted
from hutch.core.models import SandboxState, SandboxStatus
from hutch.drivers.egress import AllowLists
from hutch.drivers.nomad.client import NomadClient, NomadNotFound
from hutch.drivers.nomad.jobs import LIVE
from hutch.drivers.nomad.pools import PoolEntry
from hutch.drivers.nomad.runtime_images import RuntimeImages
from hutch.drivers.nomad.state import NomadSandbox, StateFiles

log = logging.getLogger(__name__)

class NomadAdoption:
    _client: NomadClient
    _states: StateFiles
    _images: RuntimeImages
    _allow: AllowLists
    _sandboxes: dict[str, NomadSandbox]
    _pool: dict[str, deque[PoolEntry]]
    pool_sizes: dict[str, int]
    _foreign: Callable[[], Awaitable[list[dict[str, str]]]] | None
    _replica_id: str | None  # roles.Adoption.set_replica
    _deployment: str | None  # the same
    _taken_over: bool  # the same

    # Provided by NomadDriver (the class this is mixed into).
    def _job_prefix(self) -> str:
        raise NotImplementedError

    def _spawn(self, coro: Any, name: str) -> None:
        raise NotImplementedError

    def _lock(self, sid: str) -> asyncio.Lock:
        raise NotImplementedError

    def _found_paused(self, sid: str) -> None:
        raise NotImplementedError

    async def _stop_job(self, job_id: str, alloc_id: str | None, *, node_lost: bool = False) -> None:
        raise NotImplementedError

    async def _unmake(self, sb: NomadSandbox) -> None:
        raise NotImplementedError

    async def _recover(self) -> list[PoolEntry]:
        """Adopt the sandboxes a previous run of this data dir left; its idle pool allocations
        of a runtime still wanted are returned (they rejoin the pool once their agents start:
        pools.py), the others stopped, and all of them after a take-over (``_taken_over``)."""
        left: list[PoolEntry] = []
        # Asked with their meta: a pool job is known by it (``hutch.pool``, pools.py), and the
        # stubs of a plain list carry none, which stopped every pool job a restart found.
        jobs = {j["ID"]: j for j in await self._client.jobs(self._job_prefix(), meta=True)}
        # Taken over by another replica while this one was gone: theirs now, left alone.
        claimed = {h.get("job_id") for h in await self._foreign()} if self._foreign is not None else set()
        for sb in self._states.load_all():
            if sb.job_id in claimed:
                self._states.forget(sb.id)
                continue
            claimed.add(sb.job_id)
            if await self._alloc_running(sb.job_id, sb.alloc_id):
                self._sandboxes[sb.id] = sb
                if sb.allow:
                    self._allow.adopt(sb.id, sb.allow)
            else:
                self._states.forget(sb.id)
                if sb.job_id in jobs:
                    self._spawn(self._stop_job(sb.job_id, None), f"nomad-reap-{sb.job_id}")
        for job_id, job in jobs.items():
            if job_id in claimed or job.get("Status") == "dead":
                continue
            try:
                marks = await self._client.job_meta(job)
            except NomadNotFound:
                continue  # gone since the list
            if not self._placed_here(marks):
                # Another replica's job: the prefix is the data dir's, and replicas whose data
                # dirs have one path (/data: the Terraform module's) share it. Its idle pool jobs
                # and its sandboxes whose handle is not yet in their owner row (a create under
                # way) are that replica's to hand out and run; lost, its survivor ends them
                # (lost_leftovers, discard_unrecorded). Stopped here, they were purged under it.
                continue
            runtime = marks.get("hutch.pool")
            allocs = await self._client.job_allocations(job_id)
            running = [a for a in allocs if a.get("ClientStatus") in LIVE]
            # Not after a take-over: the survivor listed this run's pool jobs as it claimed it and
            # stops them (lost_leftovers), keeping only those a handle names as it read the owner
            # rows; one taken back and claimed by a create meanwhile was stopped under its sandbox.
            if runtime and running and self.pool_sizes.get(runtime, 0) > 0 and not self._taken_over:
                left.append(PoolEntry(job_id, running[0]["ID"], runtime))
            else:  # a sandbox whose state file is gone, a pool we no longer want or the survivor's to end
                self._spawn(self._stop_job(job_id, None), f"nomad-reap-{job_id}")
        return left

    def _placed_here(self, meta: dict[str, str]) -> bool:
        """Whether a job's marks (pools._marks) say this replica placed it: unmarked ones (a
        single server, or placed before the marks) are everyone's, as they were; one marked
        with this replica's id and no deployment is its own from before the deployment mark."""
        placer = meta.get("hutch.replica")
        if placer is None:
            return True
        return placer == self._replica_id and meta.get("hutch.deployment") in (None, self._deployment)

    async def _alloc_running(self, job_id: str, alloc_id: str) -> bool:
        try:
            alloc = await self._client.allocation(alloc_id)
        except NomadNotFound:
            return False
        return alloc.get("JobID") == job_id and alloc.get("ClientStatus") in LIVE \
            and alloc.get("DesiredStatus") == "run"

    async def discard_unrecorded(self, sandbox_id: str, handle: dict[str, str]) -> None:
        """End a sandbox a lost replica placed and never recorded: its job is named
        ``hutch-<that replica's instance>-<sandbox id>`` (provision), so it is found by name
        among hutch's jobs whichever replica placed it, stopped (its task gone) and purged. One
        made from a warm pool entry keeps the entry's job name: found through ``handle`` (the
        owner row's, written before the create is recorded), else left to its replica's
        restart (recovery). Nothing when no job is found."""
        named = re.compile(r"hutch-[0-9a-f]{8}-" + re.escape(sandbox_id))
        jobs = {j["ID"] for j in await self._client.jobs("hutch-") if named.fullmatch(str(j.get("ID", "")))}
        if handle.get("job_id"):
            jobs.add(handle["job_id"])
        for job_id in sorted(jobs):
            try:
                allocs = await self._client.job_allocations(job_id)
            except NomadNotFound:
                continue
            live = [a["ID"] for a in allocs if a.get("ClientStatus") in LIVE] or [a["ID"] for a in allocs]
            await self._stop_job(job_id, live[0] if live else None)

    async def lost_leftovers(self, replica_id: str) -> list[str]:
        """The warm pool jobs a lost replica placed (marked ``hutch.replica`` at placement,
        pools.py), idle or claimed by a create it died before recording: a claim is in that
        replica's memory only until the create's handle reaches its owner row, so nothing else
        finds them (its restart would, maybe never). Listed as the take-over is claimed: a
        replica that returns after that places its new pool jobs later, and its start-up
        recovery, told it was taken over, takes none of the old ones back (it once did: a
        create claimed one and recorded it after ``discard_leftovers`` read the handles, which
        then stopped that live sandbox).
        Only this deployment's (job meta ``hutch.deployment``): the jobs listed are every
        hutch's on the cluster, and another deployment may have a replica of the same name,
        whose claimed pool jobs are its tenants' live sandboxes that no handle here names. Jobs
        of a replica from before the mark are left to its restart."""
        found = []
        for listed in await self._client.jobs("hutch-", meta=True):  # one call, not one per job
            job_id = str(listed.get("ID", ""))
            if "-pool-" not in job_id or listed.get("Status") == "dead":
                continue
            try:
                meta = await self._client.job_meta(listed)
            except NomadNotFound:
                continue
            if meta.get("hutch.replica") == replica_id and meta.get("hutch.deployment") == self._deployment:
                found.append(job_id)
        return found

    async def discard_leftovers(self, leftovers: list[str], keep: list[dict[str, str]]) -> None:
        """Stop and purge ``leftovers`` but any job a recorded handle names: the lost replica's
        claimed sandboxes (``keep``, adopted or not: their take-over ends them), any other
        replica's (one adopted from it earlier), this driver's own."""
        kept = {h.get("job_id") for h in keep}
        if self._foreign is not None:
            kept |= {h.get("job_id") for h in await self._foreign()}
        kept |= {sb.job_id for sb in self._sandboxes.values()}
        kept |= {entry.job_id for pool in self._pool.values() for entry in pool}
        for job_id in leftovers:
            if job_id in kept:
                continue
            log.warning("warm pool job %s of a lost replica: stopped and purged", job_id)
            try:
                allocs = await self._client.job_allocations(job_id)
            except NomadNotFound:
                continue
            live = [a["ID"] for a in allocs if a.get("ClientStatus") in LIVE]
            await self._stop_job(job_id, live[0] if live else None)

    def handle(self, sandbox_id: str) -> dict[str, str] | None:
        sb = self._sandboxes.get(sandbox_id)
        return None if sb is None else {"job_id": sb.job_id, "alloc_id": sb.alloc_id}

    async def adopt(self, sandbox: SandboxState, handle: dict[str, str]) -> bool:
        """A sandbox another replica placed (its job keeps that replica's name): driven from
        here if its allocation still runs; env and allow list come from its spec."""
        sid, spec = sandbox.sandbox_id, sandbox.spec
        async with self._lock(sid):
            if sid in self._sandboxes:
                return True
            if not await self._alloc_running(handle.get("job_id", ""), handle.get("alloc_id", "")):
                return False
            sb = NomadSandbox(sid, handle["job_id"], handle["alloc_id"], self._images.require(spec.runtime).name,
                              dict(spec.env))
            if spec.network.allow:
                sb.allow = await self._allow.first(sid, spec.network.allow)
            # Recorded before anything else of it is kept: a state file that cannot be written
            # (a full disk) left its allow list and hold here, the error a bare OSError that the
            # take-over logged and went past, and the sandbox claimed by a replica that does
            # not drive it. Without its record no restart of this replica finds it, so it is
            # ended as a create whose record fails is (_unmake), and the error says why.
            try:
                await asyncio.to_thread(self._states.save, sb)
            except OSError as err:
                await self._unmake(sb)
                log.error("sandbox %s: taking it over, writing its state file %s failed (%s); its Nomad job %s "
                          "was stopped and purged", sid, self._states.path(sid), err, sb.job_id)
                raise EndedUnadopted(f"sandbox {sid}: taking it over, the server could not record it on its own "
                                    f"disk, writing its state file ({err.strerror or err}); it was ended",
                                    sandbox_id=sid) from err
            except BaseException:
                self._allow.forget(sid)
                raise
            if sandbox.status is SandboxStatus.PAUSED:
                self._found_paused(sid)
            self._sandboxes[sid] = sb
            return True

