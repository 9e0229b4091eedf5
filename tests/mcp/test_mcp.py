"""`hutch mcp` driven by the official MCP SDK's own client, over stdio (a subprocess of
`hutch mcp`) and streamable HTTP (`hutch mcp --http`), against a real `hutch serve` (local
driver) shared by the module: the tools, their errors, the sessions' sandboxes, and an
attacker holding another organization's key."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from hutch.client import SandboxClient
from hutch.errors import InvalidInput, NotFound, SandboxNotFound

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "mcp-test-admin-key"  # the server's bootstrap key: org_local ("org A")
TOOLS = {"create_sandbox", "list_sandboxes", "destroy_sandbox", "run_code", "shell", "write_file", "read_file",
         "list_files", "snapshot"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(url: str, proc: subprocess.Popen[bytes], what: str) -> None:
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # it answers (the MCP endpoint refuses a bare GET)
        except OSError:
            assert proc.poll() is None, f"{what} exited with {proc.returncode}"
            time.sleep(0.1)
    raise AssertionError(f"{what} did not answer at {url}")


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HUTCH_LOG_LEVEL": "WARNING", **extra}
    for var in ("HUTCH_EVENT_LOG", "HUTCH_STORE"):
        env.pop(var, None)
    return env


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    env = _env(HUTCH_DATA_DIR=str(tmp_path_factory.mktemp("served")), HUTCH_DRIVER="local", HUTCH_API_KEY=ADMIN)
    env.pop("HUTCH_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "hutch.cli", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(url + "/healthz", proc, "hutch serve")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def keys(served: str) -> dict[str, str]:
    """A member key of org B, and one of org C (whose quota is one sandbox)."""

    async def make() -> dict[str, str]:
        found = {"A": ADMIN}
        async with SandboxClient(served, ADMIN) as admin:
            for org in ("b", "c"):
                await admin.tenancy.create_org(f"mcp{org}")
                async with SandboxClient(served, ADMIN, org_id=f"org_mcp{org}") as there:
                    found[org.upper()] = str((await there.tenancy.create_key("member", name="agent")).secret)
                    if org == "b":  # a key of one request a minute
                        slow = await there.tenancy.create_key("member", name="slow", rate=1 / 60, burst=1)
                        found["B-slow"] = str(slow.secret)
            await admin.tenancy.set_quota("org_mcpc", sandboxes=1)
        return found

    return asyncio.run(make())


HELLO = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


@contextmanager
def mcp_http(served: str, *options: str) -> Iterator[str]:
    """A ``hutch mcp --http`` of its own (``options`` added), answering: its URL. It must end
    without a traceback."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "hutch.cli", "mcp", "--http", f"127.0.0.1:{port}", *options],
                            env=_env(HUTCH_URL=served), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        _wait_for(url, proc, "hutch mcp --http")
        yield url
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        assert b"Traceback" not in err, err.decode()


@pytest.fixture(scope="module")
def mcp_url(served: str) -> Iterator[str]:
    with mcp_http(served) as url:
        yield url


@asynccontextmanager
async def http_session(url: str, key: str | None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with create_mcp_http_client(headers=headers) as http, \
            Client(streamable_http_client(url, http_client=http)) as client:
        yield client


async def call(client: Client, name: str, **args: Any) -> Any:
    result = await client.call_tool(name, args)
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)


async def refused(client: Client, name: str, **args: Any) -> str:
    result = await client.call_tool(name, args)
    assert result.is_error, result.content
    return str(result.content[0].text)


async def gone(url: str, key: str, sandbox_id: str) -> bool:
    """Whether the sandbox is destroyed within a few seconds (a session's end runs after it)."""
    async with SandboxClient(url, key) as client:
        for _ in range(100):
            try:
                await client.get(sandbox_id)
            except SandboxNotFound:
                return True
            await asyncio.sleep(0.1)
    return False


