"""E2B's host routing over TLS (api/e2b/hosts.py, tls.py) and envd's signed file URLs
(api/e2b/signed.py): the SDK found by ``E2B_DOMAIN`` alone, as E2B's cloud is, reaching each
sandbox at ``https://{port}-{id}.{domain}`` under the server's own CA; and what an attacker
meets there. One embedded-profile server for the module: routing is the API's, not the log's."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography import x509

from hutch.api.e2b.signed import signature
from tests.e2b.conftest import E2bServer
from tests.system.server import KEY


@pytest.fixture(scope="module")
def served(e2b_embedded_server: E2bServer) -> E2bServer:
    return e2b_embedded_server


def _sdk(served: E2bServer, script: str) -> dict[str, Any]:
    """``script`` run by E2B's SDK in a process of its own, configured by the domain alone
    (the SDK keeps one TLS pool per process, made with the trust store of its first use).
    The script prints one JSON line: what it found."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(served.domain_env(), PYTHONPATH="")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _tls() -> ssl.SSLContext:
    return ssl.create_default_context()


def _get(served: E2bServer, url: str, method: str = "GET", body: bytes | None = None,
         **headers: str) -> tuple[int, Any]:
    context = ssl.create_default_context(cafile=str(served.ca_file))
    req = urllib.request.Request(url, data=body, method=method,
                                 headers={k.replace("_", "-"): v for k, v in headers.items()})
    try:
        with urllib.request.urlopen(req, timeout=60, context=context) as resp:
            raw = resp.read()
            return resp.status, raw
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def sandbox(served: E2bServer) -> Iterator[dict[str, str]]:
    """A sandbox made by the SDK over the domain, with a file in its home: its id and tokens."""
    found = _sdk(served, """
        import json
        from e2b import Sandbox
        sbx = Sandbox.create(timeout=300)
        sbx.files.write("note.txt", "over https")
        print(json.dumps({"id": sbx.sandbox_id, "token": sbx._envd_access_token, "traffic": sbx.traffic_access_token,
                          "host": sbx.get_host(49983),
                          "envd": sbx.envd_api_url, "out": sbx.commands.run("cat note.txt; whoami").stdout}))
    """)
    yield found
    served.call("DELETE", f"/sandboxes/{found['id']}")


def test_the_sdk_finds_the_server_by_its_domain_alone(served: E2bServer, sandbox: dict[str, str]) -> None:
    """E2B_DOMAIN (with its port), E2B_API_KEY and the CA: the control plane at
    api.{domain}, envd at 49983-{id}.{domain} over TLS; the id is hutch's without its prefix
    (no underscore in a host name), and hutch's form is taken too."""
    sid = sandbox["id"]
    assert "_" not in sid
    assert sandbox["host"] == f"49983-{sid}.{served.domain}"
    assert sandbox["envd"] == f"https://49983-{sid}.{served.domain}"
    assert sandbox["out"] == "over httpsuser\n"  # the file has no newline
    assert served.server.data("GET", f"/sandbox/sbx_{sid}")["status"] in ("idle", "running")
    assert served.call("GET", f"/sandboxes/sbx_{sid}")[1]["sandboxID"] == sid


def test_the_certificate_is_the_servers_own_for_its_domain_only(served: E2bServer, sandbox: dict[str, str]) -> None:
    """A CA of the server's, kept private in its data directory and limited to the domain by a
    name constraint: a client that trusts it trusts it for nothing else."""
    domain = served.domain.split(":")[0]
    ca = x509.load_pem_x509_certificate(served.ca_file.read_bytes())
    constraint = ca.extensions.get_extension_for_class(x509.NameConstraints)
    assert constraint.critical and [n.value for n in constraint.value.permitted_subtrees or []] == [domain]
    assert os.stat(served.ca_file.parent / "ca-key.pem").st_mode & 0o777 == 0o600
    status, _ = _get(served, f"https://{sandbox['host']}/health", X_Access_Token=sandbox["token"])
    assert status == 204
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(f"https://{sandbox['host']}/health", timeout=30, context=_tls())


