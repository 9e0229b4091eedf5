"""The attacker's pass over hutch's transitions: a guarantee that holds before and after a change
of state, but not for a moment (or for ever) across it. A real ``hutch serve`` on the local
driver (tests/adversarial/pass2.py), one per module.

Off-boarding: a member's key is revoked (or the SSH key it registered removed) while the member
holds a terminal open, on the websocket or over SSH. Every later request of that key is a 401,
but what it opened before went on: a shell that took every line typed after the revocation."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import gzip
import io
import json
import tarfile
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import asyncssh
import pytest

from tests.adversarial.pass2 import World, start_world

pytestmark = pytest.mark.isolation

# How long a session may outlive its key's end: the time a revocation takes to be projected.
ENDS_WITHIN = 5.0


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    yield from start_world(tmp_path_factory.mktemp("transitions"), "embedded")


def _leaver(world: World, **extra: str) -> tuple[str, str]:
    """A member key of beta's that is about to be off-boarded: (id, secret)."""
    made = world.data("beta_admin", "POST", "/keys", {"role": "member", **extra})
    return made["id"], made["secret"]


def _refused(world: World, secret: str) -> bool:
    return world.call(secret, "GET", "/sandbox")[0] == 401


async def _until_refused(world: World, secret: str) -> None:
    deadline = time.monotonic() + 30
    while not await asyncio.to_thread(_refused, world, secret):
        assert time.monotonic() < deadline, "the revoked key was never refused"
        await asyncio.sleep(0.1)


async def _sent_across_revocation(world: World, key_id: str, secret: str, method: str, path: str, data: bytes, *,
                                  split: int, content_type: str, settle: float = 0.0) -> tuple[int, bytes]:
    """Sends ``data`` with ``secret``'s key, its first ``split`` bytes at once and the rest only
    once the key is revoked and refused; (status, answer) of the request."""
    sent_first, go_on = asyncio.Event(), asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        yield data[:split]
        sent_first.set()
        await go_on.wait()
        yield data[split:]

    async with aiohttp.ClientSession() as http:
        request = asyncio.ensure_future(http.request(method, world.url + path, data=body(), headers={
            "Authorization": f"Bearer {secret}", "Content-Type": content_type}))
        await sent_first.wait()
        await asyncio.sleep(settle)
        world.data("beta_admin", "DELETE", f"/keys/{key_id}")
        await _until_refused(world, secret)
        go_on.set()
        resp = await request
        status, answer = resp.status, await resp.read()
        resp.close()
    return status, answer


def _exists(world: World, sid: str, path: str) -> bool:
    code, out, err = world.run("beta_admin", sid, f"test -e {path} && echo yes || echo no")
    assert code == 0, (out, err)
    return out.strip() == "yes"


@pytest.mark.parametrize("ending", ["revoked", "expired"])
async def test_a_websocket_terminal_ends_with_its_key(world: World, ending: str) -> None:
    """Before: after ``DELETE /keys/{id}`` answered (or the key's expiry passed) and the key's
    requests were 401s, its open terminal still ran what was typed into it, for as long as the
    websocket stayed open."""
    sid = world.sandbox("terminal", who="beta_member", runtime="base:latest")
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=8)).strftime("%Y-%m-%dT%H:%M:%SZ")
    key_id, secret = _leaver(world, **({"expires": soon} if ending == "expired" else {}))
    async with aiohttp.ClientSession() as http, http.ws_connect(
            f"{world.url}/sandbox/{sid}/terminal?command=sh", headers={"Authorization": f"Bearer {secret}"}) as ws:
        await ws.send_bytes(b"echo before-$((40+2))\n")
        seen = b""
        while b"before-42" not in seen:
            msg = await ws.receive(timeout=30)
            assert msg.type is aiohttp.WSMsgType.BINARY, msg
            seen += msg.data
        if ending == "revoked":
            world.data("beta_admin", "DELETE", f"/keys/{key_id}")
        await _until_refused(world, secret)
        revoked = time.monotonic()
        # The leaver types on: each line should reach nothing.
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.send_bytes(f"touch /tmp/typed-after-{ending}\n".encode())
        while not ws.closed:
            left = ENDS_WITHIN - (time.monotonic() - revoked)
            assert left > 0, "the terminal stayed open after its key was revoked"
            with contextlib.suppress(TimeoutError):
                msg = await ws.receive(timeout=left)
                if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING):
                    break
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.send_bytes(f"touch /tmp/typed-after-{ending}\n".encode())
    assert not _exists(world, sid, f"/tmp/typed-after-{ending}")


