"""Executions, jobs and lifecycle events over a :class:`~hutch._connection.Connection`:
starting, looking up, long-polling and cancelling commands, and starting and stopping
background jobs. (The public docs are on :class:`hutch.client.SandboxClient`, which delegates
here; handles of what is started are in hutch/handles.py.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from hutch._connection import Connection, items, segment
from hutch._shapes import Duration, Files, _duration, _seconds, _wire_files
from hutch.errors import InvalidInput
from hutch.models import Execution, ExecutionInfo, Job, SandboxEvent, from_wire


class Executions:
    """Executions, events and jobs."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    # ------------------------------------------------------------ executions, events

    async def start(
        self,
        sandbox_id: str,
        command: Sequence[str],
        *,
        files: Files | None = None,
        timeout: Duration | None = None,
        stream: Mapping[str, Any] | None = None,
    ) -> Execution:
        """``POST /sandbox/{id}/execute``: the execution as started (its stream URLs)."""
        body: dict[str, Any] = {"command": list(command)}
        wire_files = _wire_files(files)
        if wire_files:
            body["files"] = wire_files
        if timeout is not None:
            body["timeout"] = _duration("timeout", timeout)
        if stream:
            body["stream"] = dict(stream)
        resp = await self.connection.request(
            "POST", f"/sandbox/{segment(sandbox_id)}/execute", json=body, sandbox_id=sandbox_id
        )
        started = from_wire(Execution, resp.get("data"))
        if resp.get("autoResumed") is not None:  # beside the data, in the envelope
            started = attrs.evolve(started, auto_resumed=bool(resp["autoResumed"]))
        return started

    async def get_execution(
        self, execution_id: str, *, wait: Duration | None = None
    ) -> ExecutionInfo:
        wait_text = _duration("wait", wait)
        timeout = self.connection.request_timeout + (_seconds(wait_text) if wait_text else 0)
        resp = await self.connection.request(
            "GET",
            f"/sandbox/execution/{segment(execution_id)}",
            params={"wait": wait_text},
            max_seconds=timeout,
            execution_id=execution_id,
        )
        return from_wire(ExecutionInfo, self.connection.data(resp))

    async def cancel_execution(self, execution_id: str) -> ExecutionInfo:
        resp = await self.connection.request(
            "POST", f"/sandbox/execution/{segment(execution_id)}/cancel", execution_id=execution_id
        )
        return from_wire(ExecutionInfo, self.connection.data(resp))

    async def wait_execution(self, execution_id: str) -> ExecutionInfo:
        backoff = 0.05
        while True:
            asked = time.monotonic()
            info = await self.get_execution(execution_id, wait=self.connection.long_poll)
            if info.done:
                return info
            # A server that ignores ``wait`` answers at once; do not spin on it.
            if time.monotonic() - asked < 1.0:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
            else:
                backoff = 0.05

    async def list_executions(
        self, sandbox_id: str, *, limit: int | None = None
    ) -> list[ExecutionInfo]:
        resp = await self.connection.request(
            "GET",
            f"/sandbox/sandboxes/{segment(sandbox_id)}/executions",
            params={"limit": limit},
            sandbox_id=sandbox_id,
        )
        data = self.connection.data(resp)
        return [from_wire(ExecutionInfo, item) for item in items(data, "executions")]

    async def list_events(
        self, sandbox_id: str, *, limit: int | None = None, direction: str | None = None
    ) -> list[SandboxEvent]:
        resp = await self.connection.request(
            "GET",
            f"/sandbox/sandboxes/{segment(sandbox_id)}/events",
            params={"limit": limit, "direction": direction},
            sandbox_id=sandbox_id,
        )
        return [from_wire(SandboxEvent, item) for item in items(self.connection.data(resp), "events")]

    # ------------------------------------------------------------ jobs

    async def create_job(
        self,
        sandbox_id: str,
        command: Sequence[str],
        *,
        streams: Mapping[str, Any] | None = None,
    ) -> Job:
        if isinstance(command, str) or not command:
            raise InvalidInput(
                "command: expected a non-empty list of arguments, e.g. ['sh', '-c', '...']",
                field="command",
            )
        body: dict[str, Any] = {"command": list(command)}
        if streams:
            body["streams"] = dict(streams)
        resp = await self.connection.request(
            "POST", f"/sandbox/sandboxes/{segment(sandbox_id)}/jobs", json=body, sandbox_id=sandbox_id
        )
        return from_wire(Job, self.connection.data(resp))

    async def get_job(self, sandbox_id: str, job_id: str) -> Job:
        resp = await self.connection.request(
            "GET",
            f"/sandbox/sandboxes/{segment(sandbox_id)}/jobs/{segment(job_id)}",
            sandbox_id=sandbox_id,
            execution_id=job_id,
        )
        return from_wire(Job, self.connection.data(resp))

    async def list_jobs(self, sandbox_id: str, *, limit: int | None = None) -> list[Job]:
        resp = await self.connection.request(
            "GET",
            f"/sandbox/sandboxes/{segment(sandbox_id)}/jobs",
            params={"limit": limit},
            sandbox_id=sandbox_id,
        )
        return [from_wire(Job, item) for item in items(self.connection.data(resp), "jobs")]

    async def stop_job(self, sandbox_id: str, job_id: str, *, force: bool = False) -> Job:
        resp = await self.connection.request(
            "DELETE",
            f"/sandbox/sandboxes/{segment(sandbox_id)}/jobs/{segment(job_id)}",
            params={"force": True if force else None},
            sandbox_id=sandbox_id,
            execution_id=job_id,
        )
        return from_wire(Job, self.connection.data(resp))