def test_signed_urls_download_and_upload(served: E2bServer) -> None:
    """download_url and upload_url, signed with the envd token (with and without an expiry),
    work without any header: the sandbox is the host's."""
    found = _sdk(served, """
        import json, urllib.request, httpx
        from e2b import Sandbox
        with Sandbox.create(timeout=120) as sbx:
            sbx.files.write("dl.txt", "signed")
            got = [urllib.request.urlopen(sbx.download_url("dl.txt", "user")).read().decode(),
                   urllib.request.urlopen(sbx.download_url("dl.txt", "user", 60)).read().decode()]
            up = httpx.post(sbx.upload_url("up.txt", "user", 60), files={"file": ("up.txt", b"uploaded")})
            print(json.dumps({"got": got, "up": up.status_code, "read": sbx.files.read("up.txt")}))
    """)
    assert found == {"got": ["signed", "signed"], "up": 200, "read": "uploaded"}


def _signed(served: E2bServer, sandbox: dict[str, str], path: str, operation: str = "read",
            token: str | None = None, expiration: int | None = None) -> str:
    sig = signature(path, operation, "user", token or sandbox["token"], expiration)
    query = {"path": path, "username": "user", "signature": sig}
    if expiration is not None:
        query["signature_expiration"] = str(expiration)
    return f"https://{sandbox['host']}/files?{urllib.parse.urlencode(query)}"


def test_a_signed_url_opens_only_what_it_signed(served: E2bServer, sandbox: dict[str, str]) -> None:
    """Expired, another path, another operation, another sandbox's token, another
    organization's key's token, a revoked key's: each a 401 in E2B's shape, nothing read."""
    assert _get(served, _signed(served, sandbox, "note.txt")) == (200, b"over https")
    expired = _signed(served, sandbox, "note.txt", expiration=int(time.time()) - 5)
    assert _get(served, expired) == (401, {"code": 401, "message": "signature is already expired"})
    tampered = _signed(served, sandbox, "note.txt").replace("note.txt", "other.txt", 1)
    status, answer = _get(served, tampered)
    assert status == 401 and "not a valid signature of read 'other.txt'" in answer["message"]
    # A read's signature does not write.
    read_sig = _signed(served, sandbox, "note.txt")
    assert _get(served, read_sig, "POST", b"x", Content_Type="application/octet-stream")[0] == 401
    # Another sandbox's token signs nothing here (the sandbox is the host's).
    other_token = served.call("POST", "/sandboxes", {"templateID": "base", "timeout": 60})[1]
    try:
        assert _get(served, _signed(served, sandbox, "note.txt", token=other_token["envdAccessToken"]))[0] == 401
    finally:
        served.call("DELETE", f"/sandboxes/{other_token['sandboxID']}")
    # A token of no key of the sandbox's organization signs nothing.
    forged = f"key_forged.{'0' * 48}"
    assert _get(served, _signed(served, sandbox, "note.txt", token=forged))[0] == 401
    assert _get(served, f"https://{sandbox['host']}/files?path=note.txt&signature=v1_short")[0] == 401
    status, answer = _get(served, f"https://{sandbox['host']}/files?path=note.txt")
    assert status == 401 and "X-Access-Token" in answer["message"]


def test_the_traffic_token_opens_no_envd_at_its_host(served: E2bServer, sandbox: dict[str, str]) -> None:
    """The traffic token (the one shared so that others may reach a port) at envd's host: as
    X-Access-Token, or signing a file URL, it reads and writes nothing. Before, it was the envd
    token."""
    traffic = sandbox["traffic"]
    assert traffic != sandbox["token"]
    status, answer = _get(served, f"https://{sandbox['host']}/files?path=note.txt", X_Access_Token=traffic)
    assert status == 401 and "only the sandbox's ports" in answer["message"], answer
    assert _get(served, _signed(served, sandbox, "note.txt", token=traffic))[0] == 401
    upload = _signed(served, sandbox, "planted.txt", "write", token=traffic)
    assert _get(served, upload, "POST", b"x", Content_Type="application/octet-stream")[0] == 401
    assert _get(served, f"https://{sandbox['host']}/files?path=planted.txt", X_Access_Token=sandbox["token"])[0] == 404

