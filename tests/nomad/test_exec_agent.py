"""The nomad driver's exec agent (drivers/nomad/agent.py, scripts/services.d/nomad/exec-agent)
against the real Nomad + containerd: commands forked by it are as confined as alloc execs,
keep their streams apart, and survive the agent being killed, stopped or starved."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from hutch.core.errors import DriverFailure, SandboxBusy
from hutch.drivers.base import ExecRequest, ProvisionRequest, ResourceLimits
from hutch.drivers.nomad import agent as agent_module
from hutch.drivers.nomad import agents as agents_module
from hutch.drivers.nomad import commands
from hutch.drivers.nomad.agent import ExecAgent
from hutch.drivers.nomad.client import NomadClient
from hutch.drivers.nomad.driver import NomadDriver
from hutch.drivers.nomad.execs import ENVELOPE, noop
from hutch.drivers.nomad.jobs import TASK
from tests.drivers_support import NOMAD_ADDR, NOMAD_TOKEN, Recorder, new_id, start_nomad
from tests.isolation import terminal_probe

# The terminal probe plus what a parent passes through exec: signal dispositions and mask,
# environment, umask, working directory, OOM score.
PROBE = terminal_probe.PROBE + textwrap.dedent("""
    extra = {k: status[k].strip() for k in ("SigIgn", "SigBlk", "Groups", "Umask")}
    extra["env"] = sorted(k for k in os.environ if k != "HUTCH_EXEC_TAG")
    extra["cwd"] = os.getcwd()
    extra["oom_score_adj"] = open("/proc/self/oom_score_adj").read().strip()
    extra["fds"] = sorted(os.listdir("/proc/self/fd"))
    print("EXTRA" + json.dumps(extra))
""")


async def until_agent(driver: NomadDriver, sid: str, other_than: int | None = None) -> ExecAgent:
    """The sandbox's running agent (started in the background after a create or a loss)."""
    for _ in range(600):
        driver._agents.ensure(driver.running(sid))
        agent = driver._agents.live(sid)
        if agent is not None and agent.pid != other_than:
            return agent
        await asyncio.sleep(0.05)
    raise AssertionError(f"no exec agent came up in sandbox {sid}")


async def run(driver: NomadDriver, sid: str, argv: list[str], stdin: bytes | None = None) -> tuple[int, Recorder]:
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, argv, stdin=stdin), sink)
    return result.exit_code, sink


async def parent_of_a_command(driver: NomadDriver, sid: str) -> int:
    code, sink = await run(driver, sid, ["sh", "-c", "cut -d' ' -f4 /proc/$$/stat"])
    assert code == 0, sink.text("stderr")
    return int(sink.stdout)


def extra(output: str) -> dict:
    return json.loads(output.split("EXTRA", 1)[1])


async def test_a_command_through_the_agent_is_as_confined_as_an_alloc_exec(driver: NomadDriver) -> None:
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="python:3.13", env={"FROM_CREATE": "1"}))
    agent = await until_agent(driver, sid)
    assert await parent_of_a_command(driver, sid) == agent.pid  # forked by the agent: no runc exec
    code, through_agent = await run(driver, sid, ["python3", "-c", PROBE])
    assert code == 0, through_agent.text("stderr")
    await driver._agents.drop(sid)
    await driver._agents.hold(sid)  # no agent: the command is its own alloc exec
    code, through_alloc = await run(driver, sid, ["python3", "-c", PROBE])
    assert code == 0, through_alloc.text("stderr")
    assert await parent_of_a_command(driver, sid) == 0  # runc's exec: a parent outside the sandbox
    driver._agents.release(sid)
    assert terminal_probe.parse(through_agent.stdout) == terminal_probe.parse(through_alloc.stdout)
    assert extra(through_agent.stdout) == extra(through_alloc.stdout)
    assert "FROM_CREATE" in extra(through_agent.stdout)["env"]


