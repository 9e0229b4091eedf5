"""The service layer: HTTP-free operations that turn requests into commands, commands
into events (via ``core.lifecycle.decide``), and events into driver calls.

Writes for one sandbox are serialised by a per-sandbox lock: read the state, decide,
append, wait until the projector has applied the append (read-your-writes). Reads go
to the projection store; the events API reads the log itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import attrs

from api import archives
from api.engine_checkpoints import CheckpointOps
from api.input_streams import InputStreams
from api.output import RAW_OUTPUT, ExecutionSink, OutputStore, StreamOptions
from api.quotas import Quotas
from api.snapshots import Snapshots
from api.stream_ids import StreamIds
from api.tenancy import Tenants, owned
from api.timeouts import Reaper, seconds
from api.watchers import Watchers
from api.wire import CreateRequest, ExecuteRequest
from blobs import clear_spool
from blobs.files import FileBlobStore
from core import ids, tenancy
from core.blobs import BlobStore
from core.errors import (
    DriverFailure,
    ExecutionNotFound,
    HutchError,
    IllegalTransition,
    InvalidInput,
    NotSupported,
    SandboxNotFound,
)
from core.eventlog.base import EventLog
from core.events import Event, EventData, SandboxCreated, SnapshotCreated, decode, encode
from core.lifecycle import (
    ChangeEnv,
    Command,
    Destroy,
    Fail,
    FinishExecution,
    Pause,
    ReportBuild,
    Resume,
    Start,
    StartExecution,
    Terminate,
    decide,
)
from core.models import (
    Execution,
    ExecutionStatus,
    Mode,
    Sandbox,
    SandboxSpec,
    SandboxStatus,
)
from core.quantities import format_bytes, parse_duration
from core.tenancy import LOCAL_ORG, SCOPE, visible
from drivers.base import (
    Driver,
    ExecRequest,
    ExecResult,
    FileToWrite,
    ProvisionRequest,
)
from projections.base import ProjectionStore, SandboxQuery
from projections.runner import Projector

log = logging.getLogger(__name__)

JOB_STOP_GRACE_SECONDS = 10.0  # SIGTERM, then SIGKILL after this long
MAX_WAIT_SECONDS = 300.0  # the longest a long-poll is held (the client asks for 5m)
CREATING_WAIT_SECONDS = 60.0
CANCEL_WAIT_SECONDS = 10.0  # a cancel answers once the command's tree is gone (or after this)




def now_iso() -> str:
    return _iso(dt.datetime.now(dt.UTC))


def _iso(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _iso_after(seconds: float) -> str:
    return _iso(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds))


@attrs.frozen
class Created:
    sandbox: Sandbox
    execution_id: str | None


class Engine(CheckpointOps):
    def __init__(
        self,
        *,
        event_log: EventLog,
        store: ProjectionStore,
        driver: Driver,
        outputs: OutputStore,
        stream_secret: bytes,
        data_dir: Path,
        limits: archives.Limits | None = None,
        blobs: BlobStore | None = None,
    ) -> None:
        self.log = event_log
        self.store = store
        self.driver = driver
        self.outputs = outputs
        self.projector = Projector(event_log, store)
        self.streams = StreamIds(stream_secret)
        self.watchers = Watchers(self._abandoned)  # cancels a command its waiters all left
        self.inputs = InputStreams()  # stdin uploads (POST/PUT /streams)
        outputs.verify = self.streams.issued  # streams closed before their first byte have no file
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._stopping: set[str] = set()  # jobs asked to stop: however they exit, they were cancelled
        self._building: set[str] = set()  # sandboxes waiting for their runtime's first build
        self._cancel_reasons: dict[str, str] = {}  # why a command being cancelled is
        self.snapshots = Snapshots(self, blobs or FileBlobStore(data_dir), data_dir / "spool",
                                   limits or archives.Limits())
        self.tenants: Tenants | None = None  # set by the app (api/tenancy.py); None: no quotas
        self.quotas = Quotas(self)
        self.reaper = Reaper(self)  # idle and paused timeouts
        self._owners: dict[str, tuple[str | None, str | None]] = {}  # stream id -> (org, project)

    # ---------------------------------------------------------------- lifetime

    async def start(self) -> None:
        await self.projector.start()
        self.driver.set_listener(self._sandbox_ended)
        await self._recover()
        await self.snapshots.expire_builds()
        await asyncio.to_thread(clear_spool, self.snapshots.archives.spool_dir)  # a kill cut short
        self._spawn(self.reaper.watch(), "timeouts")

    async def close(self) -> None:
        self.watchers.close()
        self.reaper.close()
        for task in [*self._background, *self._tasks.values()]:
            task.cancel()
        for task in [*self._background, *self._tasks.values()]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.projector.close()

    async def _recover(self) -> None:
        """Sandboxes whose processes died with an old server end through a lifecycle event;
        running ones that no event gives an owner are destroyed."""
        alive = await self.driver.alive()
        live, _ = await self.store.list_sandboxes(SandboxQuery(live=True, limit=10**9))
        await self._destroy_unowned(alive - {sb.sandbox_id for sb in live})
        for sb in live:
            if sb.sandbox_id in alive and sb.status in (SandboxStatus.IDLE, SandboxStatus.RUNNING):
                for ex in await self.store.list_executions(sb.sandbox_id):
                    if not ex.status.is_final:
                        await self._command(
                            sb.sandbox_id,
                            FinishExecution(ex.execution_id, ExecutionStatus.FAILED, error="the server restarted while it ran"),
                        )
                if sb.spec.mode is Mode.ONESHOT:
                    await self._end(sb.sandbox_id, Terminate(reason="the server restarted during the oneshot command"))
                continue
            reason = "the server restarted and the sandbox's processes were gone"
            if sb.status is SandboxStatus.CREATING:
                await self._command(sb.sandbox_id, Fail(reason=reason))
            else:
                await self._command(sb.sandbox_id, Terminate(reason=reason))
            with contextlib.suppress(Exception):
                await self.driver.destroy(sb.sandbox_id)

    async def _destroy_unowned(self, candidates: set[str]) -> None:
        """The driver runs them but the log says none is live: either the log has no record of
        them (made while another log was in use: a swapped events.db, a store rebuilt from a new
        log) or it says they ended. No one could reach them through the API: destroyed."""
        for sandbox_id in sorted(candidates):
            sb = await self.store.get_sandbox(sandbox_id)
            why = "the event log has no record of it" if sb is None else f"the event log says it is {sb.status.value}"
            log.warning("sandbox %s is running but %s; destroying it", sandbox_id, why)
            with contextlib.suppress(Exception):
                await self.driver.destroy(sandbox_id)

    # ---------------------------------------------------------------- writes

    def _lock(self, sandbox_id: str) -> asyncio.Lock:
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    async def record(self, stream: str, decide: Callable[[], Iterable[EventData]]) -> list[Event]:
        """Append the events ``decide()`` returns about ``stream`` (a tenancy record's
        organization), deciding and appending under the stream's lock: checks such as a
        name's uniqueness hold against concurrent requests to this server."""
        async with self._lock(stream):
            return await self._append(stream, decide())

    async def _owner(self, stream: str, first: object) -> tuple[str | None, str | None]:
        """The organization and project an event about ``stream`` belongs to (for the envelope:
        audit records name them). Fixed for a stream's life, so remembered."""
        if isinstance(first, SandboxCreated):
            found: tuple[str | None, str | None] = (first.spec.org_id, first.spec.project_id)
        elif isinstance(first, SnapshotCreated):
            found = (first.org_id, None)
        elif stream.startswith("org_"):
            found = (stream, None)
        elif stream in self._owners:
            return self._owners[stream]
        elif stream.startswith("snp_"):
            snap = await self.store.get_snapshot(stream)
            found = (snap.org_id, None) if snap else (None, None)
        else:
            sb = await self.store.get_sandbox(stream)
            found = (sb.spec.org_id, sb.spec.project_id) if sb else (None, None)
        self._owners[stream] = found
        return found

    async def _append(self, sandbox_id: str, payloads: Iterable[EventData]) -> list[Event]:
        at = now_iso()
        payloads = list(payloads)
        if not payloads:
            return []
        org, project = await self._owner(sandbox_id, payloads[0])
        events = [Event(ids.new_id("event"), sandbox_id, at, p, org=org, project=project)
                  for p in payloads]
        for e in events:
            # An event the projector cannot read back would wedge every reader of the log:
            # refuse it here, before it is written.
            if decode(json.loads(json.dumps(encode(e)))) != e:
                raise InvalidInput(f"{e.type}: event does not survive serialisation; refusing to log it")
        positions = await self.log.append(events)
        await self.projector.wait_for(positions[-1])
        return [attrs.evolve(e, position=p) for e, p in zip(events, positions, strict=True)]

    async def _command(self, sandbox_id: str, command: Command) -> list[Event]:
        async with self._lock(sandbox_id):
            sb = await self._require(sandbox_id)
            return await self._append(sandbox_id, decide(sb, command))

    async def _require(self, sandbox_id: str, *, include_deleted: bool = True) -> Sandbox:
        sb = await self.store.get_sandbox(sandbox_id)
        if sb is None or (sb.status is SandboxStatus.DELETED and not include_deleted) or not visible(
                sb.spec.org_id, sb.spec.project_id):
            # Another organization's sandbox is as absent as one that never was.
            raise SandboxNotFound(f"sandbox {sandbox_id} not found", sandbox_id=sandbox_id)
        return sb

    async def _visible_execution(self, execution_id: str) -> Execution:
        ex = await self.store.get_execution(execution_id)
        if ex is not None and SCOPE.get() is not None:
            sb = await self.store.get_sandbox(ex.sandbox_id)
            if sb is None or not visible(sb.spec.org_id, sb.spec.project_id):
                ex = None
        if ex is None:
            raise ExecutionNotFound(f"execution {execution_id} not found", execution_id=execution_id)
        return ex

    def scoped(self, query: SandboxQuery) -> SandboxQuery:
        """``query`` limited to what the request being served may see."""
        scope = SCOPE.get()
        if scope is None:
            return query
        return attrs.evolve(query, org_id=scope.org_id, projects=scope.projects)

    # ---------------------------------------------------------------- create

    async def create(self, req: CreateRequest, *, api_key_id: str | None = None) -> Created:
        """Record the sandbox and make it real. A catalog runtime the driver lacks is built
        first (``Driver.build_runtime``): then the answer comes at once with the sandbox
        ``creating`` (its initial command ``queued``), the build's steps arrive as events, and
        execute, streams and waits hold until it is ready or ``failed`` with the build's words."""
        req = attrs.evolve(req, spec=owned(req.spec, self.tenants.directory if self.tenants else None))
        spec = req.spec
        build = spec.runtime not in self.driver.runtimes_available()
        caps = self.driver.capabilities
        for field, asked, can, what in (
            ("network.enabled", spec.network.enabled, caps.network, "give sandboxes network access"),
            ("network.allow", spec.network.allow, caps.egress_allow, "limit a network to destinations"),
            ("network.port", spec.network.port is not None, caps.ports, "expose ports"),
        ):
            if asked and not can:
                raise NotSupported(f"{field}: driver {self.driver.name} cannot {what}", field=field)
        sandbox_id = ids.new_id("sandbox")
        if spec.dependencies or spec.packages:
            if not caps.installs:
                field = "dependencies" if spec.dependencies else "packages"
                raise NotSupported(f"{field}: driver {self.driver.name} cannot install them at create", field=field)
            if not build:  # installing is where a bad package name shows: before the sandbox is recorded
                await self.driver.prepare(ProvisionRequest.for_spec(sandbox_id, spec))
        if req.stream.stdin:
            self.inputs.check(req.stream.stdin)
        execution_id = ids.new_id("execution") if req.command else None
        queued = tuple(req.command) if build and req.command else None
        async with self._lock(spec.org_id):  # the quota's check and the create it allows, as one
            await self.quotas.check_sandbox(spec.org_id, spec)
            await self._append(sandbox_id, [SandboxCreated(spec=spec, api_key_id=api_key_id,
                                                           initial_execution_id=execution_id,
                                                           initial_command=queued)])
        if build:
            if execution_id:  # readers of its streams wait for the command instead of reading nothing
                self.outputs.create(self.streams.derive(execution_id, "stdout"))
                self.outputs.create(self.streams.derive(execution_id, "stderr"))
            self._building.add(sandbox_id)
            self._spawn(self._build_then_start(sandbox_id, req, execution_id), f"build-{sandbox_id}")
        else:
            await self._start_sandbox(sandbox_id, req, execution_id)
        return Created(sandbox=await self._require(sandbox_id), execution_id=execution_id)

    def prebuild(self, names: Iterable[str]) -> None:
        """Build these runtimes in the background (``--prebuild``); creates join the build."""
        for name in set(names) - self.driver.runtimes_available():
            self._spawn(self._quietly(self.driver.build_runtime(name, lambda line: log.info("prebuild: %s", line))),
                        f"prebuild-{name}")

    async def _start_sandbox(self, sandbox_id: str, req: CreateRequest, execution_id: str | None) -> None:
        spec = req.spec
        try:
            await self.driver.provision(ProvisionRequest.for_spec(sandbox_id, spec))
            if spec.snapshot_id:
                await self.snapshots.seed(sandbox_id, spec.snapshot_id)
            if req.files:
                await self.driver.write_files(sandbox_id, req.files)
        except BaseException as err:
            reason = err.message if isinstance(err, HutchError) else f"{type(err).__name__}: {err}"
            with contextlib.suppress(Exception):
                await self.driver.destroy(sandbox_id)
            await self._command(sandbox_id, Fail(reason=f"provisioning failed: {reason}"))
            if isinstance(err, HutchError):
                raise
            if not isinstance(err, Exception):
                raise
            raise DriverFailure(f"could not start the sandbox: {reason}", sandbox_id=sandbox_id) from err
        await self._command(sandbox_id, Start())
        if req.command and execution_id:
            await self._start_execution(sandbox_id, execution_id, req.command, self._default_timeout(req.spec),
                                        stream=req.stream)

    async def _build_then_start(self, sandbox_id: str, req: CreateRequest, execution_id: str | None) -> None:
        spec = req.spec
        started = False
        try:
            try:
                await self.driver.build_runtime(spec.runtime, lambda line: self._spawn(
                    self._quietly(self._command(sandbox_id, ReportBuild(spec.runtime, line))), "build-progress"))
                if spec.dependencies or spec.packages:
                    await self.driver.prepare(ProvisionRequest.for_spec(sandbox_id, spec))
            except Exception as err:
                reason = err.message if isinstance(err, HutchError) else f"{type(err).__name__}: {err}"
                log.warning("sandbox %s: runtime %s could not be built: %s", sandbox_id, spec.runtime, reason)
                await self._quietly(self._command(sandbox_id, Fail(reason=f"runtime {spec.runtime} could not be "
                                                                          f"built: {reason}")))
                return
            sb = await self.store.get_sandbox(sandbox_id)
            if sb is None or sb.status is not SandboxStatus.CREATING:
                return  # destroyed while its runtime was built
            await self._quietly(self._start_sandbox(sandbox_id, req, execution_id))
            started = True
        finally:
            self._building.discard(sandbox_id)
            if execution_id and not (started and execution_id in self._tasks):
                self.outputs.close(self.streams.derive(execution_id, "stdout"))
                self.outputs.close(self.streams.derive(execution_id, "stderr"))

    @staticmethod
    async def _quietly(work: Awaitable[object]) -> None:
        """Background work whose failure is already recorded (or has no one to tell): logged."""
        try:
            await work
        except HutchError as err:
            log.warning("background step failed: %s", err.message)
        except Exception:
            log.exception("background step failed")

    # ---------------------------------------------------------------- execute

    def _default_timeout(self, spec: SandboxSpec) -> float | None:
        if spec.timeout.execution is None:
            return None
        seconds = parse_duration("timeout.execution", spec.timeout.execution)
        return seconds or None  # "0s" = no limit

    async def _wait_not_creating(self, sandbox_id: str) -> Sandbox:
        sb = await self._require(sandbox_id, include_deleted=False)
        ready = {s for s in SandboxStatus if s is not SandboxStatus.CREATING}
        if sb.status is SandboxStatus.CREATING:
            sb = await self.wait_status(sandbox_id, ready, CREATING_WAIT_SECONDS)
        while sb.status is SandboxStatus.CREATING and sandbox_id in self._building:
            sb = await self.wait_status(sandbox_id, ready, MAX_WAIT_SECONDS)  # a first build takes minutes
        return sb

    async def execute(self, sandbox_id: str, req: ExecuteRequest) -> tuple[Execution, bool]:
        """Start a command; returns the execution and whether a paused sandbox was resumed for it."""
        sb = await self._wait_not_creating(sandbox_id)
        auto_resumed = False
        if sb.status is SandboxStatus.PAUSED:
            await self.resume(sandbox_id, auto=True)
            auto_resumed = True
            sb = await self._require(sandbox_id)
        if sb.status not in (SandboxStatus.IDLE, SandboxStatus.RUNNING):
            raise IllegalTransition(
                f"cannot execute: sandbox {sandbox_id} is {sb.status.value}", sandbox_id=sandbox_id, status=sb.status.value
            )
        if req.stream.stdin:
            self.inputs.check(req.stream.stdin)
        if req.files:
            await self.driver.write_files(sandbox_id, req.files)
        timeout = self._default_timeout(sb.spec) if req.timeout is None else (req.timeout or None)
        execution_id = ids.new_id("execution")
        await self._start_execution(sandbox_id, execution_id, req.command, timeout, stream=req.stream)
        ex = await self.store.get_execution(execution_id)
        assert ex is not None
        return ex, auto_resumed

    # ---------------------------------------------------------------- jobs

    async def start_job(self, sandbox_id: str, command: tuple[str, ...]) -> Execution:
        """A job is an execution of kind "job": it runs beside executions and other jobs,
        outlives the request, and has no default time limit."""
        sb = await self._wait_not_creating(sandbox_id)
        if sb.status is SandboxStatus.PAUSED:
            await self.resume(sandbox_id, auto=True)
        job_id = ids.new_id("job")
        await self._start_execution(sandbox_id, job_id, command, None, kind="job")
        job = await self.store.get_execution(job_id)
        assert job is not None
        return job

    async def get_job(self, sandbox_id: str, job_id: str) -> Execution:
        await self._require(sandbox_id)
        job = await self.store.get_execution(job_id)
        if job is None or job.type != "job" or job.sandbox_id != sandbox_id:
            raise ExecutionNotFound(f"job {job_id} not found in sandbox {sandbox_id}", job_id=job_id)
        return job

    async def list_jobs(self, sandbox_id: str, limit: int | None) -> list[Execution]:
        await self._require(sandbox_id)
        jobs = [e for e in await self.store.list_executions(sandbox_id) if e.type == "job"]
        return jobs[:limit] if limit is not None else jobs

    async def cancel_execution(self, execution_id: str, *, why: str = "cancelled on request") -> Execution:
        """End a running command's whole process tree (status ``cancelled``); returns it ended."""
        ex = await self._visible_execution(execution_id)
        if ex.status is ExecutionStatus.QUEUED:  # the initial command, behind its runtime's build
            raise IllegalTransition(f"cannot cancel: execution {execution_id} is queued; destroy its sandbox")
        if ex.status.is_final:
            return ex
        self._stopping.add(execution_id)  # however it exits now, it was cancelled
        self._cancel_reasons[execution_id] = why
        deadline = time.monotonic() + CANCEL_WAIT_SECONDS
        while not ex.status.is_final and time.monotonic() < deadline:
            # Again until it ends: a command just started may not be the driver's to kill yet.
            await self.driver.cancel(execution_id)
            ex = await self.get_execution(execution_id, wait=0.3)
        return ex

    async def _abandoned(self, execution_id: str) -> None:
        ex = await self.store.get_execution(execution_id)
        if ex is not None and ex.type == "exec" and ex.status is ExecutionStatus.RUNNING:
            await self.cancel_execution(execution_id, why="cancelled: every client waiting for it went away "
                                        f"(none came back within {self.watchers.grace:g} s)")

    async def stop_job(self, sandbox_id: str, job_id: str, *, force: bool, grace: float = JOB_STOP_GRACE_SECONDS) -> Execution:
        """Graceful: SIGTERM to the job's process tree, SIGKILL after ``grace``. Forced: SIGKILL now."""
        job = await self.get_job(sandbox_id, job_id)
        if job.status.is_final:
            return job
        self._stopping.add(job_id)
        if not force:
            try:
                await self.driver.signal(job_id, signal.SIGTERM)
            except NotSupported:
                force = True
            else:
                job = await self.get_execution(job_id, wait=grace)
                if job.status.is_final:
                    return job
        await self.driver.cancel(job_id)
        return await self.get_execution(job_id, wait=10.0)

    # ---------------------------------------------------------------- files and env

    async def for_files(self, sandbox_id: str) -> Sandbox:
        """A sandbox ready for file operations: waits out creating, wakes a paused one."""
        sb = await self._wait_not_creating(sandbox_id)
        if sb.status is SandboxStatus.PAUSED:
            sb = await self.resume(sandbox_id, auto=True)
        if sb.status not in (SandboxStatus.IDLE, SandboxStatus.RUNNING):
            raise IllegalTransition(
                f"cannot use files: sandbox {sandbox_id} is {sb.status.value}", sandbox_id=sandbox_id, status=sb.status.value
            )
        self.touch(sandbox_id)
        return sb

    async def set_env(self, sandbox_id: str, changes: dict[str, str | None]) -> dict[str, str]:
        await self._require(sandbox_id, include_deleted=False)
        set_ = {k: v for k, v in changes.items() if v is not None}
        unset = tuple(k for k, v in changes.items() if v is None)
        await self._command(sandbox_id, ChangeEnv(set=set_, unset=unset))
        return dict((await self._require(sandbox_id)).spec.env)

    # ---------------------------------------------------------------- pause

    async def pause(self, sandbox_id: str) -> Sandbox:
        async with self._lock(sandbox_id):
            sb = await self._require(sandbox_id, include_deleted=False)
            paused_for = seconds(sb.spec.timeout.paused, "timeout.paused")
            deadline = _iso_after(paused_for) if paused_for else None
            events = decide(sb, Pause(terminates_at=deadline))  # refuses before the driver is touched
            if events:
                await self.driver.pause(sandbox_id)
                await self._append(sandbox_id, events)
        return await self._require(sandbox_id)

    async def resume(self, sandbox_id: str, *, auto: bool = False) -> Sandbox:
        async with self._lock(sandbox_id):
            sb = await self._require(sandbox_id, include_deleted=False)
            events = decide(sb, Resume(auto=auto))
            if events:
                await self.driver.resume(sandbox_id)
                await self._append(sandbox_id, events)
        return await self._require(sandbox_id)

    # ---------------------------------------------------------------- timeouts (api/timeouts.py)

    def touch(self, sandbox_id: str) -> None:
        """Activity that is not an event (file operations) still keeps a sandbox from idling out."""
        self.reaper.touch(sandbox_id)

    def _spawn(self, coro, name: str) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _start_execution(self, sandbox_id: str, execution_id: str, command: tuple[str, ...],
                               timeout: float | None, *, kind: str = "exec", stream: StreamOptions = RAW_OUTPUT,
                               ) -> None:
        # Streams exist before anyone learns their URLs, so a reader never sees a 404.
        stdout = self.outputs.create(self.streams.derive(execution_id, "stdout"))
        stderr = self.outputs.create(self.streams.derive(execution_id, "stderr"))
        try:
            await self._command(sandbox_id, StartExecution(execution_id, command, timeout_seconds=timeout, kind=kind))
        except BaseException:
            self.outputs.close(self.streams.derive(execution_id, "stdout"))
            self.outputs.close(self.streams.derive(execution_id, "stderr"))
            raise
        task = asyncio.create_task(
            self._run(sandbox_id, execution_id, command, timeout, ExecutionSink(stdout, stderr, stream)),
            name=f"exec-{execution_id}"
        )
        self._tasks[execution_id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(execution_id, None))

    async def _run(
        self, sandbox_id: str, execution_id: str, command: tuple[str, ...], timeout: float | None, sink: ExecutionSink
    ) -> None:
        sb = await self._require(sandbox_id)
        started = time.monotonic()
        error: str | None = None
        result: ExecResult | None = None
        stdin = self.inputs.reader(sink.options.stdin) if sink.options.stdin else None
        try:
            result = await self.driver.exec(
                ExecRequest(execution_id=execution_id, sandbox_id=sandbox_id, argv=command, timeout=timeout,
                            env=dict(sb.spec.env), stdin=stdin),
                sink,
            )
        except asyncio.CancelledError:
            error = "the server shut down while the command ran"
        except HutchError as err:
            error = err.message
        except Exception as err:
            log.exception("execution %s failed in the driver", execution_id)
            error = f"{type(err).__name__}: {err}"
        finally:
            duration_ms = int((time.monotonic() - started) * 1000)
            if stdin is not None:
                await stdin.aclose()  # an upload still sending is told the command is done with it
            truncated = any(s.truncated for s in sink.streams.values())
            self.outputs.close(self.streams.derive(execution_id, "stdout"))
            self.outputs.close(self.streams.derive(execution_id, "stderr"))
        if result is None:
            finish = FinishExecution(execution_id, ExecutionStatus.FAILED, error=error, duration_ms=duration_ms, output_truncated=truncated)
        elif result.timed_out:
            finish = FinishExecution(
                execution_id, ExecutionStatus.TIMEOUT, exit_code=result.exit_code, duration_ms=duration_ms,
                error=f"timed out after {timeout:g}s" if timeout else "timed out", output_truncated=truncated,
            )
        elif result.cancelled or execution_id in self._stopping:
            finish = FinishExecution(
                execution_id, ExecutionStatus.CANCELLED, exit_code=result.exit_code, duration_ms=duration_ms,
                error=self._cancel_reasons.pop(execution_id, "cancelled"), output_truncated=truncated,
            )
        elif result.oom_killed:
            limit = sb.spec.resources.memory_bytes
            finish = FinishExecution(
                execution_id, ExecutionStatus.FAILED, exit_code=result.exit_code, duration_ms=duration_ms,
                error="killed: out of memory" + (f" (limit {format_bytes(limit)})" if limit else ""),
                output_truncated=truncated,
            )
        else:
            finish = FinishExecution(
                execution_id, ExecutionStatus.COMPLETED, exit_code=result.exit_code, duration_ms=duration_ms,
                output_truncated=truncated,
            )
        self._stopping.discard(execution_id)
        with contextlib.suppress(IllegalTransition, SandboxNotFound):  # the sandbox ended under it
            await self._command(sandbox_id, finish)
        if sb.spec.mode is Mode.ONESHOT:
            code = finish.exit_code if finish.exit_code is not None else 1
            await self._end(sandbox_id, Terminate(reason="the oneshot command finished", exit_code=code))

    async def _sandbox_ended(self, sandbox_id: str, reason: str, failed: bool) -> None:
        """The driver saw a sandbox end on its own (a Nomad allocation lost or OOM-killed)."""
        try:
            sb = await self.store.get_sandbox(sandbox_id)
            if sb is None or sb.status.is_final:
                return
            await self._command(sandbox_id, Fail(reason=reason) if failed else Terminate(reason=reason))
        except Exception:  # the driver's watcher must survive whatever happens here
            log.exception("recording the end of sandbox %s failed", sandbox_id)

    async def _usage(self, sandbox_id: str) -> dict[str, Any]:
        """Best effort, just before the driver forgets the sandbox: stats want it later.
        Travels in the lifecycle:terminated event (Terminate's usage fields)."""
        try:
            used = await self.driver.usage(sandbox_id)
        except Exception:
            log.warning("reading the usage of %s failed", sandbox_id, exc_info=True)
            return {}
        return {"cpu_seconds": round(used.cpu_seconds, 6) if used.cpu_seconds is not None else None,
                "memory_peak_bytes": used.memory_peak_bytes}

    async def _end(self, sandbox_id: str, command: Terminate) -> None:
        command = attrs.evolve(command, **await self._usage(sandbox_id))
        try:
            await self.driver.destroy(sandbox_id)
        except Exception as err:  # still record the end; the driver cleans leftovers at start
            log.exception("destroying %s failed", sandbox_id)
            await self._command(sandbox_id, Fail(reason=f"destroy failed: {err}"))
            return
        await self._command(sandbox_id, command)
        self._forget(sandbox_id)

    def _forget(self, sandbox_id: str) -> None:
        """An ended sandbox's lock and owner entry go: kept, both grew with every sandbox the
        server ever had (bench/soak.py: +71 MiB over 26,000 sandboxes). A later command on it
        makes them again."""
        lock = self._locks.get(sandbox_id)
        if lock is not None and not lock.locked():
            del self._locks[sandbox_id]
        self._owners.pop(sandbox_id, None)

    # ---------------------------------------------------------------- destroy

    async def destroy(self, sandbox_id: str) -> None:
        sb = await self._require(sandbox_id)
        if sb.status is SandboxStatus.DELETED:
            return
        await self._command(sandbox_id, Destroy())
        for ex in await self.store.list_executions(sandbox_id):
            if not ex.status.is_final:
                with contextlib.suppress(Exception):
                    await self.driver.cancel(ex.execution_id)
        used = await self._usage(sandbox_id)
        await self.driver.destroy(sandbox_id)
        await self._command(sandbox_id, Terminate(reason="destroyed on request", deleted=True, **used))
        self._forget(sandbox_id)

    # ---------------------------------------------------------------- reads

    async def get(self, sandbox_id: str, *, include_deleted: bool = False) -> Sandbox:
        return await self._require(sandbox_id, include_deleted=include_deleted)

    async def list(self, query: SandboxQuery) -> tuple[list[Sandbox], int]:
        return await self.store.list_sandboxes(self.resolved(query))

    def resolved(self, query: SandboxQuery) -> SandboxQuery:
        """The query in the caller's scope, a project's name filtering like its id."""
        query = self.scoped(query)
        if query.project_id and self.tenants is not None:
            with contextlib.suppress(InvalidInput):
                project = tenancy.resolve_project(self.tenants.directory, query.org_id or LOCAL_ORG, query.project_id)
                query = attrs.evolve(query, project_id=project)
        return query

    async def get_execution(self, execution_id: str, wait: float = 0.0) -> Execution:
        ex = await self._visible_execution(execution_id)
        if ex.status.is_final or wait <= 0:
            return ex
        return await self._wait(
            lambda: self.store.get_execution(execution_id), lambda e: e.status.is_final, min(wait, MAX_WAIT_SECONDS)
        )

    async def list_executions(self, sandbox_id: str, limit: int | None) -> list[Execution]:
        await self._require(sandbox_id)
        found = [e for e in await self.store.list_executions(sandbox_id) if e.type != "job"]
        return found[:limit] if limit is not None else found

    async def wait_status(self, sandbox_id: str, statuses: set[SandboxStatus], wait: float) -> Sandbox:
        await self._require(sandbox_id)
        return await self._wait(
            lambda: self._require(sandbox_id), lambda s: s.status in statuses, min(wait, MAX_WAIT_SECONDS)
        )

    async def _wait(self, read, done, wait: float):  # type: ignore[no-untyped-def]
        """Hold until ``done(read())`` or ``wait`` seconds pass; returns the last read."""
        queue = self.projector.listen()
        deadline = time.monotonic() + wait
        try:
            while True:
                value = await read()
                remaining = deadline - time.monotonic()
                if done(value) or remaining <= 0:
                    return value
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await queue.get()
                while not queue.empty():  # coalesce a burst of events into one re-read
                    queue.get_nowait()
        finally:
            self.projector.unlisten(queue)

    async def events(self, sandbox_id: str, *, limit: int, reverse: bool) -> list[Event]:
        await self._require(sandbox_id)
        return await self.log.read(0, sandbox_id=sandbox_id, limit=limit, reverse=reverse)



__all__ = ["Created", "Engine", "FileToWrite"]
