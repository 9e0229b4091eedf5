"""The blocking facade: :class:`SyncSandboxClient` (also exported as ``hutch.SyncSandboxClient``).

Each client owns a private event loop on a daemon thread and runs the async client there,
so it works from plain scripts, from threads, and from code that already has a running
loop (a notebook). Output callbacks given to ``run``/``execute`` are called on that thread.
Ctrl-C during a call cancels it; a cancelled ``run`` destroys its sandbox first.

Every method is derived from its async twin (``hutch/_blocking.py``): the same name,
parameters and docstring, so the two cannot drift apart, and none is listed here: the classes
write only construction, closing, ``with`` and properties, and :func:`derive` at the bottom
adds every public coroutine and async iterator of the async class. A result that is an async
object comes back as its twin (``create`` gives a :class:`SyncSandbox`, ``fork`` a list of
them, ``terminal`` a :class:`~hutch._blocking.Blocking` terminal).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import aiohttp

from hutch._blocking import Blocking, Facade, _Portal, derive
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


# Every method of the twins above, from their async classes (the twins' own are kept).
derive({SandboxClient: SyncSandboxClient, Sandbox: SyncSandbox, ExecutionHandle: SyncExecutionHandle,
        JobHandle: SyncJobHandle}, also={"Terminal": Blocking})