async def test_concurrent_commands_keep_their_streams_apart(driver: NomadDriver) -> None:
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest"))
    agent = await until_agent(driver, sid)
    # Each: 3 MiB of its own letter on stdout (past the 1 MiB window), its stdin echoed back, a
    # line on stderr, its own exit code.
    letters = "abcdefgh"
    script = "head -c 3145728 /dev/zero | tr '\\0' {l}; cat; echo err-{l} >&2; exit {n}"
    inputs = {letter: letter.upper().encode() * 100_000 for letter in letters}
    results = await asyncio.gather(*(
        run(driver, sid, ["sh", "-c", script.format(l=letter, n=n)], stdin=inputs[letter])
        for n, letter in enumerate(letters)))
    for n, (letter, (code, sink)) in enumerate(zip(letters, results, strict=True)):
        assert code == n
        assert sink.stdout == letter * 3145728 + inputs[letter].decode()
        assert sink.text("stderr") == f"err-{letter}\n"
    assert driver._agents.live(sid) is agent  # all of it through the one agent


async def test_a_command_that_exits_at_once_keeps_its_output(driver: NomadDriver) -> None:
    """Its exit can be reaped before its output is read: the exit waits for the read (the
    reaper once finished such a command with nothing read, under load: exit 0, no output)."""
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest"))
    await until_agent(driver, sid)
    for _ in range(5):
        results = await asyncio.gather(*(run(driver, sid, ["echo", str(i)]) for i in range(48)))
        assert [(c, s.stdout) for c, s in results] == [(0, f"{i}\n") for i in range(48)]


async def agent_load(agent: ExecAgent, ready: Callable[[dict[str, int]], bool], seconds: float) -> dict[str, int]:
    """The agent's load at its heartbeats (every 2 s) until ``ready`` holds, or the last one."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    load = agent.load()
    while not ready(load) and loop.time() < deadline:
        await asyncio.sleep(0.2)
        load = agent.load()
    return load


async def test_the_agents_heartbeat_says_what_it_holds(driver: NomadDriver) -> None:
    """The heartbeat carries the agent's load: the commands it holds and its goroutines, which
    go back to what they were once its commands have ended (what a command leaves behind in
    the agent shows there)."""
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest"))
    agent = await until_agent(driver, sid)
    idle = await agent_load(agent, lambda load: "goroutines" in load, 10.0)
    assert idle.get("commands") == 0 and idle["goroutines"] > 0, idle
    running = asyncio.ensure_future(run(driver, sid, ["sh", "-c", "echo up; sleep 5"]))
    busy = await agent_load(agent, lambda load: load.get("commands") == 1, 10.0)
    assert busy.get("commands") == 1 and busy["goroutines"] > idle["goroutines"], (busy, idle)
    assert (await running)[0] == 0
    after = await agent_load(agent, lambda load: load == idle, 10.0)
    assert after == idle, (after, idle)


async def test_a_streamed_stdin_goes_through_in_order(driver: NomadDriver) -> None:
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest"))
    await until_agent(driver, sid)

    async def blocks():  # 8 MiB in uneven blocks, well past the stdin window
        for i in range(64):
            yield bytes([i]) * (131072 + i)

    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, ["sha256sum"], stdin=blocks()), sink)
    expected = hashlib.sha256(b"".join(bytes([i]) * (131072 + i) for i in range(64))).hexdigest()
    assert result.exit_code == 0 and sink.stdout.split()[0] == expected


async def test_a_silent_command_is_not_taken_for_a_stopped_agent(driver: NomadDriver,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Its start is confirmed by a frame that wakes no one; a long silence after it is the
    command's own (a streamed upload into sha256sum once failed here after 5 s)."""
    monkeypatch.setattr(agent_module, "START_TIMEOUT", 0.5)
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest"))
    agent = await until_agent(driver, sid)

    async def blocks():
        for _ in range(16):
            yield b"x" * 65536

    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, ["sh", "-c", "sleep 2; wc -c"], stdin=blocks()), sink)
    assert (result.exit_code, sink.stdout.strip()) == (0, "1048576")
    assert driver._agents.live(sid) is agent


