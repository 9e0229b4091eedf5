"""What TLS costs on the node wire, per request: a new pinned HTTPS connection (ECDSA P-256
handshake) and a request on a kept one, against plain HTTP, both ends in this one process (so
the CPU is the client's and the server's together).

    python bench/node_tls.py [--n 300]

Not a test: docs/node.md ("Transport") records the figures."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hutch.node import certificate


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def main(n: int) -> None:
    cert = certificate.make("bench")
    app = web.Application()
    app.router.add_get("/healthz", _healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=cert.context).start()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    tls_port, plain_port = (int(a[1]) for a in runner.addresses)
    pin = aiohttp.Fingerprint(bytes.fromhex(cert.fingerprint))
    try:
        for _ in range(2):  # twice: the first round warms up
            for scheme, port in (("https", tls_port), ("http", plain_port)):
                for kept in (False, True):
                    connector = aiohttp.TCPConnector(force_close=not kept)
                    async with aiohttp.ClientSession(connector=connector) as s:
                        cpu, wall = time.process_time(), time.perf_counter()
                        for _ in range(n):
                            async with s.get(f"{scheme}://127.0.0.1:{port}/healthz",
                                             ssl=pin if scheme == "https" else True) as resp:
                                await resp.read()
                        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                    print(f"{scheme:5} {'kept connection' if kept else 'new connection':15} "
                          f"{1000 * cpu / n:.2f} ms CPU, {1000 * wall / n:.2f} ms wall per request")
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300)
    asyncio.run(main(ap.parse_args().n))
