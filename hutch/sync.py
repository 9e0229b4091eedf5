"""The blocking facade: :class:`SyncSandboxClient` (also exported as ``hutch.SyncSandboxClient``).

Each client owns a private event loop on a daemon thread and runs the async client there,
so it works from plain scripts, from threads, and from code that already has a running
loop (a notebook). Output callbacks given to ``run``/``execute`` are called on that thread.
Ctrl-C during a call cancels it; a cancelled ``run`` destroys its sandbox first.

Every method is derived from its async twin (``hutch/_blocking.py``): the same name,
parameters and docstring, so the two cannot drift apart; only construction, closing and
``with`` are written here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import aiohttp

from hutch._blocking import Blocking, Facade, _Portal, blocking, blocking_iter
from hutch.client import Sandbox, SandboxClient
from hutch.handles import ExecutionHandle, JobHandle
from hutch.models import Execution, Job

__all__ = ["SyncExecutionHandle", "SyncJobHandle", "SyncSandbox", "SyncSandboxClient"]


class SyncExecutionHandle(Facade):
    """Blocking twin of :class:`hutch.client.ExecutionHandle`."""

    def __init__(self, portal: _Portal, handle: ExecutionHandle) -> None:
        self._portal = portal
        self.aio = handle  # the underlying async handle

    @property
    def execution_id(self) -> str:
        return self.aio.execution_id

    @property
    def started(self) -> Execution:
        return self.aio.started

    output = blocking_iter(ExecutionHandle.output)
    wait = blocking(ExecutionHandle.wait)
    cancel = blocking(ExecutionHandle.cancel)


class SyncJobHandle(Facade):
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

    get = blocking(JobHandle.get)
    stop = blocking(JobHandle.stop)
    output = blocking_iter(JobHandle.output)
    wait = blocking(JobHandle.wait)


def _sync_sandboxes(portal: _Portal, sandboxes: list[Sandbox]) -> list[SyncSandbox]:
    return [SyncSandbox(portal, sandbox) for sandbox in sandboxes]


class SyncSandbox(Facade):
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

    start = blocking(Sandbox.start, SyncExecutionHandle)
    execute = blocking(Sandbox.execute)
    get = blocking(Sandbox.get)
    destroy = blocking(Sandbox.destroy)
    pause = blocking(Sandbox.pause)
    resume = blocking(Sandbox.resume)
    fork = blocking(Sandbox.fork, _sync_sandboxes)
    terminal = blocking(Sandbox.terminal, Blocking)
    write_files = blocking(Sandbox.write_files)
    read_file = blocking_iter(Sandbox.read_file)
    read_bytes = blocking(Sandbox.read_bytes)
    list_files = blocking(Sandbox.list_files)
    mkdir = blocking(Sandbox.mkdir)
    rm_file = blocking(Sandbox.rm_file)
    rm_dir = blocking(Sandbox.rm_dir)
    set_env = blocking(Sandbox.set_env)
    iter_archive = blocking_iter(Sandbox.iter_archive)
    download_archive = blocking(Sandbox.download_archive)
    upload_archive = blocking(Sandbox.upload_archive)
    copy_to = blocking(Sandbox.copy_to)
    copy_from = blocking(Sandbox.copy_from)
    create_job = blocking(Sandbox.create_job, SyncJobHandle)
    get_job = blocking(Sandbox.get_job)
    list_jobs = blocking(Sandbox.list_jobs)
    stop_job = blocking(Sandbox.stop_job)
    list_executions = blocking(Sandbox.list_executions)
    list_events = blocking(Sandbox.list_events)


class SyncSandboxClient(Facade):
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

    # sandboxes, runtimes, terminals, the server
    run = blocking(SandboxClient.run)
    create = blocking(SandboxClient.create, SyncSandbox)
    connect = blocking(SandboxClient.connect, SyncSandbox)
    get = blocking(SandboxClient.get)
    get_status = blocking(SandboxClient.get_status)
    list = blocking(SandboxClient.list)
    iter_sandboxes = blocking_iter(SandboxClient.iter_sandboxes)
    destroy = blocking(SandboxClient.destroy)
    pause = blocking(SandboxClient.pause)
    resume = blocking(SandboxClient.resume)
    list_runtimes = blocking(SandboxClient.list_runtimes)
    terminal = blocking(SandboxClient.terminal, Blocking)
    server_info = blocking(SandboxClient.server_info)
    # executions, events, jobs
    get_execution = blocking(SandboxClient.get_execution)
    wait_execution = blocking(SandboxClient.wait_execution)
    cancel_execution = blocking(SandboxClient.cancel_execution)
    list_executions = blocking(SandboxClient.list_executions)
    list_events = blocking(SandboxClient.list_events)
    create_job = blocking(SandboxClient.create_job, SyncJobHandle)
    get_job = blocking(SandboxClient.get_job)
    list_jobs = blocking(SandboxClient.list_jobs)
    stop_job = blocking(SandboxClient.stop_job)
    # files, env, archives, copies
    write_files = blocking(SandboxClient.write_files)
    read_file = blocking_iter(SandboxClient.read_file)
    read_bytes = blocking(SandboxClient.read_bytes)
    list_files = blocking(SandboxClient.list_files)
    mkdir = blocking(SandboxClient.mkdir)
    rm_file = blocking(SandboxClient.rm_file)
    rm_dir = blocking(SandboxClient.rm_dir)
    set_env = blocking(SandboxClient.set_env)
    iter_archive = blocking_iter(SandboxClient.iter_archive)
    download_archive = blocking(SandboxClient.download_archive)
    upload_archive = blocking(SandboxClient.upload_archive)
    copy_to = blocking(SandboxClient.copy_to)
    copy_from = blocking(SandboxClient.copy_from)
    # checkpoints, snapshots, stats
    create_checkpoint = blocking(SandboxClient.create_checkpoint)
    list_checkpoints = blocking(SandboxClient.list_checkpoints)
    restore_checkpoint = blocking(SandboxClient.restore_checkpoint)
    delete_checkpoint = blocking(SandboxClient.delete_checkpoint)
    create_snapshot = blocking(SandboxClient.create_snapshot)
    get_snapshot = blocking(SandboxClient.get_snapshot)
    list_snapshots = blocking(SandboxClient.list_snapshots)
    tag_snapshot = blocking(SandboxClient.tag_snapshot)
    delete_snapshot = blocking(SandboxClient.delete_snapshot)
    snapshot_lineage = blocking(SandboxClient.snapshot_lineage)
    download_snapshot = blocking(SandboxClient.download_snapshot)
    build_snapshot = blocking(SandboxClient.build_snapshot)
    stats = blocking(SandboxClient.stats)