async def test_errors_read_as_before(driver: NomadDriver) -> None:
    from hutch.core.errors import InvalidInput

    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest"))
    await until_agent(driver, sid)
    code, sink = await run(driver, sid, ["no-such-command"])
    assert (code, sink.text("stderr")) == (127, "no-such-command: command not found\n")
    with pytest.raises(InvalidInput) as caught:
        await driver.exec(ExecRequest(new_id("ex"), sid, ["true"], cwd="no/such/dir"), Recorder())
    assert caught.value.field == "cwd"
    code, sink = await run(driver, sid, ["sh", "-c", "yes | head -c 3"])  # SIGPIPE is not ignored
    assert (code, sink.stdout) == (0, "y\ny")


async def test_a_killed_agent_is_replaced_and_its_running_command_fails(driver: NomadDriver) -> None:
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest"))
    agent = await until_agent(driver, sid)
    running = asyncio.ensure_future(run(driver, sid, ["sh", "-c", "sleep 60; echo never"]))
    # From inside the sandbox, a moment later, by a command that itself has ended.
    code, _ = await run(driver, sid, ["sh", "-c", f"(sleep 0.5; kill -9 {agent.pid}) >/dev/null 2>&1 &"])
    assert code == 0
    with pytest.raises(DriverFailure, match="exec agent ended while the command ran"):
        await running
    code, sink = await run(driver, sid, ["sh", "-c", "echo still; ps -eo args"])  # through alloc exec, or a new agent
    assert code == 0 and sink.stdout.startswith("still\n")
    assert "sleep 60" not in sink.stdout  # the dead agent's command did not run on
    new = await until_agent(driver, sid, other_than=agent.pid)
    assert await parent_of_a_command(driver, sid) == new.pid


async def test_a_stopped_agent_is_ended_and_the_command_runs_without_it(driver: NomadDriver) -> None:
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest"))
    agent = await until_agent(driver, sid)
    code, _ = await run(driver, sid, ["sh", "-c", f"(sleep 0.3; kill -STOP {agent.pid}) >/dev/null 2>&1 &"])
    assert code == 0
    await asyncio.sleep(0.6)  # let the stop land: the next command then meets a stopped agent
    code, sink = await run(driver, sid, ["echo", "ran"], stdin=b"")
    assert (code, sink.stdout) == (0, "ran\n")
    new = await until_agent(driver, sid, other_than=agent.pid)
    code, sink = await run(driver, sid, ["ps", "-eo", "pid"])
    assert str(agent.pid) not in sink.stdout.split()  # the stopped one was ended, not left behind
    assert await parent_of_a_command(driver, sid) == new.pid


