"""An attacker's pass over the E2B wire (api/e2b/): another organization's key and envd token
against a sandbox on every route, tokens of a read-only or revoked key, and the Connect codec
fed what no SDK sends. Raw HTTP, one server for the module."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import re
import socket
import struct
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2b.conftest import E2bServer, _serve
from tests.system.server import KEY

Answer = tuple[int, Any]


def _call(server: E2bServer, method: str, path: str, body: bytes | None = None,
          headers: dict[str, str] | None = None, timeout: float = 60) -> Answer:
    url = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    try:
        return resp.status, json.loads(raw) if raw else None
    except ValueError:
        return resp.status, raw


def _control(server: E2bServer, key: str, method: str, path: str, body: Any = None) -> Answer:
    data = json.dumps(body).encode() if body is not None else None
    return _call(server, method, path, data, {"X-API-Key": key, "Content-Type": "application/json"})


def _create(server: E2bServer, key: str) -> dict[str, Any]:
    status, sb = _control(server, key, "POST", "/sandboxes", {"templateID": "base", "timeout": 300})
    assert status == 201, sb
    return dict(sb)


def _envd_headers(sandbox_id: str, token: str, kind: str = "application/json") -> dict[str, str]:
    return {"E2b-Sandbox-Id": sandbox_id, "X-Access-Token": token, "Content-Type": kind}


def _envelope(message: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(message)) + message


STDIN_WAIT, BODY_IDLE = 3.0, 2.0  # the server's, in seconds (30 and 10 by default)


@pytest.fixture(scope="module")
def wire(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2bServer]:
    """The embedded profile: what is checked here is the wire's, above the engine. Its waits
    shortened (they are settings): the tests wait them out."""
    yield from _serve(tmp_path_factory, HUTCH_E2B_STDIN_WAIT_SECONDS=str(STDIN_WAIT),
                      HUTCH_E2B_BODY_IDLE_SECONDS=str(BODY_IDLE))


@pytest.fixture(scope="module")
def victim(wire: E2bServer) -> dict[str, Any]:
    return _create(wire, KEY)


@pytest.fixture(scope="module")
def attacker(wire: E2bServer) -> tuple[str, dict[str, Any]]:
    """Organization B's key and a sandbox of B's own (so B holds a valid envd token)."""
    key = wire.key_of_new_org("e2b-attacker")
    return key, _create(wire, key)


# Every envd route, with a body an SDK would send.
_ENVD_ROUTES = [
    ("POST", "/process.Process/Start", "application/connect+json",
     _envelope(b'{"process": {"cmd": "/bin/echo", "args": ["pwned"]}}')),
    ("POST", "/process.Process/Connect", "application/connect+json", _envelope(b'{"process": {"pid": 1000}}')),
    ("POST", "/process.Process/List", "application/json", b"{}"),
    ("POST", "/process.Process/SendSignal", "application/json", b'{"process": {"pid": 1000}, "signal": "SIGNAL_SIGKILL"}'),
    ("POST", "/process.Process/SendInput", "application/json", b'{"process": {"pid": 1000}, "input": {"stdin": "eA=="}}'),
    ("POST", "/process.Process/CloseStdin", "application/json", b'{"process": {"pid": 1000}}'),
    ("POST", "/process.Process/Update", "application/json", b'{"process": {"pid": 1000}, "pty": {"size": {"rows": 5}}}'),
    ("POST", "/filesystem.Filesystem/Stat", "application/json", b'{"path": "/etc/hostname"}'),
    ("POST", "/filesystem.Filesystem/MakeDir", "application/json", b'{"path": "/tmp/planted"}'),
    ("POST", "/filesystem.Filesystem/ListDir", "application/json", b'{"path": "/"}'),
    ("POST", "/filesystem.Filesystem/Remove", "application/json", b'{"path": "/home/agentuity"}'),
    ("GET", "/files?path=/etc/hostname", "application/json", None),
    ("POST", "/files?path=/tmp/planted", "application/octet-stream", b"planted"),
    ("GET", "/health", "application/json", None),
]


def _anonymized(answer: Answer, sandbox_id: str) -> Answer:
    status, body = answer
    return status, json.loads(json.dumps(body).replace(sandbox_id, "<id>"))


@pytest.mark.parametrize(("method", "path", "kind", "body"), _ENVD_ROUTES, ids=[r[1] for r in _ENVD_ROUTES])
def test_another_orgs_envd_token_opens_no_route_and_tells_nothing(
        wire: E2bServer, victim: dict[str, Any], attacker: tuple[str, dict[str, Any]],
        method: str, path: str, kind: str, body: bytes | None) -> None:
    """B's valid token (for B's sandbox) aimed at A's sandbox: refused as for a sandbox that
    does not exist, and nothing of A's is touched."""
    token = attacker[1]["envdAccessToken"]
    against_a = _call(wire, method, path, body, _envd_headers(victim["sandboxID"], token, kind))
    missing_id = "sbx_" + "0" * 20
    against_none = _call(wire, method, path, body, _envd_headers(missing_id, token, kind))
    assert against_a[0] == 401, against_a
    assert _anonymized(against_a, victim["sandboxID"]) == _anonymized(against_none, missing_id)
    # the port relay: the same token with E2B's port header, and with the traffic token too
    relayed = _call(wire, method, path, body, {**_envd_headers(victim["sandboxID"], token, kind),
                                               "E2b-Sandbox-Port": "49999",
                                               "E2B-Traffic-Access-Token": victim["envdAccessToken"]})
    assert relayed[0] == 401, relayed


@pytest.mark.parametrize(("method", "path", "kind", "body"), _ENVD_ROUTES, ids=[r[1] for r in _ENVD_ROUTES])
def test_no_credential_opens_no_route(wire: E2bServer, victim: dict[str, Any], method: str, path: str, kind: str,
                                      body: bytes | None) -> None:
    """Without a token, without the sandbox's id, or with a hutch API key where the token
    goes: refused, naming what is missing, on envd and on the port relay."""
    sandbox_id = victim["sandboxID"]
    for headers, words in [({"E2b-Sandbox-Id": sandbox_id}, "missing X-Access-Token"),
                           ({"X-Access-Token": victim["envdAccessToken"]}, "missing E2b-Sandbox-Id"),
                           ({"E2b-Sandbox-Id": sandbox_id, "X-Access-Token": KEY}, "not a valid access token"),
                           ({"E2b-Sandbox-Id": sandbox_id, "X-API-Key": KEY}, "missing X-Access-Token"),
                           ({"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49999"}, "missing X-Access-Token")]:
        status, answer = _call(wire, method, path, body, {**headers, "Content-Type": kind})
        assert status == 401, (headers, answer)
        assert words in answer["message"], (headers, answer)