async def test_stdio_every_tool_its_errors_and_the_session_end(served: str) -> None:
    params = StdioServerParameters(command=sys.executable, args=["-m", "hutch.cli", "mcp"],
                                   env=_env(HUTCH_URL=served, HUTCH_API_KEY=ADMIN))
    async with Client(params) as client:
        listed = (await client.list_tools()).tools
        assert {t.name for t in listed} == TOOLS
        schemas = {t.name: t.input_schema for t in listed}
        assert schemas["run_code"]["required"] == ["sandbox_id", "code"]  # the Workspace's, plus the sandbox
        sid = (await call(client, "create_sandbox"))["sandbox_id"]
        kept = await call(client, "create_sandbox", keep=True, env={"STAGE": "two"})
        assert kept["kept"] is True
        assert await call(client, "write_file", sandbox_id=sid, path="pkg/m.py", contents="X = 41\n") == \
            {"written": "pkg/m.py"}
        assert (await call(client, "read_file", sandbox_id=sid, path="pkg/m.py"))["contents"] == "X = 41\n"
        assert {"name": "m.py", "is_dir": False, "size": 7} in \
            (await call(client, "list_files", sandbox_id=sid, path="pkg"))["files"]
        ran = await call(client, "run_code", sandbox_id=sid, code="import sys; sys.path.insert(0, 'pkg')\n"
                         "import m; print(m.X + 1)")  # python unless told
        assert (ran["stdout"], ran["exit_code"]) == ("42\n", 0)
        shell = await call(client, "shell", sandbox_id=kept["sandbox_id"], command="echo $STAGE; exit 3")
        assert (shell["stdout"], shell["exit_code"]) == ("two\n", 3)
        snap = await call(client, "snapshot", sandbox_id=sid)
        assert snap["snapshot_id"].startswith("snp_") and "pkg/m.py" in snap["files"]
        again = (await call(client, "create_sandbox", snapshot=snap["snapshot_id"]))["sandbox_id"]
        assert (await call(client, "read_file", sandbox_id=again, path="pkg/m.py"))["contents"] == "X = 41\n"
        mine = {s["sandbox_id"]: s for s in (await call(client, "list_sandboxes"))["sandboxes"]}
        assert {sid, kept["sandbox_id"], again} <= set(mine) and mine[sid]["this_session"]
        assert await call(client, "destroy_sandbox", sandbox_id=again) == {"destroyed": again}
        # Errors are tool errors with hutch's message; the server goes on.
        assert "not found" in await refused(client, "read_file", sandbox_id="sbx_nope", path="x")
        assert "not found" in await refused(client, "shell", sandbox_id=again, command="true")  # destroyed
        assert "'code' is a required property" in await refused(client, "run_code", sandbox_id=sid)
        assert "outside the workspace" in await refused(client, "write_file", sandbox_id=sid, path="../x",
                                                        contents="x")
        assert "no such directory" in await refused(client, "list_files", sandbox_id=sid, path="nope")
        assert "language" in await refused(client, "run_code", sandbox_id=sid, code="1", language="cobol")
        assert "unknown tool" in await refused(client, "rm_rf")
        assert "42" in (await call(client, "run_code", sandbox_id=sid, code="print(42)"))["stdout"]
    # stdin closed: the session ends, its sandbox with it; the kept one stays.
    assert await gone(served, ADMIN, sid)
    async with SandboxClient(served, ADMIN) as admin:
        assert (await admin.get(kept["sandbox_id"])).status != "terminated"
        await admin.destroy(kept["sandbox_id"])


async def test_http_a_session_acts_with_its_key_and_ends_with_its_sandboxes(served: str, mcp_url: str,
                                                                         keys: dict[str, str]) -> None:
    async with http_session(mcp_url, keys["B"]) as client:
        # The sessionless 2026-07-28 wire is refused and the client falls back to a session.
        assert client.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
        assert {t.name for t in (await client.list_tools()).tools} == TOOLS
        sid = (await call(client, "create_sandbox"))["sandbox_id"]
        ran = await call(client, "shell", sandbox_id=sid, command="echo hi; pwd")
        assert ran["stdout"] == "hi\n/home/agentuity\n"
    async with SandboxClient(served, keys["B"]) as b:  # made in the key's organization
        assert await gone(served, keys["B"], sid)
        assert (await b.get(sid, include_deleted=True)).sandbox_id == sid


async def test_a_command_the_sandbox_killed_says_why(served: str, mcp_url: str, keys: dict[str, str]) -> None:
    """An exit code alone (137) does not tell a model that the sandbox's memory limit ended its
    program: hutch's reason comes with the result."""
    async with SandboxClient(served, keys["B"]) as b:
        small = (await b.create(runtime="workspace:latest", resources={"memory": "64Mi"})).id
        try:
            async with http_session(mcp_url, keys["B"]) as client:
                ran = await call(client, "run_code", sandbox_id=small, code="x = bytearray(500 * 2**20)")
            assert ran["exit_code"] == 137 and "out of memory" in ran["error"], ran
        finally:
            await b.destroy(small)


