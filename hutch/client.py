"""The async client: :class:`SandboxClient` and :class:`Sandbox` (handles of started
executions and jobs: hutch/handles.py; terminals: hutch/terminal.py).

It speaks the Agentuity-compatible wire (``docs/wire.md``) and mirrors the TypeScript
``SandboxClient`` in Python style: keyword arguments, snake_case results, exceptions
instead of ``{success: false}``, and cancellation through asyncio (cancel the task or wrap
the call in ``asyncio.timeout``) instead of an AbortSignal.

``SandboxClient`` is one :class:`~hutch._connection.Connection` and small services over it,
each importing only what is below it; its public methods delegate to them:

- ``hutch/_connection.py``: session, URL, key, JSON and streamed requests, error mapping, and
  the engine in this process when no server is named
- ``hutch/_sandboxes.py``: run, create, get, list, pause, resume, fork, destroy, runtimes
- ``hutch/_executions.py``: executions, events and jobs
- ``hutch/_files.py``: files, env and archives; ``hutch/_copies.py``: copy_to/copy_from
- ``hutch/_snapshots.py``: checkpoints, snapshots and stats
- ``hutch/tenancy.py``: organizations, projects, keys (``client.tenancy``)
- ``hutch/_services.py``: the services together, as the :class:`Sandbox` handles
  (``hutch/_sandbox.py``) hold them; ``hutch/_options.py``: create's options
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import IO, Any, Generic, TypeVar, Unpack, overload

import aiohttp

from hutch import _transfer
from hutch._connection import LONG_POLL, Connection, EngineOptions
from hutch._files import ARCHIVE_FORMATS, READ_CHUNK
from hutch._options import SandboxOptions, with_sandbox_options
from hutch._output import OutputSink
from hutch._sandbox import Sandbox
from hutch._services import Services
from hutch._shapes import Duration, Files
from hutch._stdin import Stdin
from hutch.handles import ExecutionHandle, JobHandle
from hutch.models import (
    Checkpoint,
    CopyResult,
    ExecutionInfo,
    Job,
    PauseResult,
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
    UploadResult,
)
from hutch.tenancy import Tenancy
from hutch.terminal import Terminal, open_terminal

__all__ = [
    "ARCHIVE_FORMATS",
    "LONG_POLL",
    "Duration",
    "ExecutionHandle",
    "Files",
    "JobHandle",
    "OutputSink",
    "Sandbox",
    "SandboxClient",
    "SandboxOptions",
    "local_client",
]

T = TypeVar("T")


class _OnConnection(Generic[T]):
    """An attribute of the client kept on its connection, where every service reads it (the
    URL, the key, the organization, the time limits): setting it on the client sets it there."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, client: None, owner: type) -> _OnConnection[T]: ...
    @overload
    def __get__(self, client: SandboxClient, owner: type) -> T: ...

    def __get__(self, client: SandboxClient | None, owner: type) -> T | _OnConnection[T]:
        return self if client is None else getattr(client.connection, self._name)

    def __set__(self, client: SandboxClient, value: T) -> None:
        setattr(client.connection, self._name, value)


