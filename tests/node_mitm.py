"""A man in the middle between the node driver and an agent: it ends TLS with a certificate
of its own, opens its own TLS connection to the agent and relays the bytes both ways, so the
requests it relays carry valid signatures. It keeps the plaintext it read from the driver:
what a tap on the network would learn if the driver went on talking through it."""

from __future__ import annotations

import asyncio
import contextlib
import ssl

from hutch.node import certificate


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keep: bytearray | None) -> None:
    with contextlib.suppress(OSError, ConnectionError, ssl.SSLError):
        while data := await reader.read(65536):
            if keep is not None:
                keep += data
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError, ConnectionError, RuntimeError, ssl.SSLError):
        writer.close()


class Mitm:
    def __init__(self, agent: str) -> None:
        host, _, port = agent.rpartition(":")
        self._agent = (host, int(port))
        self.heard = bytearray()  # what the driver sent, decrypted
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        own = certificate.make("mitm").context
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0, ssl=own)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        upstream = ssl.create_default_context()
        upstream.check_hostname = False
        upstream.verify_mode = ssl.CERT_NONE  # it takes whatever the agent presents
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._agent, ssl=upstream)
        except OSError:
            writer.close()
            return
        task = asyncio.ensure_future(asyncio.gather(_pipe(reader, up_writer, self.heard), _pipe(up_reader, writer, None)))
        self._tasks.add(task)  # type: ignore[arg-type]
        await task

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