def test_a_signed_upload_writes_only_the_file_it_signed(served: E2bServer, sandbox: dict[str, str]) -> None:
    """upload_url(path) signs one path: a multipart body's further parts, named as the sender
    likes, must not write elsewhere (`../../tmp/x` wrote /tmp/x), nor a URL signed with no path
    write whatever its parts name."""
    boundary = "hutchsigned"

    def multipart(*names: str) -> bytes:
        parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
                 f"Content-Type: application/octet-stream\r\n\r\nby {name}\r\n" for name in names]
        return ("".join(parts) + f"--{boundary}--\r\n").encode()

    kind = f"multipart/form-data; boundary={boundary}"
    url = _signed(served, sandbox, "granted.txt", "write")
    status, answer = _get(served, url, "POST", multipart("granted.txt", "../../tmp/planted", "home-planted"),
                          Content_Type=kind)
    assert status == 400 and "writes the one file it signed" in answer["message"], answer
    assert "'../../tmp/planted'" in answer["message"], answer
    unsigned_path = _signed(served, sandbox, "", "write").replace("path=&", "")
    status, answer = _get(served, unsigned_path, "POST", multipart("home-planted"), Content_Type=kind)
    assert status == 400 and "names no file" in answer["message"], answer
    token = sandbox["token"]
    for path in ("/tmp/planted", "home-planted"):
        assert _get(served, f"https://{sandbox['host']}/files?path={path}", X_Access_Token=token)[0] == 404, path
    assert _get(served, f"https://{sandbox['host']}/files?path=granted.txt", X_Access_Token=token) == \
        (200, b"by granted.txt")  # what it signed, written as asked
    assert _get(served, url, "POST", multipart("any-name"), Content_Type=kind)[0] == 200  # one part: its path


def test_a_revoked_keys_signed_url_opens_nothing(served: E2bServer) -> None:
    """The signature is made with a token of a key: once the key is revoked, its URLs fail."""
    made = served.server.data("POST", "/keys", {"role": "admin"})
    code, sbx = served.call("POST", "/sandboxes", {"templateID": "base", "timeout": 60}, key=made["secret"])
    assert code == 201, sbx
    host = f"49983-{sbx['sandboxID']}.{served.domain}"
    url = _signed(served, {"host": host, "token": sbx["envdAccessToken"]}, "/etc/hostname")
    try:
        assert _get(served, url)[0] == 200
        served.server.data("DELETE", f"/keys/{made['id']}")
        assert _get(served, url)[0] == 401
    finally:
        served.call("DELETE", f"/sandboxes/{sbx['sandboxID']}")


def test_hosts_under_the_domain_serve_only_their_sandbox(served: E2bServer, sandbox: dict[str, str]) -> None:
    """No host under the domain but api.{domain} answers as the control plane; the envd host
    answers envd's paths only; a sandbox's port needs its token (403 without, E2B's answer);
    a header naming another sandbox than the host is refused."""
    domain = served.domain
    status, answer = _get(served, f"https://nothing.{domain}/sandboxes", X_API_Key=KEY)
    assert status == 404 and "not a sandbox's host" in answer["message"]
    status, answer = _get(served, f"https://{sandbox['host']}/sandboxes", X_API_Key=KEY)
    assert status == 404 and "not an envd endpoint" in answer["message"]
    assert _get(served, f"https://api.{domain}/sandboxes", X_API_Key=KEY)[0] == 200
    port_host = f"8080-{sandbox['id']}.{domain}"
    status, answer = _get(served, f"https://{port_host}/")
    assert status == 403 and "traffic access token" in answer["message"]
    assert _get(served, f"https://{port_host}/", E2B_Traffic_Access_Token="key_x.forged")[0] == 401
    status, answer = _get(served, f"https://{sandbox['host']}/health", E2b_Sandbox_Id="01m8m88jetv0pr7enjns71c27d")
    assert status == 400 and "is not the sandbox its host names" in answer["message"]


