"""The blocking facade: :class:`SyncSandboxClient` (also exported as ``hutch.SyncSandboxClient``).

Each client owns a private event loop on a daemon thread and runs the async client there,
so it works from plain scripts, from threads, and from code that already has a running
loop (a notebook). Output callbacks given to ``run``/``execute`` are called on that thread.
Ctrl-C during a call cancels it; a cancelled ``run`` destroys its sandbox first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from typing import IO, Any, TypeVar

import aiohttp

from hutch import _transfer
from hutch.client import (
    Duration,
    ExecutionHandle,
    Files,
    JobHandle,
    OutputSink,
    Sandbox,
    SandboxClient,
)
from hutch.models import (
    Checkpoint,
    CopyResult,
    Execution,
    ExecutionInfo,
    Job,
    OutputChunk,
    PauseResult,
    RunResult,
    RuntimeList,
    SandboxEvent,
    SandboxFileInfo,
    SandboxInfo,
    SandboxList,
    SandboxStatusInfo,
    Snapshot,
    SnapshotLineageEntry,
    UploadResult,
)

__all__ = ["SyncExecutionHandle", "SyncJobHandle", "SyncSandbox", "SyncSandboxClient"]

T = TypeVar("T")


class _Portal:
    """An event loop on its own thread; ``call`` runs a coroutine there and blocks for the result."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="hutch-sync", daemon=True
        )
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        if not self._thread.is_alive():
            coro.close()
            raise RuntimeError("SyncSandboxClient is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            self._settle(timeout=10.0)
            raise

    def _settle(self, timeout: float) -> None:
        """Let cancelled work finish its cleanup (e.g. destroying a one-shot sandbox)."""

        async def wait_others() -> None:
            others = asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]
            if others:
                await asyncio.wait(others, timeout=timeout)

        with contextlib.suppress(Exception):  # cleanup is best effort
            asyncio.run_coroutine_threadsafe(wait_others(), self._loop).result(timeout + 1)

    def close(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        if not self._loop.is_closed():
            self._loop.close()


class Blocking:
    """Every coroutine method of ``target``, called and waited for on the portal's loop."""

    def __init__(self, portal: _Portal, target: object) -> None:
        self._portal = portal
        self._target = target

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)
        if name.startswith("_") or not asyncio.iscoroutinefunction(method):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._portal.call(method(*args, **kwargs))

        call.__doc__ = method.__doc__
        return call