async def test_an_org_a_session_cannot_see_read_or_destroy_org_b_sandboxes(served: str, mcp_url: str,
                                                                          keys: dict[str, str]) -> None:
    async with SandboxClient(served, keys["B"]) as b:
        victim = (await b.create(runtime="workspace:latest")).id
        await b.write_files(victim, {"/home/agentuity/secret.txt": b"org B only"})
        try:
            async with http_session(mcp_url, keys["A"]) as attacker:
                listed = (await call(attacker, "list_sandboxes"))["sandboxes"]
                assert victim not in {s["sandbox_id"] for s in listed}
                for tool, args in [("read_file", {"path": "secret.txt"}), ("list_files", {}),
                                   ("shell", {"command": "cat secret.txt"}), ("run_code", {"code": "print(1)"}),
                                   ("write_file", {"path": "x", "contents": "x"}), ("snapshot", {}),
                                   ("destroy_sandbox", {})]:
                    message = await refused(attacker, tool, sandbox_id=victim, **args)
                    assert "not found" in message and "org B only" not in message, (tool, message)
            assert await b.read_bytes(victim, "/home/agentuity/secret.txt") == b"org B only"  # untouched
        finally:
            await b.destroy(victim)


async def test_a_sandbox_id_names_a_sandbox_never_another_route(served: str, mcp_url: str) -> None:
    """The id a tool takes goes into a URL path: ``../keys/K`` or ``snapshots/S`` must not reach
    the key's or the snapshot's route (a model asked to destroy a sandbox revoked a key)."""
    async with SandboxClient(served, ADMIN) as admin:
        victim = await admin.tenancy.create_key("member", name="victim")
        sid = (await admin.create(runtime="workspace:latest")).id
        snap = (await admin.create_snapshot(sid)).snapshot_id
        try:
            async with http_session(mcp_url, ADMIN) as client:
                for bad in (f"../keys/{victim.id}", f"snapshots/{snap}", f"{sid}/../../keys/{victim.id}"):
                    message = await refused(client, "destroy_sandbox", sandbox_id=bad)  # one id, that names nothing
                    assert f"sandbox {bad} not found" in message, (bad, message)
                for bad in ("..", ".", ""):  # what an HTTP client would resolve away: refused before asking
                    assert f"{bad!r} is not an id" in await refused(client, "destroy_sandbox", sandbox_id=bad)
                assert "not found" in await refused(client, "read_file", sandbox_id=f"{sid}/../../x", path="x")
            with pytest.raises(NotFound, match=r"key \.\./sandbox/"):
                await admin.tenancy.revoke_key(f"../sandbox/{sid}")  # the SDK's own calls, the same
            with pytest.raises(InvalidInput, match="not an id"):
                await admin.delete_snapshot("..")
            async with SandboxClient(served, str(victim.secret)) as still:
                assert await still.tenancy.list_orgs()  # not revoked
            assert (await admin.get_snapshot(snap)).snapshot_id == snap  # not deleted
            assert (await admin.get(sid)).status != "terminated"
        finally:
            await admin.destroy(sid)
            await admin.delete_snapshot(snap)


