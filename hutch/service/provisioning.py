"""Provisioning: a create request becomes a recorded sandbox made real by the driver — its
runtime built first when the driver lacks it, seeded from a snapshot, given its files, and
its initial command started."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

import attrs

from hutch.core import ids, phases
from hutch.core.errors import DriverFailure, HutchError, NotSupported, ReplicaUnavailable
from hutch.core.lifecycle import Create, Fail, ReportBuild, Start
from hutch.core.models import SandboxSpec, SandboxState, SandboxStatus
from hutch.core.output import OutputStreams, OutputWriter, StreamOwner
from hutch.core.replicas import Replicas, Tenant
from hutch.drivers import egress
from hutch.drivers.base import Capabilities, ProvisionRequest
from hutch.drivers.roles import Adoption, NodeFleet, RuntimeCatalog, SandboxFiles, SandboxLifecycle
from hutch.service import faults
from hutch.service.background import Background, quietly
from hutch.service.executions import Executions, default_timeout
from hutch.service.input_streams import InputStreams
from hutch.service.org_slots import OrgSlots
from hutch.service.quotas import Quotas
from hutch.service.reads import Reads
from hutch.service.recorder import Recorder
from hutch.service.requests import CreateRequest
from hutch.service.snapshots import Snapshots
from hutch.service.stream_ids import StreamIds
from hutch.service.tenancy import owned

log = logging.getLogger(__name__)


# Installs (``dependencies``, ``packages``) of one organization built at once. The local driver
# builds four at once for the whole server (BUILDS_AT_ONCE), each for as long as apt-get or npm
# runs: an organization asking for many filled that queue, and another's install waited behind
# all of them; now behind at most two of each (service/org_slots.py).
INSTALLS_PER_ORG_AT_ONCE = 2


@attrs.frozen
class Created:
    sandbox: SandboxState
    execution_id: str | None


class Provisioning:
    def __init__(self, *, reads: Reads, recorder: Recorder, lifecycle: SandboxLifecycle, runtimes: RuntimeCatalog,
                 files: SandboxFiles, adoption: Adoption, fleet: NodeFleet, outputs: OutputStreams,
                 streams: StreamIds, inputs: InputStreams, quotas: Quotas, snapshots: Snapshots,
                 executions: Executions, background: Background, replicas: Replicas) -> None:
        self._reads = reads
        self._replicas = replicas
        self._recorder = recorder
        self._lifecycle = lifecycle
        self._runtimes = runtimes
        self._files = files  # what a create request brings along
        self._adoption = adoption  # where a sandbox runs, for another replica to take over
        self._fleet = fleet  # which machine it was placed on, recorded with its start
        self._outputs = outputs
        self._streams = streams
        self._inputs = inputs
        self._quotas = quotas
        self._snapshots = snapshots
        self._executions = executions
        self._background = background
        self._installs = OrgSlots(INSTALLS_PER_ORG_AT_ONCE)

    async def _install(self, sandbox_id: str, spec: SandboxSpec) -> None:
        """The install layer the sandbox's ``dependencies`` and ``packages`` make, built (or
        found built), in the organization's turn."""
        async with self._installs.slot(spec.org_id):
            await self._runtimes.prepare(ProvisionRequest.for_spec(sandbox_id, spec))

    async def create(self, req: CreateRequest, *, api_key_id: str | None = None,
                     sandbox_id: str | None = None) -> Created:
        """Record the sandbox and make it real. A catalog runtime the driver lacks is built
        first (``RuntimeCatalog.build_runtime``): then the answer comes at once with the sandbox
        ``creating`` (its initial command ``queued``), the build's steps arrive as events, and
        execute, streams and waits hold until it is ready or ``failed`` with the build's words.

        The sandbox is recorded as every sandbox event is, by a command ``decide`` checks
        (``Create``). What runs before it leaves nothing of this sandbox behind: the checks,
        and the driver's ``prepare`` (an install layer, kept in a cache other sandboxes share),
        where a bad package name shows before there is a sandbox to fail. On a single replica
        the driver's provision runs beside the ``Create`` append (an idle sandbox; it is
        destroyed if the append fails).

        ``sandbox_id``: one minted and reserved already (``reserve``: a fork's copies)."""
        if req.spec.network.allow:  # first, as the route did: a name that does not resolve is a 400 naming it
            await egress.resolve(req.spec.network.allow)
        tenants = self._reads.tenants
        spec = owned(req.spec, tenants.directory if tenants else None)
        # Once, here: the driver, the quota and the recorded event all see these limits.
        spec = self._quotas.defaults.apply(spec, cpu_limit=self._lifecycle.capabilities.cpu_limit)
        req = attrs.evolve(req, spec=spec)
        self._check_capabilities(spec)
        sandbox_id = sandbox_id or ids.new_id("sandbox")
        # Where it will run, before anything is recorded: a cluster or a host with no room
        # answers 503 and leaves no failed sandbox behind (the node and local drivers).
        await self.reserve(sandbox_id, spec)
        try:
            return await self._create_reserved(sandbox_id, req, api_key_id)
        except BaseException:
            # Refused or failed before the driver made it (a quota, an install): its room is
            # free at once. Once made, the driver holds no reservation for it: a no-op.
            self._lifecycle.release(sandbox_id)
            raise

    async def reserve(self, sandbox_id: str, spec: SandboxSpec) -> None:
        """Room held for the sandbox ``spec`` (its defaults applied) describes, or NoCapacity."""
        await self._lifecycle.reserve(ProvisionRequest.for_spec(sandbox_id, spec))

    def release(self, sandbox_id: str) -> None:
        """What ``reserve`` held, free again: the create it was for will not come."""
        self._lifecycle.release(sandbox_id)

    async def _create_reserved(self, sandbox_id: str, req: CreateRequest, api_key_id: str | None) -> Created:
        spec = req.spec
        build = spec.runtime not in self._runtimes.runtimes_available()
        if (spec.dependencies or spec.packages) and not build:
            # Installing is where a bad package name shows: before the sandbox is recorded.
            await self._install(sandbox_id, spec)
        if req.stream.stdin:
            self._inputs.check(req.stream.stdin)
        execution_id = ids.new_id("execution") if req.command else None
        queued = tuple(req.command) if build and req.command else None
        create = Create(spec=spec, api_key_id=api_key_id, initial_execution_id=execution_id, initial_command=queued)
        # The quota's check and the create it allows, as one, on this replica and across
        # replicas; without a quota, no lock (service/quotas.py).
        limited = self._quotas.limits_sandboxes(spec.org_id)
        if not build and not limited:
            # Made first, then recorded created and started in one append (with its command's
            # start): one durable write on the way to the start instead of two. An idle pid 1
            # runs nothing of the tenant's, and what the log refuses is destroyed. With other
            # replicas too: one starting up leaves a running sandbox the log does not know yet
            # alone while a live replica owns it (recovery.py), and ``own`` is committed before
            # the driver is asked; this replica's own restart destroys it on purpose. Not under
            # a sandbox quota, whose lock is held until the Create is in (the overlap below).
            with phases.span("create: quota check"):
                await self._quotas.check_sandbox(spec.org_id, spec)
            # The command's streams are opened beside the owner row and the driver's provision
            # (on PostgreSQL a lock statement: one round trip fewer in series before the answer).
            opened = self._executions.open_streams(sandbox_id, execution_id, org_id=spec.org_id) \
                if execution_id else None
            try:
                with phases.span("create: owner row"):
                    await self._replicas.own(sandbox_id, Tenant(spec.org_id, spec.project_id))
                await self._start_sandbox(sandbox_id, req, execution_id, create=create, opened=opened)
            except BaseException:
                if opened is not None and execution_id:
                    await self._executions.discard_streams(execution_id, opened)
                raise
            return Created(sandbox=await self._reads.require(sandbox_id), execution_id=execution_id)
        made: asyncio.Task[None] | None = None
        async with self._recorder.lock(spec.org_id) if limited else contextlib.nullcontext(), \
                self._replicas.serialised(f"quota:{spec.org_id}") if limited else contextlib.nullcontext():
            with phases.span("create: quota check"):
                await self._quotas.check_sandbox(spec.org_id, spec)
            await self._replicas.own(sandbox_id, Tenant(spec.org_id, spec.project_id))  # this replica drives it (core/replicas.py)
            if not build and not self._replicas.shared:
                # The driver makes the sandbox while its Create is appended (for the same
                # reasons as above), and nothing starts before the Start append.
                made = asyncio.ensure_future(self._provision(sandbox_id, spec))
            try:
                await self._recorder.command(sandbox_id, create, minted=True)  # ids.new_id above
            except BaseException:
                if made is not None:
                    await self._discard(made, sandbox_id)
                raise
        if build:
            if execution_id:  # readers of its streams wait for the command instead of reading nothing
                owner = StreamOwner(spec.org_id, sandbox_id)
                await self._outputs.open(self._streams.derive(execution_id, "stdout"), owner)
                await self._outputs.open(self._streams.derive(execution_id, "stderr"), owner)
            self._reads.building.add(sandbox_id)
            self._background.spawn(self._build_then_start(sandbox_id, req, execution_id), f"build-{sandbox_id}")
        else:
            await self._start_sandbox(sandbox_id, req, execution_id, made=made)
        return Created(sandbox=await self._reads.require(sandbox_id), execution_id=execution_id)

    @property
    def capabilities(self) -> Capabilities:
        """What the driver can give a new sandbox (another account's name, pausing, ...)."""
        return self._lifecycle.capabilities

    def _check_capabilities(self, spec: SandboxSpec) -> None:
        """Refuse what the driver cannot give, before anything is recorded."""
        caps, name = self._lifecycle.capabilities, self._lifecycle.name
        for field, asked, can, what in (
            ("network.enabled", spec.network.enabled, caps.network, "give sandboxes network access"),
            ("network.allow", spec.network.allow, caps.egress_allow, "limit a network to destinations"),
            ("network.deny", spec.network.deny, caps.egress_deny, "keep a network from destinations"),
            ("network.port", spec.network.port is not None, caps.ports, "expose ports"),
        ):
            if asked and not can:
                raise NotSupported(f"{field}: driver {name} cannot {what}", field=field)
        if spec.user is not None and not caps.named_user:
            raise NotSupported(f"user: driver {name} runs sandboxes as agentuity only", field="user")
        if (spec.dependencies or spec.packages) and not caps.installs:
            field = "dependencies" if spec.dependencies else "packages"
            raise NotSupported(f"{field}: driver {name} cannot install them at create", field=field)

    def prebuild(self, names: Iterable[str]) -> None:
        """Build these runtimes in the background (``--prebuild``); creates join the build."""
        for name in set(names) - self._runtimes.runtimes_available():
            self._background.spawn(
                quietly(self._runtimes.build_runtime(name, lambda line: log.info("prebuild: %s", line))),
                f"prebuild-{name}")

    async def _provision(self, sandbox_id: str, spec: SandboxSpec) -> None:
        with phases.span("driver: provision"):
            await self._lifecycle.provision(ProvisionRequest.for_spec(sandbox_id, spec))

    async def _discard(self, made: asyncio.Task[None], sandbox_id: str) -> None:
        """The Create was not recorded: what the driver made meanwhile goes."""
        with contextlib.suppress(BaseException):
            await made
        with contextlib.suppress(Exception):
            await self._lifecycle.destroy(sandbox_id)

    async def _start_sandbox(self, sandbox_id: str, req: CreateRequest, execution_id: str | None, *,
                             made: asyncio.Task[None] | None = None, create: Create | None = None,
                             opened: asyncio.Future[list[OutputWriter]] | None = None) -> None:
        """``made``: the driver's provision, already under way (``create``). ``create``: the
        sandbox's Create, not recorded yet: appended with its start. ``opened``: the initial
        command's streams, being opened (``Executions.open_streams``)."""
        spec = req.spec
        try:
            with phases.span("create: provision awaited (overlapped: what is left of it)"):
                await (made if made is not None else self._provision(sandbox_id, spec))
            if spec.snapshot_id:
                await self._snapshots.seed(sandbox_id, spec.snapshot_id)
            if req.files:
                await self._files.write_files(sandbox_id, req.files)
        except BaseException as err:
            reason = err.message if isinstance(err, HutchError) else f"{type(err).__name__}: {err}"
            with contextlib.suppress(Exception):
                await self._lifecycle.destroy(sandbox_id)
            if create is not None:  # recorded created, then failed, as when it was recorded first
                await self._recorder.command(sandbox_id, create)
            await self._recorder.command(sandbox_id, Fail(reason=f"provisioning failed: {reason}"))
            if isinstance(err, HutchError):
                raise
            if not isinstance(err, Exception):
                raise
            raise DriverFailure(f"could not start the sandbox: {reason}", sandbox_id=sandbox_id) from err
        node = self._fleet.node_of(sandbox_id)
        # For a take-over; not where the Start below records the node: the log says where it
        # runs (takeover.py), and the row's write was a statement in series on the way to idle.
        # Before the crash points: a survivor that finds the sandbox unrecorded ends it where
        # the handle says (a nomad job taken from a warm pool bears no sandbox id in its name).
        if create is not None:
            await faults.crash_point("create-made-unhandled")
        if node is None and self._replicas.shared and (handle := self._adoption.handle(sandbox_id)) is not None:
            await self._replicas.set_handle(sandbox_id, handle)
        if create is not None:
            await faults.crash_point("create-made-unrecorded")
            if not self._replicas.current():
                # After a stall this replica's lease may have lapsed, and a survivor that
                # claimed it ends the sandbox no event records (takeover.py): appending it now
                # could record one that is gone. Not recorded, and ended here too.
                with contextlib.suppress(Exception):
                    await self._lifecycle.destroy(sandbox_id)
                raise ReplicaUnavailable(f"replica {self._replicas.me} missed its lease renewals while it made the "
                                         "sandbox, which was ended, not recorded; try again")
            await faults.crash_point("create-vouched-unrecorded")
        started = Start(node=node)
        first: tuple[Create | Start, ...] = (started,) if create is None else (create, started)
        recorded: list[bool] = []
        try:
            if not (req.command and execution_id):
                try:
                    await self._recorder.command_many(sandbox_id, first, durable=lambda _p: recorded.append(True),
                                                       minted=create is not None)
                finally:
                    # Nothing launches after it: the driver's deferred work (the local warm pool's
                    # refill) need not wait for a hold to lapse. Held until then, sequential creates
                    # found the pool empty: 98 % made from scratch, 7 ms more each (docs/benchmarks.md).
                    self._lifecycle.settled(sandbox_id)
                await self._refuse_discarded(sandbox_id, create)
                return
            # Not refused when the organization's storage is full (the sandbox is made already):
            # its output keeps what fits, and says it was cut.
            budget = await self._quotas.output_budget(spec.org_id, refuse_full=False)
            try:
                # Started and its command started in one append: one durable write on the way to
                # the launch instead of two in series (docs/benchmarks.md, "Where a run()'s time goes").
                await self._executions.start(sandbox_id, execution_id, req.command, default_timeout(req.spec),
                                             org_id=spec.org_id, stream=req.stream, budget=budget,
                                             preceded_by=first, recorded=lambda: recorded.append(True),
                                             spec=spec if create is not None else None, minted=create is not None,
                                             opened=opened)
            except HutchError as err:
                if err.status is not None and err.status < 500:
                    # Refused, so nothing of the append was written (the command's start past the
                    # storage quota, say): the sandbox is made, so it is recorded started, as it was
                    # when the two were separate appends, not left creating with nothing to end it.
                    # (A log or store failure may have written it: then nothing is guessed.)
                    with contextlib.suppress(Exception):
                        await self._recorder.command_many(sandbox_id, first, durable=lambda _p: recorded.append(True),
                                                           minted=create is not None)
                raise
            await self._refuse_discarded(sandbox_id, create)
        except BaseException:
            if create is not None and not recorded:  # the log never had it: nobody can reach it
                with contextlib.suppress(Exception):
                    await self._lifecycle.destroy(sandbox_id)
            raise

    async def _refuse_discarded(self, sandbox_id: str, create: Create | None) -> None:
        """A create recorded with its start (made first: ``create``) whose append landed after
        this replica's lease lapsed and a survivor ended the sandbox (``lifecycle:discarded``,
        service/takeover.py): the log folded it failed, as it is gone; the client is told so,
        not handed a sandbox that does not run. What of it may be left here is ended too."""
        if create is None:
            return
        sb = await self._reads.sandbox(sandbox_id)  # its own: folded here, no store read on the way
        if sb is None or sb.discarded is None:
            return
        with contextlib.suppress(Exception):
            await self._lifecycle.destroy(sandbox_id)
        raise ReplicaUnavailable(f"sandbox {sandbox_id} was ended, not made: replica {self._replicas.me} recorded it "
                                 "only after its lease lapsed and another replica took it over (it is recorded "
                                 f"failed: {sb.reason}); try again", sandbox_id=sandbox_id)

    async def _build_then_start(self, sandbox_id: str, req: CreateRequest, execution_id: str | None) -> None:
        spec = req.spec
        started = False
        try:
            try:
                await self._runtimes.build_runtime(spec.runtime, lambda line: self._report_build(sandbox_id, spec, line))
                if spec.dependencies or spec.packages:
                    await self._install(sandbox_id, spec)
            except Exception as err:
                reason = err.message if isinstance(err, HutchError) else f"{type(err).__name__}: {err}"
                log.warning("sandbox %s: runtime %s could not be built: %s", sandbox_id, spec.runtime, reason)
                await quietly(self._recorder.command(
                    sandbox_id, Fail(reason=f"runtime {spec.runtime} could not be built: {reason}")))
                return
            sb = await self._reads.store.get_sandbox(sandbox_id)
            if sb is None or sb.status is not SandboxStatus.CREATING:
                return  # destroyed while its runtime was built
            await quietly(self._start_sandbox(sandbox_id, req, execution_id))
            started = True
        finally:
            self._reads.building.discard(sandbox_id)
            if not started:  # failed or destroyed before its provision: the room it held is free
                self._lifecycle.release(sandbox_id)
            if execution_id and not (started and self._executions.running(execution_id)):
                await self._executions.close_streams(execution_id)

    def _report_build(self, sandbox_id: str, spec: SandboxSpec, line: str) -> None:
        self._background.spawn(quietly(self._recorder.command(sandbox_id, ReportBuild(spec.runtime, line))),
                               "build-progress")