@pytest.mark.parametrize("ending", ["revoke the API key", "remove the SSH key"])
async def test_an_ssh_session_ends_with_its_key(world: World, ending: str) -> None:
    """Before: an SSH terminal session opened with a registered key outlived both the API key
    that registered it (revoked) and the SSH key's own removal: the gateway checked the key at
    login only, and the shell took every later line; an SFTP session of the same connection
    went on writing files."""
    sid = world.sandbox("terminal", who="beta_member", runtime="base:latest")
    key_id, secret = _leaver(world)
    private = world.keygen(f"id_leaver_{ending.split()[0]}")
    public = private.with_name(private.name + ".pub").read_text()
    registered = world.data(secret, "POST", "/ssh-keys", {"publicKey": public})
    async with asyncssh.connect("127.0.0.1", world.ssh_port, username=sid, known_hosts=None,
                                client_keys=[str(private)], agent_path=None) as conn:
        sftp = await conn.start_sftp_client()
        await sftp.listdir(".")
        proc = await conn.create_process(term_type="xterm", encoding=None)
        proc.stdin.write(b"echo before-$((40+2))\n")
        seen = b""
        while b"before-42" not in seen:
            chunk = await asyncio.wait_for(proc.stdout.read(4096), 30)
            assert chunk, seen
            seen += chunk
        if ending == "revoke the API key":
            world.data("beta_admin", "DELETE", f"/keys/{key_id}")
            await _until_refused(world, secret)
        else:
            world.data("beta_admin", "DELETE", f"/ssh-keys/{registered['id']}")
        await asyncio.sleep(1.0)  # ended at once where it is served; the leaver is still typing
        ended = time.monotonic()
        while True:
            with contextlib.suppress(ConnectionError, BrokenPipeError, asyncssh.Error):
                proc.stdin.write(b"touch /tmp/ssh-after-" + ending.split()[0].encode() + b"\n")
            with contextlib.suppress(TimeoutError):
                if not await asyncio.wait_for(proc.stdout.read(4096), 0.5):
                    break  # the session ended
            assert time.monotonic() - ended < ENDS_WITHIN, f"the SSH session outlived its key ({ending})"
        proc.close()
        with pytest.raises(asyncssh.SFTPError):
            async with sftp.open("sftp-after-" + ending.split()[0], "wb") as fh:
                await fh.write(b"x")
    assert not _exists(world, sid, "/home/agentuity/sftp-after-" + ending.split()[0])
    assert not _exists(world, sid, "/tmp/ssh-after-" + ending.split()[0])


async def test_the_web_app_s_live_feed_tells_a_revoked_key_nothing_more(world: World) -> None:
    """``GET /app/live`` follows the organization's events for as long as it stays open.
    Before: after its key was revoked it went on telling the leaver every event of the
    organization (type, sandbox, time): the commands run in a sandbox after the revocation
    came through as ``data:`` lines."""
    sid = world.sandbox("terminal", who="beta_member", runtime="base:latest")
    key_id, secret = _leaver(world)
    async with aiohttp.ClientSession() as http, http.get(
            f"{world.url}/app/live", headers={"Authorization": f"Bearer {secret}"}) as feed:
        assert feed.status == 200, await feed.text()
        assert (await asyncio.wait_for(feed.content.readline(), 30)).startswith(b": hutch live")
        world.data("beta_admin", "DELETE", f"/keys/{key_id}")
        await _until_refused(world, secret)
        await asyncio.to_thread(world.run, "beta_admin", sid, "echo after the revocation")
        told = b""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(3):
                while line := await feed.content.readline():
                    told += line
    assert b"data:" not in told, told[:500]


def test_a_presigned_upload_url_dies_with_its_key(world: World) -> None:
    """A snapshot build's ``uploadUrl`` is presigned (its token is the credential, no key
    sent). Before: it kept taking uploads after the key that made it was revoked, into the
    organization's storage (its quota) for the hour a build lives; a presigned URL lives no
    longer than the credential that signed it."""
    key_id, secret = _leaver(world)
    build = world.data(secret, "POST", "/sandbox/snapshots/build", {"runtime": "base:latest", "name": "leaver"})
    url = build["uploadUrl"].split("://", 1)[1].split("/", 1)[1]
    archive = gzip.compress(b"\0" * 1024)  # an empty tar: only checked at finalize
    status, answer = world.call(None, "PUT", "/" + url, raw=archive, headers={"Content-Type": "application/gzip"})
    assert status == 200, answer  # the control: the presigned URL works
    world.data("beta_admin", "DELETE", f"/keys/{key_id}")
    status, answer = world.call(None, "PUT", "/" + url, raw=archive, headers={"Content-Type": "application/gzip"})
    assert status == 401, (status, answer)
    assert "revoked" in answer["message"], answer