async def test_an_agent_stopped_while_a_command_runs_is_ended_and_the_command_fails(
    driver: NomadDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stopped agent sends no heartbeat: its session is ended and the command it forked is
    killed and fails, instead of waiting for its own timeout (60 s here)."""
    monkeypatch.setattr(agent_module, "SILENT_SECONDS", 3.0)
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest"))
    agent = await until_agent(driver, sid)
    running = asyncio.ensure_future(run(driver, sid, ["sh", "-c", "sleep 60; echo never"]))
    code, _ = await run(driver, sid, ["sh", "-c", f"(sleep 0.5; kill -STOP {agent.pid}) >/dev/null 2>&1 &"])
    assert code == 0
    with pytest.raises(DriverFailure, match="exec agent ended while the command ran"):
        await asyncio.wait_for(running, 30)
    code, sink = await run(driver, sid, ["ps", "-eo", "pid,args"])
    assert code == 0 and "sleep 60" not in sink.stdout, sink.stdout
    assert str(agent.pid) not in [line.split()[0] for line in sink.stdout.splitlines()[1:]]


@pytest.mark.parametrize("resources", [ResourceLimits(memory_bytes=16 * 2**20), ResourceLimits(pids=12)],
                         ids=["16MiB", "12-pids"])
async def test_a_starved_sandbox_still_runs_commands(
        driver: NomadDriver, resources: ResourceLimits, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent fits a 16 MiB sandbox (~3 MiB: its binary, unlinked, and its heap) and one
    with 12 pids (GOMAXPROCS=1: six threads), and runs their commands itself, none as an alloc
    exec. 12 pids may not hold four commands at once: init-sh and its sleep take 2, the agent 6
    threads (its 3 spares included; 7 or 8 once it had run commands, with none), so a fourth
    fork may be refused (EAGAIN) until an echo ends, and waits for it (commands.PIDS_WAIT). It once
    fell back to an alloc exec, whose process runc moves into the sandbox's cgroup, where it
    makes more: two at once had forks refused and Nomad dropped a stream (code 1006), 2 runs
    in 21 of a loop of this test's body."""

    async def no_alloc_exec(*_a: object, **_kw: object) -> None:
        raise AssertionError("a command of a starved sandbox ran as an alloc exec, not through its agent")

    monkeypatch.setattr(commands, "run_tagged", no_alloc_exec)
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest", resources=resources))
    agent = await until_agent(driver, sid)
    assert await parent_of_a_command(driver, sid) == agent.pid
    for _ in range(3):
        code, sink = await run(driver, sid, ["sh", "-c", "echo ok; cat"], stdin=b"in")
        assert (code, sink.stdout) == (0, "ok\nin")
    results = await asyncio.gather(*(run(driver, sid, ["echo", str(i)]) for i in range(4)))
    assert [(c, s.stdout) for c, s in results] == [(0, f"{i}\n") for i in range(4)]
    assert driver._agents.live(sid) is agent


# Forks sleepers until the pids limit refuses one, says so, and takes any pid freed after (a
# shell cannot: dash exits at its first refused fork, which frees a pid), for $1 s: then every
# process it made ends at one moment, freeing the limit at once (not a cancel). The plugin's pids
# guard (containerd-driver/pidsguard.go) leaves it running: forks refused in 2 consecutive seconds
# end the busiest tag of an ended command only, and the agent's running commands are its
# children (it killed them too, 137 at ~2 s, until they were told apart that way).
FILL_PIDS = textwrap.dedent("""
    import os, sys, time
    end = time.time() + float(sys.argv[1])
    said = False
    while time.time() < end:
        try:
            if os.fork() == 0:
                time.sleep(max(0.0, end - time.time()))
                os._exit(0)
        except BlockingIOError:
            if not said:
                print("full", flush=True)
                said = True
            time.sleep(0.01)
""")


async def test_a_command_finding_no_pid_left_is_refused_by_name(
        driver: NomadDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sandbox whose own processes hold its pids limit: a command waits for a pid
    (PIDS_WAIT, 1 s here), then fails as SandboxBusy naming the limit. It once ran as an
    alloc exec instead: runc moved it into the cgroup past pids.max (v1), so it ran beyond the
    limit here, and two at once lost their streams (the test above). The agent lives on (its
    spare threads: 64 pids), and runs the next command once the limit has room."""
    monkeypatch.setattr(commands, "PIDS_WAIT", 1.0)
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="python:3.13", resources=ResourceLimits(pids=64)))
    agent = await until_agent(driver, sid)
    filler = ExecRequest(new_id("ex"), sid, ["python3", "-c", FILL_PIDS, "60"], timeout=30.0)
    sink = Recorder()
    holding = asyncio.ensure_future(driver.exec(filler, sink))
    for _ in range(200):
        if sink.stdout == "full\n" or holding.done():
            break
        await asyncio.sleep(0.05)
    assert sink.stdout == "full\n", sink.stderr
    with pytest.raises(SandboxBusy, match=r"at its pids limit \(64 processes and threads\)"):
        await run(driver, sid, ["echo", "never"])
    await driver.cancel(filler.execution_id)
    assert (await holding).cancelled
    code, after = await run(driver, sid, ["echo", "after"])
    assert (code, after.stdout) == (0, "after\n") and driver._agents.live(sid) is agent


async def test_a_running_command_at_the_pids_limit_is_left_to_end_by_itself(driver: NomadDriver) -> None:
    """A command the agent runs holds its sandbox at the pids limit for 4 s, its forks refused
    every second: the plugin's pids guard ends only ended commands' leftovers, and this one
    still runs (its parent is the live agent), so its exit is its own. The guard counted as
    running only the alloc execs Nomad ran, and killed it at ~2 s (137)."""
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="python:3.13", resources=ResourceLimits(pids=64)))
    agent = await until_agent(driver, sid)
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, ["python3", "-c", FILL_PIDS, "4"], timeout=30.0), sink)
    assert (result.exit_code, sink.stdout) == (0, "full\n"), sink.text("stderr")
    code, after = await run(driver, sid, ["echo", "after"])
    assert (code, after.stdout) == (0, "after\n") and driver._agents.live(sid) is agent


async def test_a_filler_left_behind_by_an_ended_command_is_ended(driver: NomadDriver) -> None:
    """The other half: the same filler started in the background by a command that then
    ended is reparented to the sandbox's init, out of the agent's tree, and the pids guard
    ends it (forks refused in 2 consecutive seconds) though the agent still runs."""
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="python:3.13", resources=ResourceLimits(pids=64)))
    agent = await until_agent(driver, sid)
    # The command ends once the filler said it is full (builtins only: no fork left by then).
    script = 'python3 -c "$0" 120 >/tmp/filler 2>&1 & until read -r said </tmp/filler; do :; done; echo "$said"'
    code, sink = await run(driver, sid, ["sh", "-c", script, FILL_PIDS])
    assert (code, sink.stdout) == (0, "full\n"), sink.text("stderr")
    loop = asyncio.get_running_loop()
    deadline, ps = loop.time() + 20, "not run"
    while loop.time() < deadline:  # a ps may win a pid freed for a moment, or be refused
        with contextlib.suppress(SandboxBusy):
            code, sink = await run(driver, sid, ["ps", "-eo", "args"])
            ps = sink.stdout
            if code == 0 and "python3" not in ps:
                break
        await asyncio.sleep(0.2)
    assert "python3" not in ps, ps
    assert driver._agents.live(sid) is agent


def host_threads(alloc_id: str) -> int:
    """The threads of the sandbox's exec agent, counted from the host (the dev agent's client is
    this machine): a command in the sandbox counting them would have the agent make some."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            inside = f"sandbox-{alloc_id}" in Path(f"/proc/{pid}/cgroup").read_text()
            if inside and b"hutch-exec-agent" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
    raise AssertionError(f"no exec agent in allocation {alloc_id}")


async def test_the_agent_makes_its_spare_threads_as_it_starts(driver: NomadDriver) -> None:
    """The threads the Go runtime needs are made while pids are free: a command that filled the
    limit (a fork bomb) left the agent at 3 threads, and the next one the runtime needed (a
    write that blocked under load) aborted it, and the command with it ("its exec agent ended
    while the command ran"; tests/adversarial/test_pass2_nomad.py, the fork bomb)."""
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest", resources=ResourceLimits(pids=64)))
    await until_agent(driver, sid)
    # Its spares, the thread running it, sysmon and the thread that made the spares.
    assert host_threads(driver.running(sid).alloc_id) >= agents_module.spare_threads(64) + 3


async def test_a_12_pid_agent_has_spare_threads_for_no_more_pids(driver: NomadDriver) -> None:
    """At 12 pids the agent made no spare thread. It now makes 3 at any limit, paid for by the
    threads it no longer holds: its stdin and stdout are waited on in the runtime's poller, not
    by a thread in a read or a write, and its commands' exits through their pidfds, not
    through os/signal's threads. No more pids than before (6 threads idle, 7 once it had run
    commands); a command's exit still comes at once."""
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest", resources=ResourceLimits(pids=12)))
    await until_agent(driver, sid)
    assert agents_module.spare_threads(12) == 3
    alloc_id = driver.running(sid).alloc_id
    idle = host_threads(alloc_id)
    loop = asyncio.get_running_loop()
    for _ in range(5):
        started = loop.time()
        code, sink = await run(driver, sid, ["sh", "-c", "echo ok"])
        assert (code, sink.stdout) == (0, "ok\n") and loop.time() - started < 1.0  # not the 2 s sweep
    assert max(idle, host_threads(alloc_id)) <= 6, idle


async def test_12_pid_sandboxes_filled_by_their_commands_keep_their_agents(
        driver: NomadDriver) -> None:
    """Six 12-pid sandboxes at once, each filled by a command while four more ask for a fork:
    an agent with no spare thread needed one the limit refused, for the work of a system call
    (a stat of the cwd as it took a command, a write to its stdout), and the Go runtime aborted
    it ("failed to create new OS thread"): the filling command failed as a 502, "its exec agent
    ended while the command ran", and the commands after it were alloc execs, past pids.max
    (16 of 12), their streams dropped by Nomad. 1 in 4 sandboxes lost it so (four at once, 2 of
    3 runs failed); with 2 spares, 1 in 6; with 3, pollable stdio and pidfds, none in 66."""

    async def fill() -> None:
        sid = new_id()
        await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="python:3.13",
                                                resources=ResourceLimits(pids=12)))
        agent = await until_agent(driver, sid)
        sink = Recorder()
        filler = asyncio.ensure_future(driver.exec(
            ExecRequest(new_id("ex"), sid, ["python3", "-c", FILL_PIDS, "5"], timeout=30.0), sink))
        for _ in range(200):
            if sink.stdout == "full\n" or filler.done():
                break
            await asyncio.sleep(0.05)
        knocks = await asyncio.gather(*(run(driver, sid, ["sleep", "1"]) for _ in range(4)),
                                      return_exceptions=True)  # each asks PIDS_WAIT (3 s) long
        assert all(isinstance(k, SandboxBusy) or k[0] == 0 for k in knocks), knocks  # type: ignore[index]
        result = await filler
        assert (result.exit_code, sink.stdout) == (0, "full\n"), sink.text("stderr")
        assert driver._agents.live(sid) is agent

    await asyncio.gather(*(fill() for _ in range(6)))


