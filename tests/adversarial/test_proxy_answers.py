"""A sandbox's port answering what no HTTP server should: a malformed head (a bare CR that
would smuggle a header in, both ``Content-Length`` and ``Transfer-Encoding``, a NUL, a name
with a space, no status line) or a body cut short of what its head announced. The proxy is
hutch's, on hutch's origin: what it answers to the visitor must be a clear refusal, never an
"internal error", and never a connection whose framing the sandbox chose (the bytes of the
next answer on it read as the rest of the sandbox's body). The sandbox speaks raw sockets,
as a hostile tenant would; so does the visitor."""

from __future__ import annotations

import asyncio
import base64

import aiohttp
import pytest

from hutch.api.routes.proxy import WS_MESSAGE_MAX
from tests.api.conftest import Api

PORT = 8000
ANSWERS = {  # path -> the raw answer the sandbox writes, then it closes
    "ok": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
    "bare-cr": b"HTTP/1.1 200 OK\r\nX-A: a\rSet-Cookie: hutch_session=planted\r\nContent-Length: 2\r\n\r\nok",
    "te-and-cl": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    "nul": b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 2\r\n\r\nok",
    "bad-name": b"HTTP/1.1 200 OK\r\nX A: a\r\nContent-Length: 2\r\n\r\nok",
    "no-status": b"HELLO\r\n\r\n",
    "switch": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
    "short": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789",
    "short-chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
}
SERVER = r'''
import base64, contextlib, hashlib, socket, threading
ANSWERS = {answers}
def handle(c):
    head = b""
    with c:
        while b"\r\n\r\n" not in head:
            more = c.recv(65536)
            if not more:
                return
            head += more
        path = head.split(b" ")[1].decode().rsplit("/", 1)[-1]
        if path in ("ws-huge", "ws-quiet"):  # a websocket; ws-huge sends one 20 MiB message at once
            key = [v.strip() for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
                   if k.strip().lower() == b"sec-websocket-key"][0]
            accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
            c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
            if path == "ws-huge":
                c.sendall(b"\x82\x7f" + (20 << 20).to_bytes(8, "big"))
                for _ in range(20):
                    c.sendall(b"x" * (1 << 20))
            c.settimeout(30)
            with contextlib.suppress(OSError):
                while c.recv(1 << 20):
                    pass
            return
        if path == "echo":  # as most servers: the whole body first (no 100 Continue), then the head it got
            head, _, body = head.partition(b"\r\n\r\n")
            length = [int(v) for k, _, v in (h.partition(b":") for h in head.split(b"\r\n")[1:])
                      if k.strip().lower() == b"content-length"]
            while len(body) < sum(length):
                more = c.recv(65536)
                if not more:
                    return
                body += more
            c.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % (len(head) + len(body) + 1)
                      + head + b"\n" + body)
            return
        c.sendall(ANSWERS.get(path, ANSWERS["ok"]))
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {port}))
s.listen(50)
while True:
    threading.Thread(target=handle, args=(s.accept()[0],), daemon=True).start()
'''.replace("{answers}", repr(ANSWERS)).replace("{port}", str(PORT))


@pytest.fixture(params=["local"])
def driver_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)  # the relay is the API's whatever the driver


async def _hostile(api: Api) -> str:
    sid = (await api.data("POST", "/sandbox", json={"runtime": "python:3.13", "network": {"port": PORT}},
                          expect=201))["sandboxId"]
    files = [{"path": "raw.py", "content": base64.b64encode(SERVER.encode()).decode()}]
    await api.call("POST", f"/fs/{sid}", json={"files": files})
    await api.call("POST", f"/sandbox/sandboxes/{sid}/jobs", json={"command": ["python3", "raw.py"]}, expect=201)
    for _ in range(150):
        resp = await api.client.get(f"/proxy/{sid}/ok")
        if resp.status == 200:
            return sid
        await asyncio.sleep(0.1)
    raise AssertionError(f"the server did not come up: {resp.status} {await resp.text()}")


async def _raw(api: Api, request: bytes) -> bytes:
    """What the visitor's socket reads until hutch closes it (or says nothing for 5 s)."""
    server = api.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(request)
    got = b""
    try:
        while more := await asyncio.wait_for(reader.read(65536), 5):
            got += more
    except TimeoutError:
        got += b"<still open>"
    finally:
        writer.close()
    return got


async def test_a_malformed_answer_is_a_502_naming_it(make_api) -> None:  # type: ignore[no-untyped-def]
    api = await make_api()
    sid = await _hostile(api)
    # "switch": 101 to a request that asked for no upgrade. Relayed, a front (nginx, a balancer)
    # that takes any 101 as an upgrade would turn the visitor's connection into a raw tunnel
    # to hutch past the front's own rules (websocket smuggling).
    for path in ("bare-cr", "te-and-cl", "nul", "bad-name", "no-status", "switch"):
        resp = await api.client.get(f"/proxy/{sid}/{path}")
        body = await resp.json()
        assert resp.status == 502, (path, resp.status, body)
        assert body["code"] == "DRIVER_ERROR" and "malformed HTTP answer" in body["message"], (path, body)
        assert f"sandbox {sid}" in body["message"], body
        assert "Set-Cookie" not in resp.headers  # what the bare CR would have smuggled in
    assert (await api.client.get(f"/proxy/{sid}/ok")).status == 200  # the proxy still serves it


