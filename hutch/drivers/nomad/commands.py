"""How the nomad driver runs a command: through the sandbox's exec agent when it has one
running or starting (``agents.ExecAgents``: a fork, about 1 ms), else as its own alloc exec
(``execs.run_tagged``: a runc exec, about 50 ms). Both carry the same tag, so the plugin's
kill verb ends either kind; and the create-time file writes that ride on a command."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from hutch.core.errors import HutchError, InvalidInput, SandboxBusy
from hutch.drivers.base import ExecRequest, ExecResult, FileWrite, OutputSink
from hutch.drivers.nomad.agent import ExecAgent, NoPidLeft, NotStarted
from hutch.drivers.nomad.agents import ExecAgents
from hutch.drivers.nomad.client import NomadClient
from hutch.drivers.nomad.execs import plugin_verb, run_tagged
from hutch.drivers.nomad.files import pack_files
from hutch.drivers.nomad.jobs import TASK
from hutch.drivers.nomad.state import NomadSandbox

# A command whose fork the sandbox's pids limit refused waits this long (seconds) for a pid,
# asking the agent again, then fails as SandboxBusy. Not its alloc exec: runc's exec process
# joins the sandbox's cgroup and clones in it, needing more pids than the fork; two of them in
# a sandbox of 12 pids had their clones refused and Nomad dropped a stream without a word (the
# test_exec_agent 12-pids flake). Its own commands' pids come back as they end (ms).
PIDS_WAIT = 3.0
PIDS_PAUSE = (0.01, 0.2)  # the first and the longest pause between asks


async def kill_marked(client: NomadClient, sb: NomadSandbox, tag: str) -> None:
    """End what an agent-run command left when its agent could not (it ended, or stopped
    answering): the plugin's kill verb, which finds no exec of its own behind the tag and kills
    every process of the sandbox carrying it, from the host. Nothing has to start in the sandbox,
    which may be at its pids limit. Asked once: an exit 1 (none carried it) is no error here."""
    with contextlib.suppress(HutchError):
        await plugin_verb(client, sb.alloc_id, TASK, {"kill": tag})


async def run_command(agents: ExecAgents, client: NomadClient, sb: NomadSandbox, req: ExecRequest,
                      envelope: dict[str, Any], argv: Sequence[str], stop: asyncio.Event, sink: OutputSink,
                      kill: Callable[[], Awaitable[None]],
                      alloc_exec_turn: Callable[[], Awaitable[bool]] | None = None) -> int | None:
    """Run ``req`` (``envelope``/``argv``: its alloc exec form) and return its exit code (None:
    killed after ``stop``, no exit came). The agent's NotStarted means nothing ran: the alloc
    exec then runs it, once ``alloc_exec_turn`` says it may (the driver's: not while the
    sandbox is paused; False: stopped meanwhile, nothing ran); an agent that ended while the
    command ran is a DriverFailure. A fork the pids limit refused (NoPidLeft) is asked again
    for PIDS_WAIT, then is SandboxBusy."""
    agent = await agents.at_hand(sb)
    fell_back = False
    pause, deadline = PIDS_PAUSE[0], None
    while agent is not None:
        try:
            return await _through(agent, client, sb, req, envelope, stop, sink)
        except NoPidLeft as err:
            now = asyncio.get_running_loop().time()
            deadline = now + PIDS_WAIT if deadline is None else deadline
            if now >= deadline:
                raise SandboxBusy(f"sandbox {sb.id} is at its pids limit{await _limit(agents, sb)}: the command "
                                  f"could not start within {PIDS_WAIT:g} s; end some of its processes, or create "
                                  "it with a higher pids limit") from err
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause)
                return None  # cancelled or timed out while it waited: nothing of it ran
            pause = min(2 * pause, PIDS_PAUSE[1])
            agent = agents.live(sb.id)  # one that ended meanwhile gave its pids back: the alloc exec
            fell_back = agent is None
        except NotStarted:
            agents.ensure(sb)
            fell_back = True
            break
    if alloc_exec_turn is not None and not await alloc_exec_turn():
        return None
    # ignore: run_tagged's Emit takes any str, but it only ever emits "stdout"/"stderr".
    # After an agent failed (a rare path, often under pressure) the output is checked against the
    # plugin's count: one alloc exec more, and no tail lost to Nomad's stream.
    # No stdin (its envelope says noStdin): nothing is sent, not even the close (NomadClient.exec).
    return await run_tagged(client, sb.alloc_id, TASK, argv, envelope["tag"], stdin=req.stdin or None,
                            on_output=sink.write, stop=stop, kill=kill, verify=fell_back)  # type: ignore[arg-type]


async def _limit(agents: ExecAgents, sb: NomadSandbox) -> str:
    """The sandbox's pids limit, as a message says it; empty if Nomad does not say it."""
    try:
        return f" ({await agents.pids_limit(sb.job_id)} processes and threads)"
    except (HutchError, KeyError, IndexError, TypeError, ValueError):
        return ""


async def _through(agent: ExecAgent, client: NomadClient, sb: NomadSandbox, req: ExecRequest,
                   envelope: dict[str, Any], stop: asyncio.Event, sink: OutputSink) -> int | None:
    # ignore: the agent emits only "stdout"/"stderr", as OutputSink.write wants
    return await agent.run(req.argv, envelope["env"], envelope["cwd"], envelope["tag"],
                           stdin=req.stdin or None, on_output=sink.write,  # type: ignore[arg-type]
                           stop=stop, kill=lambda: kill_marked(client, sb, envelope["tag"]))


class _Runs(Protocol):
    async def exec(self, req: ExecRequest, sink: OutputSink) -> ExecResult: ...


class _Errors:
    def __init__(self) -> None:
        self.text = b""

    def write(self, stream: str, data: bytes) -> None:
        self.text += data


async def write_files(driver: _Runs, sandbox_id: str, files: Sequence[FileWrite]) -> None:
    """Create-time files: one tar stream unpacked by ``tar`` in the sandbox, as its user."""
    if not files:
        return
    errors = _Errors()
    result = await driver.exec(ExecRequest(
        execution_id=f"write-{uuid.uuid4().hex}", sandbox_id=sandbox_id,
        argv=["tar", "-x", "-p", "-f", "-", "-C", "/", "--no-same-owner", "--overwrite"],
        cwd="/", timeout=120, stdin=pack_files(files)), errors)
    if result.exit_code != 0:
        message = errors.text.decode(errors="replace").strip()[-500:]
        raise InvalidInput(f"cannot write files: {message or f'tar exited {result.exit_code}'}", field="path")