@pytest.mark.parametrize("end", ["timeout", "cancel"])
async def test_a_command_holding_the_pids_limit_ends_with_its_agent_stopped(
        driver: NomadDriver, monkeypatch: pytest.MonkeyPatch, end: str) -> None:
    """A command that stops its agent and fills the sandbox's pids limit: its timeout or cancel
    falls to the plugin's kill verb, which kills by the command's tag from the host. No process
    can start in the sandbox (a shell scanning it for the tag once had to, and could not):
    the command was left running and the sandbox full."""
    monkeypatch.setattr(agent_module, "KILL_GRACE", 1.0)  # the stopped agent does not answer the kill
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest", resources=ResourceLimits(pids=64)))
    await until_agent(driver, sid)
    # The agent is stopped once it said the command started. The bomb's first link is an orphan
    # (out of the agent's tree, which ending the agent kills); each link forks the next and
    # becomes a sleep, and the one whose fork is refused exits: the limit stays full, and no
    # fork is retried (a bomb that keeps retrying is the plugin's pids guard's).
    bomb = ("sleep 0.5; kill -STOP $PPID; exec 2>/dev/null; b(){ b & exec sleep 300; }; "
            "(b &); exec sleep 301")
    execution = ExecRequest(new_id("ex"), sid, ["sh", "-c", bomb], timeout=3.0 if end == "timeout" else None)
    task = asyncio.ensure_future(driver.exec(execution, Recorder()))
    if end == "cancel":
        await asyncio.sleep(3.0)
        await driver.cancel(execution.execution_id)
    result = await task
    assert result.timed_out if end == "timeout" else result.cancelled
    monkeypatch.setattr(agent_module, "START_TIMEOUT", 1.0)  # the stopped agent does not start the next one
    code, sink = await run(driver, sid, ["sh", "-c", "echo usable; ps -eo args"])
    assert code == 0 and sink.stdout.startswith("usable\n"), sink.stderr
    assert "sleep 30" not in sink.stdout, sink.stdout  # every link of it ended


