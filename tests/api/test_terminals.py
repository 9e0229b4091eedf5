"""Terminals over the websocket (api/routes/terminals.py), on the drivers that have them
(the fake driver answers 501: it runs nothing for real)."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import pytest

from tests.api.conftest import AUTH, NODE, REAL, WIRE, Api, AppFactory


class Screen:
    """A websocket terminal client that keeps what it has seen."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.text = ""
        self.exit_code: int | None = None
        self.errors: list[str] = []

    async def send(self, text: str) -> None:
        await self.ws.send_bytes(text.encode())

    async def expect(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        """Read until ``pattern`` is on the screen (what came after the last match)."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    if (m := re.search(pattern, self.text)) is not None:
                        self.text = self.text[m.end():]
                        return m
                    if not await self._one():
                        raise AssertionError(f"ended before {pattern!r}; screen: {self.text[-500:]!r}")
        except TimeoutError:
            raise AssertionError(f"no {pattern!r} in {timeout} s; screen: {self.text[-500:]!r}") from None

    async def _one(self) -> bool:
        msg = await self.ws.receive()
        if msg.type is aiohttp.WSMsgType.BINARY:
            self.text += msg.data.decode(errors="replace")
        elif msg.type is aiohttp.WSMsgType.TEXT:
            body = json.loads(msg.data)
            if body["type"] == "exit":
                self.exit_code = body["exitCode"]
            else:
                self.errors.append(body["message"])
        else:
            return False
        return True

    async def until_exit(self, timeout: float = 30.0) -> int:
        async with asyncio.timeout(timeout):
            while self.exit_code is None and await self._one():
                pass
        assert self.exit_code is not None, self.text[-500:]
        return self.exit_code


async def _sandbox(api: Api, **body: object) -> str:
    return (await api.data("POST", "/sandbox", json={"runtime": "base:latest", **body}, expect=201))["sandboxId"]


async def _open(api: Api, sid: str, **query: object) -> Screen:
    ws = await api.client.ws_connect(f"/sandbox/{sid}/terminal", params=query or None, headers=AUTH)
    return Screen(ws)


async def _run(api: Api, sid: str, script: str) -> str:
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sh", "-c", script]})
    await api.wait_execution(ex["executionId"])
    return (await api.stream(ex["stdoutStreamUrl"])).decode()


@pytest.mark.runs_on(*REAL)  # each real driver's terminals
async def test_a_shell_runs_commands_as_the_sandbox_user_and_passes_its_exit_code(api: Api) -> None:
    sid = await _sandbox(api, env={"GREETING": "hi"})
    screen = await _open(api, sid)
    await screen.send("echo \"[$((6*7))] [$(id -u)] [$GREETING] [$TERM] [$(tty)]\"\n")
    m = await screen.expect(r"\[42\] \[(\d+)\] \[hi\] \[xterm-256color\] \[(/dev/pts/\d+)\]")
    assert m[1] != "0"  # the sandbox user, never root
    await screen.send("exit 3\n")
    assert await screen.until_exit() == 3
    await api.call("DELETE", f"/sandbox/{sid}")


@pytest.mark.runs_on(*REAL, *NODE)  # each real driver's terminals; the node driver's websocket
async def test_a_command_a_size_a_resize_and_ctrl_c(api: Api) -> None:
    sid = await _sandbox(api)
    screen = await _open(api, sid, rows=30, cols=100, command="sh")
    await screen.send("stty size\n")
    await screen.expect(r"30 100")
    await screen.ws.send_str(json.dumps({"type": "resize", "rows": 40, "cols": 132}))
    await screen.send("stty size\n")
    await screen.expect(r"40 132")
    # Ctrl-C reaches the foreground job, not the shell: the shell answers afterwards.
    await screen.send("sleep 100\n")
    await asyncio.sleep(0.5)
    await screen.send("\x03")
    await screen.send("echo after-sleep-$?\n")
    await screen.expect(r"after-sleep-130")
    await screen.send("echo still-$((1+1))\n")
    await screen.expect(r"still-2")
    await screen.ws.send_str(json.dumps({"type": "resize", "rows": 0, "cols": 10}))
    await screen.send("exit\n")
    assert await screen.until_exit() == 0
    assert screen.errors and "rows" in screen.errors[0]
    await api.call("DELETE", f"/sandbox/{sid}")


@pytest.mark.runs_on(*REAL, *NODE)  # each real driver's terminals; a hang-up through the agent
async def test_a_client_that_leaves_hangs_the_terminal_up(api: Api) -> None:
    sid = await _sandbox(api)
    screen = await _open(api, sid, command=["sh", "-c", "trap '' HUP; echo started; sleep 300"])
    await screen.expect("started")
    await screen.ws.close()
    for _ in range(50):  # the session is hung up, and what ignores SIGHUP is killed
        if "sleep 300" not in await _run(api, sid, "ps -eo args"):
            break
        await asyncio.sleep(0.2)
    else:
        raise AssertionError("sleep 300 outlived its terminal")
    await api.call("DELETE", f"/sandbox/{sid}")


@pytest.mark.runs_on(*REAL)  # each real driver's terminals
async def test_a_paused_sandbox_resumes_for_a_terminal(api: Api) -> None:
    sid = await _sandbox(api)
    await api.call("POST", f"/sandbox/{sid}/pause")
    screen = await _open(api, sid, command=["echo", "woke"])
    await screen.expect("woke")
    assert await screen.until_exit() == 0
    assert (await api.data("GET", f"/sandbox/{sid}"))["status"] in ("idle", "running")
    await api.call("DELETE", f"/sandbox/{sid}")


@pytest.mark.runs_on(*REAL)  # each real driver's terminals
async def test_terminal_activity_keeps_the_sandbox_from_idling_out(api: Api) -> None:
    sid = await _sandbox(api, timeout={"idle": "3s"})
    screen = await _open(api, sid, command="sh")
    for i in range(7):  # 7 s of typing: more than twice the idle timeout
        await screen.send(f"echo tick-$(({i}+100))\n")
        try:
            await screen.expect(f"tick-{i + 100}")
        except AssertionError:
            events = (await api.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100"))["events"]
            raise AssertionError([(e["type"], e.get("event")) for e in events]) from None
        await asyncio.sleep(1)
    assert (await api.data("GET", f"/sandbox/{sid}"))["status"] in ("idle", "running")
    await screen.send("exit\n")
    await screen.until_exit()
    await api.call("DELETE", f"/sandbox/{sid}")


@pytest.mark.runs_on(*REAL)  # refusals, and a real missing command's 127
async def test_bad_requests_are_clear_errors_before_any_upgrade(api: Api) -> None:
    sid = await _sandbox(api)
    body = await api.call("GET", f"/sandbox/{sid}/terminal", expect=400)
    assert "websocket" in body["message"]
    for query, field in (({"rows": "0"}, "rows"), ({"cols": "x"}, "cols"), ({"term": "a b"}, "term")):
        with pytest.raises(aiohttp.WSServerHandshakeError) as err:
            await api.client.ws_connect(f"/sandbox/{sid}/terminal", params=query, headers=AUTH)
        assert err.value.status == 400, (query, field)
    with pytest.raises(aiohttp.WSServerHandshakeError) as err:
        await api.client.ws_connect("/sandbox/sbx_doesnotexist00000000000000/terminal", headers=AUTH)
    assert err.value.status == 404
    with pytest.raises(aiohttp.WSServerHandshakeError) as err:
        await api.client.ws_connect(f"/sandbox/{sid}/terminal")  # no key
    assert err.value.status == 401
    screen = await _open(api, sid, command="no-such-command")
    assert await screen.until_exit() == 127
    assert "not found" in screen.text
    await api.call("DELETE", f"/sandbox/{sid}")


@pytest.mark.runs_on(*WIRE)  # the fake driver's refusal
async def test_the_fake_driver_has_no_terminals(make_api: AppFactory) -> None:
    api = await make_api(driver="fake")
    sid = await _sandbox(api)
    with pytest.raises(aiohttp.WSServerHandshakeError) as err:
        await api.client.ws_connect(f"/sandbox/{sid}/terminal", headers=AUTH)
    assert err.value.status == 501
