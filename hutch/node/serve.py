"""``hutch node serve``: the agent's process."""

from __future__ import annotations

import asyncio
import logging
import signal

from hutch.core.waiting import default_waiting
from hutch.drivers.local.driver import LocalDriver
from hutch.edge import out_of_files
from hutch.edge.listener import Runner, Site, waiting
from hutch.node.app import make_app
from hutch.node.certificate import AgentCertificate
from hutch.node.config import NodeSettings

log = logging.getLogger(__name__)


async def serve(settings: NodeSettings, cert: AgentCertificate) -> None:
    driver = LocalDriver(settings.data_dir, settings.runtime_cache, pids_total=settings.pids_total,
                         org_pids=settings.org_pids)
    # As hutch serve's listeners: a deadline for each request head (and for the TLS handshake
    # before it), a bound on the connections waiting for one; its clients (the API's node driver)
    # let an idle connection go sooner (drivers/node/client.py).
    bound = waiting(settings.max_waiting or default_waiting(out_of_files.open_file_limit()))
    runner = Runner(make_app(settings, driver, cert.fingerprint), bound, settings.head_seconds, handle_signals=False)
    await runner.setup()
    if settings.max_waiting is None:  # counted again: the driver may have raised the open-file limit
        bound.limit = default_waiting(out_of_files.open_file_limit())
    out_of_files.install(asyncio.get_running_loop(), bound.shed, log)
    # HTTPS only: a plain-HTTP request fails its handshake and gets no answer.
    site = Site(runner, settings.host, settings.port, ssl_context=cert.context)
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
