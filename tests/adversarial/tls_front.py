"""A TLS front for a test server, as an operator's reverse proxy would be (nginx, Caddy): it
ends TLS with a throwaway self-signed certificate and pipes the bytes to hutch's plain HTTP
port, the Host header untouched. The browser then sees hutch at ``https://`` (and, with
``HUTCH_PUBLIC_URL`` saying so, hutch knows its browsers do)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def self_signed(directory: Path, *names: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "front.crt", directory / "front.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError, ConnectionError, RuntimeError):
        writer.close()


@contextlib.contextmanager
def tls_front(directory: Path, backend_port: int, *names: str) -> Iterator[int]:
    """Serve TLS on a free loopback port (yielded) in front of ``127.0.0.1:backend_port``."""
    cert, key = self_signed(directory, *names)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    loop = asyncio.new_event_loop()
    ready: list[int] = []
    writers: set[asyncio.StreamWriter] = set()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", backend_port)
        except OSError:
            writer.close()
            return
        writers.add(up_writer)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    async def start() -> asyncio.Server:
        server = await asyncio.start_server(connection, "127.0.0.1", 0, ssl=context)
        ready.append(server.sockets[0].getsockname()[1])
        return server

    server = loop.run_until_complete(start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield ready[0]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)

        async def close() -> None:
            server.close()
            for writer in writers:
                writer.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await server.wait_closed()

        loop.run_until_complete(close())
        loop.close()