def test_a_url_signed_with_another_keys_token_works(served: E2bServer, sandbox: dict[str, str]) -> None:
    """A key of the organization other than the creator's, which got its own token by a
    connect, signs URLs too: the server tries the creator's key first, then the others."""
    other = served.server.data("POST", "/keys", {"role": "admin"})["secret"]
    code, got = served.call("POST", f"/sandboxes/{sandbox['id']}/connect", {"timeout": 300}, key=other)
    assert code in (200, 201), got
    assert got["envdAccessToken"] != sandbox["token"]
    assert _get(served, _signed(served, sandbox, "note.txt", token=got["envdAccessToken"])) == (200, b"over https")


def test_auto_resume_wakes_a_paused_sandbox_on_a_request_to_its_host(served: E2bServer) -> None:
    """lifecycle auto_resume: paused at its timeout, the sandbox wakes when a request reaches it
    through its host (a command over envd), with no connect first."""
    found = _sdk(served, """
        import json, time
        from e2b import Sandbox
        sbx = Sandbox.create(timeout=60, lifecycle={"on_timeout": "pause", "auto_resume": True})
        try:
            sbx.set_timeout(1)
            deadline = time.monotonic() + 30
            while sbx.get_info().state.value != "paused" and time.monotonic() < deadline:
                time.sleep(0.2)
            before = sbx.get_info().state.value
            out = sbx.commands.run("echo awake").stdout
            print(json.dumps({"before": before, "out": out, "after": sbx.get_info().state.value}))
        finally:
            sbx.kill()
    """)
    assert found == {"before": "paused", "out": "awake\n", "after": "running"}


_ECHO = '''
import http.server, json
class Echo(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
        self.send_response(200)
        self.send_header("Set-Cookie", "sandbox=1; Domain=e2b.localhost; Path=/")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", 8000), Echo).serve_forever()
'''


def _wait_for(served: E2bServer, url: str, **headers: str) -> tuple[int, Any]:
    """The first answer that is not "nothing answers" (the server in the sandbox starting)."""
    deadline = time.monotonic() + 30
    while True:
        status, body = _get(served, url, **headers)
        if status != 502 or time.monotonic() > deadline:
            return status, body
        time.sleep(0.3)


@pytest.fixture(scope="module")
def listening(served: E2bServer) -> Iterator[dict[str, str]]:
    """A sandbox without network whose process listens on its own loopback, port 8000 (a
    server that answers with the headers it got and sets a cookie), declared nowhere."""
    found = _sdk(served, f"""
        import json
        from e2b import Sandbox
        sbx = Sandbox.create(timeout=300)
        sbx.files.write("echo.py", {_ECHO!r})
        sbx.commands.run("python3 echo.py", background=True)
        print(json.dumps({{"id": sbx.sandbox_id, "token": sbx.traffic_access_token,
                          "nets": sbx.commands.run("tail -n +3 /proc/net/dev | cut -d: -f1").stdout.split()}}))
    """)
    yield found
    served.call("DELETE", f"/sandboxes/{found['id']}")


def test_any_port_a_process_opens_is_reached_at_its_host(served: E2bServer, listening: dict[str, str]) -> None:
    """E2B's get_host(port) for a port no create declared: served with the sandbox's traffic
    token, and the sandbox gains no network by it (loopback only); nothing of the client's
    credentials reaches it, and its cookie does not come back."""
    url = f"https://8000-{listening['id']}.{served.domain}/"
    assert listening["nets"] == ["lo"]
    status, answer = _get(served, url)
    assert status == 403 and "traffic access token" in answer["message"]
    status, raw = _wait_for(served, url, E2B_Traffic_Access_Token=listening["token"], Cookie="hutch_session=x",
                            Authorization=f"Bearer {KEY}", X_API_Key=KEY)
    assert status == 200, raw
    seen = json.loads(raw)
    assert not {"cookie", "authorization", "x-api-key", "e2b-traffic-access-token", "x-access-token"} & set(seen), seen
    context = ssl.create_default_context(cafile=str(served.ca_file))
    req = urllib.request.Request(url, headers={"E2B-Traffic-Access-Token": listening["token"]})
    with urllib.request.urlopen(req, timeout=60, context=context) as resp:
        assert resp.headers.get("Set-Cookie") is None


