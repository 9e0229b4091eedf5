"""The exec agent's helpers (drivers/nomad/helpers.py) never hold up what does not need them,
and never wait for ever: CI's POST /fs (tests/api/test_ports.py) waited 300 s on the xattrs
helper of its __pycache__ listing, a zombie whose exit the agent never reported."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hutch.core.errors import DriverFailure
from hutch.drivers.base import ExecRequest
from hutch.drivers.nomad import helpers as helpers_module
from hutch.drivers.nomad.agent import ExecAgent
from hutch.drivers.nomad.driver import NomadDriver
from tests.drivers_support import Recorder, new_id, provision
from tests.nomad.test_exec_agent import run, until_agent

SOURCE = b"print('served')\n"


def lose_helper_exits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's exit frames of helpers never arrive (what the zombie did): the commands'
    own are left alone."""
    helpers: set[tuple[int, int]] = set()
    real_run, real_frame = ExecAgent.run, ExecAgent._frame

    async def run_(self: ExecAgent, *args: Any, helper: bool = False, **kw: Any) -> int | None:
        if helper:  # its command id is the next one: nothing runs between here and its taking it
            helpers.add((id(self), self._next_id))
        return await real_run(self, *args, helper=helper, **kw)

    def frame(self: ExecAgent, kind: bytes, cid: int, payload: bytes) -> None:
        if not (kind == b"X" and (id(self), cid) in helpers):
            real_frame(self, kind, cid, payload)

    monkeypatch.setattr(ExecAgent, "run", run_)
    monkeypatch.setattr(ExecAgent, "_frame", frame)


async def slowly(data: bytes, pieces: int, pause: float) -> AsyncIterator[bytes]:
    size = -(-len(data) // pieces)
    for at in range(0, len(data), size):
        yield data[at:at + size]
        await asyncio.sleep(pause)


async def read(driver: NomadDriver, sid: str, path: str) -> bytes:
    return b"".join([chunk async for chunk in driver.read_file(sid, path)])


async def test_a_helper_whose_exit_never_comes_holds_up_no_write_and_ends_naming_the_sandbox(
        driver: NomadDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(helpers_module, "HELPER_TIMEOUT", 2.0)
    sid = await provision(driver, "python:3.13")
    await until_agent(driver, sid)
    lose_helper_exits(monkeypatch)
    async with asyncio.timeout(20):  # it waited 300 s, then the client gave up
        await driver.write_file(sid, "server.py", slowly(SOURCE, 1, 0))
    assert await read(driver, sid, "server.py") == SOURCE
    started = time.monotonic()
    with pytest.raises(DriverFailure, match=rf"sandbox {sid}: the meta helper did not finish within 2 s"):
        await asyncio.wait_for(driver.set_metadata(sid, "server.py", {"k": "v"}), 20)
    # A listing is not refused for the metadata it could not read: it comes without it.
    entries = await asyncio.wait_for(driver.list_files(sid, "server.py"), 20)
    assert [(e.name, e.metadata) for e in entries] == [("server.py", {})]
    assert time.monotonic() - started < 15


async def test_an_agent_killed_mid_write_fails_its_helper_in_seconds_and_the_write_lands(
        driver: NomadDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent is killed while a .py streams in and a metadata helper waits on it: the
    helper fails naming the sandbox, at once, and the write (an alloc exec of its own) lands."""
    sid = await provision(driver, "python:3.13")
    agent = await until_agent(driver, sid)
    lose_helper_exits(monkeypatch)  # the helper is still running when its agent goes
    await driver.write_file(sid, "tagged.txt", slowly(b"x", 1, 0))
    tagging = asyncio.ensure_future(driver.set_metadata(sid, "tagged.txt", {"k": "v"}))
    body = SOURCE * 5000
    writing = asyncio.ensure_future(driver.write_file(sid, "app.py", slowly(body, 20, 0.1)))
    code, _ = await run(driver, sid, ["sh", "-c", f"(sleep 0.5; kill -9 {agent.pid}) >/dev/null 2>&1 &"])
    assert code == 0
    started = time.monotonic()
    with pytest.raises(DriverFailure, match=rf"sandbox {sid}: its exec agent ended while the command ran"):
        await asyncio.wait_for(tagging, 20)
    assert time.monotonic() - started < 10
    assert await asyncio.wait_for(writing, 30) == len(body)
    assert await read(driver, sid, "app.py") == body
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, ["sh", "-c", "ps -eo args"]), sink)
    assert result.exit_code == 0 and "hutch-exec-agent-helper" not in sink.stdout, sink.stdout