async def test_a_stdin_upload_takes_nothing_more_once_its_key_is_revoked(world: World) -> None:
    """``PUT /streams/{id}`` streams a command's stdin for as long as its body lasts. Before: an
    upload begun before the key was revoked went on feeding the command every line sent after
    (a shell reading it ran them), as the terminal did."""
    sid = world.sandbox("terminal", who="beta_member", runtime="base:latest")
    key_id, secret = _leaver(world)
    stdin = world.call(secret, "POST", "/streams", {"name": "leaver"})[1]["id"]
    ex = world.data(secret, "POST", f"/sandbox/{sid}/execute", {
        "command": ["sh", "-c", "while read -r line; do echo \"$line\" >> /tmp/stdin-got; done"],
        "stream": {"stdin": stdin}, "timeout": "60s"})
    lines: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def body() -> AsyncIterator[bytes]:
        while (line := await lines.get()) is not None:
            yield line

    async with aiohttp.ClientSession() as http:
        upload = asyncio.ensure_future(http.put(f"{world.url}/streams/{stdin}", data=body(),
                                                headers={"Authorization": f"Bearer {secret}"}))
        await lines.put(b"before\n")
        deadline = time.monotonic() + 30
        while not await asyncio.to_thread(_exists, world, sid, "/tmp/stdin-got"):
            assert time.monotonic() < deadline, "the command never got its first line"
            await asyncio.sleep(0.2)
        world.data("beta_admin", "DELETE", f"/keys/{key_id}")
        await _until_refused(world, secret)
        await lines.put(b"after\n")
        await asyncio.sleep(1.0)
        await lines.put(None)
        with contextlib.suppress(aiohttp.ClientError):
            (await upload).close()
    world.data("beta_admin", "POST", f"/sandbox/execution/{ex['executionId']}/cancel")
    code, got, err = world.run("beta_admin", sid, "cat /tmp/stdin-got")
    assert (code, got) == (0, "before\n"), (code, got, err)


async def test_an_archive_upload_finished_after_its_key_s_revocation_lands_nothing(world: World) -> None:
    """``POST /fs/upload`` takes an archive as slowly as it comes, then unpacks it into the
    sandbox. Before: one begun before the key was revoked and finished after was unpacked
    all the same (its files in the sandbox)."""
    sid = world.sandbox("terminal", who="beta_member", runtime="base:latest")
    key_id, secret = _leaver(world)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("landed-after-revocation")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    status, _ = await _sent_across_revocation(world, key_id, secret, "POST", f"/fs/upload/{sid}?path=/tmp&format=tar.gz",
                                              buf.getvalue(), split=10, content_type="application/gzip")
    assert status == 401, status
    assert not _exists(world, sid, "/tmp/landed-after-revocation")


@pytest.mark.parametrize("route", ["POST /keys", "POST /sandbox/{sid}/execute"])
async def test_a_json_body_finished_after_its_key_s_revocation_does_nothing(world: World, route: str) -> None:
    """A JSON body may arrive as slowly as its sender likes; the key was checked on the
    request's headers. Before: an admin being off-boarded who had a ``POST /keys`` under way
    (its body's last bytes held back) finished it after the revocation and got a fresh admin
    key, the access the revocation ended back for good; an execute ran its command."""
    sid = world.sandbox("terminal", who="beta_member", runtime="base:latest")
    made = world.data("beta_admin", "POST", "/keys", {"role": "admin"})
    key_id, secret = made["id"], made["secret"]
    method, path = route.split(" ")
    path = path.format(sid=sid)
    payload = json.dumps({"role": "admin", "name": "comeback"} if path == "/keys" else
                         {"command": ["touch", "/tmp/json-after-revocation"]}).encode()
    status, raw = await _sent_across_revocation(world, key_id, secret, method, path, payload, split=5,
                                                content_type="application/json",
                                                settle=0.5)  # the headers are in: authenticated
    answer = json.loads(raw)
    assert status == 401, (status, answer)
    assert "revoked" in answer["message"], answer
    assert not [k for k in world.data("beta_admin", "GET", "/keys")["keys"] if k.get("name") == "comeback"]
    await asyncio.sleep(1.0)  # an execute that got through would have run by now
    assert not _exists(world, sid, "/tmp/json-after-revocation")