async def test_what_a_sandbox_holds_comes_back_bounded(served: str, mcp_url: str, keys: dict[str, str]) -> None:
    """The server is shared by every organization's sessions: a tool's answer must not bring a
    sandbox's whole file or output into it (a 200 MiB file read took it to 14.6 GiB, 20 MiB of
    output to 816 MiB). Larger than the bound: a tool error saying so, or the output cut."""
    from hutch.mcp_server import MAX_BYTES

    async with http_session(mcp_url, keys["B"]) as client:
        sid = (await call(client, "create_sandbox"))["sandbox_id"]
        made = await call(client, "shell", sandbox_id=sid, command=f"mkdir -p d; head -c {2 * MAX_BYTES} /dev/zero "
                          "| tr '\\0' a > d/big; echo small > d/small")
        assert made["exit_code"] == 0, made
        message = await refused(client, "read_file", sandbox_id=sid, path="d/big")
        assert f"larger than the {MAX_BYTES} bytes" in message and "head" in message, message
        assert (await call(client, "read_file", sandbox_id=sid, path="d/small"))["contents"] == "small\n"
        ran = await call(client, "shell", sandbox_id=sid, command="cat d/big; cat d/big >&2; echo done >&2")
        assert ran["exit_code"] == 0 and ran["stdout"].startswith("a" * MAX_BYTES), ran["stdout"][-200:]
        assert ran["stdout"].endswith(f"[hutch: {MAX_BYTES} more bytes of stdout not kept]\n"), ran["stdout"][-200:]
        assert f"[hutch: {MAX_BYTES + 5} more bytes of stderr not kept]" in ran["stderr"], ran["stderr"][-200:]
        snap = await call(client, "snapshot", sandbox_id=sid)
        assert snap["snapshot_id"].startswith("snp_") and {"d/big", "d/small"} <= set(snap["files"]), snap
        await call(client, "shell", sandbox_id=sid, command="mkdir many; cd many; seq 1 1200 | xargs touch")
        listed = await call(client, "list_files", sandbox_id=sid, path="many")
        assert (len(listed["files"]), listed["files_not_listed"]) == (1000, 200), listed["files"][:3]
        again = await call(client, "snapshot", sandbox_id=sid)
        assert (len(again["files"]), again["files_not_listed"]) == (1000, 1202 - 1000), again["files"][:3]


async def test_a_session_is_bound_to_the_key_that_opened_it(mcp_url: str, keys: dict[str, str]) -> None:
    """A leaked session id is useless with another key: the session answers as if unknown."""
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with httpx2.AsyncClient() as http:
        opened = await http.post(mcp_url, json=HELLO, headers={**accept, "Authorization": f"Bearer {keys['B']}"})
        assert opened.status_code == 200
        session = opened.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        stolen = await http.post(mcp_url, json=listing, headers={
            **accept, "Authorization": f"Bearer {keys['A']}", "Mcp-Session-Id": session,
            "MCP-Protocol-Version": "2025-11-25"})
        assert stolen.status_code == 404 and "tools" not in stolen.text


def test_an_organization_holds_a_bounded_number_of_sessions(served: str, keys: dict[str, str]) -> None:
    """Sessions are the server's (10,000 at most, for everyone): one organization opening them
    as fast as it can, with one key or several, must not leave none for the others."""

    async def scenario(url: str) -> None:
        async with SandboxClient(served, ADMIN, org_id="org_mcpb") as there:
            other_b = str((await there.tenancy.create_key("member", name="second")).secret)
        async with httpx2.AsyncClient(headers={"Accept": "application/json, text/event-stream"}) as http:
            def open_as(key: str) -> Any:
                return http.post(url, json=HELLO, headers={"Authorization": f"Bearer {key}"})
            opened = [await open_as(keys["B"]), await open_as(other_b)]
            assert [r.status_code for r in opened] == [200, 200]
            for key in (keys["B"], other_b):  # the organization's third, whichever key asks
                full = await open_as(key)
                assert full.status_code == 429, full.text
                assert "2 MCP sessions" in full.json()["error"]["message"], full.text
            assert (await open_as(keys["A"])).status_code == 200  # another organization is not held up
            ended = await http.delete(url, headers={"Authorization": f"Bearer {keys['B']}", "MCP-Protocol-Version":
                                                    "2025-11-25", "Mcp-Session-Id": opened[0].headers["mcp-session-id"]})
            assert ended.status_code == 200, ended.text
            assert (await open_as(other_b)).status_code == 200  # an ended session's room is free again

    with mcp_http(served, "--max-org-sessions", "2") as url:
        asyncio.run(scenario(url))


