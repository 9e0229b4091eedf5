"""The async :class:`Sandbox` handle: one interactive sandbox bound to its client, as
``SandboxClient.create``/``connect`` return it. Its methods are the client's, with the
sandbox's id filled in (plus ``start``/``execute`` of commands and ``fork``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

from hutch import _transfer
from hutch._files import _READ_CHUNK
from hutch._output import OutputSink
from hutch._shapes import Duration, Files, _duration, _wire_files
from hutch._stdin import Stdin, StdinUpload
from hutch.errors import InvalidInput, SandboxError
from hutch.handles import ExecutionHandle, JobHandle
from hutch.models import (
    CopyResult,
    Execution,
    ExecutionInfo,
    Job,
    PauseResult,
    SandboxCreated,
    SandboxEvent,
    SandboxFileInfo,
    SandboxInfo,
    UploadResult,
    from_wire,
)
from hutch.terminal import Terminal, open_terminal

if TYPE_CHECKING:
    from hutch.client import SandboxClient


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
