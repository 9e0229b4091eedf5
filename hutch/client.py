"""The async client: :class:`SandboxClient` and :class:`Sandbox` (handles of started
executions and jobs: hutch/handles.py; terminals: hutch/terminal.py).

It speaks the Agentuity-compatible wire (``docs/wire.md``) and mirrors the TypeScript
``SandboxClient`` in Python style: keyword arguments, snake_case results, exceptions
instead of ``{success: false}``, and cancellation through asyncio (cancel the task or wrap
the call in ``asyncio.timeout``) instead of an AbortSignal.

``SandboxClient`` is assembled from one class per resource over one transport:

- ``hutch/_transport.py``: session, URL, key, JSON and streamed requests, error mapping
- ``hutch/_sandboxes.py``: run, create, connect, get, list, pause, resume, destroy, runtimes
- ``hutch/_executions.py``: executions, events and jobs
- ``hutch/_files.py``: files, env and archives; ``hutch/_copies.py``: copy_to/copy_from
- ``hutch/_snapshots.py``: checkpoints, snapshots and stats
- ``hutch/_sandbox.py``: the :class:`Sandbox` handle; ``hutch/_options.py``: create's options
"""

from __future__ import annotations

import aiohttp

from hutch._copies import CopiesAPI
from hutch._files import ARCHIVE_FORMATS
from hutch._options import SandboxOptions
from hutch._output import OutputSink
from hutch._sandbox import Sandbox
from hutch._sandboxes import SandboxesAPI
from hutch._shapes import Duration, Files
from hutch._snapshots import SnapshotsAPI
from hutch._transport import LONG_POLL
from hutch.handles import ExecutionHandle, JobHandle
from hutch.tenancy import Tenancy

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
]


class SandboxClient(SandboxesAPI, CopiesAPI, SnapshotsAPI):
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
        super().__init__(
            url,
            api_key,
            connector=connector,
            request_timeout=request_timeout,
            long_poll=long_poll,
            drain_timeout=drain_timeout,
            org_id=org_id,
        )
        #: Organizations, projects, API keys and quotas (:class:`hutch.tenancy.Tenancy`).
        self.tenancy = Tenancy(self)

    def __repr__(self) -> str:
        return f"SandboxClient(url={self.url!r})"

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
