"""An operator's CA certificates in every sandbox's trust store (HUTCH_SANDBOX_CA_CERTS,
drivers/trust.py): behind a TLS-inspecting proxy, pip, Python, Node.js and curl in a sandbox
trust what the proxy signs. A TLS server inside the sandbox, signed by a test CA, stands in
for the proxy (a sandbox reaches nothing on the host); without the setting the same clients
refuse it."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest

from tests.api.conftest import Api, AppFactory


@pytest.fixture(params=["local"])
def driver_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["embedded"])
async def profile(request: pytest.FixtureRequest) -> dict[str, str]:
    return {}  # the trust store is the driver's business, whatever the log


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A test CA and a server certificate for localhost signed by it."""
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=hutch test proxy CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=localhost", cwd=d)
    (d / "ext.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf", cwd=d)
    return d


SERVER = """import http.server, ssl
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain("server.pem", "server.key")
httpd = http.server.HTTPServer(("127.0.0.1", 8443), http.server.SimpleHTTPRequestHandler)
httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True); httpd.serve_forever()
"""
CLIENTS = (
    "python3 -c \"import urllib.request; print('python', urllib.request.urlopen('https://localhost:8443/ok').read().decode())\"; "
    "node -e \"require('https').get('https://localhost:8443/ok', r => r.on('data', d => console.log('node', String(d))))"
    ".on('error', e => console.log('node-failed', e.code))\"; "
    "curl -sS https://localhost:8443/ok | sed 's/^/curl /'; "
    "echo pip=$PIP_CERT requests=$REQUESTS_CA_BUNDLE"
)


async def _clients_in_a_sandbox(api: Api, pki: Path, runtime: str = "workspace:latest") -> str:
    files = [{"path": name, "content": base64.b64encode((pki / name).read_bytes()).decode()}
             for name in ("server.pem", "server.key")]
    files += [{"path": "ok", "content": "dHJ1c3RlZA=="}, {"path": "server.py", "content": base64.b64encode(SERVER.encode()).decode()}]
    sandbox = await api.data("POST", "/sandbox", json={"runtime": runtime, "files": files}, expect=201)
    sid = sandbox["sandboxId"]
    await api.data("POST", f"/sandbox/sandboxes/{sid}/jobs", json={"command": ["python3", "server.py"]}, expect=201)
    started = await api.data("POST", f"/sandbox/{sid}/execute", json={
        "command": ["sh", "-c", "for i in $(seq 50); do (echo > /dev/tcp/127.0.0.1/8443) 2>/dev/null && break;"
                    " sleep 0.1; done; " + CLIENTS]})
    done = await api.wait_execution(started["executionId"])
    out = (await api.stream(done["stdoutStreamUrl"])).decode() + (await api.stream(done["stderrStreamUrl"])).decode()
    await api.call("DELETE", f"/sandbox/{sid}")
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("configured", [False, True], ids=["without", "with"])
async def test_sandboxes_trust_the_operators_ca(make_api: AppFactory, pki: Path, monkeypatch: pytest.MonkeyPatch,
                                                configured: bool) -> None:
    if configured:
        monkeypatch.setenv("HUTCH_SANDBOX_CA_CERTS", str(pki / "ca.pem"))
    else:  # the control: the same clients refuse the server
        monkeypatch.delenv("HUTCH_SANDBOX_CA_CERTS", raising=False)
    out = await _clients_in_a_sandbox(await make_api(), pki)
    if not configured:
        assert "CERTIFICATE_VERIFY_FAILED" in out and "node-failed UNABLE_TO_VERIFY_LEAF_SIGNATURE" in out, out
        assert "trusted" not in out and "pip= requests=" in out
        return
    for tool in ("python", "node", "curl"):
        assert f"{tool} trusted" in out, out
    assert "pip=/etc/ssl/certs/ca-certificates.crt requests=/etc/ssl/certs/ca-certificates.crt" in out


@pytest.mark.timeout(300)
async def test_nomad_sandboxes_trust_the_operators_ca_too(make_api: AppFactory, pki: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The nomad driver bakes the certificates into its image's bundle (a tag of its own, pushed
    on first use: drivers/nomad/images.py); python:3.13 has python, not node or curl."""
    monkeypatch.setenv("HUTCH_SANDBOX_CA_CERTS", str(pki / "ca.pem"))
    out = await _clients_in_a_sandbox(await make_api(driver="nomad"), pki, runtime="python:3.13")
    assert "python trusted" in out, out
    assert "pip=/etc/ssl/certs/ca-certificates.crt requests=/etc/ssl/certs/ca-certificates.crt" in out


async def test_a_bad_ca_setting_stops_the_start(tmp_path: Path) -> None:
    from hutch.core.errors import InvalidInput
    from hutch.service.config import Config

    (tmp_path / "not.pem").write_text("hello")
    for value, words in ((str(tmp_path / "nope.pem"), "cannot read"), (str(tmp_path / "not.pem"), "no PEM")):
        with pytest.raises(InvalidInput, match=f"HUTCH_SANDBOX_CA_CERTS: .*{words}"):
            Config(sandbox_ca_certs=value)