@pytest.mark.parametrize(("method", "path", "body"), [
    ("GET", "/sandboxes/{id}", None), ("DELETE", "/sandboxes/{id}", None),
    ("POST", "/sandboxes/{id}/pause", None), ("POST", "/sandboxes/{id}/resume", {}),
    ("POST", "/sandboxes/{id}/connect", {"timeout": 60}), ("POST", "/v2/sandboxes/{id}/connect", {}),
    ("POST", "/sandboxes/{id}/timeout", {"timeout": 1}),
])
def test_another_orgs_key_finds_no_sandbox_on_the_control_plane(
        wire: E2bServer, victim: dict[str, Any], attacker: tuple[str, dict[str, Any]],
        method: str, path: str, body: Any) -> None:
    key = attacker[0]
    against_a = _control(wire, key, method, path.format(id=victim["sandboxID"]), body)
    against_none = _control(wire, key, method, path.format(id="sbx_" + "0" * 20), body)
    assert against_a[0] == 404, against_a
    assert _anonymized(against_a, victim["sandboxID"]) == _anonymized(against_none, "sbx_" + "0" * 20)
    assert _control(wire, KEY, "GET", f"/sandboxes/{victim['sandboxID']}")[0] == 200  # untouched


def test_a_token_is_for_its_sandbox_and_its_key_only(wire: E2bServer, victim: dict[str, Any],
                                                      attacker: tuple[str, dict[str, Any]]) -> None:
    """Neither half of a token can be swapped: the key id of another's token with one's own
    MAC, nor one sandbox's token with another sandbox's id of the same organization."""
    mine, theirs = attacker[1]["envdAccessToken"], victim["envdAccessToken"]
    spliced = f"{theirs.rpartition('.')[0]}.{mine.rpartition('.')[2]}"
    listing = ("POST", "/process.Process/List", b"{}")
    for sandbox_id, token in [(victim["sandboxID"], spliced), (victim["sandboxID"], theirs + "0"),
                              (victim["sandboxID"], "." + theirs.rpartition(".")[2]),
                              (attacker[1]["sandboxID"], theirs)]:
        status, body = _call(wire, *listing[:2], listing[2], _envd_headers(sandbox_id, token))
        assert status == 401, (token, body)
    assert _call(wire, *listing[:2], listing[2], _envd_headers(victim["sandboxID"], theirs))[0] == 200


def _key_of(wire: E2bServer, role: str) -> tuple[str, str]:
    made = wire.server.data("POST", "/keys", {"role": role})
    return str(made["id"]), str(made["secret"])


def test_a_read_only_or_revoked_keys_token_runs_nothing(wire: E2bServer, victim: dict[str, Any]) -> None:
    _, reader = _key_of(wire, "read-only")
    status, got = _control(wire, reader, "GET", f"/sandboxes/{victim['sandboxID']}")
    assert status == 200, got
    start = _envelope(b'{"process": {"cmd": "/bin/touch", "args": ["/tmp/by-reader"]}}')
    status, body = _call(wire, "POST", "/process.Process/Start", start,
                         _envd_headers(victim["sandboxID"], got["envdAccessToken"], "application/connect+json"))
    assert status == 403, body
    key_id, member = _key_of(wire, "member")
    status, got = _control(wire, member, "POST", f"/sandboxes/{victim['sandboxID']}/connect", {})
    assert status == 200, got
    headers = _envd_headers(victim["sandboxID"], got["envdAccessToken"])
    assert _call(wire, "POST", "/process.Process/List", b"{}", headers)[0] == 200
    wire.server.data("DELETE", f"/keys/{key_id}")
    status, body = _call(wire, "POST", "/process.Process/List", b"{}", headers)
    assert status == 401, body
    status, body = _call(wire, "GET", "/files?path=/etc/hostname", None, headers)
    assert status == 401, body


def _frames(resp: http.client.HTTPResponse) -> Iterator[tuple[int, Any]]:
    """A Connect server stream's envelopes as they come: (flags, the JSON message)."""
    while len(head := resp.read(5)) == 5:
        flags, size = struct.unpack(">BI", head)
        yield flags, json.loads(resp.read(size))


# The rest of envd: watches, and the RPCs no SDK call above names.
_MORE_ENVD_ROUTES = [
    ("POST", "/filesystem.Filesystem/WatchDir", "application/connect+json", _envelope(b'{"path": "/tmp"}')),
    ("POST", "/filesystem.Filesystem/CreateWatcher", "application/json", b'{"path": "/tmp"}'),
    ("POST", "/filesystem.Filesystem/GetWatcherEvents", "application/json", b'{"watcherId": "w"}'),
    ("POST", "/filesystem.Filesystem/RemoveWatcher", "application/json", b'{"watcherId": "w"}'),
    ("POST", "/filesystem.Filesystem/Move", "application/json", b'{"source": "/etc/hostname", "destination": "/tmp/m"}'),
]


@pytest.mark.parametrize(("method", "path", "kind", "body"), _ENVD_ROUTES + _MORE_ENVD_ROUTES,
                         ids=[r[1] for r in _ENVD_ROUTES + _MORE_ENVD_ROUTES])
def test_the_traffic_token_opens_no_envd_route(wire: E2bServer, victim: dict[str, Any], method: str, path: str,
                                               kind: str, body: bytes | None) -> None:
    """E2B's trafficAccessToken is what a user hands out so that someone may reach a
    sandbox's ports. Before: it was the envd token itself, so sharing a port gave a shell and
    the sandbox's files. Now envd refuses it, saying what it is for, however it is sent."""
    sandbox_id, token = victim["sandboxID"], victim["trafficAccessToken"]
    for extra in ({}, {"E2b-Sandbox-Port": "49983"}, {"E2B-Traffic-Access-Token": token}):
        status, answer = _call(wire, method, path, body, {**_envd_headers(sandbox_id, token, kind), **extra})
        assert status == 401, (extra, answer)
        assert "X-Access-Token" in answer["message"] and "only the sandbox's ports" in answer["message"], answer