def test_another_port_is_refused_to_others_and_off_its_host(served: E2bServer, listening: dict[str, str],
                                                            sandbox: dict[str, str]) -> None:
    """Another sandbox's token opens nothing here; a port nothing listens on says so; at
    E2B_SANDBOX_URL (one origin for every sandbox) the port is not served."""
    url = f"https://8000-{listening['id']}.{served.domain}/"
    status, answer = _get(served, url, E2B_Traffic_Access_Token=sandbox["token"])
    assert status == 401 and "not a valid access token" in answer["message"]
    status, answer = _get(served, f"https://8001-{listening['id']}.{served.domain}/",
                          E2B_Traffic_Access_Token=listening["token"])
    assert status == 502 and "nothing answers on port 8001" in answer["message"]
    req = urllib.request.Request(served.url + "/", headers={"E2b-Sandbox-Id": listening["id"], "E2b-Sandbox-Port": "8000",
                                                            "E2B-Traffic-Access-Token": listening["token"]})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=60)
    assert refused.value.code == 404 and "at its own host only" in json.loads(refused.value.read())["message"]


def test_allow_public_traffic_opens_that_sandbox_alone_without_a_token(served: E2bServer) -> None:
    """network.allowPublicTraffic true: token-less requests reach its ports; a sandbox whose
    E2B metadata names the opt-in's key (a string) stays closed, as the default does."""
    found = _sdk(served, """
        import json
        from e2b import Sandbox
        public = Sandbox.create(timeout=120, network={"allow_public_traffic": True})
        forged = Sandbox.create(timeout=120, metadata={"e2b.allowPublicTraffic": "true"})
        for sbx in (public, forged):
            sbx.commands.run("python3 -m http.server 8000", background=True)
        print(json.dumps({"public": public.sandbox_id, "forged": forged.sandbox_id}))
    """)
    try:
        status, _ = _wait_for(served, f"https://8000-{found['public']}.{served.domain}/")
        assert status == 200
        status, answer = _get(served, f"https://8000-{found['forged']}.{served.domain}/")
        assert status == 403 and "traffic access token" in answer["message"]
    finally:
        for sid in found.values():
            served.call("DELETE", f"/sandboxes/{sid}")


_WS = """
import asyncio
from aiohttp import web
async def echo(request):
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    async for msg in ws:
        await ws.send_str("echo:" + msg.data)
    return ws
app = web.Application()
app.router.add_get("/ws", echo)
web.run_app(app, host="127.0.0.1", port=8002)
"""


def test_a_websocket_to_a_sandboxs_port_is_relayed(served: E2bServer) -> None:
    """A websocket server a process opens (aiohttp, in the code-interpreter template) is
    reached at its host with the token; without it, 403 before any upgrade."""
    found = _sdk(served, f"""
        import json, os, ssl, time
        import aiohttp, asyncio
        from e2b import Sandbox
        sbx = Sandbox.create(template="code-interpreter-v1", timeout=120)
        server = {_WS!r}
        sbx.files.write("ws.py", server)
        sbx.commands.run("python3 ws.py", background=True)

        async def talk(headers):
            context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
            async with aiohttp.ClientSession() as session:
                try:
                    async with session.ws_connect(f"wss://{{sbx.get_host(8002)}}/ws", headers=headers, ssl=context) as ws:
                        await ws.send_str("hi")
                        return (await ws.receive()).data
                except aiohttp.WSServerHandshakeError as err:
                    return err.status

        async def main():
            token = {{"E2B-Traffic-Access-Token": sbx.traffic_access_token}}
            deadline = time.monotonic() + 30
            got = await talk(token)
            while got == 502 and time.monotonic() < deadline:
                await asyncio.sleep(0.3)
                got = await talk(token)
            return got, await talk({{}})
        try:
            print(json.dumps(asyncio.run(main())))
        finally:
            sbx.kill()
    """)
    assert found == ["echo:hi", 403]
