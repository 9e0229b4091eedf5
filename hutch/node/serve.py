"""``hutch node serve``: the agent's process."""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from hutch.drivers.local.driver import LocalDriver
from hutch.node.app import make_app
from hutch.node.certificate import AgentCertificate
from hutch.node.config import NodeSettings

log = logging.getLogger(__name__)


async def serve(settings: NodeSettings, cert: AgentCertificate) -> None:
    driver = LocalDriver(settings.data_dir, settings.runtime_cache, pids_total=settings.pids_total,
                         org_pids=settings.org_pids)
    runner = web.AppRunner(make_app(settings, driver, cert.fingerprint), handle_signals=False, access_log=None)
    await runner.setup()
    # HTTPS only: a plain-HTTP request fails its handshake and gets no answer.
    site = web.TCPSite(runner, settings.host, settings.port, ssl_context=cert.context)
    await site.start()
    # One line the supervisor (and the tests) wait for.
    print(f"hutch node {settings.name} listening on {settings.host}:{settings.port} (https, certificate "
          f"sha256 {cert.fingerprint})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        # The sandboxes keep running: the next start adopts them (Teardown.reap_leftovers).
        await runner.cleanup()
