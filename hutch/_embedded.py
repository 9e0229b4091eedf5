"""The engine inside this process, for a client with no server to talk to (``hutch run``, any
CLI command, ``SandboxClient()`` and the Workspace's ``sandbox`` backend when neither an URL,
``HUTCH_URL`` nor a ``hutch serve`` on the data dir names one, and ``hutch.client.local_client``):
the same API app, reachable only through a private Unix socket (a mode-0700 directory).

The SDK's one bridge to the server: only :class:`hutch._connection.Connection` imports this
module, when it starts an engine, and this module imports the server's code (hutch.api,
hutch.service) only then, so a client that talks to a server never loads it. It imports nothing
of the SDK.

Sandboxes outlive it (as they outlive a server): the next engine on the same data dir adopts
them, which is how a workspace is reattached from another process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from typing import Any

import aiohttp

SHUTDOWN_SECONDS = 30.0
log = logging.getLogger("hutch")


class EmbeddedEngine:
    """The API app of this process on a private socket; ``start`` answers how to reach it."""

    def __init__(self, *, data_dir: str | os.PathLike[str] | None = None, driver: str | None = None) -> None:
        self._data_dir, self._driver = data_dir, driver
        self._runner: Any = None
        self._private: tempfile.TemporaryDirectory[str] | None = None

    async def start(self) -> tuple[aiohttp.UnixConnector, str]:
        """(a connector to the engine, its API key)."""
        from aiohttp import web

        from hutch.api.app import create_app
        from hutch.service.config import Config, resolve_api_key

        config = Config.from_env(data_dir=self._data_dir, driver=self._driver)
        self._runner = web.AppRunner(create_app(config), handle_signals=False, access_log=None)
        try:
            await self._runner.setup()  # starts the log, projections and driver (the app's cleanup_ctx)
            self._private = tempfile.TemporaryDirectory(prefix="hutch-")  # mkdtemp: mode 0700
            socket_path = os.path.join(self._private.name, "api.sock")
            await web.UnixSite(self._runner, socket_path).start()
        except BaseException:
            await self.stop()
            raise
        key, _ = resolve_api_key(config)
        return aiohttp.UnixConnector(path=socket_path), key

    async def stop(self) -> None:
        try:
            if self._runner is not None:
                async with asyncio.timeout(SHUTDOWN_SECONDS):
                    await self._runner.cleanup()
        except TimeoutError:
            log.warning("the in-process engine did not shut down within %ss", SHUTDOWN_SECONDS)
        finally:
            self._runner = None
            if self._private is not None:
                self._private.cleanup()
                self._private = None

