"""The async client: :class:`SandboxClient` and :class:`Sandbox` (handles of started
executions and jobs: hutch/handles.py; terminals: hutch/terminal.py).

It speaks the Agentuity-compatible wire (``docs/wire.md``) and mirrors the TypeScript
``SandboxClient`` in Python style: keyword arguments, snake_case results, exceptions
instead of ``{success: false}``, and cancellation through asyncio (cancel the task or wrap
the call in ``asyncio.timeout``) instead of an AbortSignal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json as jsonlib
import os
import posixpath
import stat
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import urljoin, urlsplit

import aiohttp

from hutch import _config, _transfer
from hutch._output import OutputSink, _OutputCollector
from hutch._shapes import (
    Duration,
    Files,
    _duration,
    _network,
    _query,
    _resources,
    _seconds,
    _timeouts,
    _wire_files,
)
from hutch._stdin import Stdin, StdinUpload
from hutch.errors import (
    ConnectionFailed,
    FileNotFound,
    InvalidInput,
    SandboxError,
    ServerError,
    error_from_response,
)
from hutch.handles import ExecutionHandle, JobHandle
from hutch.models import (
    Checkpoint,
    CopyResult,
    Execution,
    ExecutionInfo,
    Job,
    Network,
    PauseResult,
    Resources,
    RunResult,
    RuntimeList,
    SandboxCreated,
    SandboxEvent,
    SandboxFileInfo,
    SandboxInfo,
    SandboxList,
    SandboxStatusInfo,
    Snapshot,
    SnapshotLineageEntry,
    Timeouts,
    UploadResult,
    from_wire,
)
from hutch.tenancy import Tenancy
from hutch.terminal import Terminal, open_terminal

__all__ = [
    "ARCHIVE_FORMATS",
    "Duration",
    "ExecutionHandle",
    "Files",
    "JobHandle",
    "OutputSink",
    "Sandbox",
    "SandboxClient",
]

T = TypeVar("T")

LONG_POLL = "5m"  # the longest server-side wait the wire allows per request
_EXIT_CODE_FAST_WAIT = "250ms"
_STATUS_SETTLE_WAIT_MS = 15_000
_READ_CHUNK = 256 * 1024
#: Archive formats of ``/fs/download`` and ``/fs/upload``.
ARCHIVE_FORMATS = ("tar.gz", "zip", "tar")


class Sandbox:
    """An interactive sandbox bound to a client (what :meth:`SandboxClient.create` and
    :meth:`SandboxClient.connect` return). ``async with`` destroys it on exit."""

    def __init__(
        self,
        client: SandboxClient,
        sandbox_id: str,
        status: str,
        *,
        created: SandboxCreated | None = None,
        info: SandboxInfo | None = None,
    ) -> None:
        self._client = client
        self.id = sandbox_id
        self.status = status
        self.created = created
        self.info = info
        source: Any = created or info
        self.stdout_stream_url: str | None = getattr(source, "stdout_stream_url", None)
        self.stderr_stream_url: str | None = getattr(source, "stderr_stream_url", None)
        self.audit_stream_url: str | None = getattr(source, "audit_stream_url", None)
        self.url: str | None = getattr(source, "url", None)

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, status={self.status!r})"

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(SandboxError):
            await self.destroy()

    async def start(
        self,
        command: Sequence[str],
        *,
        files: Files | None = None,
        timeout: Duration | None = None,
        stream: Mapping[str, Any] | None = None,
        stdin: Stdin | None = None,
    ) -> ExecutionHandle:
        """Start a command and return at once with a handle (stream URLs, ``output()``, ``wait()``).
        ``stdin``: bytes, text, a binary file or an async iterable of chunks, streamed to it."""
        if isinstance(command, str):
            raise InvalidInput(
                "command: expected a list of arguments, e.g. ['sh', '-c', '...']", field="command"
            )
        upload = await StdinUpload.open(self._client, stdin) if stdin is not None else None
        if upload is not None:
            stream = {**(stream or {}), "stdin": upload.stream_id}
        body: dict[str, Any] = {"command": list(command)}
        wire_files = _wire_files(files)
        if wire_files:
            body["files"] = wire_files
        if timeout is not None:
            body["timeout"] = _duration("timeout", timeout)
        if stream:
            body["stream"] = dict(stream)
        try:
            resp = await self._client._request(
                "POST", f"/sandbox/{self.id}/execute", json=body, sandbox_id=self.id
            )
        except BaseException:
            if upload is not None:
                await upload.cancel()
            raise
        started = from_wire(Execution, resp.get("data"))
        if resp.get("autoResumed") is not None:
            started = Execution(**{**_fields(started), "auto_resumed": bool(resp["autoResumed"])})
        return ExecutionHandle(self._client, self.id, started, upload)

    async def execute(
        self,
        command: Sequence[str],
        *,
        files: Files | None = None,
        timeout: Duration | None = None,
        stdout: OutputSink | None = None,
        stderr: OutputSink | None = None,
        capture: bool = True,
        stream: Mapping[str, Any] | None = None,
        stdin: Stdin | None = None,
    ) -> Execution:
        """Run a command and wait for it to finish (``stdin``: see :meth:`start`).

        Output streams to ``stdout``/``stderr`` sinks as it arrives and, unless
        ``capture=False``, is also returned decoded in ``Execution.stdout``/``.stderr``.
        A non-zero exit is not an exception: check ``exit_code`` and ``status``.
        """
        handle = await self.start(command, files=files, timeout=timeout, stream=stream, stdin=stdin)
        return await handle._complete(stdout=stdout, stderr=stderr, capture=capture)

    async def get(self) -> SandboxInfo:
        info = await self._client.get(self.id)
        self.status = info.status
        self.info = info
        return info

    async def destroy(self) -> None:
        await self._client.destroy(self.id)
        self.status = "terminated"

    async def pause(self) -> PauseResult:
        result = await self._client.pause(self.id)
        self.status = result.status
        return result

    async def resume(self) -> None:
        await self._client.resume(self.id)

    async def write_files(self, files: Files) -> int:
        return await self._client.write_files(self.id, files)

    def read_file(self, path: str, *, chunk_size: int = _READ_CHUNK) -> AsyncIterator[bytes]:
        """The file's bytes as they arrive (``async for chunk in sandbox.read_file(p)``)."""
        return self._client.read_file(self.id, path, chunk_size=chunk_size)

    async def read_bytes(self, path: str) -> bytes:
        return await self._client.read_bytes(self.id, path)

    async def list_files(self, path: str | None = None) -> list[SandboxFileInfo]:
        return await self._client.list_files(self.id, path)

    async def mkdir(self, path: str, *, recursive: bool = False) -> None:
        await self._client.mkdir(self.id, path, recursive=recursive)

    async def rm_file(self, path: str) -> bool:
        return await self._client.rm_file(self.id, path)

    async def rm_dir(self, path: str, *, recursive: bool = False) -> bool:
        return await self._client.rm_dir(self.id, path, recursive=recursive)

    async def fork(self, count: int = 1) -> list[Sandbox]:
        """``count`` new sandboxes with this one's files and env as they are now (processes
        are not carried); the snapshot of that instant is in each copy's ``info.snapshot``."""
        body = await self._client._request("POST", f"/sandbox/{self.id}/fork", json={"count": count},
                                           sandbox_id=self.id)
        return [Sandbox(self._client, s["sandboxId"], s["status"]) for s in self._client._data(body)["sandboxes"]]

    async def terminal(self, command: Sequence[str] | None = None, **kw: Any) -> Terminal:
        """A shell (or ``command``) on a new terminal: see :meth:`SandboxClient.terminal`."""
        return await open_terminal(self._client, self.id, command, **kw)

    async def set_env(self, env: Mapping[str, str | None]) -> dict[str, str]:
        return await self._client.set_env(self.id, env)

    def iter_archive(self, *, path: str | None = None, format: str = "tar.gz") -> AsyncIterator[bytes]:
        return self._client.iter_archive(self.id, path=path, format=format)

    async def download_archive(
        self,
        dest: str | os.PathLike[str] | IO[bytes],
        *,
        path: str | None = None,
        format: str = "tar.gz",
    ) -> int:
        return await self._client.download_archive(self.id, dest, path=path, format=format)

    async def upload_archive(
        self, source: _transfer.Source, *, path: str | None = None, format: str | None = None
    ) -> UploadResult:
        return await self._client.upload_archive(self.id, source, path=path, format=format)

    async def copy_to(
        self, local: str | os.PathLike[str], dest: str, *, recursive: bool = False, strict: bool = False
    ) -> CopyResult:
        return await self._client.copy_to(self.id, local, dest, recursive=recursive, strict=strict)

    async def copy_from(
        self, source: str, local: str | os.PathLike[str], *, recursive: bool = False, strict: bool = False
    ) -> CopyResult:
        return await self._client.copy_from(self.id, source, local, recursive=recursive, strict=strict)

    async def create_job(
        self, command: Sequence[str], *, streams: Mapping[str, Any] | None = None
    ) -> JobHandle:
        return await self._client.create_job(self.id, command, streams=streams)

    async def get_job(self, job_id: str) -> Job:
        return await self._client.get_job(self.id, job_id)

    async def list_jobs(self, *, limit: int | None = None) -> list[Job]:
        return await self._client.list_jobs(self.id, limit=limit)

    async def stop_job(self, job_id: str, *, force: bool = False) -> Job:
        return await self._client.stop_job(self.id, job_id, force=force)

    async def list_executions(self, *, limit: int | None = None) -> list[ExecutionInfo]:
        return await self._client.list_executions(self.id, limit=limit)

    async def list_events(
        self, *, limit: int | None = None, direction: str | None = None
    ) -> list[SandboxEvent]:
        return await self._client.list_events(self.id, limit=limit, direction=direction)