def _port_call(wire: E2bServer, sb: dict[str, Any], **tokens: str) -> Answer:
    """A request for port 49999 of a base sandbox at E2B_SANDBOX_URL: let in, it is a 404
    (its ports are served at their own hosts only); refused, a 401."""
    headers = {"E2b-Sandbox-Id": sb["sandboxID"], "E2b-Sandbox-Port": "49999",
               **{name.replace("_", "-"): value for name, value in tokens.items()}}
    return _call(wire, "GET", "/", None, headers)


def test_the_traffic_token_is_its_own_and_opens_the_ports(wire: E2bServer, victim: dict[str, Any],
                                                           attacker: tuple[str, dict[str, Any]]) -> None:
    """The create and connect answer a traffic token apart from the envd token, for the same
    key; either opens the sandbox's ports, and only its own sandbox's."""
    traffic, envd = victim["trafficAccessToken"], victim["envdAccessToken"]
    assert traffic != envd and traffic.rpartition(".")[0] == envd.rpartition(".")[0]
    for tokens in ({"E2B_Traffic_Access_Token": traffic}, {"X_Access_Token": envd},
                   {"X_Access_Token": envd, "E2B_Traffic_Access_Token": traffic}):
        status, answer = _port_call(wire, victim, **tokens)
        assert status == 404 and "at its own host only" in answer["message"], (tokens, answer)
    theirs = attacker[1]["trafficAccessToken"]
    for tokens in ({"E2B_Traffic_Access_Token": theirs}, {"X_Access_Token": envd, "E2B_Traffic_Access_Token": theirs},
                   {"X_Access_Token": theirs, "E2B_Traffic_Access_Token": traffic}):
        status, answer = _port_call(wire, victim, **tokens)
        assert status == 401 and "not a valid access token" in answer["message"], (tokens, answer)
    status, got = _control(wire, KEY, "POST", f"/sandboxes/{victim['sandboxID']}/connect", {})
    assert status == 200 and (got["envdAccessToken"], got["trafficAccessToken"]) == (envd, traffic), got


def test_a_revoked_keys_traffic_token_opens_no_port(wire: E2bServer, victim: dict[str, Any]) -> None:
    key_id, member = _key_of(wire, "member")
    status, got = _control(wire, member, "POST", f"/sandboxes/{victim['sandboxID']}/connect", {})
    assert status == 200, got
    assert got["trafficAccessToken"].startswith(key_id + ".")
    assert _port_call(wire, victim, E2B_Traffic_Access_Token=got["trafficAccessToken"])[0] == 404
    wire.server.data("DELETE", f"/keys/{key_id}")
    status, answer = _port_call(wire, victim, E2B_Traffic_Access_Token=got["trafficAccessToken"])
    assert status == 401, answer