async def test_an_answer_cut_short_ends_the_visitors_connection(make_api) -> None:  # type: ignore[no-untyped-def]
    """A sandbox announcing 100 bytes and sending 10 (or a chunked body with no last chunk)
    must not leave the visitor's connection open as if its answer were whole: the next answer
    on it (here the Web App's, pipelined) would be read as the rest of the sandbox's body."""
    api = await make_api()
    sid = await _hostile(api)
    pipelined = f"GET /proxy/{sid}/short HTTP/1.1\r\nHost: h\r\n\r\nGET /app/session HTTP/1.1\r\nHost: h\r\n\r\n"
    got = await _raw(api, pipelined.encode())
    head, _, body = got.partition(b"\r\n\r\n")
    assert b"Content-Length: 100" in head and body == b"0123456789", got  # what it sent, then the end
    got = await _raw(api, f"GET /proxy/{sid}/short-chunked HTTP/1.1\r\nHost: h\r\n\r\n".encode())
    head, _, body = got.partition(b"\r\n\r\n")
    # Its five bytes, then the end of the connection: never the last chunk that says "whole".
    assert b"Transfer-Encoding: chunked" in head and body == b"5\r\nhello\r\n", got
    assert (await api.client.get(f"/proxy/{sid}/ok")).status == 200


async def test_a_body_sent_after_100_continue_reaches_the_sandbox(make_api) -> None:  # type: ignore[no-untyped-def]
    """curl sends ``Expect: 100-continue`` before a large body. hutch answers the 100 itself;
    passed on, the expectation made hutch wait for the sandbox's own 100 before sending the
    body, and a server that reads the body first (most, without a word) never sends one:
    the upload hung for good."""
    api = await make_api()
    sid = await _hostile(api)
    got = await _raw(api, f"POST /proxy/{sid}/echo HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n"
                          "Expect: 100-continue\r\nConnection: close\r\n\r\nhello".encode())
    assert got.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK"), got
    assert got.endswith(b"\nhello") and b"expect:" not in got.lower(), got


async def test_the_forwarded_headers_the_app_sees_are_hutchs(make_api) -> None:  # type: ignore[no-untyped-def]
    """The app behind the proxy is told to trust ``X-Forwarded-*`` (docs: it sees them from
    hutch). A visitor's own ``X-Forwarded-Prefix`` passed through on the host form (hutch sets
    none there): an app building links or redirects from it (Werkzeug's ProxyFix, Spring's
    ForwardedHeaderFilter) would build them on the visitor's word. Now the app gets hutch's
    ``X-Forwarded-Proto``/``-Host``/``-Prefix`` only, however the visitor spells its own."""
    api = await make_api(sandbox_domain="sandboxes.test")
    sid = await _hostile(api)
    # Spelt in lower case too: the relay's headers were keyed by the visitor's spelling.
    spoof = ("X-Forwarded-Prefix: /evil\r\nx-forwarded-host: evil.example\r\nx-forwarded-proto: https\r\n"
             "x-forwarded-prefix: /evil2\r\n")
    for host, target, prefix in ((f"8000-{sid.removeprefix('sbx_')}.sandboxes.test", "/echo", None),
                                 ("h", f"/proxy/{sid}/echo", f"/proxy/{sid}")):
        got = (await _raw(api, f"GET {target} HTTP/1.1\r\nHost: {host}\r\n{spoof}Connection: close\r\n\r\n".encode()))
        seen = got.partition(b"\r\n\r\n")[2].decode().lower().split("\r\n")
        prefixes = [line for line in seen if line.startswith("x-forwarded-prefix:")]
        assert prefixes == ([f"x-forwarded-prefix: {prefix.lower()}"] if prefix else []), got
        assert [line for line in seen if line.startswith(("x-forwarded-host:", "x-forwarded-proto:"))] == [
            "x-forwarded-proto: http", f"x-forwarded-host: {host}"], got


async def test_a_websocket_message_past_the_bound_ends_the_relay(make_api) -> None:  # type: ignore[no-untyped-def]
    """The port relay read each websocket message whole, unbounded (``max_msg_size=0``), before
    passing it on: a sandbox's port, or any visitor of a public port URL, had hutch hold a
    message as large as it liked (gigabytes; more from a compressed one), the server's memory
    spent for every tenant. Now a message past ``WS_MESSAGE_MAX`` closes that relay (1009)."""
    api = await make_api()
    sid = await _hostile(api)
    assert WS_MESSAGE_MAX < 20 << 20
    ws = await api.client.ws_connect(f"/proxy/{sid}/ws-huge", max_msg_size=0)
    msg = await ws.receive(timeout=20)  # the sandbox's 20 MiB message: not passed on
    assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), (msg.type, len(msg.data or b""))
    ws = await api.client.ws_connect(f"/proxy/{sid}/ws-quiet")
    try:  # the visitor's: refused as its frame's head says its size (1009, or the connection cut mid-send)
        await ws.send_bytes(b"y" * (20 << 20))
        msg = await ws.receive(timeout=20)
        assert msg.type is aiohttp.WSMsgType.CLOSE and msg.data == aiohttp.WSCloseCode.MESSAGE_TOO_BIG, msg
    except ConnectionError:
        msg = await ws.receive(timeout=20)
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR), msg
    ws = await api.client.ws_connect(f"/proxy/{sid}/ws-quiet")
    await ws.send_bytes(b"z" * (1 << 20))  # a message within the bound passes as ever
    await ws.close()
