"""Executions and jobs: start a command in a sandbox, stream its output, record how it
ended; cancel one (or stop a job) and cancel a command its waiters all left."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Sequence

import attrs

from hutch.core import ids, phases
from hutch.core.errors import HutchError, IllegalTransition, NotSupported, SandboxNotFound
from hutch.core.lifecycle import Command, FinishExecution, StartExecution, Terminate
from hutch.core.models import (
    ExecutionState,
    ExecutionStatus,
    Mode,
    SandboxSpec,
    SandboxStatus,
)
from hutch.core.output import OutputStreams, OutputWriter, StreamOwner
from hutch.core.quantities import format_bytes, stored_duration
from hutch.drivers.base import ExecRequest, ExecResult
from hutch.drivers.roles import CommandRunner, SandboxFiles
from hutch.service.background import Background
from hutch.service.control import SandboxControl
from hutch.service.input_streams import InputStreams
from hutch.service.output import RAW_OUTPUT, ExecutionSink, OutputBudget, StreamOptions
from hutch.service.quotas import Quotas
from hutch.service.reads import Reads
from hutch.service.recorder import Recorder
from hutch.service.requests import ExecuteRequest
from hutch.service.stream_ids import StreamIds
from hutch.service.watchers import Watchers

log = logging.getLogger(__name__)

JOB_STOP_GRACE_SECONDS = 10.0  # SIGTERM, then SIGKILL after this long
CANCEL_WAIT_SECONDS = 10.0  # a cancel answers once the command's tree is gone (or after this)


def default_timeout(spec: SandboxSpec) -> float | None:
    if spec.timeout.execution is None:
        return None
    seconds = stored_duration("timeout.execution", spec.timeout.execution)  # past the cap (older): the cap
    return seconds or None  # "0s" = no limit


class Executions:
    def __init__(self, *, reads: Reads, recorder: Recorder, control: SandboxControl, commands: CommandRunner,
                 files: SandboxFiles, outputs: OutputStreams, streams: StreamIds, inputs: InputStreams,
                 background: Background, quotas: Quotas) -> None:
        self._reads = reads
        self._quotas = quotas  # the output an organization keeps counts against its storage quota
        self._recorder = recorder
        self._control = control
        self._commands = commands
        self._files = files  # what an execute request brings along
        self._outputs = outputs
        self._streams = streams
        self._inputs = inputs
        self._background = background
        self.watchers = Watchers(self._abandoned)  # cancels a command its waiters all left
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopping: set[str] = set()  # jobs asked to stop: however they exit, they were cancelled
        self._cancel_reasons: dict[str, str] = {}  # why a command being cancelled is

    def running(self, execution_id: str) -> bool:
        """Whether this server runs the command now (its task has not ended)."""
        return execution_id in self._tasks

    async def execute(self, sandbox_id: str, req: ExecuteRequest) -> tuple[ExecutionState, bool]:
        """Start a command; returns the execution and whether a paused sandbox was resumed for it."""
        sb = await self._reads.wait_not_creating(sandbox_id)
        # Before anything happens for it: an organization whose storage is full runs nothing.
        budget = await self._quotas.output_budget(sb.spec.org_id, refuse_full=True)
        auto_resumed = False
        if sb.status is SandboxStatus.PAUSED:
            await self._control.resume(sandbox_id, auto=True)
            auto_resumed = True
            sb = await self._reads.require(sandbox_id)
        if sb.status not in (SandboxStatus.IDLE, SandboxStatus.RUNNING):
            raise IllegalTransition(
                f"cannot execute: sandbox {sandbox_id} is {sb.status.value}", sandbox_id=sandbox_id, sandbox_status=sb.status.value
            )
        if req.stream.stdin:
            self._inputs.check(req.stream.stdin)
        if req.files:
            await self._files.write_files(sandbox_id, req.files)
        timeout = default_timeout(sb.spec) if req.timeout is None else (req.timeout or None)
        execution_id = ids.new_id("execution")
        await self.start(sandbox_id, execution_id, req.command, timeout, org_id=sb.spec.org_id, stream=req.stream,
                         budget=budget)
        return await self._reads.execution(execution_id), auto_resumed

    async def start_job(self, sandbox_id: str, command: tuple[str, ...]) -> ExecutionState:
        """A job is an execution of kind "job": it runs beside executions and other jobs,
        outlives the request, and has no default time limit."""
        sb = await self._reads.wait_not_creating(sandbox_id)
        budget = await self._quotas.output_budget(sb.spec.org_id, refuse_full=True)
        if sb.status is SandboxStatus.PAUSED:
            await self._control.resume(sandbox_id, auto=True)
        job_id = ids.new_id("job")
        await self.start(sandbox_id, job_id, command, None, org_id=sb.spec.org_id, kind="job", budget=budget)
        return await self._reads.execution(job_id)

    async def cancel(self, execution_id: str, *, why: str = "cancelled on request") -> ExecutionState:
        """End a running command's whole process tree (status ``cancelled``); returns it ended."""
        ex = await self._reads.visible_execution(execution_id)
        if ex.status is ExecutionStatus.QUEUED:  # the initial command, behind its runtime's build
            raise IllegalTransition(f"cannot cancel: execution {execution_id} is queued; destroy its sandbox")
        if ex.status.is_final:
            return ex
        self._stopping.add(execution_id)  # however it exits now, it was cancelled
        self._cancel_reasons[execution_id] = why
        deadline = time.monotonic() + CANCEL_WAIT_SECONDS
        while not ex.status.is_final and time.monotonic() < deadline:
            # Again until it ends: a command just started may not be the driver's to kill yet.
            await self._commands.cancel(execution_id)
            ex = await self._reads.get_execution(execution_id, wait=0.3)
        return ex

    async def _abandoned(self, execution_id: str) -> None:
        ex = await self._reads.store.get_execution(execution_id)
        # Only a command this process runs: another replica's waiters do not decide for it.
        if ex is not None and ex.type == "exec" and ex.status is ExecutionStatus.RUNNING and self.running(execution_id):
            await self.cancel(execution_id, why="cancelled: every client waiting for it went away "
                              f"(none came back within {self.watchers.grace:g} s)")

    async def stop_job(self, sandbox_id: str, job_id: str, *, force: bool,
                       grace: float = JOB_STOP_GRACE_SECONDS) -> ExecutionState:
        """Graceful: SIGTERM to the job's process tree, SIGKILL after ``grace``. Forced: SIGKILL now."""
        job = await self._reads.get_job(sandbox_id, job_id)
        if job.status.is_final:
            return job
        self._stopping.add(job_id)
        if not force:
            try:
                await self._commands.signal(job_id, signal.SIGTERM)
            except NotSupported:
                force = True
            else:
                job = await self._reads.get_execution(job_id, wait=grace)
                if job.status.is_final:
                    return job
        await self._commands.cancel(job_id)
        return await self._reads.get_execution(job_id, wait=10.0)

    def open_streams(self, sandbox_id: str, execution_id: str, *, org_id: str) -> asyncio.Task[list[OutputWriter]]:
        """A command's two streams, opened ahead of its ``start`` (``opened``): a create opens
        them beside its owner row and the driver's provision instead of after them (on
        PostgreSQL a lock statement, one round trip fewer in series on the way to the answer).
        Whoever does not hand them to ``start`` ends them with ``discard_streams``."""
        return asyncio.ensure_future(self._outputs.open_all(self._stream_ids(execution_id),
                                                            StreamOwner(org_id, sandbox_id)))

    async def discard_streams(self, execution_id: str, opened: asyncio.Future[list[OutputWriter]]) -> None:
        """Streams opened ahead (``open_streams``) of a command that is not running: closed,
        once their open is done (they are nobody's: no URL of them was given out). A command
        ``start`` launched keeps them (it closes them when it ends)."""
        if self.running(execution_id):
            return
        with contextlib.suppress(BaseException):
            await opened
        if not self.running(execution_id):
            await self.close_streams(execution_id)  # a close of a stream not open here is nothing

    async def start(self, sandbox_id: str, execution_id: str, command: tuple[str, ...], timeout: float | None,
                    *, org_id: str, kind: str = "exec", stream: StreamOptions = RAW_OUTPUT,
                    budget: OutputBudget | None = None, preceded_by: Sequence[Command] = (),
                    recorded: Callable[[], None] = lambda: None, spec: SandboxSpec | None = None,
                    minted: bool = False, opened: asyncio.Future[list[OutputWriter]] | None = None) -> None:
        """Record the command started and run it in the background. Its output is the
        organization's (``org_id``), kept within ``budget`` (Quotas.output_budget) until the
        retention drops it (service/retention.py). ``preceded_by``: commands recorded in the
        same append, before the start (a create's ``Start``): all of them or none. ``recorded``
        is called once they are in the log (before the command is launched). ``spec``: the
        sandbox's, when the store may not show it yet (recorded in this same append);
        ``minted``: ``preceded_by`` creates an id made just now (Recorder.command); ``opened``:
        the streams, being opened already (``open_streams``)."""
        # Streams exist before anyone learns their URLs, so a reader never sees a 404.
        with phases.span("streams: open both (what is left of it)" if opened is not None else "streams: open both"):
            try:
                stdout, stderr = await (opened if opened is not None else self._outputs.open_all(
                    self._stream_ids(execution_id), StreamOwner(org_id, sandbox_id)))
            except BaseException:
                await self.close_streams(execution_id)  # the one of the two that opened, if any
                raise
        launched: list[asyncio.Task[None]] = []

        def launch(position: int) -> None:
            recorded()
            # Once ``execution:started`` is in the log the command may run: nothing runs
            # unrecorded, and it need not wait for the projector (3.3 ms p50 on PostgreSQL).
            # Should that wait fail (the store away), the command runs on and its end is
            # recorded once the store shows its start (``_run``): the request's error says
            # the write is in the log.
            task = self._background.spawn(
                self._run(sandbox_id, execution_id, command, timeout, ExecutionSink(stdout, stderr, stream, budget),
                          position, spec),
                f"exec-{execution_id}")
            self._tasks[execution_id] = task
            task.add_done_callback(lambda _t: self._tasks.pop(execution_id, None))
            launched.append(task)

        try:
            await self._recorder.command_many(
                sandbox_id, (*preceded_by, StartExecution(execution_id, command, timeout_seconds=timeout, kind=kind)),
                durable=launch, minted=minted)
        except BaseException:
            if not launched:  # the command never started: its streams are nobody's
                await self.close_streams(execution_id)
            raise

    async def close_streams(self, execution_id: str) -> None:
        """Every byte saved and both streams closed (here; elsewhere a round trip later, see
        ``OutputStreams.close``): before the execution is recorded finished, so a reader that
        sees it finished reads its whole output."""
        with phases.span("streams: close both"):
            await self._outputs.close_all(self._stream_ids(execution_id))

    def _stream_ids(self, execution_id: str) -> tuple[str, str]:
        return self._streams.derive(execution_id, "stdout"), self._streams.derive(execution_id, "stderr")

    async def _run(self, sandbox_id: str, execution_id: str, command: tuple[str, ...], timeout: float | None,
                   sink: ExecutionSink, started_at: int, spec: SandboxSpec | None = None) -> None:
        t_run = phases.start()
        try:
            if spec is None:
                spec = (await self._reads.require(sandbox_id)).spec
        except BaseException:
            await self.close_streams(execution_id)
            raise
        started = time.monotonic()
        error: str | None = None
        result: ExecResult | None = None
        stdin = self._inputs.reader(sink.options.stdin) if sink.options.stdin else None
        t_exec = phases.start()
        try:
            result = await self._commands.exec(
                ExecRequest(execution_id=execution_id, sandbox_id=sandbox_id, argv=command, timeout=timeout,
                            env=dict(spec.env), stdin=stdin),
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
            phases.end("driver: exec, whole", t_exec)
            duration_ms = int((time.monotonic() - started) * 1000)
            if stdin is not None:
                await stdin.aclose()  # an upload still sending is told the command is done with it
            truncated = any(s.truncated for s in sink.streams.values())
            await self.close_streams(execution_id)
        finish = self._finish(spec, execution_id, result, error, timeout, duration_ms, truncated)
        self._stopping.discard(execution_id)
        with phases.span("execution: settled wait (start projected)"):
            await self._recorder.settled(started_at)  # the end is decided against a store showing the start
        recorded = False
        with contextlib.suppress(IllegalTransition, SandboxNotFound):  # the sandbox ended under it
            await self._recorder.command(sandbox_id, finish)
            recorded = True
        phases.end("execution: task, start to finish recorded", t_run)
        if spec.mode is Mode.ONESHOT and (recorded or await self._ends_on_its_own(sandbox_id)):
            code = finish.exit_code if finish.exit_code is not None else 1
            await self._control.end(sandbox_id, Terminate(reason="the oneshot command finished", exit_code=code))

    async def _ends_on_its_own(self, sandbox_id: str) -> bool:
        """Whether a oneshot whose command's end was refused is still to be ended here: not when
        a destroy or another end stopped the command (their end is under way, and recorded the
        command's), only when something else did (a filesystem-only pause)."""
        sb = await self._reads.store.get_sandbox(sandbox_id)
        return sb is not None and not sb.status.is_final and sb.status is not SandboxStatus.STOPPING

    def _finish(self, spec: SandboxSpec, execution_id: str, result: ExecResult | None, error: str | None,
                timeout: float | None, duration_ms: int, truncated: bool) -> FinishExecution:
        """How the command ended, from what the driver said (or the error it raised)."""
        if result is None:
            return FinishExecution(execution_id, ExecutionStatus.FAILED, error=error, duration_ms=duration_ms,
                                   output_truncated=truncated)
        done = FinishExecution(execution_id, ExecutionStatus.COMPLETED, exit_code=result.exit_code,
                               duration_ms=duration_ms, output_truncated=truncated)
        if result.timed_out:
            return attrs.evolve(done, status=ExecutionStatus.TIMEOUT,
                                error=f"timed out after {timeout:g}s" if timeout else "timed out")
        if result.cancelled or execution_id in self._stopping:
            return attrs.evolve(done, status=ExecutionStatus.CANCELLED,
                                error=self._cancel_reasons.pop(execution_id, "cancelled"))
        if result.oom_killed:
            limit = spec.resources.memory_bytes
            return attrs.evolve(done, status=ExecutionStatus.FAILED,
                                error="killed: out of memory" + (f" (limit {format_bytes(limit)})" if limit else ""))
        return done
