"""The service layer: HTTP-free operations that turn requests into commands, commands
into events, and events into driver calls.

``Engine`` exposes collaborators and forwards nothing: a route calls
``engine.<collaborator>.<verb>`` (``engine.provisioning.create``, ``engine.reads.require``,
``engine.files.list`` …). The adapters it is composed of (event log, projection store,
projector, driver and its roles, output streams, blobs) are ``engine.parts``, for composition
and tests only: hutch/api never names them (tests/unit/test_api_uses_services.py). Collaborators:
``Reads`` (queries over the projection store), ``Recorder`` (THE way a command becomes
appended events: decide, round-trip check, append, wait for the projection),
``Provisioning`` (create), ``SandboxControl`` (pause, resume, env, destroy and ends),
``Executions`` (commands and jobs), ``Checkpoints`` (the routes call it directly), ``Snapshots``, ``Quotas``,
``Recovery`` (start-up), ``OutputRetention`` (ended sandboxes' output), ``Background`` with
the ``Reaper`` (idle and paused timeouts), ``FileAccess`` (files), ``Runtimes``, ``UsageReports``
(stats, metrics), ``Changes`` (following events), ``Takeover`` (a lost replica's sandboxes),
``Ports``, ``OutputReads``, ``SandboxOutput`` (a sandbox's own streams), ``TerminalSessions``,
``History`` (time travel), ``Forks`` and the directory's ``TenancyWrites``. Each is given the
collaborators and adapters it uses, never the engine: below it, no service module names
``Engine`` (tests/unit/test_api_uses_services.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import attrs

from hutch.blobs.files import FileBlobStore
from hutch.core.blobs import BlobStore
from hutch.core.eventlog.base import EventLog
from hutch.core.events import Event
from hutch.core.output import OutputStreams
from hutch.core.replicas import Replicas, SoleReplica
from hutch.core.tenancy import QuotaSet
from hutch.drivers.base import Driver, DriverRoles, FileWrite
from hutch.projections.base import ProjectionStore
from hutch.projections.runner import Projector
from hutch.service import archives
from hutch.service.background import Background, quietly
from hutch.service.changes import Changes
from hutch.service.checkpoints import CheckpointLimits, Checkpoints
from hutch.service.control import SandboxControl
from hutch.service.defaults import SandboxDefaults
from hutch.service.egress_rules import EgressRules
from hutch.service.executions import Executions
from hutch.service.files import FileAccess
from hutch.service.fork import Forks
from hutch.service.history import History
from hutch.service.input_streams import InputStreams
from hutch.service.nodes import Nodes
from hutch.service.output import OutputReads
from hutch.service.ports import Ports
from hutch.service.provisioning import Created, Provisioning
from hutch.service.quotas import Quotas
from hutch.service.reads import Reads
from hutch.service.recorder import Recorder, now_iso
from hutch.service.recovery import Recovery
from hutch.service.retention import DEFAULT_RETENTION_SECONDS, OutputRetention
from hutch.service.runtimes import Runtimes
from hutch.service.sandbox_streams import SandboxOutput
from hutch.service.snapshots import BUILD_SWEEP_SECONDS, Snapshots
from hutch.service.stream_ids import StreamIds
from hutch.service.takeover import Takeover
from hutch.service.tenancy import TenancyWrites
from hutch.service.terminals import TerminalSessions
from hutch.service.timeouts import Reaper
from hutch.service.usage import UsageReports
from hutch.storage.spool import clear_spool

log = logging.getLogger(__name__)


@attrs.frozen
class Parts:
    """The adapters an engine is composed of: composition (api/app.py) and tests reach them
    here; routes go through the engine's collaborators."""

    log: EventLog
    store: ProjectionStore
    projector: Projector
    driver: Driver  # whole, for start-up (its listener) and tests; collaborators take roles
    roles: DriverRoles
    outputs: OutputStreams
    blobs: BlobStore


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
        roles = DriverRoles.of(driver)  # each collaborator takes the roles it uses
        projector = projector or Projector(event_log, store)
        blob_store = blobs or FileBlobStore(data_dir)
        self.parts = Parts(log=event_log, store=store, projector=projector, driver=driver, roles=roles,
                           outputs=outputs, blobs=blob_store)
        self.streams = StreamIds(stream_secret)
        self.inputs = InputStreams()  # stdin uploads (POST/PUT /streams)
        outputs.verify = self.streams.issued  # streams closed before their first byte store nothing
        self.background = Background()
        self.reads = Reads(store, event_log, projector)
        self.recorder = Recorder(event_log, store, projector, self.reads)
        self.quotas = Quotas(self.reads, defaults, checkpointing=roles.checkpointing, blobs=blob_store,
                             outputs=outputs)
        self.replicas = replicas or SoleReplica()
        self.quotas.serialise = self._one_at_a_time
        self.recorder.meter = self.quotas.admit_events
        self.control = SandboxControl(self.reads, self.recorder, self.replicas, lifecycle=roles.lifecycle,
                                      pausing=roles.pausing, commands=roles.commands, usage=roles.usage)
        self.egress = EgressRules(self.reads, self.recorder, lifecycle=roles.lifecycle, network=roles.network)
        self.reaper = Reaper(store, projector, self.background, self.control,  # idle and paused timeouts
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
                                         fleet=roles.fleet,
                                         outputs=outputs, streams=self.streams, inputs=self.inputs, quotas=self.quotas,
                                         snapshots=self.snapshots, executions=self.executions,
                                         background=self.background, replicas=self.replicas)
        self.forks = Forks(self.reads, self.quotas, self.snapshots, self.provisioning, self.control)  # copies of a sandbox
        self.recovery = Recovery(store, self.recorder, self.control, roles.lifecycle, roles.fleet)
        self.retention = OutputRetention(store, outputs, output_retention)  # ended sandboxes' output
        self.tenancy = TenancyWrites(self.recorder.record, lambda: self.reads.tenants)  # the directory's writes
        self.files = FileAccess(self.reads, self.control, self.reaper, roles,
                                spool_bytes=(limits or archives.Limits()).max_bytes, spool_dir=data_dir / "spool")
        self.terminals = TerminalSessions(roles.terminals, roles.lifecycle, self.files)
        self.runtimes = Runtimes(roles.runtimes)
        self.usage = UsageReports(log=event_log, store=store, projector=projector, reads=self.reads,
                                  lifecycle=roles.lifecycle, usage=roles.usage)
        self.changes = Changes(event_log, store, projector)
        self.history = History(event_log, self.reads)  # a sandbox as of any of its events
        self.changes.observe(self._quota_changes)
        self.takeover = Takeover(log=event_log, store=store, projector=projector, reads=self.reads,
                                 recorder=self.recorder, control=self.control, reaper=self.reaper,
                                 lifecycle=roles.lifecycle, adoption=roles.adoption)
        self.ports = Ports(self.files, roles.ports)
        roles.fleet.set_locator(self._node_in_log)
        self.nodes = Nodes(roles, reads=self.reads, recorder=self.recorder, replicas=self.replicas,  # the node
                           limits=self.snapshots.limits, spool=self.snapshots.archives.spool,  # driver's machines
                           defaults=self.quotas.defaults)
        self.output = OutputReads(outputs)
        self.sandbox_output = SandboxOutput(self.changes, store, outputs, self.streams)  # a sandbox's console

    async def _node_in_log(self, sandbox_id: str) -> str | None:
        sb = await self.parts.store.get_sandbox(sandbox_id)
        return sb.node if sb is not None and not sb.status.is_final else None

    async def _node_drained(self, node: str, by: str) -> None:
        """A node drained outside hutch (``nomad node drain``): its idle sandboxes move, in the
        background (the driver's reads of its nodes go on meanwhile)."""
        self.background.spawn(quietly(self.nodes.drained_by(node, by)), f"drained-{node}")

    def _quota_changes(self, batch: Sequence[Event]) -> None:
        """A quota set (here or on another replica) reaches the commands running here, once
        the directory shows it (the task runs after this batch's observers)."""
        for org_id in {e.sandbox_id for e in batch if isinstance(e.data, QuotaSet)}:
            self.background.spawn(self.quotas.requota(org_id), f"requota-{org_id}")

    # ---------------------------------------------------------------- lifetime

    async def start(self) -> None:
        await self.parts.projector.start()
        self.parts.driver.set_listener(self.control.ended)
        await self.recovery.run()
        # Told only now: a move needs the sandboxes as recovery left them.
        self.parts.driver.set_drain_listener(self._node_drained)
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
        await self.parts.projector.close()


__all__ = ["Created", "Engine", "FileWrite", "Parts", "now_iso"]
