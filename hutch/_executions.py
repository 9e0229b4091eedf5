"""Executions, jobs and lifecycle events of :class:`hutch.client.SandboxClient`: looking up,
long-polling and cancelling commands, and starting and stopping background jobs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from hutch._shapes import Duration, _duration, _seconds
from hutch._transport import Transport, _items
from hutch.errors import InvalidInput
from hutch.handles import JobHandle
from hutch.models import ExecutionInfo, Job, SandboxEvent, from_wire


class ExecutionsAPI(Transport):
    """Executions, events and jobs (a base of ``SandboxClient``)."""

    # ------------------------------------------------------------ executions, events

    async def get_execution(
        self, execution_id: str, *, wait: Duration | None = None
    ) -> ExecutionInfo:
        """An execution's state; with ``wait`` the server holds the request until the execution is
        terminal or the wait passes (at most 5m), then answers with the current state."""
        wait_text = _duration("wait", wait)
        timeout = self.request_timeout + (_seconds(wait_text) if wait_text else 0)
        resp = await self._request(
            "GET",
            f"/sandbox/execution/{execution_id}",
            params={"wait": wait_text},
            max_seconds=timeout,
            execution_id=execution_id,
        )
        return from_wire(ExecutionInfo, self._data(resp))

    async def cancel_execution(self, execution_id: str) -> ExecutionInfo:
        """End a running command's whole process tree; answers it ended (``cancelled``), or as it
        ended if it already had."""
        resp = await self._request("POST", f"/sandbox/execution/{execution_id}/cancel", execution_id=execution_id)
        return from_wire(ExecutionInfo, self._data(resp))

    async def wait_execution(self, execution_id: str) -> ExecutionInfo:
        """Long-poll :meth:`get_execution` until the execution reaches a terminal status."""
        backoff = 0.05
        while True:
            asked = time.monotonic()
            info = await self.get_execution(execution_id, wait=self.long_poll)
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
        resp = await self._request(
            "GET",
            f"/sandbox/sandboxes/{sandbox_id}/executions",
            params={"limit": limit},
            sandbox_id=sandbox_id,
        )
        data = self._data(resp)
        return [from_wire(ExecutionInfo, item) for item in _items(data, "executions")]

    async def list_events(
        self, sandbox_id: str, *, limit: int | None = None, direction: str | None = None
    ) -> list[SandboxEvent]:
        """Lifecycle events, oldest first by default (``direction="desc"`` for newest first)."""
        resp = await self._request(
            "GET",
            f"/sandbox/sandboxes/{sandbox_id}/events",
            params={"limit": limit, "direction": direction},
            sandbox_id=sandbox_id,
        )
        return [from_wire(SandboxEvent, item) for item in _items(self._data(resp), "events")]

    # ------------------------------------------------------------ jobs

    async def create_job(
        self,
        sandbox_id: str,
        command: Sequence[str],
        *,
        streams: Mapping[str, Any] | None = None,
    ) -> JobHandle:
        """Start a background job; it runs beside executions and outlives this call."""
        if isinstance(command, str) or not command:
            raise InvalidInput(
                "command: expected a non-empty list of arguments, e.g. ['sh', '-c', '...']",
                field="command",
            )
        body: dict[str, Any] = {"command": list(command)}
        if streams:
            body["streams"] = dict(streams)
        resp = await self._request(
            "POST", f"/sandbox/sandboxes/{sandbox_id}/jobs", json=body, sandbox_id=sandbox_id
        )
        return JobHandle(self._as_client(), from_wire(Job, self._data(resp)))

    async def get_job(self, sandbox_id: str, job_id: str) -> Job:
        resp = await self._request(
            "GET",
            f"/sandbox/sandboxes/{sandbox_id}/jobs/{job_id}",
            sandbox_id=sandbox_id,
            execution_id=job_id,
        )
        return from_wire(Job, self._data(resp))

    async def list_jobs(self, sandbox_id: str, *, limit: int | None = None) -> list[Job]:
        resp = await self._request(
            "GET",
            f"/sandbox/sandboxes/{sandbox_id}/jobs",
            params={"limit": limit},
            sandbox_id=sandbox_id,
        )
        return [from_wire(Job, item) for item in _items(self._data(resp), "jobs")]

    async def stop_job(self, sandbox_id: str, job_id: str, *, force: bool = False) -> Job:
        """Stop a job: SIGTERM then SIGKILL after a grace period, or SIGKILL now with ``force``.
        Stopping a finished job returns it unchanged."""
        resp = await self._request(
            "DELETE",
            f"/sandbox/sandboxes/{sandbox_id}/jobs/{job_id}",
            params={"force": True if force else None},
            sandbox_id=sandbox_id,
            execution_id=job_id,
        )
        return from_wire(Job, self._data(resp))
