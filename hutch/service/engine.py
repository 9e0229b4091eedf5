"""The service layer: HTTP-free operations that turn requests into commands, commands
into events, and events into driver calls.

``Engine`` is the facade the routes use; each job is a collaborator of its own:
``Reads`` (queries over the projection store), ``Recorder`` (THE way a command becomes
appended events: decide, round-trip check, append, wait for the projection),
``Provisioning`` (create), ``SandboxControl`` (pause, resume, env, destroy and ends),
``Executions`` (commands and jobs), ``Checkpoints`` (the routes call it directly), ``Snapshots``, ``Quotas``,
``Recovery`` (start-up), ``OutputRetention`` (ended sandboxes' output) and ``Background`` with
the ``Reaper`` (idle and paused timeouts).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

from hutch.blobs.files import FileBlobStore
from hutch.core.blobs import BlobStore
from hutch.core.errors import IllegalTransition
from hutch.core.eventlog.base import EventLog
from hutch.core.events import Event
from hutch.core.models import Execution, Sandbox, SandboxStatus
from hutch.core.output import OutputStreams
from hutch.core.replicas import Replicas, SoleReplica
from hutch.drivers.base import Driver, DriverRoles, FileToWrite
from hutch.projections.base import ProjectionStore, SandboxQuery
from hutch.projections.runner import Projector
from hutch.service import archives
from hutch.service.background import Background
from hutch.service.checkpoints import CheckpointLimits, Checkpoints
from hutch.service.control import SandboxControl
from hutch.service.defaults import SandboxDefaults
from hutch.service.executions import JOB_STOP_GRACE_SECONDS, Executions
from hutch.service.input_streams import InputStreams
from hutch.service.provisioning import Created, Provisioning
from hutch.service.quotas import Quotas
from hutch.service.reads import Reads
from hutch.service.recorder import Recorder, now_iso
from hutch.service.recovery import Recovery
from hutch.service.requests import CreateRequest, ExecuteRequest
from hutch.service.retention import DEFAULT_RETENTION_SECONDS, OutputRetention
from hutch.service.snapshots import BUILD_SWEEP_SECONDS, Snapshots
from hutch.service.stream_ids import StreamIds
from hutch.service.tenancy import TenancyWrites, Tenants
from hutch.service.timeouts import Reaper
from hutch.storage.spool import clear_spool

log = logging.getLogger(__name__)


class Engine:
    def __init__(
        self,
        *,
        event_log: EventLog,
        store: ProjectionStore,
        driver: Driver,
        outputs: OutputStreams,
        stream_secret: bytes,
        data_dir: Path,
        limits: archives.Limits | None = None,
        blobs: BlobStore | None = None,
        projector: Projector | None = None,  # api.composition builds it; default: one that applies
        replicas: Replicas | None = None,  # other API processes on this log (core/replicas.py)
        defaults: SandboxDefaults | None = None,  # what an unsized sandbox gets (service/defaults.py)
        checkpoint_limits: CheckpointLimits | None = None,  # per sandbox (service/checkpoints.py)
        output_retention: float = DEFAULT_RETENTION_SECONDS,  # after a sandbox ends (service/retention.py)
    ) -> None:
        self.log = event_log
        self.store = store
        self.driver = driver  # whole: the API's routes still call it directly
        self.roles = roles = DriverRoles.of(driver)  # each collaborator takes the roles it uses
        self.outputs = outputs
        self.projector = projector or Projector(event_log, store)
        self.streams = StreamIds(stream_secret)
        self.inputs = InputStreams()  # stdin uploads (POST/PUT /streams)
        outputs.verify = self.streams.issued  # streams closed before their first byte store nothing
        self.background = Background()
        self.reads = Reads(store, event_log, self.projector)
        self.recorder = Recorder(event_log, store, self.projector, self.reads)
        blob_store = blobs or FileBlobStore(data_dir)
        self.quotas = Quotas(self.reads, defaults, checkpointing=roles.checkpointing, blobs=blob_store,
                             outputs=outputs)
        self.replicas = replicas or SoleReplica()
        self.quotas.serialise = self._one_at_a_time
        self.control = SandboxControl(self.reads, self.recorder, self.replicas, lifecycle=roles.lifecycle,
                                      pausing=roles.pausing, commands=roles.commands, usage=roles.usage)
        self.reaper = Reaper(store, self.projector, self.background, self.control,  # idle and paused timeouts
                            read=self.reads.sandbox)
        self.executions = Executions(reads=self.reads, recorder=self.recorder, control=self.control,
                                     commands=roles.commands, files=roles.files, outputs=outputs,
                                     streams=self.streams, inputs=self.inputs, background=self.background,
                                     quotas=self.quotas)
        self.watchers = self.executions.watchers  # cancels a command its waiters all left
        self.checkpoints = Checkpoints(self.reads, self.recorder, roles.checkpointing, self.reaper, self.quotas,
                                       checkpoint_limits)
        self.snapshots = Snapshots(store=store, reads=self.reads, recorder=self.recorder, driver=roles,
                                   quotas=self.quotas, streams=self.streams, reaper=self.reaper,
                                   blobs=blob_store, spool_dir=data_dir / "spool",
                                   limits=limits or archives.Limits())
        self.provisioning = Provisioning(reads=self.reads, recorder=self.recorder, lifecycle=roles.lifecycle,
                                         runtimes=roles.runtimes, files=roles.files, adoption=roles.adoption,
                                         outputs=outputs, streams=self.streams, inputs=self.inputs, quotas=self.quotas,
                                         snapshots=self.snapshots, executions=self.executions,
                                         background=self.background, replicas=self.replicas)
        self.recovery = Recovery(store, self.recorder, self.control, roles.lifecycle)
        self.retention = OutputRetention(store, outputs, output_retention)  # ended sandboxes' output
        self.tenancy = TenancyWrites(self.recorder.record, lambda: self.reads.tenants)  # the directory's writes

    @property
    def tenants(self) -> Tenants | None:
        """The organizations (service/tenancy.py), set by the app; None: no quotas, one organization."""
        return self.reads.tenants

    @tenants.setter
    def tenants(self, tenants: Tenants | None) -> None:
        self.reads.tenants = tenants

    # ---------------------------------------------------------------- lifetime

    async def start(self) -> None:
        await self.projector.start()
        self.driver.set_listener(self.control.ended)
        await self.recovery.run()
        await self.snapshots.expire_builds()
        self.background.spawn(self._sweep_builds(), "expire-builds")
        self.background.spawn(self.retention.run(), "output-retention")
        await asyncio.to_thread(clear_spool, self.snapshots.archives.spool_dir)  # a kill cut short
        self.background.spawn(self.reaper.watch(), "timeouts")

    async def _sweep_builds(self) -> None:
        """Abandoned snapshot builds (and their uploads) go within BUILD_SWEEP_SECONDS of expiring."""
        while True:
            await asyncio.sleep(BUILD_SWEEP_SECONDS)
            try:
                await self.snapshots.expire_builds()
            except Exception:  # the next sweep tries again; a failed one leaves everything as it was
                log.exception("expiring abandoned snapshot builds failed")

    @contextlib.asynccontextmanager
    async def _one_at_a_time(self, key: str) -> AsyncIterator[None]:
        """``key`` held by one request at a time, on this replica and across replicas."""
        async with self.recorder.lock(key), self.replicas.serialised(key):
            yield

    async def close(self) -> None:
        self.watchers.close()
        self.reaper.close()
        await self.background.close()
        await self.projector.close()

    # ---------------------------------------------------------------- writes

    async def create(self, req: CreateRequest, *, api_key_id: str | None = None) -> Created:
        return await self.provisioning.create(req, api_key_id=api_key_id)

    def prebuild(self, names: Iterable[str]) -> None:
        self.provisioning.prebuild(names)

    async def execute(self, sandbox_id: str, req: ExecuteRequest) -> tuple[Execution, bool]:
        return await self.executions.execute(sandbox_id, req)

    async def start_job(self, sandbox_id: str, command: tuple[str, ...]) -> Execution:
        return await self.executions.start_job(sandbox_id, command)

    async def cancel_execution(self, execution_id: str, *, why: str = "cancelled on request") -> Execution:
        return await self.executions.cancel(execution_id, why=why)

    async def stop_job(self, sandbox_id: str, job_id: str, *, force: bool,
                       grace: float = JOB_STOP_GRACE_SECONDS) -> Execution:
        return await self.executions.stop_job(sandbox_id, job_id, force=force, grace=grace)

    async def for_files(self, sandbox_id: str) -> Sandbox:
        """A sandbox ready for file operations: waits out creating, wakes a paused one."""
        sb = await self.reads.wait_not_creating(sandbox_id)
        if sb.status is SandboxStatus.PAUSED:
            sb = await self.control.resume(sandbox_id, auto=True)
        if sb.status not in (SandboxStatus.IDLE, SandboxStatus.RUNNING):
            raise IllegalTransition(
                f"cannot use files: sandbox {sandbox_id} is {sb.status.value}", sandbox_id=sandbox_id, sandbox_status=sb.status.value
            )
        self.touch(sandbox_id)
        return sb

    def touch(self, sandbox_id: str) -> None:
        """Activity that is not an event (file operations) still keeps a sandbox from idling out."""
        self.reaper.touch(sandbox_id)

    async def set_env(self, sandbox_id: str, changes: dict[str, str | None]) -> dict[str, str]:
        return await self.control.set_env(sandbox_id, changes)

    async def pause(self, sandbox_id: str) -> Sandbox:
        return await self.control.pause(sandbox_id)

    async def resume(self, sandbox_id: str, *, auto: bool = False) -> Sandbox:
        return await self.control.resume(sandbox_id, auto=auto)

    async def destroy(self, sandbox_id: str) -> None:
        await self.control.destroy(sandbox_id)

    # ---------------------------------------------------------------- reads

    def scoped(self, query: SandboxQuery) -> SandboxQuery:
        return self.reads.scoped(query)

    def resolved(self, query: SandboxQuery) -> SandboxQuery:
        return self.reads.resolved(query)

    async def get(self, sandbox_id: str, *, include_deleted: bool = False) -> Sandbox:
        return await self.reads.require(sandbox_id, include_deleted=include_deleted)

    async def list(self, query: SandboxQuery) -> tuple[builtins.list[Sandbox], int]:
        return await self.reads.list(query)

    async def wait_status(self, sandbox_id: str, statuses: set[SandboxStatus], wait: float) -> Sandbox:
        return await self.reads.wait_status(sandbox_id, statuses, wait)

    async def events(self, sandbox_id: str, *, limit: int, reverse: bool) -> builtins.list[Event]:
        return await self.reads.events(sandbox_id, limit=limit, reverse=reverse)

    async def get_execution(self, execution_id: str, wait: float = 0.0) -> Execution:
        return await self.reads.get_execution(execution_id, wait)

    async def list_executions(self, sandbox_id: str, limit: int | None) -> builtins.list[Execution]:
        return await self.reads.list_executions(sandbox_id, limit)

    async def get_job(self, sandbox_id: str, job_id: str) -> Execution:
        return await self.reads.get_job(sandbox_id, job_id)

    async def list_jobs(self, sandbox_id: str, limit: int | None) -> builtins.list[Execution]:
        return await self.reads.list_jobs(sandbox_id, limit)


__all__ = ["Created", "Engine", "FileToWrite", "now_iso"]