@pytest.mark.parametrize("rpc", ["process", "watch"])
def test_an_open_stream_tells_a_revoked_key_nothing_more(wire: E2bServer, victim: dict[str, Any], rpc: str) -> None:
    """envd's server streams (a command's output, a directory's changes) were authorized once,
    when they opened. Before: after the key was revoked (and its every call a 401), a stream it
    held open went on telling it what the sandbox's commands printed, or which files changed,
    for as long as it stayed open. Now the stream ends (``unauthenticated``) before it tells
    anything more."""
    key_id, member = _key_of(wire, "member")
    status, got = _control(wire, member, "POST", f"/sandboxes/{victim['sandboxID']}/connect", {})
    assert status == 200, got
    headers = _envd_headers(victim["sandboxID"], got["envdAccessToken"], "application/connect+json")
    ticker = "i=0; while [ $i -lt 40 ]; do i=$((i+1)); echo tick-$i; touch /tmp/watched/f$i; sleep 0.2; done"
    _call(wire, "POST", "/process.Process/Start",
          _envelope(b'{"process": {"cmd": "/bin/sh", "args": ["-c", "mkdir -p /tmp/watched"]}}'), headers)
    url = urllib.parse.urlsplit(wire.url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
    try:
        if rpc == "process":
            body = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", ticker]}}).encode()
            conn.request("POST", "/process.Process/Start", body=_envelope(body), headers=headers)
        else:
            conn.request("POST", "/filesystem.Filesystem/WatchDir",
                         body=_envelope(b'{"path": "/tmp/watched"}'), headers={**headers, "Keepalive-Ping-Interval": "1"})
            background = f"({ticker}) >/dev/null 2>&1 &"  # Start's stream ends as sh does
            _call(wire, "POST", "/process.Process/Start",
                  _envelope(json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", background]}}).encode()),
                  _envd_headers(victim["sandboxID"], victim["envdAccessToken"], "application/connect+json"))
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        frames = _frames(resp)
        told = lambda f: "data" in str(f[1]) or "filesystem" in f[1]  # noqa: E731
        while not told(next(frames)):  # the stream runs: it tells what happens
            pass
        wire.server.data("DELETE", f"/keys/{key_id}")
        assert _call(wire, "POST", "/process.Process/List", b"{}", _envd_headers(
            victim["sandboxID"], got["envdAccessToken"]))[0] == 401
        # The files made by now may have been told before the revocation took (its request can
        # take a while on a loaded machine); none made after may be.
        status, listed = _call(wire, "POST", "/filesystem.Filesystem/ListDir", b'{"path": "/tmp/watched"}',
                               _envd_headers(victim["sandboxID"], victim["envdAccessToken"]))
        assert status == 200, listed
        made_before = {entry["name"] for entry in listed.get("entries", [])}
        time.sleep(0.5)  # the sandbox goes on: its next ticks and files
        after: list[tuple[str, Any]] = []
        deadline = time.monotonic() + 5  # keep-alives would hold a watch open for ever
        for flags, message in frames:
            if flags & 2:  # the end of the stream
                after.append(("end", message))
                break
            after.append(("msg", message))
            if time.monotonic() > deadline:
                break
        # What was in flight as the key was revoked may still come; nothing told 0.5 s later,
        # and of the watch nothing about a file made after the revocation.
        late = [m for kind, m in after[-3:] if kind == "msg" and told((0, m))] if rpc == "process" else [
            m for kind, m in after if kind == "msg" and "filesystem" in m
            and m["filesystem"]["name"].rsplit("/", 1)[-1] not in made_before]
        assert after and after[-1][0] == "end" and not late, after[-5:]
        assert after[-1][1]["error"]["code"] == "unauthenticated", after[-1]
    finally:
        conn.close()


def test_a_download_under_way_ends_when_its_key_is_revoked(wire: E2bServer, victim: dict[str, Any]) -> None:
    """``GET /files`` of a large file, read slowly, was judged when it began. Before: after the
    key was revoked (its every new call a 401) the download went on to the file's last byte.
    Now it breaks off (api/refusals.py): what the socket buffers held may still come, not the
    file."""
    big = 64 * 2**20
    make = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", f"head -c {big} /dev/urandom > /tmp/big"]}})
    status, _ = _call(wire, "POST", "/process.Process/Start", _envelope(make.encode()),
                      _envd_headers(victim["sandboxID"], victim["envdAccessToken"], "application/connect+json"))
    assert status == 200
    key_id, member = _key_of(wire, "member")
    status, got = _control(wire, member, "POST", f"/sandboxes/{victim['sandboxID']}/connect", {})
    assert status == 200, got
    headers = _envd_headers(victim["sandboxID"], got["envdAccessToken"])
    url = urllib.parse.urlsplit(wire.url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
    received = 0
    try:
        conn.request("GET", "/files?path=/tmp/big", headers=headers)
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        received += len(resp.read(2**16))  # under way, read slowly
        wire.server.data("DELETE", f"/keys/{key_id}")
        assert _call(wire, "GET", "/files?path=/etc/hostname", None, headers)[0] == 401
        time.sleep(2.0)
        ended: Exception | None = None
        try:
            while chunk := resp.read(2**20):
                received += len(chunk)
        except (http.client.IncompleteRead, ConnectionError) as err:
            ended = err
    finally:
        conn.close()
    assert received < big and ended is not None, f"{received} bytes of {big} reached a revoked key ({ended!r})"
    assert received <= 16 * 2**20, f"{received} bytes reached a revoked key: more than the socket buffers hold"


def test_a_killed_sandboxs_token_opens_nothing(wire: E2bServer) -> None:
    sb = _create(wire, KEY)
    assert _control(wire, KEY, "DELETE", f"/sandboxes/{sb['sandboxID']}")[0] == 204
    headers = _envd_headers(sb["sandboxID"], sb["envdAccessToken"])
    for path, body in [("/filesystem.Filesystem/Stat", b'{"path": "/etc/hostname"}'),
                       ("/process.Process/List", b"{}")]:
        status, answer = _call(wire, "POST", path, body, headers)
        assert status == 404, (path, answer)
        assert answer["code"] == "not_found", answer
    status, answer = _call(wire, "GET", "/files?path=/etc/hostname", None, headers)
    assert status == 404, answer


# ------------------------------------------------------------------ the codec


@pytest.mark.parametrize(("kind", "body", "words"), [
    ("application/json", b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
    ("application/json", b'{"depth": ' + b"9" * 5000 + b"}", "body"),
    ("application/json", b'{"path": "/", "depth": "\xc2\xb2"}', "depth"),
    ("application/json", b'{"path": "/", "depth": "--5"}', "depth"),
    ("application/json", b'{"path": "/", "depth": "' + b"9" * 5000 + b'"}', "depth"),  # int() refuses 4,301+
    ("application/json", b'{"path": "/", "depth": "-' + b"9" * 5000 + b'"}', "depth"),
    ("application/json", b'{"path": "/", "depth": NaN}', "NaN|nan"),
    ("application/json", b'{"path": "/\\u0000x"}', "NUL|path"),
    ("application/proto", b"\x0a\xff\xff\xff\xff\x0f", "runs past the end"),
    ("application/proto", b"\x0a" + b"\xff" * 20, "varint"),
    ("application/proto", b"\x0b\x0c", "wire type"),
    ("application/proto", b"\x12\x02\x0a", "runs past the end"),
    ("text/plain", b"{}", "Content-Type"),
])
def test_a_malformed_message_is_a_clear_4xx(wire: E2bServer, victim: dict[str, Any], kind: str, body: bytes,
                                            words: str) -> None:
    status, answer = _call(wire, "POST", "/filesystem.Filesystem/ListDir", body,
                           _envd_headers(victim["sandboxID"], victim["envdAccessToken"], kind))
    assert 400 <= status < 500, answer
    assert answer["code"] in ("invalid_argument", "resource_exhausted"), answer
    assert re.search(words, answer["message"]), answer


@pytest.mark.parametrize(("body", "headers", "status", "words"), [
    (struct.pack(">BI", 0, 2**32 - 1) + b"{}", {}, 429, "the envelope says 4294967295 bytes"),  # resource_exhausted
    (_envelope(b'{"process": {"cmd": "/bin/true"}}', flags=1), {}, 400, "compressed"),
    (b"\x00\x00", {}, 400, "five-byte envelope"),
    (_envelope(b"{}") + _envelope(b"{}"), {}, 400, "exactly one request message"),
    (_envelope(b"{}"), {"Connect-Content-Encoding": "gzip"}, 400, "uncompressed"),
    (_envelope(b'{"process": {"cmd": "/bin/true"}}'), {"Connect-Timeout-Ms": "\u00b2"}, 400, "Connect-Timeout-Ms"),
])
def test_a_bad_envelope_is_a_clear_4xx(wire: E2bServer, victim: dict[str, Any], body: bytes,
                                      headers: dict[str, str], status: int, words: str) -> None:
    sent = {**_envd_headers(victim["sandboxID"], victim["envdAccessToken"], "application/connect+json"), **headers}
    sent = {k: v.encode().decode("latin-1") for k, v in sent.items()}
    got, answer = _call(wire, "POST", "/process.Process/Start", body, sent)
    assert got == status, answer
    assert words in answer["message"], answer


def _raw_connection(wire: E2bServer) -> socket.socket:
    url = urllib.parse.urlsplit(wire.url)
    return socket.create_connection((url.hostname or "127.0.0.1", url.port), timeout=60)


def _head(victim: dict[str, Any], path: str, kind: str, extra: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: {victim['sandboxID']}\r\n"
            f"X-Access-Token: {victim['envdAccessToken']}\r\nContent-Type: {kind}\r\n{extra}"
            "Connection: close\r\n\r\n").encode()


def _answer_of(sock: socket.socket) -> tuple[int, bytes]:
    """The answer, once it has all come (the server may keep the socket a while longer,
    reading what the client still sends: aiohttp's lingering)."""
    raw = b""
    while chunk := sock.recv(65536):
        raw += chunk
        head, found, body = raw.partition(b"\r\n\r\n")
        size = re.search(rb"(?i)content-length: *(\d+)", head)
        if found and size and len(body) >= int(size.group(1)):
            break
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_a_message_that_arrives_in_pieces_is_read_whole(wire: E2bServer, victim: dict[str, Any]) -> None:
    """A body in several TCP segments (or chunks) is one message, not its first piece."""
    body = json.dumps({"path": "/" + "a/" * 2000 + "b"}).encode()
    with _raw_connection(wire) as sock:
        sock.sendall(_head(victim, "/filesystem.Filesystem/Stat", "application/json",
                           f"Content-Length: {len(body)}\r\n"))
        sock.sendall(body[:100])
        time.sleep(0.5)
        sock.sendall(body[100:])
        status, answer = _answer_of(sock)
    assert status == 404, answer  # the whole path was read: no such file (not "not JSON")
    assert b"\"not_found\"" in answer, answer
    with _raw_connection(wire) as sock:
        sock.sendall(_head(victim, "/filesystem.Filesystem/Stat", "application/json", "Transfer-Encoding: chunked\r\n"))
        for piece in (body[:50], body[50:]):
            sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            time.sleep(0.3)
        sock.sendall(b"0\r\n\r\n")
        status, answer = _answer_of(sock)
    assert status == 404, answer


def test_a_message_that_never_ends_is_refused_in_bounded_time(wire: E2bServer, victim: dict[str, Any]) -> None:
    with _raw_connection(wire) as sock:
        sock.sendall(_head(victim, "/process.Process/List", "application/json", "Content-Length: 100\r\n"))
        sock.sendall(b"{")
        began = time.monotonic()
        status, answer = _answer_of(sock)
    assert status == 400, answer
    assert b"did not arrive whole (1 bytes came" in answer, answer
    assert time.monotonic() - began < BODY_IDLE + 10


@pytest.mark.parametrize("name", ["limit", "nextToken"])
def test_a_listing_paged_in_unicode_digits_is_a_400(wire: E2bServer, name: str) -> None:
    status, answer = _control(wire, KEY, "GET", f"/sandboxes?{name}=%C2%B2")
    assert status == 400, answer
    assert answer["message"].startswith(f"{name}: "), answer


def test_the_port_relay_passes_no_cookie_the_sandbox_sets() -> None:
    """What answers on the interpreter's port is the sandbox's to choose; this listener shares
    its host with hutch's API, so a Set-Cookie from it never reaches the client."""
    from hutch.api.e2b import ports

    upstream = [("Content-Type", "application/json"), ("Set-Cookie", "hutch_session=attacker; Domain=example.com"),
                ("set-cookie2", "x=1"), ("SET-COOKIE", "y=2; Path=/"), ("X-Kernel", "k1")]
    assert ports.answer_headers(upstream) == [("Content-Type", "application/json"), ("X-Kernel", "k1")]


def test_one_organizations_idempotency_keys_never_evict_anothers() -> None:
    """The keys are kept in memory, bounded; an organization making keys by the thousand
    forgets its own oldest, never another's: A's retry still finds A's sandbox."""
    from hutch.api.e2b import idempotency

    async def scenario() -> None:
        table = idempotency.IdempotentCreates()
        made: list[str] = []

        async def create(name: str) -> str:
            made.append(name)
            return name

        assert await table.once("org_a", "retry-me", lambda: create("sbx_a")) == ("sbx_a", True)
        for n in range(idempotency.MAX_KEYS_PER_ORG + 50):
            await table.once("org_b", f"k{n}", lambda n=n: create(f"sbx_b{n}"))  # type: ignore[misc]
        assert await table.once("org_a", "retry-me", lambda: create("sbx_a_again")) == ("sbx_a", False)
        assert "sbx_a_again" not in made
        assert await table.once("org_b", "k0", lambda: create("sbx_b0_again")) == ("sbx_b0_again", True)
        assert table.size("org_b") <= idempotency.MAX_KEYS_PER_ORG

    asyncio.run(scenario())


def _start(wire: E2bServer, sb: dict[str, Any], *argv: str) -> bytes:
    message = json.dumps({"process": {"cmd": argv[0], "args": list(argv[1:])}}).encode()
    status, answer = _call(wire, "POST", "/process.Process/Start", _envelope(message),
                           _envd_headers(sb["sandboxID"], sb["envdAccessToken"], "application/connect+json"))
    assert status == 200, answer
    assert b'"exitCode"' not in answer or b'"exitCode": 0' in answer or b'"exited": true' in answer, answer
    return bytes(answer)


@pytest.mark.parametrize("path", ["/dev/zero", "/tmp/zero-link", "/tmp/fifo", "/proc/self/pagemap"])
def test_a_download_of_an_endless_file_is_not_held(wire: E2bServer, victim: dict[str, Any], path: str) -> None:
    """A device, a link to one, a FIFO nobody writes, a /proc file of 512 GiB: refused, or
    streamed as read (never read whole into the server's memory, never a hang)."""
    _start(wire, victim, "/bin/sh", "-c", "ln -sf /dev/zero /tmp/zero-link; [ -p /tmp/fifo ] || mkfifo /tmp/fifo")
    url = urllib.parse.urlsplit(wire.url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=60)
    began = time.monotonic()
    try:
        conn.request("GET", f"/files?path={path}", headers=_envd_headers(victim["sandboxID"],
                                                                          victim["envdAccessToken"]))
        resp = conn.getresponse()
        first = resp.read(2**20) if resp.status == 200 else resp.read()
    finally:
        conn.close()
    refused = 400 <= resp.status < 500 and f"path: {path}".encode() in first  # a clear refusal naming it
    assert refused or (resp.status == 200 and len(first) == 2**20), (resp.status, first[:200])
    assert time.monotonic() - began < 30
    status, _ = _call(wire, "GET", "/health", None, _envd_headers(victim["sandboxID"], victim["envdAccessToken"]))
    assert status == 204


def _start_detached(wire: E2bServer, sb: dict[str, Any], message: dict[str, Any]) -> tuple[int, bytes]:
    """A Start whose stream is left after its first bytes (the command goes on, as envd's)."""
    url = urllib.parse.urlsplit(wire.url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=60)
    try:
        conn.request("POST", "/process.Process/Start", _envelope(json.dumps(message).encode()),
                     _envd_headers(sb["sandboxID"], sb["envdAccessToken"], "application/connect+json"))
        resp = conn.getresponse()
        return resp.status, resp.read(5) if resp.status == 200 else resp.read()
    finally:
        conn.close()


def test_live_commands_per_sandbox_are_bounded(wire: E2bServer) -> None:
    """Each live command holds server descriptors: a sandbox gets MAX_LIVE, then a clear
    resource_exhausted; ending one makes room again."""
    from hutch.api.e2b import processes

    sb = _create(wire, KEY)
    try:
        sleep = {"process": {"cmd": "/bin/sleep", "args": ["600"]}}
        for n in range(processes.MAX_LIVE):
            status, first = _start_detached(wire, sb, {**sleep, "tag": f"t{n}"} if n else {**sleep, "tag": "first"})
            assert status == 200, (n, first)
        status, answer = _start_detached(wire, sb, {**sleep, "pty": {"size": {"rows": 5, "cols": 5}}})
        assert status == 429, answer
        assert b"256 commands and terminals running" in answer, answer
        status, answer = _call(wire, "POST", "/process.Process/SendSignal",
                               b'{"process": {"tag": "first"}, "signal": "SIGNAL_SIGKILL"}',
                               _envd_headers(sb["sandboxID"], sb["envdAccessToken"]))
        assert status == 200, answer
        deadline = time.monotonic() + 30
        while (status := _start_detached(wire, sb, sleep)[0]) == 429 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert status == 200
    finally:
        _control(wire, KEY, "DELETE", f"/sandboxes/{sb['sandboxID']}")


def test_live_commands_started_at_once_are_bounded_too(wire: E2bServer) -> None:
    """MAX_LIVE holds for Starts that arrive together (each was checked before any was
    counted: 300 at once made 300 live commands), and what the server keeps of each live
    command (its argv, env and tag, for List) is bounded per sandbox: 16 tags of 4 MiB held
    150 MiB of the server's memory."""
    from concurrent.futures import ThreadPoolExecutor

    from hutch.api.e2b import processes

    sb = _create(wire, KEY)
    try:
        sleep = {"process": {"cmd": "/bin/sleep", "args": ["600"]}}
        with ThreadPoolExecutor(64) as pool:
            answers = list(pool.map(lambda n: _start_detached(wire, sb, {**sleep, "tag": f"t{n}"}),
                                    range(processes.MAX_LIVE + 40)))
        assert sum(status == 200 for status, _ in answers) == processes.MAX_LIVE, [a for a in answers if a[0] != 429]
        assert all(b"256 commands and terminals running" in body for status, body in answers if status != 200)
        status, listed = _call(wire, "POST", "/process.Process/List", b"{}", _envd_headers(sb["sandboxID"],
                                                                                         sb["envdAccessToken"]))
        assert status == 200 and len(listed["processes"]) == processes.MAX_LIVE
    finally:
        _control(wire, KEY, "DELETE", f"/sandboxes/{sb['sandboxID']}")
    sb = _create(wire, KEY)
    try:
        big = {"process": {"cmd": "/bin/sleep", "args": ["600"]}, "tag": "x" * (3 * 2**20)}
        status, body = _start_detached(wire, sb, big)
        assert status == 400 and b"tag: at most" in body, body
        held = {"process": {"cmd": "/bin/sh", "args": ["-c", "sleep 600", "x" * 100_000], "envs": {"E": "y" * 100_000}}}
        answers = [_start_detached(wire, sb, held) for _ in range(processes.MAX_KEPT_BYTES // 200_000 + 2)]
        assert answers[0][0] == 200 and answers[-1][0] == 429, answers[-1]
        assert b"keeps at most" in answers[-1][1], answers[-1]
    finally:
        _control(wire, KEY, "DELETE", f"/sandboxes/{sb['sandboxID']}")


@pytest.mark.parametrize("path", ["/dev/full", "/proc/sysrq-trigger", "/etc/passwd/x", "/dev/zero-link-dir/x"])
def test_an_upload_that_cannot_be_written_is_a_clear_refusal(wire: E2bServer, victim: dict[str, Any],
                                                             path: str) -> None:
    """A full disk (/dev/full answers ENOSPC), a kernel file, a path under a file: each a 4xx
    naming the path, never a 500, and the sandbox goes on."""
    status, answer = _call(wire, "POST", f"/files?path={path}", b"x" * 2**20,
                           _envd_headers(victim["sandboxID"], victim["envdAccessToken"], "application/octet-stream"))
    assert 400 <= status < 500, answer
    assert path.split("/")[1] in answer["message"], answer
    status, _ = _call(wire, "GET", "/health", None, _envd_headers(victim["sandboxID"], victim["envdAccessToken"]))
    assert status == 204


def test_streams_following_one_command_are_bounded(wire: E2bServer, victim: dict[str, Any]) -> None:
    """Each stream that follows a command holds what it fell behind by until its connection
    dies: MAX_FOLLOWERS at once per command, then a clear resource_exhausted; closing
    them makes room."""
    from hutch.api.e2b import processes

    url = urllib.parse.urlsplit(wire.url)
    held: list[http.client.HTTPConnection] = []

    def stream(path: str, message: dict[str, Any]) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=60)
        conn.request("POST", path, _envelope(json.dumps(message).encode()),
                     _envd_headers(victim["sandboxID"], victim["envdAccessToken"], "application/connect+json"))
        resp = conn.getresponse()
        if resp.status != 200:
            body = resp.read()
            conn.close()
            return resp.status, body
        held.append(conn)
        return 200, resp.read(5)

    try:
        assert stream("/process.Process/Start", {"process": {"cmd": "/bin/sleep", "args": ["600"]},
                                                 "tag": "followed"})[0] == 200
        for _ in range(processes.MAX_FOLLOWERS - 1):
            status, body = stream("/process.Process/Connect", {"process": {"tag": "followed"}})
            assert status == 200, body
        status, body = stream("/process.Process/Connect", {"process": {"tag": "followed"}})
        assert status == 429, body
        assert b"16 streams following it" in body, body
    finally:
        for conn in held:
            conn.close()
        _call(wire, "POST", "/process.Process/SendSignal", b'{"process": {"tag": "followed"}, "signal": "SIGNAL_SIGKILL"}',
              _envd_headers(victim["sandboxID"], victim["envdAccessToken"]))


@pytest.mark.parametrize("content", [b"\xff\xfe not UTF-8", b"x" * 2**30, b"t" * 40])
def test_the_interpreter_token_file_the_sandbox_rewrote_is_read_bounded(content: bytes) -> None:
    """After a restart the relay reads the interpreter's token back from the sandbox, whose code
    may have replaced the file: a huge one is not read whole into the server (a sparse 100 GiB
    file costs the sandbox nothing), bytes that are not text are no 500; the interpreter then
    refuses the relayed request, as for a token it did not make."""
    from types import SimpleNamespace

    from aiohttp import web

    from hutch.api.e2b import ports
    from hutch.api.keys import ENGINE

    served = []

    async def read(sandbox_id: str, path: str) -> Any:
        for at in range(0, len(content), 2**16):
            served.append(at)
            yield content[at:at + 2**16]

    app = web.Application()
    app[ENGINE] = SimpleNamespace(files=SimpleNamespace(read=read))  # type: ignore[misc]
    app[ports.TOKENS] = {}
    token = asyncio.run(ports._token(app, "sbx_x"))
    assert token == ("t" * 40 if content == b"t" * 40 else "")
    assert len(served) <= 2


def test_input_a_command_does_not_read_is_held_back_then_refused(wire: E2bServer, victim: dict[str, Any]) -> None:
    """SendInput to a command that does not read its stdin queued 16 messages of up to 4 MiB
    each at once (64 MiB of server memory per command, 256 commands per sandbox); to a
    terminal whose program reads nothing it waited for ever. Now stdin is queued by bytes and
    both wait STDIN_WAIT_SECONDS, then answer resource_exhausted saying what was taken."""
    from concurrent.futures import ThreadPoolExecutor

    sleep = {"process": {"cmd": "/bin/sleep", "args": ["600"]}}
    assert _start_detached(wire, victim, {**sleep, "stdin": True, "tag": "deaf"})[0] == 200
    raw_tty = {"process": {"cmd": "/bin/sh", "args": ["-c", "stty raw -echo; sleep 600"]},  # raw: nothing discarded
               "pty": {"size": {"rows": 5, "cols": 5}}, "tag": "deaf-pty"}
    assert _start_detached(wire, victim, raw_tty)[0] == 200
    time.sleep(1)  # stty has run
    raw = b"\0" * (3 * 2**20 - 2**16)  # as much as a 4 MiB JSON message holds
    headers = _envd_headers(victim["sandboxID"], victim["envdAccessToken"])

    def send(tag: str, stream: str) -> tuple[Answer, float]:
        began = time.monotonic()
        body = json.dumps({"process": {"tag": tag}, "input": {stream: base64.b64encode(raw).decode()}}).encode()
        return _call(wire, "POST", "/process.Process/SendInput", body, headers, timeout=90), time.monotonic() - began

    try:
        with ThreadPoolExecutor(2) as pool:
            (stdin, stdin_took), (pty, pty_took) = pool.map(send, ["deaf", "deaf-pty"], ["stdin", "pty"])
        assert stdin[0] == 429 and stdin_took >= STDIN_WAIT, (stdin, stdin_took, pty, pty_took)
        assert re.search(rf"\d+ of the {len(raw)} bytes sent were taken", stdin[1]["message"]), stdin
        assert pty[0] == 429 and pty_took >= STDIN_WAIT, pty
        assert "terminal has not read its input" in pty[1]["message"], pty
    finally:
        for tag in ("deaf", "deaf-pty"):
            _call(wire, "POST", "/process.Process/SendSignal",
                  json.dumps({"process": {"tag": tag}, "signal": "SIGNAL_SIGKILL"}).encode(), headers)


@pytest.mark.parametrize("where", ["token", "key id", "sandbox"])
def test_a_credential_that_is_not_ascii_is_refused_not_a_500(wire: E2bServer, victim: dict[str, Any],
                                                             where: str) -> None:
    token, sandbox_id = victim["envdAccessToken"], victim["sandboxID"]
    key_id, _, mac = token.rpartition(".")
    if where == "token":
        token = f"{key_id}.{mac[:-1]}\u00e9"
    elif where == "key id":
        token = f"{key_id}\u00e9.{mac}"
    else:
        sandbox_id += "\u00e9"
    headers = {"E2b-Sandbox-Id": sandbox_id, "X-Access-Token": token, "Content-Type": "application/json"}
    for extra in ({}, {"E2b-Sandbox-Port": "49999"}):
        sent = {k: v.encode().decode("latin-1") for k, v in {**headers, **extra}.items()}
        status, answer = _call(wire, "POST", "/process.Process/List", b"{}", sent)
        assert status == 401, answer
        assert "not a valid access token" in answer["message"], answer


def test_an_api_key_that_is_not_ascii_is_refused_not_a_500(wire: E2bServer) -> None:
    for raw in (KEY.encode() + "\u00e9".encode(), "\u00e9".encode(), b"hk_\xff"):  # UTF-8, and not even that
        status, answer = _call(wire, "GET", "/sandboxes", None, {"X-API-Key": raw.decode("latin-1")})
        assert status == 401, (raw, answer)


@pytest.mark.parametrize("query", ["path=%ff%fe", "path=%00", "path=", "", "path=" + "a" * 5000])
def test_a_download_path_that_is_no_path_is_a_clear_4xx(wire: E2bServer, victim: dict[str, Any], query: str) -> None:
    status, answer = _call(wire, "GET", f"/files?{query}", None,
                           _envd_headers(victim["sandboxID"], victim["envdAccessToken"]))
    assert 400 <= status < 500, answer
    assert "path" in answer["message"], answer


def _sent_slowly(server: E2bServer, path: str, headers: dict[str, str], first: bytes, rest: bytes,
                 between: Any) -> Answer:
    """A request whose body's ``first`` bytes go at once and its ``rest`` after ``between()``."""
    url = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=60)
    try:
        conn.putrequest("POST", path)
        for name, value in {**headers, "Content-Length": str(len(first) + len(rest))}.items():
            conn.putheader(name, value)
        conn.endheaders(first)
        time.sleep(0.5)  # the headers are in: the key checked
        between()
        conn.send(rest)
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    try:
        return resp.status, json.loads(raw) if raw else None
    except ValueError:
        return resp.status, raw


@pytest.mark.parametrize("route", ["/files", "/process.Process/Start"])
def test_a_body_that_ends_after_its_keys_revocation_does_nothing(wire: E2bServer, victim: dict[str, Any],
                                                                 route: str) -> None:
    """envd's calls were authorized on their headers; a body may come as slowly as its sender
    likes (an upload for as long as it lasts, a Connect message for up to a minute). Before: a
    file upload, or a command's Start, begun before the key's revocation and finished after
    wrote its file (every byte sent after included) or ran its command."""
    key_id, member = _key_of(wire, "member")
    status, got = _control(wire, member, "POST", f"/sandboxes/{victim['sandboxID']}/connect", {})
    assert status == 200, got
    target = f"/tmp/after-revocation-{route.rsplit('/', 1)[-1].lower()}"
    if route == "/files":
        path, kind, body = f"/files?path={target}", "application/octet-stream", b"before-" + b"after" * 1000
    else:
        message = json.dumps({"process": {"cmd": "/bin/touch", "args": [target]}}).encode()
        path, kind, body = route, "application/connect+json", _envelope(message)
    status, answer = _sent_slowly(wire, path, _envd_headers(victim["sandboxID"], got["envdAccessToken"], kind),
                                  body[:7], body[7:], lambda: wire.server.data("DELETE", f"/keys/{key_id}"))
    assert status == 401 or (status == 200 and "unauthenticated" in str(answer)), (status, answer)
    status, listed = _call(wire, "POST", "/filesystem.Filesystem/ListDir", b'{"path": "/tmp"}',
                           _envd_headers(victim["sandboxID"], victim["envdAccessToken"]))
    assert status == 200, listed
    sizes = {e["name"]: e.get("size") for e in listed.get("entries", [])}
    # What was sent before the revocation may have landed (an upload writes as it comes), nothing after.
    assert sizes.get(target.rsplit("/", 1)[-1]) in (None, "7" if route == "/files" else None), sizes


_DIGITS = "9" * 5000  # past Python's int() digit limit (4,300): int() raises ValueError


@pytest.mark.parametrize(("path", "name"), [("/sandboxes", "limit"), ("/v2/sandboxes", "limit"),
                                            ("/snapshots", "limit"), ("/snapshots", "nextToken")])
@pytest.mark.parametrize("value", [_DIGITS, str(2**63), "1" + "0" * 4000 + "1"], ids=["5000-digits", "2^63", "4002"])
def test_a_listing_paged_by_a_huge_number_is_a_400(wire: E2bServer, path: str, name: str, value: str) -> None:
    status, answer = _control(wire, KEY, "GET", f"{path}?{name}={value}")
    assert status == 400, answer
    assert answer["message"].startswith(f"{name}: "), answer


@pytest.mark.parametrize("value", [str(10**17), "0" * 4000 + "1"])
def test_a_snapshot_listing_past_its_end_is_an_empty_page(wire: E2bServer, value: str) -> None:
    status, answer = _control(wire, KEY, "GET", f"/snapshots?nextToken={value}")
    assert (status, answer) == (200, []), answer


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize("token", [
    "0", "1", "%00", "====", "a" * 4000, "9" * 5000, _b64(b"\xff\xfe"), _b64(b"no-space"), _b64(b"a b c"),
    _b64(b"2026-01-01T00:00:00 sbx_x"),  # no timezone
    _b64(b"2026-01-01T00:00:00Z other_x"), _b64(b"yesterday sbx_x"), _b64(b"2026-13-01T00:00:00Z sbx_x"),
    _b64(b"9999-12-31T23:59:59-23:59 sbx_x"), _b64(b"0001-01-01T00:00:00+23:59 sbx_x"),
], ids=lambda t: t[:24])
def test_a_forged_listing_token_is_a_400_or_a_page_never_a_500(wire: E2bServer, token: str) -> None:
    status, answer = _control(wire, KEY, "GET", f"/sandboxes?nextToken={token}")
    assert status in (200, 400), answer
    if status == 400:
        assert answer["message"].startswith("nextToken: "), answer


def test_another_organizations_listing_token_shows_only_ones_own(wire: E2bServer, victim: dict[str, Any],
                                                                 attacker: tuple[str, dict[str, Any]]) -> None:
    """A token is only a place in the order (a start and an id): B's token, or one forged to name
    A's sandbox, pages B's own listing and never shows A's sandbox."""
    key, own = attacker
    status, listed = _control(wire, KEY, "GET", "/sandboxes")
    assert status == 200, listed
    started = next(sb["startedAt"] for sb in listed if sb["sandboxID"] == victim["sandboxID"])
    sid = victim["sandboxID"] if victim["sandboxID"].startswith("sbx_") else f"sbx_{victim['sandboxID']}"
    just_after = _b64(f"{started.replace('Z', '+00:00')} {sid}~".encode())  # A's sandbox is next in asc
    everything = [(_b64(b"2000-01-01T00:00:00Z sbx_0"), "asc"), (_b64(b"9999-01-01T00:00:00Z sbx_z"), "desc")]
    for token, order in [(just_after, "desc"), (just_after, "asc"), *everything]:
        status, page = _control(wire, key, "GET", f"/sandboxes?order={order}&nextToken={token}")
        assert status == 200, page
        ids = {sb["sandboxID"] for sb in page}
        assert victim["sandboxID"] not in ids, page
        if (token, order) in everything:  # a place before all: B's own are listed
            assert own["sandboxID"] in ids, page


@pytest.mark.parametrize("name", ["start", "end"])
def test_metrics_asked_from_a_huge_time_are_a_400(wire: E2bServer, victim: dict[str, Any], name: str) -> None:
    status, answer = _control(wire, KEY, "GET", f"/sandboxes/{victim['sandboxID']}/metrics?{name}={_DIGITS}")
    assert status == 400, answer
    assert answer["message"].startswith(f"{name}: "), answer
