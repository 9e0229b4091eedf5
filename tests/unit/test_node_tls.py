"""TLS between the node driver and its agents, as an attacker meets it: a man in the middle
with its own certificate relaying valid signatures, a hello that proves a certificate other
than its connection's, plain HTTP; and the re-pin after an agent's restart. The agents here
are the real application (make_app) over a fake local driver: no root, no sandbox."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from hutch.core.errors import DriverFailure, FileNotFound, Unauthorized
from hutch.drivers.node import wire
from hutch.drivers.node.client import AgentClient
from hutch.node import certificate
from hutch.node.app import make_app
from hutch.node.config import NodeSettings
from tests.node_mitm import Mitm

SECRET = b"t" * 40


class _Driver:
    def set_listener(self, listener: Any) -> None:
        pass

    async def list_files(self, sandbox_id: str, path: str) -> list[Any]:
        raise FileNotFound(f"no such file or directory: {path}", field="path")


class _Agent:
    """One agent process, as far as the wire goes: a new certificate and instance per start."""

    def __init__(self, tmp: Path, *, proves: str | None = None) -> None:
        self._tmp, self._proves = tmp, proves
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        self.cert = certificate.make("t1")
        settings = NodeSettings(name="t1", host="127.0.0.1", port=0, data_dir=self._tmp, runtime_cache=self._tmp,
                                secret=SECRET)
        app = make_app(settings, _Driver(), self._proves or self.cert.fingerprint, own_driver=False)  # type: ignore[arg-type]
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self.cert.context)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[_Agent]:
    a = _Agent(tmp_path)
    await a.start()
    yield a
    await a.stop()


async def _reaches(client: AgentClient) -> None:
    """A signed call the agent answers (with its 404): the request went through."""
    with pytest.raises(FileNotFound):
        await client.json("GET", client.path("sandboxes", "sb-1", "list", path="a"))


async def test_the_hello_pins_the_certificate_it_came_on(agent: _Agent) -> None:
    client = AgentClient("t1", f"127.0.0.1:{agent.port}", SECRET)
    try:
        instance = await client.hello()
        assert client._pin is not None and client._pin.fingerprint == bytes.fromhex(agent.cert.fingerprint)
        await _reaches(client)
        assert client.instance == instance
    finally:
        await client.close()


async def test_a_man_in_the_middle_relaying_valid_signatures_is_refused(agent: _Agent) -> None:
    mitm = Mitm(f"127.0.0.1:{agent.port}")
    through = await mitm.start()
    client = AgentClient("t1", through, SECRET)
    try:
        # Its hello reaches the real agent, whose proof covers the agent's certificate, not
        # the one this connection presented.
        with pytest.raises(Unauthorized, match="something between the API and the agent ends TLS"):
            await client.hello()
        assert client._pin is None and client.instance is None
        # A call with no pin asks for the hello first, and sends nothing when it fails.
        with pytest.raises(DriverFailure, match=r"^node t1 did not answer: it could not prove its certificate$"):
            await _reaches(client)
        assert mitm.connections >= 2 and b"GET /v1/hello?" in mitm.heard  # it did relay: the refusal is the driver's
        assert b"/v1/sandboxes" not in mitm.heard, bytes(mitm.heard)
        # Pinned on a direct connection, then diverted through it: refused in the handshake,
        # and the hello asked again fails the same way; the request never leaves.
        client.address = f"127.0.0.1:{agent.port}"
        await client.hello()
        await _reaches(client)
        client.address = through
        with pytest.raises(DriverFailure, match="could not prove its certificate"):
            await _reaches(client)
        with pytest.raises(DriverFailure, match="could not prove its certificate"):
            await client.websocket(client.path("sandboxes", "sb-1", "terminal"))
        assert b"/v1/sandboxes" not in mitm.heard, bytes(mitm.heard)
    finally:
        await client.close()
        await mitm.close()


async def test_a_hello_proving_another_certificate_is_refused(tmp_path: Path) -> None:
    """An agent that holds the secret but proves a certificate its connection did not present."""
    other = certificate.make("elsewhere").fingerprint
    liar = _Agent(tmp_path, proves=other)
    address = await liar.start()
    client = AgentClient("t1", address, SECRET)
    try:
        with pytest.raises(Unauthorized, match=f"proved certificate {other[:16]}…, but the connection presented "
                                               f"{liar.cert.fingerprint[:16]}…"):
            await client.hello()
    finally:
        await client.close()
        await liar.stop()


async def test_a_restarted_agent_is_pinned_again(agent: _Agent) -> None:
    """Its new certificate fails the old pin; the client asks for a hello, which proves the new
    one, and the call goes on: the instance is new and the ends are counted afresh."""
    client = AgentClient("t1", f"127.0.0.1:{agent.port}", SECRET)
    try:
        first = await client.hello()
        old_pin = agent.cert.fingerprint
        client.ended_seq = 5
        await agent.stop()
        await agent.start()  # same port
        assert agent.cert.fingerprint != old_pin
        await _reaches(client)
        assert client._pin is not None and client._pin.fingerprint == bytes.fromhex(agent.cert.fingerprint)
        assert client.instance != first and client.ended_seq == 0
    finally:
        await client.close()


async def test_plain_http_gets_no_answer_and_healthz_answers_over_https(agent: _Agent) -> None:
    path = "/v1/sandboxes/sb-1/list?path=a"
    async with aiohttp.ClientSession() as s:
        for url, headers in ((f"http://127.0.0.1:{agent.port}/healthz", {}),
                             (f"http://127.0.0.1:{agent.port}{path}", wire.sign(SECRET, "GET", path))):
            with pytest.raises(aiohttp.ClientError):
                async with s.get(url, headers=headers) as resp:
                    raise AssertionError(f"plain HTTP was answered: {resp.status} {await resp.text()}")
        # What Nomad's check asks (https, the certificate not verified): nothing about the node.
        async with s.get(f"https://127.0.0.1:{agent.port}/healthz", ssl=False) as resp:
            assert (resp.status, await resp.json()) == (200, {"ok": True})


@pytest.mark.parametrize("use_cryptography", [True, False], ids=["cryptography", "openssl"])
def test_the_certificate_is_fresh_ecdsa_p256(use_cryptography: bool, tmp_path: Path) -> None:
    one, two = (certificate.make("t1", use_cryptography=use_cryptography) for _ in range(2))
    assert one.fingerprint != two.fingerprint and len(one.fingerprint) == 64
    # What a client is shown: the certificate whose fingerprint the hello proves.
    server = one.context
    assert isinstance(server, ssl.SSLContext)
    pem = _served_certificate(one)
    cert = x509.load_pem_x509_certificate(pem.encode())
    key = cert.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
    assert wire.cert_fingerprint(ssl.PEM_cert_to_DER_cert(pem)) == one.fingerprint


def _served_certificate(cert: certificate.AgentCertificate) -> str:
    import socket
    import threading

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def accept() -> None:
            conn, _ = listener.accept()
            try:
                with cert.context.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass

        t = threading.Thread(target=accept)
        t.start()
        try:
            return ssl.get_server_certificate(listener.getsockname())
        finally:
            t.join(5)


def test_without_cryptography_or_openssl_the_agent_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(certificate.shutil, "which", lambda name: None)
    with pytest.raises(certificate.CertificateError, match="needs the Python package 'cryptography' or the 'openssl' "
                                                           "command to make its TLS certificate"):
        certificate.make("t1", use_cryptography=False)
