"""A nomad sandbox paused with commands running (issue 36), against the real Nomad +
containerd: its exec agent is frozen with them and kept (its silence and a command's start
count on the run clock), their time limits stand still, and a command the agent does not run
(an alloc exec) refuses the pause, or waits for the resume. What the API shows of it (a
cancel while paused, a destroy, the paused timeout) is tests/api/test_lifecycle.py's, with
the local driver's; the driver's contract, tests/contracts/test_driver.py's TestPausing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hutch.core.errors import NotSupported
from hutch.drivers.base import ExecRequest, ExecResult, ProvisionRequest
from hutch.drivers.nomad import agent as agent_module
from hutch.drivers.nomad.driver import NomadDriver
from tests.drivers_support import Recorder, new_id, start_nomad
from tests.nomad.test_exec_agent import agent_load, run, until_agent


def command(driver: NomadDriver, sid: str, script: str, timeout: float | None = None
            ) -> tuple[asyncio.Future[ExecResult], Recorder]:
    sink = Recorder()
    req = ExecRequest(new_id("ex"), sid, ["sh", "-c", script], timeout=timeout)
    return asyncio.ensure_future(driver.exec(req, sink)), sink


async def test_a_pause_past_the_agents_silence_keeps_it_and_its_commands(
    driver: NomadDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paused 4 s, twice the agent's silence limit and four times a command's start limit:
    the frozen agent is not taken for a stopped one (its session and pid kept), the command
    it ran carries on past its 3 s limit (1 s of it used), and one sent to it while paused
    starts at the resume, forked by that same agent (not run again as an alloc exec)."""
    monkeypatch.setattr(agent_module, "SILENT_SECONDS", 2.0)
    monkeypatch.setattr(agent_module, "START_TIMEOUT", 1.0)
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest"))
    agent = await until_agent(driver, sid)
    running, out = command(driver, sid, "echo before; sleep 1; echo after", timeout=3.0)
    for _ in range(100):  # under way: its first line came
        if out.stdout:
            break
        await asyncio.sleep(0.05)
    await driver.pause(sid)
    late, late_out = command(driver, sid, "cut -d' ' -f4 /proc/$$/stat")  # its parent's pid
    await asyncio.sleep(4.0)
    assert not running.done() and not late.done()
    assert agent.alive and driver._agents.live(sid) is agent
    await driver.resume(sid)
    result = await asyncio.wait_for(running, 30)
    assert (result.exit_code, result.timed_out, out.stdout) == (0, False, "before\nafter\n")
    result = await asyncio.wait_for(late, 30)
    assert (result.exit_code, late_out.stdout.strip()) == (0, str(agent.pid)), late_out.stderr
    assert driver._agents.live(sid) is agent  # the same session throughout


async def test_a_time_limit_stands_still_while_paused_and_runs_out_after(driver: NomadDriver) -> None:
    """A command's limit counts on the run clock: paused 2 s of its 1.5 s, it has 1.2 s left
    at the resume, and a command that never ends still times out on it."""
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest"))
    await until_agent(driver, sid)
    endless, _ = command(driver, sid, "sleep 60", timeout=1.5)
    await asyncio.sleep(0.3)
    await driver.pause(sid)
    await asyncio.sleep(2.0)
    assert not endless.done()
    await driver.resume(sid)
    loop = asyncio.get_running_loop()
    resumed_at = loop.time()
    result = await asyncio.wait_for(endless, 30)
    assert result.timed_out and 0.8 < loop.time() - resumed_at < 5.0, loop.time() - resumed_at


@pytest.fixture
async def alloc_driver(tmp_path: Path) -> AsyncIterator[NomadDriver]:
    """Commands as their own alloc execs (HUTCH_NOMAD_EXEC=alloc): no agent."""
    d = await start_nomad(tmp_path / "data", exec_mode="alloc")
    assert isinstance(d, NomadDriver)
    yield d
    for sid in list(d._sandboxes):
        await d.destroy(sid)
    await d.close()


async def test_an_alloc_exec_refuses_the_pause_and_one_waits_for_the_resume(alloc_driver: NomadDriver) -> None:
    """A runc exec frozen while it starts holds the resume, so no alloc exec is frozen: a pause
    while one runs is a 501 naming it (the sandbox running on), and one that would start while
    paused waits for the resume, its time limit standing still meanwhile."""
    driver = alloc_driver
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest"))
    busy, out = command(driver, sid, "sleep 0.5; echo ran")
    await asyncio.sleep(0.2)
    (eid,) = [e for e, ex in driver._executions.items() if ex.sandbox_id == sid]
    with pytest.raises(NotSupported, match=rf"running as its own alloc exec, outside its exec agent \(execution {eid}\)"):
        await driver.pause(sid)
    result = await busy
    assert (result.exit_code, out.stdout) == (0, "ran\n")  # not frozen, not killed
    await driver.pause(sid)
    late, late_out = command(driver, sid, "echo late", timeout=1.5)
    await asyncio.sleep(2.0)
    assert not late.done()
    await driver.resume(sid)
    result = await asyncio.wait_for(late, 30)
    assert (result.exit_code, result.timed_out, late_out.stdout) == (0, False, "late\n")
    await driver.pause(sid)
    doomed, _ = command(driver, sid, "echo never")
    await asyncio.sleep(0.3)
    await driver.destroy(sid)  # a destroy of the paused sandbox ends the waiting command too
    result = await asyncio.wait_for(doomed, 30)
    assert result.cancelled


async def test_a_command_cancelled_as_its_sandbox_pauses_ends_in_the_agent_too(driver: NomadDriver) -> None:
    """Cancelled once the pause has stopped the run clock, a command is killed through the
    plugin (the agent may be frozen, taking no signal) and its output no longer read. Its
    output window was full (``yes``): its pump in the agent waited for acknowledgements no one
    would send, and the agent held the command (pumps, pipes, its end) for the rest of its
    session. Now the API says it dropped the command, and all of it ends: the agent's load
    (its heartbeat) goes back to what it was before."""
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest"))
    agent = await until_agent(driver, sid)
    idle = await agent_load(agent, lambda load: "goroutines" in load, 10.0)
    assert idle.get("commands") == 0, idle
    req = ExecRequest(new_id("ex"), sid, ["yes"])
    running = asyncio.ensure_future(driver.exec(req, Recorder()))
    busy = await agent_load(agent, lambda load: load.get("commands") == 1, 10.0)
    assert busy.get("commands") == 1, busy
    pausing = asyncio.ensure_future(driver.pause(sid))
    for _ in range(100_000):  # the run clock stops first, then the plugin freezes the task
        if agent.clock.frozen:
            break
        await asyncio.sleep(0)
    assert agent.clock.frozen and not pausing.done()
    await driver.cancel(req.execution_id)
    result = await asyncio.wait_for(running, 30)
    assert result.cancelled
    await pausing
    await asyncio.sleep(1.0)
    await driver.resume(sid)
    after = await agent_load(agent, lambda load: load.get("commands") == 0
                             and load.get("goroutines", 10**6) <= idle["goroutines"], 15.0)
    assert after.get("commands") == 0 and after.get("goroutines", 10**6) <= idle["goroutines"], (
        f"the agent still holds the cancelled command: {after}, idle {idle}")
    code, sink = await run(driver, sid, ["echo", "usable"])
    assert (code, sink.stdout) == (0, "usable\n")
