"""Sandboxes over a :class:`~hutch._connection.Connection`: one-shot runs, creating, looking
up, listing, pausing, resuming, forking and destroying sandboxes, plus the server-wide calls
(runtimes, the server's own info). (The public docs are on :class:`hutch.client.SandboxClient`,
which delegates here and makes the :class:`~hutch._sandbox.Sandbox` handles.)"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Unpack

from hutch._connection import Connection, segment
from hutch._executions import Executions
from hutch._options import SandboxOptions, check_options, create_body
from hutch._output import OutputCollector, OutputSink
from hutch._shapes import _wire_files
from hutch._stdin import Stdin, StdinUpload
from hutch.errors import InvalidInput, SandboxError
from hutch.models import (
    ExecutionInfo,
    PauseResult,
    RunResult,
    RuntimeList,
    SandboxCreated,
    SandboxInfo,
    SandboxList,
    SandboxStatusInfo,
    from_wire,
)

_EXIT_CODE_FAST_WAIT = "250ms"
_STATUS_SETTLE_WAIT_MS = 15_000


class Sandboxes:
    """Sandbox lifecycle and server-wide calls (and one-shot runs, which wait for their
    execution through the executions service)."""

    def __init__(self, connection: Connection, executions: Executions) -> None:
        self.connection = connection
        self.executions = executions

    # ------------------------------------------------------------ one-shot

    async def run(
        self,
        command: Sequence[str],
        *,
        stream: Mapping[str, Any] | None = None,
        stdout: OutputSink | None = None,
        stderr: OutputSink | None = None,
        on_created: Callable[[SandboxCreated], Any] | None = None,
        stdin: Stdin | None = None,
        **options: Unpack[SandboxOptions],
    ) -> RunResult:
        check_options("run", options)
        if isinstance(command, str):
            raise InvalidInput(
                "command: expected a list of arguments, e.g. ['sh', '-c', '...']", field="command"
            )
        started = time.monotonic()
        body = _oneshot_body(command, stream, options)
        upload = await StdinUpload.open(self.connection, stdin) if stdin is not None else None
        if upload is not None:
            body["stream"]["stdin"] = upload.stream_id
        try:
            created = await self._created(body)
        except BaseException:
            if upload is not None:
                await upload.cancel()
            raise
        if on_created is not None:
            on_created(created)
        collector = OutputCollector(
            self.connection, created.stdout_stream_url, created.stderr_stream_url,
            stdout=stdout, stderr=stderr,
        )
        collector.start()
        final, exit_code = await self._finish_oneshot(created, collector, upload)
        out, err = collector.text()
        return RunResult(
            sandbox_id=created.sandbox_id,
            execution_id=created.execution_id,
            exit_code=exit_code,
            duration_ms=int((time.monotonic() - started) * 1000),
            stdout=out,
            stderr=err,
            status=final.status if final else None,
            output_truncated=final.output_truncated if final else None,
            error=final.error if final else None,
        )

    async def _finish_oneshot(
        self, created: SandboxCreated, collector: OutputCollector, upload: StdinUpload | None
    ) -> tuple[ExecutionInfo | None, int]:
        """Wait for a one-shot command and its output: (its final state, its exit code).
        On any failure or cancellation the sandbox is destroyed before the error propagates."""
        sandbox_id = created.sandbox_id
        try:
            final: ExecutionInfo | None = None
            if created.execution_id:
                final = await self.executions.wait_execution(created.execution_id)
            else:
                await collector.drain(None)
            exit_code = await self._settle_exit_code(sandbox_id, final)
            await collector.drain(self.connection.drain_timeout)
            if upload is not None:
                await upload.finish()
        except BaseException:
            await collector.cancel()
            if upload is not None:
                await upload.cancel()
            with contextlib.suppress(Exception):
                await asyncio.shield(self.destroy(sandbox_id))
            raise
        return final, exit_code

    async def _settle_exit_code(self, sandbox_id: str, final: ExecutionInfo | None) -> int:
        """The exit code of a one-shot run, reconciled the way the TypeScript client does."""
        if final is not None and final.exit_code is not None:
            return final.exit_code
        if final is not None and final.status == "completed":
            with contextlib.suppress(SandboxError):
                again = await self.executions.get_execution(final.execution_id, wait=_EXIT_CODE_FAST_WAIT)
                if again.exit_code is not None:
                    return again.exit_code
        with contextlib.suppress(SandboxError):
            status = await self.get_status(
                sandbox_id, wait_for_status=["terminated", "failed"], wait_ms=_STATUS_SETTLE_WAIT_MS
            )
            if status.exit_code is not None:
                return status.exit_code
            if status.status == "failed":
                return 1
            if status.status == "terminated":
                return 0
        return 0 if final is None or final.status == "completed" else 1

    # ------------------------------------------------------------ sandboxes

    async def _created(self, body: Mapping[str, Any]) -> SandboxCreated:
        resp = await self.connection.request("POST", "/sandbox", json=body)
        return from_wire(SandboxCreated, self.connection.data(resp))

    async def create(self, **options: Unpack[SandboxOptions]) -> SandboxCreated:
        check_options("create", options)
        return await self._created(create_body(options))

    async def fork(self, sandbox_id: str, count: int) -> list[tuple[str, str]]:
        """(id, status) of each of ``count`` new copies of the sandbox."""
        resp = await self.connection.request("POST", f"/sandbox/{segment(sandbox_id)}/fork", json={"count": count},
                                             sandbox_id=sandbox_id)
        return [(s["sandboxId"], s["status"]) for s in self.connection.data(resp)["sandboxes"]]

    async def get(
        self,
        sandbox_id: str,
        *,
        include_deleted: bool = False,
        wait_for_status: str | Sequence[str] | None = None,
        wait_ms: int | None = None,
    ) -> SandboxInfo:
        params = {
            "includeDeleted": True if include_deleted else None,
            "waitForStatus": wait_for_status,
            "waitMs": wait_ms,
        }
        timeout = self.connection.request_timeout + (wait_ms or 0) / 1000
        resp = await self.connection.request(
            "GET",
            f"/sandbox/{segment(sandbox_id)}",
            params=params,
            max_seconds=timeout,
            sandbox_id=sandbox_id,
        )
        return from_wire(SandboxInfo, self.connection.data(resp))

    async def get_status(
        self,
        sandbox_id: str,
        *,
        wait_for_status: str | Sequence[str] | None = None,
        wait_ms: int | None = None,
    ) -> SandboxStatusInfo:
        timeout = self.connection.request_timeout + (wait_ms or 0) / 1000
        resp = await self.connection.request(
            "GET",
            f"/sandbox/status/{segment(sandbox_id)}",
            params={"waitForStatus": wait_for_status, "waitMs": wait_ms},
            max_seconds=timeout,
            sandbox_id=sandbox_id,
        )
        return from_wire(SandboxStatusInfo, self.connection.data(resp))

    async def list(
        self,
        *,
        status: str | None = None,
        name: str | None = None,
        mode: str | None = None,
        project_id: str | None = None,
        snapshot_id: str | None = None,
        live: bool | None = None,
        limit: int | None = None,
        offset: int | None = None,
        sort: str | None = None,
        direction: str | None = None,
        deleted_only: bool = False,
    ) -> SandboxList:
        params = {
            "name": name,
            "mode": mode,
            "projectId": project_id,
            "snapshotId": snapshot_id,
            "status": status,
            "live": live,
            "limit": limit,
            "offset": offset,
            "sort": sort,
            "direction": direction,
            "deletedOnly": True if deleted_only else None,
        }
        resp = await self.connection.request("GET", "/sandbox", params=params)
        return from_wire(SandboxList, self.connection.data(resp))

    async def iter_sandboxes(
        self, *, page_size: int = 100, **filters: Any
    ) -> AsyncIterator[SandboxInfo]:
        offset = 0
        while True:
            page = await self.list(limit=page_size, offset=offset, **filters)
            for item in page.sandboxes:
                yield item
            offset += len(page.sandboxes)
            if not page.sandboxes or offset >= page.total:
                return

    async def destroy(self, sandbox_id: str) -> None:
        await self.connection.request("DELETE", f"/sandbox/{segment(sandbox_id)}", sandbox_id=sandbox_id)

    async def pause(self, sandbox_id: str, *, memory: bool = True) -> PauseResult:
        # No body for a memory pause: what every hutch (and Agentuity) server takes.
        resp = await self.connection.request("POST", f"/sandbox/{segment(sandbox_id)}/pause", sandbox_id=sandbox_id,
                                             json=None if memory else {"memory": False})
        return from_wire(PauseResult, resp.get("data", resp))

    async def resume(self, sandbox_id: str) -> None:
        await self.connection.request("POST", f"/sandbox/{segment(sandbox_id)}/resume", sandbox_id=sandbox_id)

    async def update_network(self, sandbox_id: str, *, enabled: bool, allow: Sequence[str] | None = None,
                             deny: Sequence[str] | None = None) -> SandboxInfo:
        body: dict[str, Any] = {"enabled": enabled}
        if allow is not None:
            body["allow"] = list(allow)
        if deny is not None:
            body["deny"] = list(deny)
        resp = await self.connection.request("PUT", f"/sandbox/{segment(sandbox_id)}/network", json=body, sandbox_id=sandbox_id)
        return from_wire(SandboxInfo, self.connection.data(resp))

    # ------------------------------------------------------------ runtimes, the server

    async def list_runtimes(
        self,
        *,
        limit: int | None = None,
        offset: int | None = None,
        sort: str | None = None,
        direction: str | None = None,
    ) -> RuntimeList:
        resp = await self.connection.request(
            "GET",
            "/sandbox/runtimes",
            params={"limit": limit, "offset": offset, "sort": sort, "direction": direction},
        )
        return from_wire(RuntimeList, self.connection.data(resp))

    async def server_info(self) -> dict[str, Any]:
        return dict(self.connection.data(await self.connection.request("GET", "/healthz")))


def _oneshot_body(
    command: Sequence[str], stream: Mapping[str, Any] | None, options: SandboxOptions
) -> dict[str, Any]:
    """The create body of a one-shot run: the sandbox's options, with ``files`` written for
    the command (``command.files``) rather than into the sandbox's create."""
    sandbox_options = options.copy()
    files = sandbox_options.pop("files", None)
    cmd: dict[str, Any] = {"exec": list(command), "mode": "oneshot"}
    wire_files = _wire_files(files)
    if wire_files:
        cmd["files"] = wire_files
    body = create_body(sandbox_options)
    body["command"] = cmd
    body["stream"] = dict(stream or {})
    return body
