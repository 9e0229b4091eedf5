"""A node agent killed, and a sandbox's init killed on a node: the node driver reports the
sandboxes failed, naming the node, and a node that comes back ends what it still runs of them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from hutch.core.errors import DriverFailure
from hutch.drivers.base import ExecRequest, ProvisionRequest
from hutch.drivers.node import wire
from hutch.drivers.node.client import AgentClient
from tests.drivers_support import (
    NODE_SECRET,
    NodeAgents,
    Recorder,
    built_runtimes,  # noqa: F401  (fixture)
    new_id,
    require_root,
    start_node,
)

pytestmark = pytest.mark.isolation


async def _listed(address: str) -> list[str]:
    path = "/v1/sandboxes"
    async with aiohttp.ClientSession() as s, \
            s.get(f"https://{address}{path}", headers=wire.sign(NODE_SECRET.encode(), "GET", path), ssl=False) as resp:
        return list((await resp.json())["sandboxes"])


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed init is reparented; whether it is reaped at once is
    not ours to decide)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def _until(what: str, check, timeout: float) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.1)
    return time.monotonic() - started


async def test_a_lost_node_fails_its_sandboxes_and_ends_them_when_it_returns(built_runtimes: Path,  # noqa: F811
                                                                              tmp_path: Path) -> None:
    require_root()
    agents = NodeAgents(tmp_path, ("lost1",))
    driver = await start_node(agents)  # the default LOST_AFTER: the 15 s is the bound
    ended: list[tuple[str, str, bool]] = []

    async def listener(sid: str, reason: str, failed: bool) -> None:
        ended.append((sid, reason, failed))

    driver.set_listener(listener)
    try:
        # An init killed on the host: reported through the agent.
        killed = new_id()
        await driver.provision(ProvisionRequest(killed, "base:latest"))
        meta = json.loads((tmp_path / "lost1" / "sandboxes" / killed / "meta.json").read_text())
        os.kill(int(meta["init_pid"]), signal.SIGKILL)
        await _until("the killed init reported", lambda: any(e[0] == killed for e in ended), 10)
        sid, reason, failed = next(e for e in ended if e[0] == killed)
        assert failed and reason.startswith("on node lost1: the sandbox's init process"), reason

        # The agent killed: its sandboxes failed within 15 s, naming the node.
        sid = new_id()
        await driver.provision(ProvisionRequest(sid, "base:latest", port=8000))
        tunnel = await driver.port_target(sid)
        running = asyncio.create_task(driver.exec(ExecRequest(new_id("ex"), sid, ["sleep", "60"]), Recorder()))
        await asyncio.sleep(0.5)
        agents.kill("lost1")
        with pytest.raises(DriverFailure):
            await asyncio.wait_for(running, 5)  # not left hanging on a dead agent
        took = await _until("the lost node's sandbox failed", lambda: any(e[0] == sid for e in ended), 15)
        _, reason, failed = next(e for e in ended if e[0] == sid)
        assert failed and reason.startswith("node lost1 was lost: its agent has not answered for"), reason
        print(f"lost after {took:.1f} s")
        with pytest.raises(ConnectionRefusedError):  # its port's listener went with it
            await asyncio.open_connection(*tunnel)
        assert sid in await asyncio.to_thread(lambda: os.listdir(tmp_path / "lost1" / "sandboxes"))  # still there

        # It comes back (adopting what runs): the failed sandbox is ended there.
        agents.restart("lost1")
        assert sid in await _listed(agents.addresses["lost1"])
        for _ in range(150):
            if sid not in await _listed(agents.addresses["lost1"]):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the returned node still runs the sandbox failed while it was lost")
    finally:
        for left in await driver.alive():
            await driver.destroy(left)
        await driver.close()
        await asyncio.to_thread(agents.stop)


async def test_reap_ends_what_a_stopped_agent_left(built_runtimes: Path, tmp_path: Path) -> None:  # noqa: F811
    """A stopped agent leaves its sandboxes running (its next start adopts them); a cluster's
    stop ends them with ``hutch node reap``."""
    require_root()
    agents = NodeAgents(tmp_path, ("r1",))
    driver = await start_node(agents)
    sid = new_id()
    try:
        await driver.provision(ProvisionRequest(sid, "base:latest"))
        meta = json.loads((tmp_path / "r1" / "sandboxes" / sid / "meta.json").read_text())
    finally:
        await driver.close()
        await asyncio.to_thread(agents.stop)
    init = int(meta["init_pid"])
    assert _running(init)  # still running after its agent stopped
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "hutch", "node", "reap", "--data-dir",
                                                str(tmp_path / "r1"), stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert proc.returncode == 0 and out.decode().startswith("hutch node reap: ended 1 sandboxes"), out
    assert not _running(init)
    assert not (tmp_path / "r1" / "sandboxes" / sid).exists()


async def test_a_silent_node_is_lost_too_and_ends_its_sandbox_when_it_answers(built_runtimes: Path,  # noqa: F811
                                                                              tmp_path: Path) -> None:
    """A host that stops answering (SIGSTOP: connections open, nothing comes back), as a
    partition looks: every read times out, and the node is still lost within 15 s."""
    require_root()
    agents = NodeAgents(tmp_path, ("quiet",))
    driver = await start_node(agents)
    ended: list[tuple[str, str, bool]] = []

    async def listener(sid: str, reason: str, failed: bool) -> None:
        ended.append((sid, reason, failed))

    driver.set_listener(listener)
    pid = agents.procs["quiet"].pid
    try:
        sid = new_id()
        await driver.provision(ProvisionRequest(sid, "base:latest"))
        os.kill(pid, signal.SIGSTOP)
        took = await _until("the silent node's sandbox failed", lambda: any(e[0] == sid for e in ended), 15)
        print(f"lost after {took:.1f} s")
        assert ended == [(sid, "node quiet was lost: its agent has not answered for 8 s", True)]
        os.kill(pid, signal.SIGCONT)
        for _ in range(100):
            if sid not in await _listed(agents.addresses["quiet"]):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the node that answered again still runs the sandbox failed meanwhile")
    finally:
        os.kill(pid, signal.SIGCONT)
        for left in await driver.alive():
            await driver.destroy(left)
        await driver.close()
        await asyncio.to_thread(agents.stop)


async def test_a_create_whose_answer_was_lost_is_ended_when_its_node_answers(built_runtimes: Path,  # noqa: F811
                                                                             tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent made the sandbox and died before answering: the create failed (the service
    records it so and asks for a destroy, which finds no node answering), and the agent's next
    start adopts the sandbox. Nothing else would ever end it: the driver does, when its node
    answers again."""
    require_root()
    agents = NodeAgents(tmp_path, ("lossy",))
    driver = await start_node(agents)
    sid = new_id()
    original = AgentClient.json

    async def answer_lost(self: AgentClient, method: str, path_qs: str, body: object = None, **kw: object) -> object:
        answer = await original(self, method, path_qs, body, **kw)  # type: ignore[arg-type]
        if method == "PUT" and path_qs.endswith(f"/sandboxes/{sid}"):
            await asyncio.to_thread(agents.kill, "lossy")  # made, then the agent died: no answer came
            raise DriverFailure("node lossy did not answer: it closed the connection")
        return answer

    monkeypatch.setattr(AgentClient, "json", answer_lost)
    try:
        with pytest.raises(DriverFailure):
            await driver.provision(ProvisionRequest(sid, "base:latest"))
        await driver.destroy(sid)  # what the service does after a failed provision: no node answers
        agents.restart("lossy")
        assert sid in await _listed(agents.addresses["lossy"])  # adopted by the new agent
        for _ in range(100):
            if sid not in await _listed(agents.addresses["lossy"]):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the sandbox of the create that failed still runs on its node")
    finally:
        for left in await driver.alive():
            await driver.destroy(left)
        await driver.close()
        await asyncio.to_thread(agents.stop)
        await asyncio.to_thread(agents.reap)  # the orphan, should the driver not have ended it