def _fields(obj: Any) -> dict[str, Any]:
    import attrs

    return attrs.asdict(obj, recurse=False)


class SandboxClient:
    """Async client for a hutch server (or any Agentuity-compatible sandbox API).

    ``url`` defaults to ``$HUTCH_URL``, else ``http://127.0.0.1:8700``. ``api_key`` defaults to
    ``$HUTCH_API_KEY``, else the key file of a local server (``$HUTCH_DATA_DIR/api-key`` or
    ``~/.local/share/hutch/api-key``). Pass ``connector`` (e.g. ``aiohttp.UnixConnector``) to
    reach an in-process server; the client closes it on :meth:`close`.

    Use as ``async with SandboxClient() as client: ...`` or call :meth:`close`.
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        connector: aiohttp.BaseConnector | None = None,
        request_timeout: float = 60.0,
        long_poll: Duration = LONG_POLL,
        drain_timeout: float = 30.0,
        org_id: str | None = None,
    ) -> None:
        self.url = _config.resolve_url(url)
        #: The organization calls act in (``orgId`` on every request), for a key that may act
        #: for several (the server's administrator); None: the key's own.
        self.org_id = org_id
        #: Organizations, projects, API keys and quotas (:class:`hutch.tenancy.Tenancy`).
        self.tenancy = Tenancy(self)
        self.api_key = _config.resolve_api_key(api_key)
        self._connector = connector
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self.request_timeout = request_timeout
        self.long_poll = long_poll
        #: After an execution ends, how long a silent output stream may stay open before we stop reading.
        self.drain_timeout = drain_timeout

    def __repr__(self) -> str:
        return f"SandboxClient(url={self.url!r})"

    # ------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None
        elif self._connector is not None:
            await self._connector.close()
        self._connector = None

    def _http(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("SandboxClient is closed")
        if self._session is None:
            from hutch import __version__

            self._session = aiohttp.ClientSession(
                connector=self._connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
                headers={"User-Agent": f"hutch-python/{__version__}", "Accept": "application/json"},
            )
        return self._session

    # ------------------------------------------------------------ transport

    def _params(self, params: Mapping[str, Any] | None) -> dict[str, str]:
        query = _query(params or {})
        if self.org_id is not None:
            query.setdefault("orgId", self.org_id)
        return query

    def _auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        max_seconds: float | None = None,
        sandbox_id: str | None = None,
        execution_id: str | None = None,
    ) -> dict[str, Any]:
        """One JSON call. Returns the whole body (envelope included); raises on any failure."""
        url = self.url + path
        limit = max_seconds if max_seconds is not None else self.request_timeout
        try:
            async with self._http().request(
                method,
                url,
                params=self._params(params),
                json=json,
                headers=self._auth_headers(),
                timeout=aiohttp.ClientTimeout(total=limit, sock_connect=30),
            ) as resp:
                text = await resp.text(errors="replace")
                status = resp.status
        except TimeoutError as err:
            raise ConnectionFailed(
                f"{method} {path}: no answer from {self.url} within {limit:g}s"
            ) from err
        except (aiohttp.ClientError, OSError) as err:
            raise ConnectionFailed(f"cannot reach hutch server at {self.url}: {err}") from err
        try:
            body: Any = jsonlib.loads(text) if text else None
        except ValueError:
            body = text
        if status >= 400 or (isinstance(body, dict) and body.get("success") is False):
            raise error_from_response(
                status, body, sandbox_id=sandbox_id, execution_id=execution_id
            )
        if not isinstance(body, dict):
            raise ServerError(
                f"{method} {path}: expected a JSON object, got {text[:200]!r}",
                code="BAD_RESPONSE",
                status=status,
            )
        return body

    @staticmethod
    def _data(body: Mapping[str, Any]) -> Any:
        return body.get("data", body)

    def _absolute(self, url: str) -> str:
        return url if urlsplit(url).scheme else urljoin(self.url + "/", url.lstrip("/"))

    async def _iter_stream(self, url: str) -> AsyncIterator[bytes]:
        """The bytes behind an output stream URL, as they arrive, until the server closes it."""
        full = self._absolute(url)
        # Stream URLs are capabilities; only send our key where it cannot leak.
        trusted = self._connector is not None or urlsplit(full)[:2] == urlsplit(self.url)[:2]
        headers = self._auth_headers() if trusted else {}
        try:
            async with self._http().get(
                full, headers=headers, timeout=aiohttp.ClientTimeout(total=None, sock_connect=30)
            ) as resp:
                if resp.status == 404:
                    return
                if resp.status >= 400:
                    text = await resp.text(errors="replace")
                    try:
                        body: Any = jsonlib.loads(text)
                    except ValueError:
                        body = text
                    raise error_from_response(resp.status, body)
                async for chunk in resp.content.iter_any():
                    yield chunk
        except (aiohttp.ClientError, OSError) as err:
            raise ConnectionFailed(f"reading output stream {full}: {err}") from err

    # ------------------------------------------------------------ one-shot

    async def run(
        self,
        command: Sequence[str],
        *,
        runtime: str | None = None,
        runtime_id: str | None = None,
        files: Files | None = None,
        env: Mapping[str, str] | None = None,
        timeout: Duration | Timeouts | Mapping[str, Any] | None = None,
        resources: Resources | Mapping[str, Any] | None = None,
        network: bool | Network | Mapping[str, Any] | None = None,
        snapshot: str | None = None,
        name: str | None = None,
        description: str | None = None,
        dependencies: Sequence[str] | None = None,
        packages: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        scopes: Sequence[str] | None = None,
        project_id: str | None = None,
        stream: Mapping[str, Any] | None = None,
        stdout: OutputSink | None = None,
        stderr: OutputSink | None = None,
        on_created: Callable[[SandboxCreated], Any] | None = None,
        stdin: Stdin | None = None,
    ) -> RunResult:
        """Run one command in a fresh one-shot sandbox and return its exit code and output.

        The server destroys the sandbox when the command exits. Output is captured and, if
        ``stdout``/``stderr`` sinks are given, forwarded as it streams. If the call fails or
        is cancelled, the sandbox is destroyed before the error propagates. ``on_created`` hears
        the create's answer (e.g. ``status == "creating"``: its runtime is being built first).
        """
        if isinstance(command, str):
            raise InvalidInput(
                "command: expected a list of arguments, e.g. ['sh', '-c', '...']", field="command"
            )
        started = time.monotonic()
        cmd: dict[str, Any] = {"exec": list(command), "mode": "oneshot"}
        wire_files = _wire_files(files)
        if wire_files:
            cmd["files"] = wire_files
        body = self._create_body(
            runtime=runtime,
            runtime_id=runtime_id,
            env=env,
            timeout=timeout,
            resources=resources,
            network=network,
            snapshot=snapshot,
            name=name,
            description=description,
            dependencies=dependencies,
            packages=packages,
            metadata=metadata,
            scopes=scopes,
            project_id=project_id,
        )
        body["command"] = cmd
        body["stream"] = dict(stream or {})
        upload = await StdinUpload.open(self, stdin) if stdin is not None else None
        if upload is not None:
            body["stream"]["stdin"] = upload.stream_id
        try:
            created = await self._create(body)
        except BaseException:
            if upload is not None:
                await upload.cancel()
            raise
        sandbox_id = created.sandbox_id
        if on_created is not None:
            on_created(created)
        collector = _OutputCollector(
            self, created.stdout_stream_url, created.stderr_stream_url, stdout=stdout, stderr=stderr
        )
        collector.start()
        try:
            final: ExecutionInfo | None = None
            if created.execution_id:
                final = await self.wait_execution(created.execution_id)
            else:
                await collector.drain(None)
            exit_code = await self._settle_exit_code(sandbox_id, final)
            await collector.drain(self.drain_timeout)
            if upload is not None:
                await upload.finish()
        except BaseException:
            await collector.cancel()
            if upload is not None:
                await upload.cancel()
            with contextlib.suppress(Exception):
                await asyncio.shield(self.destroy(sandbox_id))
            raise
        out, err = collector.text()
        return RunResult(
            sandbox_id=sandbox_id,
            execution_id=created.execution_id,
            exit_code=exit_code,
            duration_ms=int((time.monotonic() - started) * 1000),
            stdout=out,
            stderr=err,
            status=final.status if final else None,
            output_truncated=final.output_truncated if final else None,
        )

    async def _settle_exit_code(self, sandbox_id: str, final: ExecutionInfo | None) -> int:
        """The exit code of a one-shot run, reconciled the way the TypeScript client does."""
        if final is not None and final.exit_code is not None:
            return final.exit_code
        if final is not None and final.status == "completed":
            with contextlib.suppress(SandboxError):
                again = await self.get_execution(final.execution_id, wait=_EXIT_CODE_FAST_WAIT)
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

    def _create_body(
        self,
        *,
        runtime: str | None = None,
        runtime_id: str | None = None,
        name: str | None = None,
        description: str | None = None,
        resources: Resources | Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        network: bool | Network | Mapping[str, Any] | None = None,
        timeout: Duration | Timeouts | Mapping[str, Any] | None = None,
        files: Files | None = None,
        snapshot: str | None = None,
        dependencies: Sequence[str] | None = None,
        packages: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        scopes: Sequence[str] | None = None,
        project_id: str | None = None,
    ) -> dict[str, Any]:
        if snapshot and (runtime or runtime_id):
            raise InvalidInput(
                "snapshot: cannot specify both snapshot and runtime; snapshot includes its own runtime",
                field="snapshot",
            )
        body: dict[str, Any] = {
            "projectId": project_id,
            "runtime": runtime,
            "runtimeId": runtime_id,
            "name": name,
            "description": description,
            "resources": _resources(resources),
            "env": dict(env) if env is not None else None,
            "network": _network(network),
            "timeout": _timeouts(timeout),
            "files": _wire_files(files),
            "snapshot": snapshot,
            "dependencies": list(dependencies) if dependencies else None,
            "packages": list(packages) if packages else None,
            "metadata": dict(metadata) if metadata is not None else None,
            "scopes": list(scopes) if scopes else None,
        }
        return {k: v for k, v in body.items() if v is not None}

    async def _create(self, body: Mapping[str, Any]) -> SandboxCreated:
        resp = await self._request("POST", "/sandbox", json=body)
        return from_wire(SandboxCreated, self._data(resp))

    async def create(
        self,
        *,
        runtime: str | None = None,
        runtime_id: str | None = None,
        name: str | None = None,
        description: str | None = None,
        resources: Resources | Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        network: bool | Network | Mapping[str, Any] | None = None,
        timeout: Duration | Timeouts | Mapping[str, Any] | None = None,
        files: Files | None = None,
        snapshot: str | None = None,
        dependencies: Sequence[str] | None = None,
        packages: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        scopes: Sequence[str] | None = None,
        project_id: str | None = None,
    ) -> Sandbox:
        """Create an interactive sandbox. ``timeout`` may be ``Timeouts(idle=, execution=, paused=)``;
        a bare duration sets the per-execution timeout. The server makes ``execute`` wait while
        the sandbox is still ``creating``."""
        body = self._create_body(
            runtime=runtime,
            runtime_id=runtime_id,
            name=name,
            description=description,
            resources=resources,
            env=env,
            network=network,
            timeout=timeout,
            files=files,
            snapshot=snapshot,
            dependencies=dependencies,
            packages=packages,
            metadata=metadata,
            scopes=scopes,
            project_id=project_id,
        )
        created = await self._create(body)
        return Sandbox(self, created.sandbox_id, created.status, created=created)

    async def connect(self, sandbox_id: str) -> Sandbox:
        """A :class:`Sandbox` for an existing id (fails with ``SandboxNotFound`` if there is none)."""
        info = await self.get(sandbox_id)
        return Sandbox(self, info.sandbox_id, info.status, info=info)

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
        timeout = self.request_timeout + (wait_ms or 0) / 1000
        resp = await self._request(
            "GET",
            f"/sandbox/{sandbox_id}",
            params=params,
            max_seconds=timeout,
            sandbox_id=sandbox_id,
        )
        return from_wire(SandboxInfo, self._data(resp))

    async def get_status(
        self,
        sandbox_id: str,
        *,
        wait_for_status: str | Sequence[str] | None = None,
        wait_ms: int | None = None,
    ) -> SandboxStatusInfo:
        """Lightweight status (status and exit code); optionally held server-side until one of
        ``wait_for_status`` is reached or ``wait_ms`` passes."""
        timeout = self.request_timeout + (wait_ms or 0) / 1000
        resp = await self._request(
            "GET",
            f"/sandbox/status/{sandbox_id}",
            params={"waitForStatus": wait_for_status, "waitMs": wait_ms},
            max_seconds=timeout,
            sandbox_id=sandbox_id,
        )
        return from_wire(SandboxStatusInfo, self._data(resp))

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
        """One page of sandboxes (server default 50, max 100) and the total that match."""
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
        resp = await self._request("GET", "/sandbox", params=params)
        return from_wire(SandboxList, self._data(resp))

    async def iter_sandboxes(
        self, *, page_size: int = 100, **filters: Any
    ) -> AsyncIterator[SandboxInfo]:
        """Every sandbox matching ``filters`` (as for :meth:`list`), fetching page by page."""
        offset = 0
        while True:
            page = await self.list(limit=page_size, offset=offset, **filters)
            for item in page.sandboxes:
                yield item
            offset += len(page.sandboxes)
            if not page.sandboxes or offset >= page.total:
                return

    async def destroy(self, sandbox_id: str) -> None:
        await self._request("DELETE", f"/sandbox/{sandbox_id}", sandbox_id=sandbox_id)

    async def pause(self, sandbox_id: str) -> PauseResult:
        resp = await self._request("POST", f"/sandbox/{sandbox_id}/pause", sandbox_id=sandbox_id)
        return from_wire(PauseResult, resp.get("data", resp))

    async def resume(self, sandbox_id: str) -> None:
        await self._request("POST", f"/sandbox/{sandbox_id}/resume", sandbox_id=sandbox_id)

    # ------------------------------------------------------------ executions, events, runtimes

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

    async def list_runtimes(
        self,
        *,
        limit: int | None = None,
        offset: int | None = None,
        sort: str | None = None,
        direction: str | None = None,
    ) -> RuntimeList:
        resp = await self._request(
            "GET",
            "/sandbox/runtimes",
            params={"limit": limit, "offset": offset, "sort": sort, "direction": direction},
        )
        return from_wire(RuntimeList, self._data(resp))

    async def terminal(self, sandbox_id: str, command: Sequence[str] | None = None, *, rows: int = 24,
                       cols: int = 80, cwd: str | None = None, term: str | None = None) -> Terminal:
        """Start ``command`` (default: the sandbox user's login shell) on a new pseudo-terminal:
        a :class:`hutch.terminal.Terminal` to write, read, resize and wait on."""
        return await open_terminal(self, sandbox_id, command, rows=rows, cols=cols, cwd=cwd, term=term)

    async def server_info(self) -> dict[str, Any]:
        """What the server says of itself (``GET /healthz``): ``status``, and ``ssh.port`` when
        it runs an SSH gateway."""
        return dict(self._data(await self._request("GET", "/healthz")))

    # ------------------------------------------------------------ files and env

    @contextlib.asynccontextmanager
    async def _raw(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        data: Any = None,
        headers: Mapping[str, str] | None = None,
        sandbox_id: str | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A request whose body and/or answer is streamed (no total time limit; a stalled
        socket still fails after ``request_timeout``). Raises on any 4xx/5xx."""
        try:
            async with self._http().request(
                method,
                self.url + path,
                params=self._params(params),
                data=data,
                headers={**self._auth_headers(), **(headers or {})},
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=30, sock_read=self.request_timeout
                ),
            ) as resp:
                if resp.status >= 400:
                    text = await resp.text(errors="replace")
                    try:
                        body: Any = jsonlib.loads(text)
                    except ValueError:
                        body = text
                    raise error_from_response(resp.status, body, sandbox_id=sandbox_id)
                yield resp
        except aiohttp.ClientError as err:
            raise ConnectionFailed(f"{method} {path}: connection to {self.url} failed: {err}") from err

    async def write_files(self, sandbox_id: str, files: Files) -> int:
        """Write small files (sent base64 in one JSON body; parent directories are created).
        For large files use :meth:`copy_to` or :meth:`upload_archive`, which stream."""
        resp = await self._request(
            "POST",
            f"/fs/{sandbox_id}",
            json={"files": _wire_files(files) or []},
            sandbox_id=sandbox_id,
        )
        data = resp.get("data") if isinstance(resp.get("data"), dict) else {}
        return int(data.get("filesWritten", resp.get("filesWritten", 0)))

    async def read_file(
        self, sandbox_id: str, path: str, *, chunk_size: int = _READ_CHUNK
    ) -> AsyncIterator[bytes]:
        """A file's bytes as they arrive: ``async for chunk in client.read_file(sid, path)``.
        Errors (missing file: ``FileNotFound``) are raised on the first iteration."""
        async with self._raw(
            "GET", f"/fs/{sandbox_id}", params={"path": path}, sandbox_id=sandbox_id
        ) as resp:
            async for chunk in resp.content.iter_chunked(chunk_size):
                yield chunk

    async def read_bytes(self, sandbox_id: str, path: str) -> bytes:
        """A whole (small) file in memory."""
        return b"".join([chunk async for chunk in self.read_file(sandbox_id, path)])

    async def list_files(self, sandbox_id: str, path: str | None = None) -> list[SandboxFileInfo]:
        resp = await self._request(
            "GET", f"/fs/list/{sandbox_id}", params={"path": path}, sandbox_id=sandbox_id
        )
        return [from_wire(SandboxFileInfo, item) for item in _items(self._data(resp), "files")]

    async def mkdir(self, sandbox_id: str, path: str, *, recursive: bool = False) -> None:
        await self._request(
            "POST",
            f"/fs/mkdir/{sandbox_id}",
            json={"path": path, "recursive": recursive},
            sandbox_id=sandbox_id,
        )

    async def rm_file(self, sandbox_id: str, path: str) -> bool:
        """Remove a file; returns whether it existed."""
        resp = await self._request(
            "POST", f"/fs/rm/{sandbox_id}", json={"path": path}, sandbox_id=sandbox_id
        )
        return bool(resp.get("found", True))

    async def rm_dir(self, sandbox_id: str, path: str, *, recursive: bool = False) -> bool:
        """Remove a directory (``recursive`` for a non-empty one); returns whether it existed."""
        resp = await self._request(
            "POST",
            f"/fs/rmdir/{sandbox_id}",
            json={"path": path, "recursive": recursive},
            sandbox_id=sandbox_id,
        )
        return bool(resp.get("found", True))

    async def set_env(self, sandbox_id: str, env: Mapping[str, str | None]) -> dict[str, str]:
        """Set variables (``None`` deletes one); returns the sandbox's whole env afterwards.
        Later executions and jobs see the result."""
        resp = await self._request(
            "PATCH", f"/sandbox/env/{sandbox_id}", json={"env": dict(env)}, sandbox_id=sandbox_id
        )
        data = self._data(resp)
        return dict(data.get("env", {})) if isinstance(data, dict) else {}

    async def iter_archive(
        self, sandbox_id: str, *, path: str | None = None, format: str = "tar.gz"
    ) -> AsyncIterator[bytes]:
        """An archive (``tar.gz``, ``zip`` or ``tar``) of ``path`` (default: the workspace),
        as the server streams it."""
        if format not in ARCHIVE_FORMATS:
            raise InvalidInput(
                f"format: expected one of {', '.join(ARCHIVE_FORMATS)}, got {format!r}",
                field="format",
            )
        async with self._raw(
            "GET",
            f"/fs/download/{sandbox_id}",
            params={"path": path, "format": format},
            sandbox_id=sandbox_id,
        ) as resp:
            async for chunk in resp.content.iter_chunked(_READ_CHUNK):
                yield chunk

    async def download_archive(
        self,
        sandbox_id: str,
        dest: str | os.PathLike[str] | IO[bytes],
        *,
        path: str | None = None,
        format: str = "tar.gz",
    ) -> int:
        """Stream an archive of ``path`` into ``dest`` (a local path or a binary file);
        returns the number of bytes written. A partial local file is removed on failure."""
        return await _save_to(self.iter_archive(sandbox_id, path=path, format=format), dest)

    async def upload_archive(
        self,
        sandbox_id: str,
        source: _transfer.Source,
        *,
        path: str | None = None,
        format: str | None = None,
    ) -> UploadResult:
        """Send an archive and extract it at ``path`` (default: the workspace). ``source`` is
        a local path, a binary file, bytes or an (async) iterable of chunks; it is streamed,
        never read whole. ``format`` (tar.gz, zip, tar) is detected by the server if omitted."""
        if format is not None and format not in (*ARCHIVE_FORMATS, "tgz"):
            raise InvalidInput(
                f"format: expected one of {', '.join(ARCHIVE_FORMATS)}, got {format!r}",
                field="format",
            )
        async with self._raw(
            "POST",
            f"/fs/upload/{sandbox_id}",
            params={"path": path, "format": format},
            data=_transfer.source_chunks(source),
            headers={"Content-Type": "application/octet-stream"},
            sandbox_id=sandbox_id,
        ) as resp:
            text = await resp.text(errors="replace")
        try:
            body = jsonlib.loads(text) if text else {}
        except ValueError:
            body = {}
        data = body.get("data") if isinstance(body, dict) else None
        data = data if isinstance(data, dict) else {}
        return UploadResult(
            files=int(data.get("files", 0)),
            directories=int(data.get("directories", 0)),
            symlinks=int(data.get("symlinks", 0)),
            bytes=int(data.get("bytes", 0)),
        )

    async def _remote_kind(self, sandbox_id: str, path: str) -> str | None:
        """"dir", "file" (symlinks count as files) or None when nothing is there."""
        p = path.rstrip("/")
        if p in ("", "."):
            return "dir"
        parent, name = posixpath.split(p)
        try:
            entries = await self.list_files(sandbox_id, parent or ".")
        except (FileNotFound, InvalidInput):
            return None
        for entry in entries:
            if entry.path == name:
                return "dir" if entry.is_dir else "file"
        return None

    async def _missing_dirs(self, sandbox_id: str, directory: str) -> list[str]:
        """The ancestors of ``directory`` (itself included) that do not exist, outermost first."""
        missing: list[str] = []
        d = directory.rstrip("/")
        while d not in ("", ".", "/"):
            try:
                await self.list_files(sandbox_id, d)
                break
            except FileNotFound:
                missing.append(d)
                d = posixpath.dirname(d)
        return missing[::-1]

    async def copy_to(
        self,
        sandbox_id: str,
        local: str | os.PathLike[str],
        dest: str,
        *,
        recursive: bool = False,
        strict: bool = False,
    ) -> CopyResult:
        """Copy a local file (or, with ``recursive``, a directory) to ``dest`` in the sandbox,
        streaming it as a tar built on the fly. A ``dest`` that is an existing directory or ends
        in ``/`` receives the source under its own name. Missing parent directories are created
        (listed in ``directories_created``) unless ``strict``."""
        src = _local_path(local)
        try:
            st = await asyncio.to_thread(os.stat, src)
        except OSError as err:
            raise InvalidInput(f"source {str(local)!r}: {err.strerror or err}", field="source") from err
        if stat.S_ISDIR(st.st_mode):
            if not recursive:
                raise InvalidInput(
                    f"source {str(local)!r} is a directory; copy it recursively (-r)",
                    field="recursive",
                )
        elif not stat.S_ISREG(st.st_mode):
            raise InvalidInput(f"source {str(local)!r} is not a regular file", field="source")
        name = src.name or (await asyncio.to_thread(src.resolve)).name
        target = dest
        if dest in ("", ".") or dest.endswith("/") or await self._remote_kind(sandbox_id, dest) == "dir":
            target = posixpath.join(dest or ".", name)
        target = target.rstrip("/")
        if not posixpath.basename(target):
            raise InvalidInput(f"destination {dest!r}: cannot replace the root directory", field="destination")
        parent = posixpath.dirname(target) or "."
        missing = await self._missing_dirs(sandbox_id, parent)
        if missing and strict:
            raise FileNotFound(
                f"directory {parent!r} does not exist in sandbox {sandbox_id} (strict: not creating it)",
                field="strict",
                sandbox_id=sandbox_id,
            )
        stats = _transfer.TarStats()
        result = await self.upload_archive(
            sandbox_id,
            _transfer.tar_stream(src, posixpath.basename(target), stats),
            path=parent,
            format="tar",
        )
        return CopyResult(
            source=str(local),
            destination=f"{sandbox_id}:{dest}",
            bytes_transferred=result.bytes or stats.bytes,
            files_transferred=result.files or stats.files,
            directories_created=missing,
        )

    async def copy_from(
        self,
        sandbox_id: str,
        source: str,
        local: str | os.PathLike[str],
        *,
        recursive: bool = False,
        strict: bool = False,
    ) -> CopyResult:
        """Copy a file (or, with ``recursive``, a directory) from the sandbox to ``local``,
        streamed to disk. A ``local`` that is an existing directory or ends in ``/`` receives
        it under its own name. Missing local parent directories are created unless ``strict``."""
        kind = await self._remote_kind(sandbox_id, source)
        if kind is None:
            raise FileNotFound(
                f"{sandbox_id}:{source}: no such file or directory",
                field="source",
                sandbox_id=sandbox_id,
            )
        if kind == "dir" and not recursive:
            raise InvalidInput(
                f"{sandbox_id}:{source} is a directory; copy it recursively (-r)", field="recursive"
            )
        dest = _local_path(local)
        name = posixpath.basename(source.rstrip("/")) or sandbox_id
        if name == ".":
            name = sandbox_id
        local_text = os.fspath(local)
        into = local_text.endswith(os.sep) or await asyncio.to_thread(dest.is_dir)
        target = dest / name if into else dest
        parent = target.parent
        missing: list[Path] = []
        p = parent
        while not p.exists():
            missing.append(p)
            p = p.parent
        if missing and strict:
            raise InvalidInput(
                f"local directory {str(parent)!r} does not exist (strict: not creating it)",
                field="strict",
            )
        for d in reversed(missing):
            d.mkdir()
        if kind == "file":
            tmp = tempfile.NamedTemporaryFile(  # noqa: SIM115 - renamed or removed below
                dir=parent, prefix=f".{target.name}.", suffix=".part", delete=False
            )
            try:
                with tmp:
                    size = await _drain_to(self.read_file(sandbox_id, source), tmp)
                os.replace(tmp.name, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp.name)
                raise
            files = 1
        else:
            if target.exists() and not target.is_dir():
                raise InvalidInput(
                    f"destination {str(target)!r} exists and is not a directory", field="destination"
                )
            with tempfile.TemporaryFile(prefix="hutch-download-") as spool:
                await _drain_to(self.iter_archive(sandbox_id, path=source, format="tar"), spool)
                await asyncio.to_thread(spool.seek, 0)
                try:
                    files, size = await asyncio.to_thread(_transfer.extract_tree, spool, target)
                except (tarfile.TarError, OSError) as err:
                    raise ServerError(
                        f"could not unpack the archive of {sandbox_id}:{source}: {err}",
                        code="BAD_RESPONSE",
                    ) from err
        return CopyResult(
            source=f"{sandbox_id}:{source}",
            destination=local_text,
            bytes_transferred=size,
            files_transferred=files,
            directories_created=[str(d) for d in reversed(missing)],
        )

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
        return JobHandle(self, from_wire(Job, self._data(resp)))

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

    # ---------------------------------------------------------------- checkpoints, stats

    async def create_checkpoint(self, sandbox_id: str, name: str) -> Checkpoint:
        resp = await self._request(
            "POST", f"/sandbox/{sandbox_id}/checkpoint", json={"name": name}, sandbox_id=sandbox_id
        )
        return from_wire(Checkpoint, self._data(resp))

    async def list_checkpoints(self, sandbox_id: str) -> list[Checkpoint]:
        resp = await self._request("GET", f"/sandbox/checkpoints/{sandbox_id}", sandbox_id=sandbox_id)
        return [from_wire(Checkpoint, item) for item in _items(self._data(resp), "checkpoints")]

    async def restore_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        """Bring the sandbox's files back to exactly that checkpoint."""
        await self._request(
            "POST", f"/sandbox/{sandbox_id}/checkpoint/{checkpoint_id}/restore", sandbox_id=sandbox_id
        )

    async def delete_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        await self._request(
            "DELETE", f"/sandbox/{sandbox_id}/checkpoint/{checkpoint_id}", sandbox_id=sandbox_id
        )

    # ---------------------------------------------------------------- snapshots

    async def create_snapshot(
        self,
        sandbox_id: str,
        *,
        name: str | None = None,
        tag: str | None = None,
        description: str | None = None,
        public: bool | None = None,
    ) -> Snapshot:
        """Snapshot the sandbox's workspace, env and runtime; new sandboxes can start from it
        (``create(snapshot=...)`` with its id, ``name:tag`` or tag)."""
        body = {"name": name, "tag": tag, "description": description, "public": public}
        resp = await self._request(
            "POST", f"/sandbox/{sandbox_id}/snapshot",
            json={k: v for k, v in body.items() if v is not None}, sandbox_id=sandbox_id,
        )
        return from_wire(Snapshot, self._data(resp))

    async def get_snapshot(self, snapshot: str) -> Snapshot:
        """By id (``snp_...``), ``name:tag`` or tag."""
        resp = await self._request("GET", f"/sandbox/snapshots/{snapshot}")
        return from_wire(Snapshot, self._data(resp))

    async def list_snapshots(
        self,
        *,
        sandbox_id: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
        sort: str | None = None,
        direction: str | None = None,
    ) -> tuple[list[Snapshot], int]:
        """(one page of snapshots, how many match in all)."""
        resp = await self._request("GET", "/sandbox/snapshots", params={
            "sandboxId": sandbox_id, "limit": limit, "offset": offset, "sort": sort, "direction": direction})
        data = self._data(resp)
        return [from_wire(Snapshot, item) for item in _items(data, "snapshots")], int(data.get("total", 0))

    async def tag_snapshot(self, snapshot_id: str, tag: str | None) -> Snapshot:
        """Give the snapshot ``tag`` (taking it from whichever snapshot of that name had it),
        or remove its tag with None."""
        resp = await self._request("PATCH", f"/sandbox/snapshots/{snapshot_id}", json={"tag": tag})
        return from_wire(Snapshot, self._data(resp))

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Sandboxes already made from it keep their files; lineage shows it as deleted."""
        await self._request("DELETE", f"/sandbox/snapshots/{snapshot_id}")

    async def snapshot_lineage(
        self, *, snapshot: str | None = None, name: str | None = None, tag: str | None = None,
        limit: int | None = None,
    ) -> list[SnapshotLineageEntry]:
        """The snapshot and its ancestors, newest first."""
        resp = await self._request("GET", "/sandbox/snapshots/lineage", params={
            "snapshot": snapshot, "name": name, "tag": tag, "limit": limit})
        return [from_wire(SnapshotLineageEntry, item) for item in _items(self._data(resp), "lineage")]

    async def download_snapshot(self, snapshot_id: str, dest: str | os.PathLike[str] | IO[bytes]) -> int:
        """The snapshot's workspace archive (tar.gz) into ``dest``; returns bytes written."""
        async def chunks() -> AsyncIterator[bytes]:
            async with self._raw("GET", f"/sandbox/snapshots/{snapshot_id}/download") as resp:
                async for chunk in resp.content.iter_chunked(1 << 20):
                    yield chunk

        return await _save_to(chunks(), dest)

    async def build_snapshot(
        self,
        runtime: str,
        archive: _transfer.Source | None,
        *,
        name: str | None = None,
        tag: str | None = None,
        description: str | None = None,
        message: str | None = None,
        content_hash: str | None = None,
        force: bool = False,
        public: bool = False,
        env: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        dependencies: Sequence[str] = (),
        packages: Sequence[str] = (),
        progress: Callable[[str], None] | None = None,
    ) -> tuple[Snapshot, bool]:
        """Build a snapshot from a workspace archive (tar.gz; None for env only): init, upload,
        finalize. Returns (the snapshot, whether it is new): with ``content_hash`` and no
        ``force``, a snapshot of that name with the same hash is returned instead."""
        body: dict[str, Any] = {"runtime": runtime, "name": name, "tag": tag, "description": description,
                                "message": message, "contentHash": content_hash, "force": force or None,
                                "public": public}
        resp = await self._request("POST", "/sandbox/snapshots/build",
                                   json={k: v for k, v in body.items() if v is not None})
        init = self._data(resp)
        say = progress or (lambda _m: None)
        if init.get("unchanged"):
            say(f"unchanged: {init.get('existingId')} has this content already")
            return await self.get_snapshot(str(init["existingId"])), False
        snapshot_id = str(init["snapshotId"])
        say(f"build {snapshot_id} started")
        if archive is not None:
            say("uploading the archive")
            async with self._raw("PUT", f"/sandbox/snapshots/{snapshot_id}/upload",
                                 data=_transfer.source_chunks(archive),
                                 headers={"Content-Type": "application/gzip"}) as upload:
                await upload.read()
        say("finalizing" + (" (installing dependencies and packages)" if dependencies or packages else ""))
        resp = await self._request("POST", f"/sandbox/snapshots/{snapshot_id}/finalize", max_seconds=1800, json={
            "sizeBytes": 0, "fileCount": 0, "files": [], "env": dict(env or {}), "metadata": dict(metadata or {}),
            "dependencies": list(dependencies), "packages": list(packages)})
        return from_wire(Snapshot, self._data(resp)), True

    async def stats(self, *, start: str | None = None, end: str | None = None) -> dict[str, Any]:
        """Usage of the sandboxes created in [start, end) (ISO 8601 times; open-ended when None)."""
        resp = await self._request("GET", "/sandbox/stats", params={"start": start, "end": end})
        data = self._data(resp)
        return dict(data) if isinstance(data, dict) else {}


def _local_path(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.expanduser(path))


async def _save_to(chunks: AsyncIterator[bytes], dest: str | os.PathLike[str] | IO[bytes]) -> int:
    """``chunks`` into a binary file or a local path; a partial local file is removed on failure."""
    if hasattr(dest, "write"):
        return await _drain_to(chunks, dest)  # type: ignore[arg-type]
    target = Path(dest)  # type: ignore[arg-type]
    fh = await asyncio.to_thread(open, target, "wb")
    try:
        with fh:
            return await _drain_to(chunks, fh)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(target)
        raise


async def _drain_to(chunks: AsyncIterator[bytes], fh: IO[bytes]) -> int:
    size = 0
    async for chunk in chunks:
        await asyncio.to_thread(fh.write, chunk)
        size += len(chunk)
    return size

def _items(data: Any, key: str) -> list[Any]:
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise ServerError(
            f"unexpected response shape: expected a list under {key!r}", code="BAD_RESPONSE"
        )
    return data[key]
