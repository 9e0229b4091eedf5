"""The async :class:`Sandbox` handle: one interactive sandbox, as ``SandboxClient.create`` and
``connect`` return it. Its methods are the client's, with the sandbox's id filled in (plus
``start``/``execute`` of commands and ``fork``); it holds the client's services
(hutch/_services.py), not the client."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import IO, Any

from hutch import _transfer
from hutch._connection import Connected
from hutch._files import READ_CHUNK
from hutch._interpreter import CodeContext, CodeExecution, Interpreter, OutputHandler
from hutch._output import OutputSink
from hutch._services import Services
from hutch._shapes import Duration, Files
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
)
from hutch.terminal import Terminal, open_terminal


class Sandbox:
    """An interactive sandbox (what :meth:`SandboxClient.create` and
    :meth:`SandboxClient.connect` return). ``async with`` destroys it on exit."""

    def __init__(
        self,
        services: Services | Connected,
        sandbox_id: str,
        status: str,
        *,
        created: SandboxCreated | None = None,
        info: SandboxInfo | None = None,
    ) -> None:
        # Services, or a client as it was given before handles held services (they keep no state
        # but the connection: new ones over the client's are the same).
        self._services = services if isinstance(services, Services) else Services.over(services.connection)
        self.id = sandbox_id
        self.status = status
        self.created = created
        self.info = info
        source: Any = created or info
        self.stdout_stream_url: str | None = getattr(source, "stdout_stream_url", None)
        self.stderr_stream_url: str | None = getattr(source, "stderr_stream_url", None)
        self.audit_stream_url: str | None = getattr(source, "audit_stream_url", None)
        self.url: str | None = getattr(source, "url", None)
        self._interpreter: Interpreter | None = None

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
        upload = await StdinUpload.open(self._services.connection, stdin) if stdin is not None else None
        if upload is not None:
            stream = {**(stream or {}), "stdin": upload.stream_id}
        try:
            started = await self._services.executions.start(self.id, command, files=files, timeout=timeout,
                                                            stream=stream)
        except BaseException:
            if upload is not None:
                await upload.cancel()
            raise
        return ExecutionHandle(self._services.executions, self.id, started, upload)

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

    async def run_code(
        self,
        code: str,
        *,
        context: CodeContext | str | None = None,
        language: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        on_stdout: OutputHandler | None = None,
        on_stderr: OutputHandler | None = None,
    ) -> CodeExecution:
        """Run ``code`` in a kernel that keeps its state between calls (the default context of
        ``language``: ``"python"``, ``"javascript"``/``"js"``, ``"typescript"``; or
        ``context``): stdout/stderr as they arrive (``on_stdout``/``on_stderr``), rich results
        (``.results``: text, html, png bytes, ...) and the exception as ``.error`` (name,
        value, traceback). Needs the ``code-interpreter`` runtime and
        ``network={"port": 49999}``; starts the interpreter on first use."""
        return await self._code().run_code(code, context=context, language=language, env=env, timeout=timeout,
                                           on_stdout=on_stdout, on_stderr=on_stderr)

    async def create_code_context(self, *, language: str | None = None, cwd: str | None = None) -> CodeContext:
        """A new kernel with state of its own, for ``run_code(context=...)``: ``language``
        ``"python"`` (the default), ``"javascript"`` or ``"typescript"``."""
        return await self._code().create_context(language=language, cwd=cwd)

    def _code(self) -> Interpreter:
        if self._interpreter is None:
            self._interpreter = Interpreter(self, self._services.connection)
        return self._interpreter

    async def get(self) -> SandboxInfo:
        info = await self._services.sandboxes.get(self.id)
        self.status = info.status
        self.info = info
        return info

    async def destroy(self) -> None:
        await self._services.sandboxes.destroy(self.id)
        self.status = "terminated"

    async def pause(self, *, memory: bool = True) -> PauseResult:
        """Frozen, memory kept; ``memory=False``: filesystem only, the resume a new boot."""
        result = await self._services.sandboxes.pause(self.id, memory=memory)
        self.status = result.status
        return result

    async def resume(self) -> None:
        await self._services.sandboxes.resume(self.id)

    async def update_network(self, *, enabled: bool, allow: Sequence[str] | None = None,
                             deny: Sequence[str] | None = None) -> SandboxInfo:
        """Replace this sandbox's egress rules whole (:meth:`SandboxClient.update_network`)."""
        info = await self._services.sandboxes.update_network(self.id, enabled=enabled, allow=allow, deny=deny)
        self.info = info
        return info

    async def write_files(self, files: Files) -> int:
        return await self._services.files.write_files(self.id, files)

    def read_file(self, path: str, *, chunk_size: int = READ_CHUNK) -> AsyncIterator[bytes]:
        """The file's bytes as they arrive (``async for chunk in sandbox.read_file(p)``)."""
        return self._services.files.read_file(self.id, path, chunk_size=chunk_size)

    async def read_bytes(self, path: str) -> bytes:
        return await self._services.files.read_bytes(self.id, path)

    async def list_files(self, path: str | None = None) -> list[SandboxFileInfo]:
        return await self._services.files.list_files(self.id, path)

    async def mkdir(self, path: str, *, recursive: bool = False) -> None:
        await self._services.files.mkdir(self.id, path, recursive=recursive)

    async def rm_file(self, path: str) -> bool:
        return await self._services.files.rm_file(self.id, path)

    async def rm_dir(self, path: str, *, recursive: bool = False) -> bool:
        return await self._services.files.rm_dir(self.id, path, recursive=recursive)

    async def fork(self, count: int = 1) -> list[Sandbox]:
        """``count`` new sandboxes with this one's files and env as they are now (processes
        are not carried); the snapshot of that instant is in each copy's ``info.snapshot``."""
        made = await self._services.sandboxes.fork(self.id, count)
        return [Sandbox(self._services, sandbox_id, status) for sandbox_id, status in made]

    async def terminal(self, command: Sequence[str] | None = None, **kw: Any) -> Terminal:
        """A shell (or ``command``) on a new terminal: see :meth:`SandboxClient.terminal`."""
        return await open_terminal(self._services.connection, self.id, command, **kw)

    async def set_env(self, env: Mapping[str, str | None]) -> dict[str, str]:
        return await self._services.files.set_env(self.id, env)

    def iter_archive(self, *, path: str | None = None, format: str = "tar.gz") -> AsyncIterator[bytes]:
        return self._services.files.iter_archive(self.id, path=path, format=format)

    async def download_archive(
        self,
        dest: str | os.PathLike[str] | IO[bytes],
        *,
        path: str | None = None,
        format: str = "tar.gz",
    ) -> int:
        return await self._services.files.download_archive(self.id, dest, path=path, format=format)

    async def upload_archive(
        self, source: _transfer.Source, *, path: str | None = None, format: str | None = None
    ) -> UploadResult:
        return await self._services.files.upload_archive(self.id, source, path=path, format=format)

    async def copy_to(
        self, local: str | os.PathLike[str], dest: str, *, recursive: bool = False, strict: bool = False
    ) -> CopyResult:
        return await self._services.copies.copy_to(self.id, local, dest, recursive=recursive, strict=strict)

    async def copy_from(
        self, source: str, local: str | os.PathLike[str], *, recursive: bool = False, strict: bool = False
    ) -> CopyResult:
        return await self._services.copies.copy_from(self.id, source, local, recursive=recursive, strict=strict)

    async def create_job(
        self, command: Sequence[str], *, streams: Mapping[str, Any] | None = None
    ) -> JobHandle:
        job = await self._services.executions.create_job(self.id, command, streams=streams)
        return JobHandle(self._services.executions, job)

    async def get_job(self, job_id: str) -> Job:
        return await self._services.executions.get_job(self.id, job_id)

    async def list_jobs(self, *, limit: int | None = None) -> list[Job]:
        return await self._services.executions.list_jobs(self.id, limit=limit)

    async def stop_job(self, job_id: str, *, force: bool = False) -> Job:
        return await self._services.executions.stop_job(self.id, job_id, force=force)

    async def list_executions(self, *, limit: int | None = None) -> list[ExecutionInfo]:
        return await self._services.executions.list_executions(self.id, limit=limit)

    async def list_events(
        self, *, limit: int | None = None, direction: str | None = None
    ) -> list[SandboxEvent]:
        return await self._services.executions.list_events(self.id, limit=limit, direction=direction)