def test_the_agents_go_tests_pass() -> None:
    """exec-agent's own tests (reap_test.go: an exit whose SIGCHLD no one received is still
    reported; the first helper of a fresh agent hung a write in CI that way)."""
    go = shutil.which("go") or "/usr/local/go/bin/go"
    assert Path(go).is_file(), "Go is not installed: the exec agent cannot be built or tested"
    done = subprocess.run([go, "test", "-count=1", "."], cwd=agents_module.SOURCE, capture_output=True, text=True,
                          env={**os.environ, "CGO_ENABLED": "0"}, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


async def agent_pids(client: NomadClient, alloc_id: str) -> list[str]:
    out = bytearray()
    code = await client.exec(alloc_id, TASK, [ENVELOPE, json.dumps({"env": ["PATH=/usr/bin:/bin"], "cwd": "/"}),
                                              "ps", "-eo", "pid,args"], stdin=None,
                             on_output=lambda _s, d: out.extend(d), stop=asyncio.Event(), kill=noop)
    assert code == 0
    return [line.split()[0] for line in out.decode().splitlines() if "hutch-exec-agent" in line]


async def test_the_agent_ends_when_its_api_goes_away(tmp_path: Path) -> None:
    """An API killed outright (no close): Nomad ends the exec, and the agent with it."""
    child = textwrap.dedent(f"""
        import asyncio, json, os, sys
        sys.path.insert(0, {os.getcwd()!r})
        from hutch.drivers.base import ProvisionRequest
        from tests.drivers_support import start_nomad
        from tests.nomad.test_exec_agent import until_agent
        async def main():
            d = await start_nomad(__import__("pathlib").Path({str(tmp_path / "data")!r}))
            await d.provision(ProvisionRequest(sandbox_id="gone", runtime="base:latest"))
            agent = await until_agent(d, "gone")
            sb = d._sandboxes["gone"]
            print(json.dumps({{"alloc": sb.alloc_id, "job": sb.job_id}}), flush=True)
            os._exit(0)
        asyncio.run(main())
    """)
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", child], capture_output=True,
                                   text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    info = json.loads(done.stdout.strip().splitlines()[-1])
    client = NomadClient(NOMAD_ADDR, token=NOMAD_TOKEN)
    await client.start()
    try:
        for _ in range(200):
            if not await agent_pids(client, info["alloc"]):
                break
            await asyncio.sleep(0.1)
        assert await agent_pids(client, info["alloc"]) == []
    finally:
        await client.deregister(info["job"])
        await client.close()


async def test_a_closed_driver_leaves_no_agent(driver: NomadDriver) -> None:
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest"))
    await until_agent(driver, sid)
    alloc = driver._sandboxes[sid].alloc_id
    assert len(await agent_pids(driver.client, alloc)) == 1
    await driver._agents.close()  # the session ends: the agent reads the end of its stdin
    for _ in range(200):
        if not await agent_pids(driver.client, alloc):
            break
        await asyncio.sleep(0.05)
    assert await agent_pids(driver.client, alloc) == []


async def test_a_pause_waits_for_an_agent_starting(driver: NomadDriver) -> None:
    """A freeze while runc sets up the agent's exec held that exec, and the resume waited
    behind it: a terminal on a just-paused sandbox hung."""
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest"))  # starts the agent
    await driver.pause(sid)
    await driver.resume(sid)
    code, sink = await run(driver, sid, ["echo", "thawed"])
    assert (code, sink.stdout) == (0, "thawed\n")
    await until_agent(driver, sid)


async def test_a_pooled_sandbox_takes_over_the_agent_its_allocation_started(tmp_path: Path) -> None:
    """An idle pool allocation starts its agent when placed, and the sandbox that claims it
    runs its first command through that agent: it used to run as an alloc exec (150-250 ms
    on the cluster) while a new agent started behind it. An allocation leaving the pool ends
    its agent's session."""
    driver = await start_nomad(tmp_path / "data", pool_sizes={"base:latest": 1})
    assert isinstance(driver, NomadDriver)
    try:
        pool = driver._pool["base:latest"]
        for _ in range(1200):
            if pool:
                break
            await asyncio.sleep(0.05)
        entry = pool[0]
        idle_agent = driver._agents.live(entry.job_id)
        assert idle_agent is not None, "the idle allocation has no agent"
        assert await agent_pids(driver.client, entry.alloc_id) == [str(idle_agent.pid)]

        sid = new_id()
        await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest"))
        assert driver._sandboxes[sid].alloc_id == entry.alloc_id  # claimed from the pool
        assert driver._agents.live(sid) is idle_agent and driver._agents.live(entry.job_id) is None
        assert await parent_of_a_command(driver, sid) == idle_agent.pid  # the first command, through it

        for _ in range(1200):  # refilled, with an agent of its own
            if pool and driver._agents.live(pool[0].job_id) is not None:
                break
            await asyncio.sleep(0.05)
        spare = pool[0]
        spare_agent = driver._agents.live(spare.job_id)
        assert spare_agent is not None
        driver.pool_sizing.fixed = {"base:latest": 0}  # wanted no more: the spare leaves the pool
        driver._refill_wakeup.set()
        for _ in range(400):
            if not spare_agent.alive and spare.job_id not in driver._agents._agents:
                break
            await asyncio.sleep(0.05)
        assert not spare_agent.alive and spare.job_id not in driver._agents._agents
        await driver.destroy(sid)
    finally:
        await driver.close()


async def test_a_streamed_stdin_at_the_pids_limit_is_refused_by_name_not_lost(
        driver: NomadDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command with streamed stdin (stream.stdin: an async iterable) at the pids limit. Its
    feeder took stdin as the start went out, before the agent's refused fork was reported:
    with a block taken it was a 502 DriverFailure ("part of its streamed stdin was already
    taken"), not the SandboxBusy a command without stdin gets. With none taken yet, the feeder
    was cancelled while it waited in the stream: an async generator (a stream another replica
    holds) is closed by that, and the command asked again once a pid was free ran with an
    empty stdin, its bytes lost without a word. Now stdin is read once the fork is reported:
    the first is SandboxBusy, the second gets all of its stdin."""
    monkeypatch.setattr(commands, "PIDS_WAIT", 0.3)  # refused before the pids guard may act (>= 1 s)
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="python:3.13", resources=ResourceLimits(pids=64)))
    filler = ExecRequest(new_id("ex"), sid, ["python3", "-c", FILL_PIDS, "3"], timeout=30.0)
    holder = Recorder()
    holding = asyncio.ensure_future(driver.exec(filler, holder))
    for _ in range(200):
        if holder.stdout == "full\n" or holding.done():
            break
        await asyncio.sleep(0.05)
    assert holder.stdout == "full\n", holder.stderr

    async def ready() -> AsyncIterator[bytes]:  # uploaded before the command: there at once
        for _ in range(3):
            yield b"data\n"

    with pytest.raises(SandboxBusy, match=r"at its pids limit \(64 processes and threads\)"):
        await driver.exec(ExecRequest(new_id("ex"), sid, ["cat"], stdin=ready()), Recorder())

    async def late() -> AsyncIterator[bytes]:  # its first block comes after the first refusal
        await asyncio.sleep(0.3)
        yield b"late\n"

    monkeypatch.setattr(commands, "PIDS_WAIT", 10.0)  # the filler lets go well within it
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, ["cat"], stdin=late()), sink)
    assert (result.exit_code, sink.stdout) == (0, "late\n"), "a command asked again ran without its stdin"
    # Its end: its own, at 3 s (the pids guard spares a running command), which frees the pids.
    assert (await holding).exit_code == 0