class SyncExecutionHandle:
    def __init__(self, portal: _Portal, handle: ExecutionHandle) -> None:
        self._portal = portal
        self._handle = handle

    @property
    def execution_id(self) -> str:
        return self._handle.execution_id

    @property
    def started(self) -> Execution:
        return self._handle.started

    def output(self) -> Iterator[OutputChunk]:
        """Yield stdout/stderr chunks as they arrive until both streams end."""
        agen = self._handle.output()
        try:
            while True:
                try:
                    yield self._portal.call(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._portal.call(agen.aclose())

    def wait(self) -> Execution:
        return self._portal.call(self._handle.wait())

    def cancel(self) -> Execution:
        return self._portal.call(self._handle.cancel())


def _iterate(portal: _Portal, agen: AsyncIterator[T]) -> Iterator[T]:
    """Drive an async iterator on the portal's loop, one item per blocking call."""
    try:
        while True:
            try:
                yield portal.call(agen.__anext__())  # type: ignore[arg-type]
            except StopAsyncIteration:
                return
    finally:
        aclose = getattr(agen, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(RuntimeError):
                portal.call(aclose())


class SyncJobHandle:
    """Blocking twin of :class:`hutch.client.JobHandle`."""

    def __init__(self, portal: _Portal, handle: JobHandle) -> None:
        self._portal = portal
        self.aio = handle

    def __repr__(self) -> str:
        return f"SyncJobHandle(id={self.id!r}, status={self.status!r})"

    @property
    def id(self) -> str:
        return self.aio.id

    @property
    def job(self) -> Job:
        return self.aio.job

    @property
    def status(self) -> str:
        return self.aio.status

    def get(self) -> Job:
        return self._portal.call(self.aio.get())

    def stop(self, *, force: bool = False) -> Job:
        return self._portal.call(self.aio.stop(force=force))

    def output(self) -> Iterator[OutputChunk]:
        return _iterate(self._portal, self.aio.output())

    def wait(self, *, poll: float = 0.05, max_poll: float = 1.0) -> Job:
        return self._portal.call(self.aio.wait(poll=poll, max_poll=max_poll))


class SyncSandbox:
    """Blocking twin of :class:`hutch.Sandbox`; ``with`` destroys it on exit."""

    def __init__(self, portal: _Portal, sandbox: Sandbox) -> None:
        self._portal = portal
        self.aio = sandbox  # the underlying async Sandbox

    @property
    def id(self) -> str:
        return self.aio.id

    @property
    def status(self) -> str:
        return self.aio.status

    @property
    def url(self) -> str | None:
        return self.aio.url

    def __repr__(self) -> str:
        return f"SyncSandbox(id={self.id!r}, status={self.status!r})"

    def __enter__(self) -> SyncSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self._portal.call(self.aio.__aexit__(*exc))

    def execute(
        self,
        command: Sequence[str],
        *,
        files: Files | None = None,
        timeout: Duration | None = None,
        stdout: OutputSink | None = None,
        stderr: OutputSink | None = None,
        capture: bool = True,
        stream: Mapping[str, Any] | None = None,
    ) -> Execution:
        return self._portal.call(
            self.aio.execute(
                command,
                files=files,
                timeout=timeout,
                stdout=stdout,
                stderr=stderr,
                capture=capture,
                stream=stream,
            )
        )

    def start(
        self, command: Sequence[str], *, files: Files | None = None, timeout: Duration | None = None
    ) -> SyncExecutionHandle:
        return SyncExecutionHandle(
            self._portal, self._portal.call(self.aio.start(command, files=files, timeout=timeout))
        )

    def get(self) -> SandboxInfo:
        return self._portal.call(self.aio.get())

    def destroy(self) -> None:
        self._portal.call(self.aio.destroy())

    def pause(self) -> PauseResult:
        return self._portal.call(self.aio.pause())

    def resume(self) -> None:
        self._portal.call(self.aio.resume())

    def write_files(self, files: Files) -> int:
        return self._portal.call(self.aio.write_files(files))

    def read_file(self, path: str) -> Iterator[bytes]:
        """The file's bytes, chunk by chunk, as they arrive."""
        return _iterate(self._portal, self.aio.read_file(path))

    def read_bytes(self, path: str) -> bytes:
        return self._portal.call(self.aio.read_bytes(path))

    def list_files(self, path: str | None = None) -> list[SandboxFileInfo]:
        return self._portal.call(self.aio.list_files(path))

    def mkdir(self, path: str, *, recursive: bool = False) -> None:
        self._portal.call(self.aio.mkdir(path, recursive=recursive))

    def rm_file(self, path: str) -> bool:
        return self._portal.call(self.aio.rm_file(path))

    def rm_dir(self, path: str, *, recursive: bool = False) -> bool:
        return self._portal.call(self.aio.rm_dir(path, recursive=recursive))

    def set_env(self, env: Mapping[str, str | None]) -> dict[str, str]:
        return self._portal.call(self.aio.set_env(env))

    def iter_archive(self, *, path: str | None = None, format: str = "tar.gz") -> Iterator[bytes]:
        return _iterate(self._portal, self.aio.iter_archive(path=path, format=format))

    def download_archive(
        self, dest: str | os.PathLike[str] | IO[bytes], *, path: str | None = None, format: str = "tar.gz"
    ) -> int:
        return self._portal.call(self.aio.download_archive(dest, path=path, format=format))

    def upload_archive(
        self, source: _transfer.Source, *, path: str | None = None, format: str | None = None
    ) -> UploadResult:
        return self._portal.call(self.aio.upload_archive(source, path=path, format=format))

    def copy_to(
        self, local: str | os.PathLike[str], dest: str, *, recursive: bool = False, strict: bool = False
    ) -> CopyResult:
        return self._portal.call(self.aio.copy_to(local, dest, recursive=recursive, strict=strict))

    def copy_from(
        self, source: str, local: str | os.PathLike[str], *, recursive: bool = False, strict: bool = False
    ) -> CopyResult:
        return self._portal.call(self.aio.copy_from(source, local, recursive=recursive, strict=strict))

    def create_job(
        self, command: Sequence[str], *, streams: Mapping[str, Any] | None = None
    ) -> SyncJobHandle:
        return SyncJobHandle(self._portal, self._portal.call(self.aio.create_job(command, streams=streams)))

    def get_job(self, job_id: str) -> Job:
        return self._portal.call(self.aio.get_job(job_id))

    def list_jobs(self, *, limit: int | None = None) -> list[Job]:
        return self._portal.call(self.aio.list_jobs(limit=limit))

    def stop_job(self, job_id: str, *, force: bool = False) -> Job:
        return self._portal.call(self.aio.stop_job(job_id, force=force))

    def list_executions(self, *, limit: int | None = None) -> list[ExecutionInfo]:
        return self._portal.call(self.aio.list_executions(limit=limit))

    def list_events(
        self, *, limit: int | None = None, direction: str | None = None
    ) -> list[SandboxEvent]:
        return self._portal.call(self.aio.list_events(limit=limit, direction=direction))


class SyncSandboxClient:
    """Blocking twin of :class:`hutch.SandboxClient`, same arguments and results.

    ``connector`` may be a zero-argument callable returning an aiohttp connector (it is
    called on the client's own loop, where aiohttp needs it to be created).
    Use as ``with SyncSandboxClient() as client: ...`` or call :meth:`close`.
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        connector: Callable[[], aiohttp.BaseConnector] | None = None,
        request_timeout: float = 60.0,
        org_id: str | None = None,
    ) -> None:
        self._portal = _Portal()

        async def make() -> SandboxClient:
            return SandboxClient(
                url,
                api_key,
                connector=connector() if connector else None,
                request_timeout=request_timeout,
                org_id=org_id,
            )

        self.aio = self._portal.call(make())  # the underlying async client
        #: ``client.tenancy``'s methods, blocking (derived, not written twice).
        self.tenancy = Blocking(self._portal, self.aio.tenancy)

    @property
    def url(self) -> str:
        return self.aio.url

    def __repr__(self) -> str:
        return f"SyncSandboxClient(url={self.url!r})"

    def __enter__(self) -> SyncSandboxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._portal.call(self.aio.close())
        self._portal.close()

    def run(self, command: Sequence[str], **options: Any) -> RunResult:
        """See :meth:`hutch.SandboxClient.run`; the same keyword options."""
        return self._portal.call(self.aio.run(command, **options))

    def create(self, **options: Any) -> SyncSandbox:
        """See :meth:`hutch.SandboxClient.create`; the same keyword options."""
        return SyncSandbox(self._portal, self._portal.call(self.aio.create(**options)))

    def connect(self, sandbox_id: str) -> SyncSandbox:
        return SyncSandbox(self._portal, self._portal.call(self.aio.connect(sandbox_id)))

    def terminal(self, sandbox_id: str, command: Sequence[str] | None = None, **options: Any) -> Any:
        """See :meth:`hutch.SandboxClient.terminal`: the same terminal, its methods blocking."""
        return Blocking(self._portal, self._portal.call(self.aio.terminal(sandbox_id, command, **options)))

    def get(self, sandbox_id: str, **options: Any) -> SandboxInfo:
        return self._portal.call(self.aio.get(sandbox_id, **options))

    def get_status(self, sandbox_id: str, **options: Any) -> SandboxStatusInfo:
        return self._portal.call(self.aio.get_status(sandbox_id, **options))

    def list(self, **filters: Any) -> SandboxList:
        return self._portal.call(self.aio.list(**filters))

    def iter_sandboxes(self, *, page_size: int = 100, **filters: Any) -> Iterator[SandboxInfo]:
        offset = 0
        while True:
            page = self.list(limit=page_size, offset=offset, **filters)
            yield from page.sandboxes
            offset += len(page.sandboxes)
            if not page.sandboxes or offset >= page.total:
                return

    def destroy(self, sandbox_id: str) -> None:
        self._portal.call(self.aio.destroy(sandbox_id))

    def pause(self, sandbox_id: str) -> PauseResult:
        return self._portal.call(self.aio.pause(sandbox_id))

    def resume(self, sandbox_id: str) -> None:
        self._portal.call(self.aio.resume(sandbox_id))

    def get_execution(self, execution_id: str, *, wait: Duration | None = None) -> ExecutionInfo:
        return self._portal.call(self.aio.get_execution(execution_id, wait=wait))

    def wait_execution(self, execution_id: str) -> ExecutionInfo:
        return self._portal.call(self.aio.wait_execution(execution_id))

    def cancel_execution(self, execution_id: str) -> ExecutionInfo:
        return self._portal.call(self.aio.cancel_execution(execution_id))

    def list_executions(self, sandbox_id: str, *, limit: int | None = None) -> list[ExecutionInfo]:
        return self._portal.call(self.aio.list_executions(sandbox_id, limit=limit))

    def list_events(
        self, sandbox_id: str, *, limit: int | None = None, direction: str | None = None
    ) -> list[SandboxEvent]:
        return self._portal.call(self.aio.list_events(sandbox_id, limit=limit, direction=direction))

    def list_runtimes(self, **options: Any) -> RuntimeList:
        return self._portal.call(self.aio.list_runtimes(**options))

    def write_files(self, sandbox_id: str, files: Files) -> int:
        return self._portal.call(self.aio.write_files(sandbox_id, files))

    def read_file(self, sandbox_id: str, path: str) -> Iterator[bytes]:
        """The file's bytes, chunk by chunk, as they arrive."""
        return _iterate(self._portal, self.aio.read_file(sandbox_id, path))

    def read_bytes(self, sandbox_id: str, path: str) -> bytes:
        return self._portal.call(self.aio.read_bytes(sandbox_id, path))

    def list_files(self, sandbox_id: str, path: str | None = None) -> list[SandboxFileInfo]:
        return self._portal.call(self.aio.list_files(sandbox_id, path))

    def mkdir(self, sandbox_id: str, path: str, *, recursive: bool = False) -> None:
        self._portal.call(self.aio.mkdir(sandbox_id, path, recursive=recursive))

    def rm_file(self, sandbox_id: str, path: str) -> bool:
        return self._portal.call(self.aio.rm_file(sandbox_id, path))

    def rm_dir(self, sandbox_id: str, path: str, *, recursive: bool = False) -> bool:
        return self._portal.call(self.aio.rm_dir(sandbox_id, path, recursive=recursive))

    def set_env(self, sandbox_id: str, env: Mapping[str, str | None]) -> dict[str, str]:
        return self._portal.call(self.aio.set_env(sandbox_id, env))

    def create_checkpoint(self, sandbox_id: str, name: str) -> Checkpoint:
        return self._portal.call(self.aio.create_checkpoint(sandbox_id, name))

    def list_checkpoints(self, sandbox_id: str) -> list[Checkpoint]:
        return self._portal.call(self.aio.list_checkpoints(sandbox_id))

    def restore_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        self._portal.call(self.aio.restore_checkpoint(sandbox_id, checkpoint_id))

    def delete_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        self._portal.call(self.aio.delete_checkpoint(sandbox_id, checkpoint_id))

    def stats(self, *, start: str | None = None, end: str | None = None) -> dict[str, Any]:
        return self._portal.call(self.aio.stats(start=start, end=end))

    def create_snapshot(self, sandbox_id: str, *, name: str | None = None, tag: str | None = None,
                        description: str | None = None, public: bool | None = None) -> Snapshot:
        return self._portal.call(self.aio.create_snapshot(
            sandbox_id, name=name, tag=tag, description=description, public=public))

    def get_snapshot(self, snapshot: str) -> Snapshot:
        return self._portal.call(self.aio.get_snapshot(snapshot))

    def list_snapshots(self, *, sandbox_id: str | None = None, limit: int | None = None, offset: int | None = None,
                       sort: str | None = None, direction: str | None = None) -> tuple[list[Snapshot], int]:
        return self._portal.call(self.aio.list_snapshots(
            sandbox_id=sandbox_id, limit=limit, offset=offset, sort=sort, direction=direction))

    def tag_snapshot(self, snapshot_id: str, tag: str | None) -> Snapshot:
        return self._portal.call(self.aio.tag_snapshot(snapshot_id, tag))

    def delete_snapshot(self, snapshot_id: str) -> None:
        self._portal.call(self.aio.delete_snapshot(snapshot_id))

    def snapshot_lineage(self, *, snapshot: str | None = None, name: str | None = None, tag: str | None = None,
                         limit: int | None = None) -> list[SnapshotLineageEntry]:
        return self._portal.call(self.aio.snapshot_lineage(snapshot=snapshot, name=name, tag=tag, limit=limit))

    def download_snapshot(self, snapshot_id: str, dest: str | os.PathLike[str] | IO[bytes]) -> int:
        return self._portal.call(self.aio.download_snapshot(snapshot_id, dest))

    def build_snapshot(self, runtime: str, archive: _transfer.Source | None, **kw: Any) -> tuple[Snapshot, bool]:
        return self._portal.call(self.aio.build_snapshot(runtime, archive, **kw))

    def iter_archive(
        self, sandbox_id: str, *, path: str | None = None, format: str = "tar.gz"
    ) -> Iterator[bytes]:
        return _iterate(self._portal, self.aio.iter_archive(sandbox_id, path=path, format=format))

    def download_archive(
        self,
        sandbox_id: str,
        dest: str | os.PathLike[str] | IO[bytes],
        *,
        path: str | None = None,
        format: str = "tar.gz",
    ) -> int:
        return self._portal.call(self.aio.download_archive(sandbox_id, dest, path=path, format=format))

    def upload_archive(
        self,
        sandbox_id: str,
        source: _transfer.Source,
        *,
        path: str | None = None,
        format: str | None = None,
    ) -> UploadResult:
        return self._portal.call(self.aio.upload_archive(sandbox_id, source, path=path, format=format))

    def copy_to(self, sandbox_id: str, local: str | os.PathLike[str], dest: str, **options: Any) -> CopyResult:
        return self._portal.call(self.aio.copy_to(sandbox_id, local, dest, **options))

    def copy_from(self, sandbox_id: str, source: str, local: str | os.PathLike[str], **options: Any) -> CopyResult:
        return self._portal.call(self.aio.copy_from(sandbox_id, source, local, **options))

    def create_job(
        self, sandbox_id: str, command: Sequence[str], *, streams: Mapping[str, Any] | None = None
    ) -> SyncJobHandle:
        return SyncJobHandle(
            self._portal, self._portal.call(self.aio.create_job(sandbox_id, command, streams=streams))
        )

    def get_job(self, sandbox_id: str, job_id: str) -> Job:
        return self._portal.call(self.aio.get_job(sandbox_id, job_id))

    def list_jobs(self, sandbox_id: str, *, limit: int | None = None) -> list[Job]:
        return self._portal.call(self.aio.list_jobs(sandbox_id, limit=limit))

    def stop_job(self, sandbox_id: str, job_id: str, *, force: bool = False) -> Job:
        return self._portal.call(self.aio.stop_job(sandbox_id, job_id, force=force))