def test_a_revoked_keys_sessions_give_their_room_back(served: str, keys: dict[str, str]) -> None:
    """A key revoked (it leaked) while its sessions are open: they answer 401 from then on, so
    no DELETE can end them, and they held the organization's room for 30 minutes, its other
    keys answered 429. The organization at its limit, a revoked key's sessions are ended."""
    from hutch.mcp_http import RECHECK_SECONDS


    async def scenario(url: str) -> None:
        async with httpx2.AsyncClient(headers={"Accept": "application/json, text/event-stream"}) as http:
            def open_as(key: str) -> Any:
                return http.post(url, json=HELLO, headers={"Authorization": f"Bearer {key}"})
            async with SandboxClient(served, ADMIN, org_id="org_mcpb") as there:
                leaked = await there.tenancy.create_key("member", name="leaked")
                opened = [await open_as(str(leaked.secret)) for _ in range(2)]
                assert [r.status_code for r in opened] == [200, 200]
                assert (await open_as(keys["B"])).status_code == 429  # the organization is full
                await there.tenancy.revoke_key(leaked.id)
            await asyncio.sleep(RECHECK_SECONDS)  # the gate took the key just now: not asked again sooner
            again = await open_as(keys["B"])
            assert again.status_code == 200, again.text  # the revoked key's sessions gave their room back
            assert (await open_as(keys["B"])).status_code == 200
            assert (await open_as(keys["B"])).status_code == 429  # and the limit still holds

    with mcp_http(served, "--max-org-sessions", "2") as url:
        asyncio.run(scenario(url))


async def test_http_refuses_no_key_and_a_bad_key(mcp_url: str, keys: dict[str, str]) -> None:
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    async with httpx2.AsyncClient() as http:
        bare = await http.post(mcp_url, json=hello)
        assert bare.status_code == 401 and bare.headers["www-authenticate"].startswith("Bearer")
        assert "Authorization: Bearer <hutch API key>" in bare.json()["error"]["message"]
        bad = await http.post(mcp_url, json=hello, headers={"Authorization": "Bearer hk_not_a_key"})
        assert bad.status_code == 401 and "refused this API key" in bad.json()["error"]["message"]
        for status in (200, 429):  # the key's rate limit, met while the key is checked: the client's to hear
            limited = await http.post(mcp_url, json=hello, headers={"Authorization": f"Bearer {keys['B-slow']}"})
            assert limited.status_code == status, limited.text
        assert "could not check the API key" in limited.json()["error"]["message"]
    for key, said in ((None, "Authorization: Bearer <hutch API key>"), ("hk_not_a_key", "refused this API key")):
        with pytest.raises(BaseExceptionGroup) as failed:  # the SDK's MCPError, out of its task groups
            async with http_session(mcp_url, key):
                pass
        assert said in _leaves(failed.value)


@pytest.mark.parametrize("key", [None, "A"])
def test_http_refuses_a_websocket_with_or_without_a_key(mcp_url: str, keys: dict[str, str], key: str | None) -> None:
    """A websocket handshake (the server speaks it) is refused by the gate, naming what is
    served; before, it went to the MCP app without any key asked."""
    url = urllib.parse.urlsplit(mcp_url)
    auth = f"Authorization: Bearer {keys[key]}\r\n" if key else ""
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(f"GET {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\nUpgrade: websocket\r\n"
                     "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     f"Sec-WebSocket-Version: 13\r\n{auth}\r\n".encode())
        answer = b""
        while b"}" not in answer and (chunk := sock.recv(65536)):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), answer
    assert "websocket connections are not served" in json.loads(body)["error"]["message"], answer

def _leaves(err: BaseException) -> str:
    if isinstance(err, BaseExceptionGroup):
        return " ".join(_leaves(e) for e in err.exceptions)
    return str(err)


async def test_a_quota_is_a_tool_error(served: str, mcp_url: str, keys: dict[str, str]) -> None:
    async with http_session(mcp_url, keys["C"]) as client:  # org C may hold one sandbox
        first = (await call(client, "create_sandbox"))["sandbox_id"]
        message = await refused(client, "create_sandbox")
        assert "quota" in message.lower(), message
        assert "sandbox" in await refused(client, "create_sandbox", runtime=7)  # and a bad argument
    assert await gone(served, keys["C"], first)


