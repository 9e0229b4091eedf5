"""network.enabled and network.port through the wire: the url, the reverse proxy (HTTP with
streamed bodies, websockets), and what drivers without them say."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import os

import pytest

from tests.api.conftest import AUTH, NODE, REAL, WIRE, Api

SERVER = r'''
import base64, hashlib, socket, struct, threading
def handle(c):
    f = c.makefile("rb")
    method, path, _ = f.readline().decode().split()
    headers = {}
    while (h := f.readline().decode().strip()):
        k, v = h.split(":", 1)
        headers[k.strip().lower()] = v.strip()
    if headers.get("upgrade", "").lower() == "websocket":
        acc = base64.b64encode(hashlib.sha1((headers["sec-websocket-key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        c.sendall(f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {acc}\r\n\r\n".encode())
        while True:
            b1, b2 = f.read(2)
            op, n = b1 & 15, b2 & 127
            if n == 126: n = struct.unpack(">H", f.read(2))[0]
            elif n == 127: n = struct.unpack(">Q", f.read(8))[0]
            mask = f.read(4) if b2 & 128 else b"\0\0\0\0"
            data = bytes(x ^ mask[i % 4] for i, x in enumerate(f.read(n)))
            if op == 8:
                c.sendall(b"\x88\x00")
                break
            if op in (1, 2):
                out = b"echo:" + data
                c.sendall(bytes([0x80 | op]) + (bytes([len(out)]) if len(out) < 126 else b"\x7e" + struct.pack(">H", len(out))) + out)
        c.close()
        return
    n = int(headers.get("content-length", "0"))
    body = f.read(n) if n else b""
    resp = (f"{method} {path} prefix={headers.get('x-forwarded-prefix')} auth={headers.get('authorization')} "
            f"len={len(body)} sha={hashlib.sha256(body).hexdigest()} "
            f"relay={headers.get('x-hutch-forwarded-by')},{headers.get('x-hutch-forwarded-token')}").encode()
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(resp) + resp)
    c.close()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8000))
s.listen()
while True:
    c, _ = s.accept()
    threading.Thread(target=handle, args=(c,), daemon=True).start()
'''


def path_of(url: str) -> str:
    return "/" + url.split("://", 1)[1].split("/", 1)[1]


@pytest.mark.runs_on(*REAL, *NODE)  # a real server in a real sandbox, through each driver's port (node: the tunnel)
async def test_a_port_is_served_through_its_url(api: Api) -> None:
    created = await api.call("POST", "/sandbox", json={"runtime": "python:3.13", "network": {"port": 8000}}, expect=201)
    sid = created["data"]["sandboxId"]
    url = created["data"]["url"]
    assert url.endswith(f"/proxy/{sid}/") and url.startswith("http")
    info = await api.data("GET", f"/sandbox/{sid}")
    assert info["url"] == url and info["networkPort"] == 8000 and info["networkEnabled"] is False
    await api.call("POST", f"/fs/{sid}", json={"files": [{"path": "server.py", "content": base64.b64encode(SERVER.encode()).decode()}]})
    await api.call("POST", f"/sandbox/sandboxes/{sid}/jobs", json={"command": ["python3", "server.py"]}, expect=201)
    base = path_of(url)
    for _ in range(100):
        resp = await api.client.get(base + "hello?x=1", headers=AUTH)
        if resp.status == 200:
            break
        await asyncio.sleep(0.1)
    text = await resp.text()
    assert resp.status == 200, text
    assert text.startswith(f"GET /hello?x=1 prefix=/proxy/{sid} auth=None len=0"), text  # the API key stays out
    # A relay's credentials between replicas (api/replication.py) stay out too.
    relayed = {**AUTH, "X-Hutch-Forwarded-By": "replica-b", "X-Hutch-Forwarded-Token": "f" * 64}
    text = await (await api.client.get(base + "hello?x=1", headers=relayed)).text()
    assert text.endswith(" relay=None,None"), text

    body = os.urandom(5 * 2**20)
    resp = await api.client.post(base + "upload", data=io.BytesIO(body))
    text = await resp.text()
    assert resp.status == 200 and f"len={len(body)} sha={hashlib.sha256(body).hexdigest()}" in text, text

    ws = await api.client.ws_connect(base + "ws")
    await ws.send_str("hi")
    assert (await ws.receive(timeout=5)).data == "echo:hi"
    await ws.send_bytes(b"\x00\x01" * 100)
    assert (await ws.receive(timeout=5)).data == b"echo:" + b"\x00\x01" * 100
    await ws.close()

    resp = await api.client.get(f"/proxy/{sid}")  # no trailing slash: redirected
    assert resp.status == 200 and resp.url.path.endswith(f"/proxy/{sid}/")

    plain = (await api.call("POST", "/sandbox", json={"network": {"enabled": True}}, expect=201))["data"]
    assert "url" not in plain
    info = await api.data("GET", f"/sandbox/{plain['sandboxId']}")
    assert info["networkEnabled"] is True and "url" not in info
    # A sandbox without a port is as absent as an unknown id (tests/adversarial/test_origins.py).
    resp = await api.client.get(f"/proxy/{plain['sandboxId']}/")
    assert resp.status == 404 and (await resp.json())["message"] == f"sandbox {plain['sandboxId']} not found"
    resp = await api.client.get("/proxy/sbx_nope/")
    assert resp.status == 404

    await api.call("DELETE", f"/sandbox/{sid}")
    resp = await api.client.get(base)
    assert resp.status == 404


@pytest.mark.runs_on("local-embedded")  # the API's host routing; the port's target as above
async def test_with_a_wildcard_domain_a_port_is_served_at_the_root_of_its_own_host(make_api) -> None:  # type: ignore[no-untyped-def]
    """HUTCH_SANDBOX_DOMAIN: the url is {port}-{id}.{domain} and a request with that Host reaches
    the port at / (no prefix: X-Forwarded-Prefix is not sent), websockets too, no key needed."""
    api = await make_api(sandbox_domain="sandboxes.test")
    created = await api.data("POST", "/sandbox", json={"runtime": "python:3.13", "network": {"port": 8000}}, expect=201)
    sid = created["sandboxId"]
    host = f"8000-{sid.removeprefix('sbx_')}.sandboxes.test"
    assert created["url"] == f"http://{host}/"
    await api.call("POST", f"/fs/{sid}", json={"files": [{"path": "server.py", "content": base64.b64encode(SERVER.encode()).decode()}]})
    await api.call("POST", f"/sandbox/sandboxes/{sid}/jobs", json={"command": ["python3", "server.py"]}, expect=201)
    for _ in range(100):
        resp = await api.client.get("/hello?x=1", headers={"Host": host})
        if resp.status == 200:
            break
        await asyncio.sleep(0.1)
    text = await resp.text()
    assert resp.status == 200 and text.startswith("GET /hello?x=1 prefix=None auth=None len=0"), text
    # The API's own paths on that host are the sandbox's, not the API's.
    resp = await api.client.get("/sandbox", headers={"Host": host, **AUTH})
    assert resp.status == 200 and (await resp.text()).startswith("GET /sandbox prefix=None auth=None")
    ws = await api.client.ws_connect("/ws", headers={"Host": host})
    await ws.send_str("hi")
    assert (await ws.receive(timeout=5)).data == "echo:hi"
    await ws.close()
    # Another port, or a sandbox that is not there: 404; other hosts reach the API as before.
    resp = await api.client.get("/", headers={"Host": host.replace("8000-", "9000-", 1)})
    assert resp.status == 404 and (await resp.json())["message"] == f"sandbox {sid} not found"
    resp = await api.client.get("/", headers={"Host": "8000-" + "0" * 26 + ".sandboxes.test"})
    assert resp.status == 404
    assert (await api.data("GET", f"/sandbox/{sid}"))["url"] == f"http://{host}/"


@pytest.mark.runs_on(*WIRE)  # the fake driver refuses them
async def test_drivers_without_network_or_ports_refuse_them(make_api) -> None:  # type: ignore[no-untyped-def]
    api = await make_api(driver="fake")
    err = await api.call("POST", "/sandbox", json={"network": {"port": 8000}}, expect=501)
    assert "network.port" in err["message"]
    err = await api.call("POST", "/sandbox", json={"network": {"enabled": True}}, expect=501)
    assert "network.enabled" in err["message"]