class SandboxClient:
    """Async client for a hutch server (or any Agentuity-compatible sandbox API).

    ``url`` defaults to ``$HUTCH_URL``, else ``http://127.0.0.1:8700``. ``api_key`` defaults to
    ``$HUTCH_API_KEY``, else the key file of a local server (``$HUTCH_DATA_DIR/api-key`` or
    ``~/.local/share/hutch/api-key``). Pass ``connector`` (e.g. ``aiohttp.UnixConnector``) to
    reach an in-process server; the client closes it on :meth:`close`.

    Use as ``async with SandboxClient() as client: ...`` or call :meth:`close`.
    """

    url: _OnConnection[str] = _OnConnection()
    api_key: _OnConnection[str | None] = _OnConnection()
    #: The organization calls act in (``orgId`` on every request), for a key that may act for
    #: several (the server's administrator); None: the key's own.
    org_id: _OnConnection[str | None] = _OnConnection()
    #: Whether this client runs the engine in its own process (no server), started at its
    #: first call and stopped by :meth:`close`.
    embedded: _OnConnection[bool] = _OnConnection()
    request_timeout: _OnConnection[float] = _OnConnection()
    long_poll: _OnConnection[Duration] = _OnConnection()
    #: After an execution ends, how long a silent output stream may stay open before we stop reading.
    drain_timeout: _OnConnection[float] = _OnConnection()

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
        self._attach(Connection(url, api_key, connector=connector, request_timeout=request_timeout,
                                long_poll=long_poll, drain_timeout=drain_timeout, org_id=org_id))

    @classmethod
    def _over(cls, connection: Connection) -> SandboxClient:
        """A client over a connection made otherwise (:func:`local_client`'s)."""
        client = cls.__new__(cls)
        client._attach(connection)
        return client

    def _attach(self, connection: Connection) -> None:
        services = Services.over(connection)
        self._services = services
        self._sandboxes, self._executions = services.sandboxes, services.executions
        self._files, self._copies, self._snapshots = services.files, services.copies, services.snapshots
        #: Organizations, projects, API keys and quotas (:class:`hutch.tenancy.Tenancy`).
        self.tenancy = Tenancy(connection)

    @property
    def connection(self) -> Connection:
        """The one connection under this client and its services (session, URL, key, raw
        requests): the SDK's internal API, for calls the client has no method for."""
        return self._services.connection

    def __repr__(self) -> str:
        return f"SandboxClient(url={self.url!r})"

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.connection.close()

    # ------------------------------------------------------------ sandboxes

    @with_sandbox_options
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
        """Run one command in a fresh one-shot sandbox and return its exit code and output.

        The server destroys the sandbox when the command exits. Output is captured and, if
        ``stdout``/``stderr`` sinks are given, forwarded as it streams. If the call fails or
        is cancelled, the sandbox is destroyed before the error propagates. ``on_created`` hears
        the create's answer (e.g. ``status == "creating"``: its runtime is being built first).
        """
        return await self._sandboxes.run(command, stream=stream, stdout=stdout, stderr=stderr,
                                         on_created=on_created, stdin=stdin, **options)

    @with_sandbox_options
    async def create(self, **options: Unpack[SandboxOptions]) -> Sandbox:
        """Create an interactive sandbox. ``timeout`` may be ``Timeouts(idle=, execution=, paused=)``;
        a bare duration sets the per-execution timeout. The server makes ``execute`` wait while
        the sandbox is still ``creating``."""
        created = await self._sandboxes.create(**options)
        return Sandbox(self._services, created.sandbox_id, created.status, created=created)

    async def connect(self, sandbox_id: str) -> Sandbox:
        """A :class:`Sandbox` for an existing id (fails with ``SandboxNotFound`` if there is none)."""
        info = await self._sandboxes.get(sandbox_id)
        return Sandbox(self._services, info.sandbox_id, info.status, info=info)

    async def get(
        self,
        sandbox_id: str,
        *,
        include_deleted: bool = False,
        wait_for_status: str | Sequence[str] | None = None,
        wait_ms: int | None = None,
    ) -> SandboxInfo:
        return await self._sandboxes.get(sandbox_id, include_deleted=include_deleted,
                                         wait_for_status=wait_for_status, wait_ms=wait_ms)

    async def get_status(
        self,
        sandbox_id: str,
        *,
        wait_for_status: str | Sequence[str] | None = None,
        wait_ms: int | None = None,
    ) -> SandboxStatusInfo:
        """Lightweight status (status and exit code); optionally held server-side until one of
        ``wait_for_status`` is reached or ``wait_ms`` passes."""
        return await self._sandboxes.get_status(sandbox_id, wait_for_status=wait_for_status,
                                                wait_ms=wait_ms)

    def iter_sandboxes(
        self, *, page_size: int = 100, **filters: Any
    ) -> AsyncIterator[SandboxInfo]:
        """Every sandbox matching ``filters`` (as for :meth:`list`), fetching page by page."""
        return self._sandboxes.iter_sandboxes(page_size=page_size, **filters)

    async def destroy(self, sandbox_id: str) -> None:
        await self._sandboxes.destroy(sandbox_id)

    async def pause(self, sandbox_id: str, *, memory: bool = True) -> PauseResult:
        """Pause: frozen, memory kept; ``memory=False``: filesystem only (every process ended,
        the files kept; the resume boots it again, with a new boot id)."""
        return await self._sandboxes.pause(sandbox_id, memory=memory)

    async def resume(self, sandbox_id: str) -> None:
        await self._sandboxes.resume(sandbox_id)

    async def update_network(self, sandbox_id: str, *, enabled: bool, allow: Sequence[str] | None = None,
                             deny: Sequence[str] | None = None) -> SandboxInfo:
        """Replace a running sandbox's egress rules whole: ``enabled``, and an ``allow``-list
        (only these) or a ``deny``-list (all but these IPv4 addresses/CIDRs). A sandbox made
        without network gets none; its port stays. Returns the sandbox as it is then."""
        return await self._sandboxes.update_network(sandbox_id, enabled=enabled, allow=allow, deny=deny)

    async def list_runtimes(
        self,
        *,
        limit: int | None = None,
        offset: int | None = None,
        sort: str | None = None,
        direction: str | None = None,
    ) -> RuntimeList:
        return await self._sandboxes.list_runtimes(limit=limit, offset=offset, sort=sort,
                                                   direction=direction)

    async def terminal(self, sandbox_id: str, command: Sequence[str] | None = None, *, rows: int = 24,
                       cols: int = 80, cwd: str | None = None, term: str | None = None) -> Terminal:
        """Start ``command`` (default: the sandbox user's login shell) on a new pseudo-terminal:
        a :class:`hutch.terminal.Terminal` to write, read, resize and wait on."""
        return await open_terminal(self.connection, sandbox_id, command, rows=rows, cols=cols, cwd=cwd, term=term)

    async def server_info(self) -> dict[str, Any]:
        """What the server says of itself (``GET /healthz``): ``status``, and ``ssh.port`` when
        it runs an SSH gateway."""
        return await self._sandboxes.server_info()

    # ------------------------------------------------------------ executions

    async def get_execution(
        self, execution_id: str, *, wait: Duration | None = None
    ) -> ExecutionInfo:
        """An execution's state; with ``wait`` the server holds the request until the execution is
        terminal or the wait passes (at most 5m), then answers with the current state."""
        return await self._executions.get_execution(execution_id, wait=wait)

    async def cancel_execution(self, execution_id: str) -> ExecutionInfo:
        """End a running command's whole process tree; answers it ended (``cancelled``), or as it
        ended if it already had."""
        return await self._executions.cancel_execution(execution_id)

    async def wait_execution(self, execution_id: str) -> ExecutionInfo:
        """Long-poll :meth:`get_execution` until the execution reaches a terminal status."""
        return await self._executions.wait_execution(execution_id)

    async def list_executions(
        self, sandbox_id: str, *, limit: int | None = None
    ) -> list[ExecutionInfo]:
        return await self._executions.list_executions(sandbox_id, limit=limit)

    async def list_events(
        self, sandbox_id: str, *, limit: int | None = None, direction: str | None = None
    ) -> list[SandboxEvent]:
        """Lifecycle events, oldest first by default (``direction="desc"`` for newest first)."""
        return await self._executions.list_events(sandbox_id, limit=limit, direction=direction)

    async def create_job(
        self,
        sandbox_id: str,
        command: Sequence[str],
        *,
        streams: Mapping[str, Any] | None = None,
    ) -> JobHandle:
        """Start a background job; it runs beside executions and outlives this call."""
        return JobHandle(self._executions, await self._executions.create_job(sandbox_id, command, streams=streams))

    async def get_job(self, sandbox_id: str, job_id: str) -> Job:
        return await self._executions.get_job(sandbox_id, job_id)

    async def list_jobs(self, sandbox_id: str, *, limit: int | None = None) -> list[Job]:
        return await self._executions.list_jobs(sandbox_id, limit=limit)

    async def stop_job(self, sandbox_id: str, job_id: str, *, force: bool = False) -> Job:
        """Stop a job: SIGTERM then SIGKILL after a grace period, or SIGKILL now with ``force``.
        Stopping a finished job returns it unchanged."""
        return await self._executions.stop_job(sandbox_id, job_id, force=force)

    # ------------------------------------------------------------ files

    async def write_files(self, sandbox_id: str, files: Files) -> int:
        """Write small files (sent base64 in one JSON body; parent directories are created).
        For large files use :meth:`copy_to` or :meth:`upload_archive`, which stream."""
        return await self._files.write_files(sandbox_id, files)

    def read_file(
        self, sandbox_id: str, path: str, *, chunk_size: int = READ_CHUNK
    ) -> AsyncIterator[bytes]:
        """A file's bytes as they arrive: ``async for chunk in client.read_file(sid, path)``.
        Errors (missing file: ``FileNotFound``) are raised on the first iteration."""
        return self._files.read_file(sandbox_id, path, chunk_size=chunk_size)

    async def read_bytes(self, sandbox_id: str, path: str) -> bytes:
        """A whole (small) file in memory."""
        return await self._files.read_bytes(sandbox_id, path)

    async def list_files(self, sandbox_id: str, path: str | None = None) -> list[SandboxFileInfo]:
        return await self._files.list_files(sandbox_id, path)

    async def mkdir(self, sandbox_id: str, path: str, *, recursive: bool = False) -> None:
        await self._files.mkdir(sandbox_id, path, recursive=recursive)

    async def rm_file(self, sandbox_id: str, path: str) -> bool:
        """Remove a file; returns whether it existed."""
        return await self._files.rm_file(sandbox_id, path)

    async def rm_dir(self, sandbox_id: str, path: str, *, recursive: bool = False) -> bool:
        """Remove a directory (``recursive`` for a non-empty one); returns whether it existed."""
        return await self._files.rm_dir(sandbox_id, path, recursive=recursive)

    async def set_env(self, sandbox_id: str, env: Mapping[str, str | None]) -> dict[str, str]:
        """Set variables (``None`` deletes one); returns the sandbox's whole env afterwards.
        Later executions and jobs see the result."""
        return await self._files.set_env(sandbox_id, env)

    def iter_archive(
        self, sandbox_id: str, *, path: str | None = None, format: str = "tar.gz"
    ) -> AsyncIterator[bytes]:
        """An archive (``tar.gz``, ``zip`` or ``tar``) of ``path`` (default: the workspace),
        as the server streams it."""
        return self._files.iter_archive(sandbox_id, path=path, format=format)

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
        return await self._files.download_archive(sandbox_id, dest, path=path, format=format)

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
        return await self._files.upload_archive(sandbox_id, source, path=path, format=format)

    # ------------------------------------------------------------ copies

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
        return await self._copies.copy_to(sandbox_id, local, dest, recursive=recursive, strict=strict)

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
        return await self._copies.copy_from(sandbox_id, source, local, recursive=recursive,
                                            strict=strict)

    # ------------------------------------------------------------ snapshots

    async def create_checkpoint(self, sandbox_id: str, name: str) -> Checkpoint:
        return await self._snapshots.create_checkpoint(sandbox_id, name)

    async def list_checkpoints(self, sandbox_id: str) -> list[Checkpoint]:
        return await self._snapshots.list_checkpoints(sandbox_id)

    async def restore_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        """Bring the sandbox's files back to exactly that checkpoint."""
        await self._snapshots.restore_checkpoint(sandbox_id, checkpoint_id)

    async def delete_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        await self._snapshots.delete_checkpoint(sandbox_id, checkpoint_id)

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
        return await self._snapshots.create_snapshot(sandbox_id, name=name, tag=tag,
                                                     description=description, public=public)

    async def get_snapshot(self, snapshot: str) -> Snapshot:
        """By id (``snp_...``), ``name:tag`` or tag."""
        return await self._snapshots.get_snapshot(snapshot)

    async def list_snapshots(
        self,
        *,
        sandbox_id: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
        sort: str | None = None,
        direction: str | None = None,
        forks: bool = False,
    ) -> tuple[list[Snapshot], int]:
        """(one page of snapshots, how many match in all). ``forks``: also the snapshots forks
        keep of the instant they copied (hidden by default)."""
        return await self._snapshots.list_snapshots(sandbox_id=sandbox_id, limit=limit, offset=offset,
                                                    sort=sort, direction=direction, forks=forks)

    async def tag_snapshot(self, snapshot_id: str, tag: str | None) -> Snapshot:
        """Give the snapshot ``tag`` (taking it from whichever snapshot of that name had it),
        or remove its tag with None."""
        return await self._snapshots.tag_snapshot(snapshot_id, tag)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Sandboxes already made from it keep their files; lineage shows it as deleted."""
        await self._snapshots.delete_snapshot(snapshot_id)

    async def snapshot_lineage(
        self, *, snapshot: str | None = None, name: str | None = None, tag: str | None = None,
        limit: int | None = None,
    ) -> list[SnapshotLineageEntry]:
        """The snapshot and its ancestors, newest first."""
        return await self._snapshots.snapshot_lineage(snapshot=snapshot, name=name, tag=tag,
                                                      limit=limit)

    async def download_snapshot(self, snapshot_id: str, dest: str | os.PathLike[str] | IO[bytes]) -> int:
        """The snapshot's workspace archive (tar.gz) into ``dest``; returns bytes written."""
        return await self._snapshots.download_snapshot(snapshot_id, dest)

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
        return await self._snapshots.build_snapshot(
            runtime, archive, name=name, tag=tag, description=description, message=message,
            content_hash=content_hash, force=force, public=public, env=env, metadata=metadata,
            dependencies=dependencies, packages=packages, progress=progress)

    async def stats(self, *, start: str | None = None, end: str | None = None) -> dict[str, Any]:
        """Usage of the sandboxes created in [start, end) (ISO 8601 times; open-ended when None)."""
        return await self._snapshots.stats(start=start, end=end)

    # ------------------------------------------------------------ last: below this method, `list[...]`
    # in an annotation would name it rather than the builtin

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
        return await self._sandboxes.list(
            status=status, name=name, mode=mode, project_id=project_id, snapshot_id=snapshot_id,
            live=live, limit=limit, offset=offset, sort=sort, direction=direction,
            deleted_only=deleted_only)


@asynccontextmanager
async def local_client(*, data_dir: str | os.PathLike[str] | None = None,
                       driver: str | None = None) -> AsyncIterator[SandboxClient]:
    """A client bound to a new engine in this process, whatever HUTCH_URL says."""
    connection = Connection(None, None, engine=EngineOptions(data_dir=data_dir, driver=driver))
    async with SandboxClient._over(connection) as client:
        await connection.session()  # the engine starts now: a failure to start is this call's
        yield client
