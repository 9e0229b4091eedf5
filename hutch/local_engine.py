"""The engine inside this process, for ``hutch run`` without a server and the Workspace's
``sandbox`` backend: the same API app, reachable only through a private Unix socket (a
mode-0700 directory), with a :class:`SandboxClient` bound to it.

Sandboxes outlive it (as they outlive a server): the next engine on the same data dir adopts
them, which is how a workspace is reattached from another process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

from hutch.client import SandboxClient

SHUTDOWN_SECONDS = 30.0
log = logging.getLogger("hutch")


@asynccontextmanager
async def local_client(*, data_dir: str | os.PathLike[str] | None = None,
                       driver: str | None = None) -> AsyncIterator[SandboxClient]:
    from aiohttp import web

    from hutch.api.app import create_app
    from hutch.api.config import Config, resolve_api_key

    config = Config.from_env(data_dir=data_dir, driver=driver)
    runner = web.AppRunner(create_app(config), handle_signals=False, access_log=None)
    try:
        await runner.setup()  # starts the log, projections and driver (the app's cleanup_ctx)
        with tempfile.TemporaryDirectory(prefix="hutch-") as private:  # mkdtemp: mode 0700
            socket_path = os.path.join(private, "api.sock")
            site = web.UnixSite(runner, socket_path)
            await site.start()
            key, _ = resolve_api_key(config)
            client = SandboxClient("http://localhost", key, connector=aiohttp.UnixConnector(path=socket_path))
            async with client:
                yield client
    finally:
        try:
            async with asyncio.timeout(SHUTDOWN_SECONDS):
                await runner.cleanup()
        except TimeoutError:
            log.warning("the in-process engine did not shut down within %ss", SHUTDOWN_SECONDS)
