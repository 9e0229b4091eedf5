"""Handles of started work: :class:`ExecutionHandle` (a command) and :class:`JobHandle` (a
background job), as ``Sandbox.start``/``Sandbox.create_job`` return them. They hold the
executions service (hutch/_executions.py) and read output through its connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from hutch._connection import Connected
from hutch._executions import Executions
from hutch._output import OutputCollector, OutputSink, interleave
from hutch._stdin import StdinUpload
from hutch.models import Execution, ExecutionInfo, Job, OutputChunk

__all__ = ["ExecutionHandle", "JobHandle"]


class ExecutionHandle:
    """A started execution: iterate its output as it arrives, then :meth:`wait` for the result."""

    def __init__(self, executions: Executions | Connected, sandbox_id: str, started: Execution,
                 stdin: StdinUpload | None = None) -> None:
        self._executions = _executions(executions)
        self.sandbox_id = sandbox_id
        self.started = started
        self._stdin = stdin

    @property
    def execution_id(self) -> str:
        return self.started.execution_id

    @property
    def stdout_stream_url(self) -> str | None:
        return self.started.stdout_stream_url

    @property
    def stderr_stream_url(self) -> str | None:
        return self.started.stderr_stream_url

    async def output(self) -> AsyncIterator[OutputChunk]:
        """Yield :class:`OutputChunk` s from stdout and stderr, interleaved as they arrive, until both end."""
        async for chunk in interleave(self._executions.connection, self.stdout_stream_url, self.stderr_stream_url):
            yield chunk

    async def wait(self) -> Execution:
        """Long-poll until the execution is terminal; output is not captured here."""
        final = await self._executions.wait_execution(self.execution_id)
        return self._result(final, None)

    async def cancel(self) -> Execution:
        """End the command's whole process tree (status ``cancelled``)."""
        return self._result(await self._executions.cancel_execution(self.execution_id), None)

    def _result(self, final: ExecutionInfo, collector: OutputCollector | None) -> Execution:
        out = err = None
        if collector is not None:
            out, err = collector.text()
        return Execution(
            execution_id=final.execution_id,
            status=final.status,
            exit_code=final.exit_code,
            duration_ms=final.duration_ms,
            stdout_stream_url=self.started.stdout_stream_url or final.stdout_stream_url,
            stderr_stream_url=self.started.stderr_stream_url or final.stderr_stream_url,
            output_truncated=final.output_truncated
            if final.output_truncated is not None
            else self.started.output_truncated,
            auto_resumed=self.started.auto_resumed,
            stdout=out,
            stderr=err,
            error=final.error,
        )

    async def _complete(
        self, *, stdout: OutputSink | None, stderr: OutputSink | None, capture: bool
    ) -> Execution:
        collector = None
        if capture or stdout is not None or stderr is not None:
            collector = OutputCollector(
                self._executions.connection,
                self.stdout_stream_url,
                self.stderr_stream_url,
                stdout=stdout,
                stderr=stderr,
                capture=capture,
            )
            collector.start()
        try:
            final = await self._executions.wait_execution(self.execution_id)
            if collector is not None:
                await collector.drain(self._executions.connection.drain_timeout)
            if self._stdin is not None:
                await self._stdin.finish()
        except BaseException:
            if collector is not None:
                await collector.cancel()
            if self._stdin is not None:
                await self._stdin.cancel()
            raise
        return self._result(final, collector if capture else None)


class JobHandle:
    """A background job: :attr:`job` is the last state seen; :meth:`get` refreshes it,
    :meth:`output` follows stdout/stderr, :meth:`wait` polls until it ends, :meth:`stop` ends it."""

    def __init__(self, executions: Executions | Connected, job: Job) -> None:
        self._executions = _executions(executions)
        self.job = job

    def __repr__(self) -> str:
        return f"JobHandle(id={self.id!r}, status={self.job.status!r})"

    @property
    def id(self) -> str:
        return self.job.job_id

    @property
    def sandbox_id(self) -> str:
        return self.job.sandbox_id

    @property
    def status(self) -> str:
        return self.job.status

    async def get(self) -> Job:
        self.job = await self._executions.get_job(self.sandbox_id, self.id)
        return self.job

    async def stop(self, *, force: bool = False) -> Job:
        """Graceful (SIGTERM, then SIGKILL after the server's grace period) or, with
        ``force``, SIGKILL at once."""
        self.job = await self._executions.stop_job(self.sandbox_id, self.id, force=force)
        return self.job

    async def output(self) -> AsyncIterator[OutputChunk]:
        """stdout/stderr chunks, interleaved as they arrive, until the job's streams end."""
        async for chunk in interleave(
            self._executions.connection, self.job.stdout_stream_url, self.job.stderr_stream_url
        ):
            yield chunk

    async def wait(self, *, poll: float = 0.05, max_poll: float = 1.0) -> Job:
        """Poll :meth:`get` (backing off from ``poll`` to ``max_poll`` seconds) until the job
        is completed, failed or cancelled. Bound it with ``asyncio.timeout``."""
        delay = poll
        while not (await self.get()).done:
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_poll)
        return self.job


def _executions(given: Executions | Connected) -> Executions:
    """The executions service a handle calls: the one given, or a new one over the connection of
    the client given (as handles were made before they held services; a service keeps no state
    but its connection, so the two are the same)."""
    return given if isinstance(given, Executions) else Executions(given.connection)