async def test_signing_out_of_the_web_app_ends_its_terminals(world: World) -> None:
    """A terminal opened with the Web App's session cookie lived as long as the API key behind
    the session: signing out (the cookie refused from then on) left the terminal taking every
    line typed into it, for whoever has the browser tab (a shared or borrowed computer) or
    holds the websocket. A terminal opened by a session ends with the session."""
    sid = world.sandbox("terminal", who="beta_member", runtime="base:latest")
    async with aiohttp.ClientSession(world.url, cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        signed = await browser.post("/app/session", json={"apiKey": world.keys["beta_member"]},
                                    headers={"Origin": world.url})
        assert signed.status == 201, await signed.text()
        csrf = (await signed.json())["data"]["csrf"]
        async with browser.ws_connect(f"/sandbox/{sid}/terminal?command=sh", headers={"Origin": world.url}) as ws:
            await ws.send_bytes(b"echo before-$((40+2))\n")
            seen = b""
            while b"before-42" not in seen:
                msg = await ws.receive(timeout=30)
                assert msg.type is aiohttp.WSMsgType.BINARY, msg
                seen += msg.data
            out = await browser.delete("/app/session", headers={"Origin": world.url, "X-CSRF-Token": csrf})
            assert out.status == 200, await out.text()
            assert (await browser.get("/sandbox", headers={"Origin": world.url})).status == 401  # the control
            ended = time.monotonic()
            while not ws.closed:
                left = ENDS_WITHIN - (time.monotonic() - ended)
                assert left > 0, "the terminal stayed open after its session was signed out"
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await ws.send_bytes(b"touch /tmp/typed-after-sign-out\n")
                with contextlib.suppress(TimeoutError):
                    msg = await ws.receive(timeout=min(left, 0.5))
                    if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING):
                        break
    assert not _exists(world, sid, "/tmp/typed-after-sign-out")


async def test_a_snapshot_upload_stores_nothing_sent_after_its_key_s_revocation(world: World) -> None:
    """``PUT /sandbox/snapshots/{id}/upload`` with the key (not the presigned URL) takes the
    archive as slowly as it comes, into the organization's storage. Before: one begun before the
    key's revocation was stored whole after it (200), though the presigned URL of the same
    build was refused (401) by then."""
    key_id, secret = _leaver(world)
    build = world.data(secret, "POST", "/sandbox/snapshots/build", {"runtime": "base:latest", "name": "slow"})
    status, answer = await _sent_across_revocation(world, key_id, secret, "PUT",
                                                   f"/sandbox/snapshots/{build['snapshotId']}/upload",
                                                   gzip.compress(b"\0" * 1024), split=10,
                                                   content_type="application/gzip")
    assert status == 401, (status, answer)


async def test_a_revoked_key_s_long_poll_cancels_nothing_by_leaving(world: World) -> None:
    """A command is cancelled when every client waiting for it went away, and a member's
    long-poll counts as one (its right judged when the wait starts). Before: a member's key
    revoked while it long-polled an admin's command still cancelled that command by hanging up,
    an act of the organization's after the key's end."""
    sid = world.sandbox("terminal", who="beta_member", runtime="base:latest")
    key_id, secret = _leaver(world)
    ex = world.data("beta_admin", "POST", f"/sandbox/{sid}/execute", {"command": ["sleep", "40"], "timeout": "60s"})
    async with aiohttp.ClientSession() as http:
        poll = asyncio.ensure_future(http.get(f"{world.url}/sandbox/execution/{ex['executionId']}?wait=50s",
                                              headers={"Authorization": f"Bearer {secret}"}))
        await asyncio.sleep(1.0)  # the long-poll waits
        world.data("beta_admin", "DELETE", f"/keys/{key_id}")
        await _until_refused(world, secret)
        poll.cancel()  # the leaver hangs up
        with contextlib.suppress(asyncio.CancelledError):
            await poll
    await asyncio.sleep(5.0)  # past the abandon grace (3 s)
    status = world.data("beta_admin", "GET", f"/sandbox/execution/{ex['executionId']}")["status"]
    world.data("beta_admin", "POST", f"/sandbox/execution/{ex['executionId']}/cancel")
    assert status == "running", status