def test_a_server_stopped_by_sigterm_destroys_its_sessions_sandboxes(served: str, keys: dict[str, str]) -> None:
    """What a client's shutdown (stdio) or an operator's (HTTP) does: the sessions still open
    end, and their sandboxes with them. Raw JSON-RPC, so the session stays open until the signal."""
    port = _free_port()
    stdio = subprocess.Popen([sys.executable, "-m", "hutch.cli", "mcp"], env=_env(HUTCH_URL=served, HUTCH_API_KEY=ADMIN),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    http = subprocess.Popen([sys.executable, "-m", "hutch.cli", "mcp", "--http", f"127.0.0.1:{port}"],
                            env=_env(HUTCH_URL=served), stdout=subprocess.DEVNULL)
    ready = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    create = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "create_sandbox", "arguments": {}}}
    try:
        assert stdio.stdin is not None and stdio.stdout is not None
        for message in (HELLO, ready, create):
            stdio.stdin.write(json.dumps(message).encode() + b"\n")
            stdio.stdin.flush()
        answers = [json.loads(stdio.stdout.readline()) for _ in range(2)]
        by_stdio = answers[1]["result"]["structuredContent"]["sandbox_id"]
        url = f"http://127.0.0.1:{port}/mcp"
        _wait_for(url, http, "hutch mcp --http")
        headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {keys['B']}"}
        with httpx2.Client(headers=headers) as client:
            opened = client.post(url, json=HELLO)
            headers.update({"Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"})
            client.post(url, json=ready, headers=headers)
            made = client.post(url, json=create, headers=headers).text
        data = next(line.removeprefix("data:") for line in made.splitlines() if line.startswith("data:"))
        by_http = json.loads(data)["result"]["structuredContent"]["sandbox_id"]
        for proc in (stdio, http):
            proc.terminate()
        assert stdio.wait(30) == 0
        assert http.wait(30) == -signal.SIGTERM  # uvicorn re-raises the signal once it has shut down
    finally:
        for proc in (stdio, http):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if stdio.stdin is not None:
            stdio.stdin.close()
        if stdio.stdout is not None:
            stdio.stdout.close()
    assert asyncio.run(gone(served, ADMIN, by_stdio)) and asyncio.run(gone(served, keys["B"], by_http))


def test_without_the_extra_it_says_what_to_install(served: str) -> None:
    """A process of its own: in this one the SDK's modules are loaded already."""
    code = "import sys; sys.modules['mcp'] = None; from hutch.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, "mcp"], capture_output=True, text=True, timeout=60,
                          env=_env(HUTCH_URL=served), stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "pip install 'hutch[mcp]'" in done.stderr, done.stderr


def test_a_bad_bind_or_a_missing_server_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from hutch.cli import main

    monkeypatch.setenv("HUTCH_DATA_DIR", str(tmp_path))  # no `hutch serve` runs on it
    monkeypatch.delenv("HUTCH_URL", raising=False)
    for argv, said in ([["mcp"], "no hutch server"], [["--url", "http://x", "mcp", "--http", "nohost"], "HOST:PORT"],
                       [["--url", "http://x", "--api-key", "k", "mcp", "--http", "127.0.0.1:1"], "over HTTP"],
                       [["--url", "http://x", "--org-id", "org_b", "mcp", "--http", "127.0.0.1:1"], "over HTTP"],
                       [["--url", "http://x", "mcp", "--max-org-sessions", "3"], "is for --http"],
                       [["--url", "http://x", "mcp", "--http", "127.0.0.1:1", "--max-org-sessions", "0"], "1 or more"]):
        assert main(argv) == 2
        assert said in capsys.readouterr().err, argv


async def test_stdio_acts_in_the_organization_org_id_names(served: str, keys: dict[str, str]) -> None:
    """An operator's key serves one organization's agent: what the session makes is that
    organization's, seen by its members."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "hutch.cli", "--org-id", "org_mcpb", "mcp"],
                                   env=_env(HUTCH_URL=served, HUTCH_API_KEY=ADMIN))
    async with Client(params) as client:
        sid = (await call(client, "create_sandbox", keep=True))["sandbox_id"]
    async with SandboxClient(served, keys["B"]) as b:
        assert (await b.get(sid)).status != "terminated"
        await b.destroy(sid)


def test_stdio_in_an_organization_the_key_cannot_act_in_says_so_once(served: str, keys: dict[str, str],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from hutch.cli import main

    assert main(["--url", served, "--api-key", keys["B"], "--org-id", "org_mcpc", "mcp"]) == 1
    assert "org_mcpc" in capsys.readouterr().err


def test_stdio_with_a_bad_key_says_so_once_and_exits(served: str, capsys: pytest.CaptureFixture[str]) -> None:
    from hutch.cli import main

    assert main(["--url", served, "--api-key", "hk_wrong", "mcp"]) == 1
    assert "invalid API key" in capsys.readouterr().err
