"""The nomad driver's commands (a mixin of :class:`drivers.nomad.driver.NomadDriver`): a run
(``commands.run_command``: the exec agent, else its own alloc exec), its time limit on the
sandbox's run clock (``drivers.runclock``: a paused sandbox's time is not the command's), its
cancel, and the kill of everything it started (the plugin's kill verb, by the command's tag).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from hutch.core.errors import DriverFailure, HutchError, IllegalTransition, InvalidInput
from hutch.drivers import runclock, trust
from hutch.drivers.base import ExecRequest, ExecResult, OutputSink, check_env
from hutch.drivers.nomad import commands, images
from hutch.drivers.nomad.agents import ExecAgents
from hutch.drivers.nomad.client import ExecFailed, NomadClient
from hutch.drivers.nomad.execs import ENVELOPE, command_envelope, refused
from hutch.drivers.nomad.jobs import HOME
from hutch.drivers.nomad.state import NomadSandbox

USER = images.USER
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
EXIT_TIMEOUT = 124
EXIT_CANCELLED = 137
KILL_TRIES = 20  # x 0.1 s: how long a kill waits for a command just starting to be killable


@attrs.define
class RunningCommand:
    sandbox_id: str
    stop: asyncio.Event
    cancelled: bool = False
    alloc_exec: bool = False  # runs as its own alloc exec (not the agent's): a pause refuses it
    ended: asyncio.Event = attrs.field(factory=asyncio.Event)  # its exec returned


class NomadExecutions:
    _client: NomadClient
    _agents: ExecAgents
    _sandboxes: dict[str, NomadSandbox]
    _executions: dict[str, RunningCommand]

    if TYPE_CHECKING:  # provided by NomadDriver and NomadPausing; a stub here would shadow them in the MRO
        def running(self, sid: str) -> NomadSandbox: ...
        def gone(self, sandbox_id: str) -> bool: ...
        async def _verb(self, sb: NomadSandbox, verb: dict[str, Any]) -> None: ...
        async def _alloc_exec_turn(self, sb: NomadSandbox, execution: RunningCommand) -> bool: ...

    def command_env(self, sb: NomadSandbox, extra: Mapping[str, str]) -> list[str]:
        check_env(extra, "env")
        env = {"PATH": DEFAULT_PATH, "HOME": HOME, "USER": USER, "LOGNAME": USER,
               "SHELL": "/bin/bash", "LANG": "C.UTF-8", "HOSTNAME": "sandbox", **trust.sandbox_env()}
        env.update(sb.env)
        env.update(extra)
        return [f"{k}={v}" for k, v in env.items()]

    async def exec(self, req: ExecRequest, sink: OutputSink) -> ExecResult:
        """Run a command. Not refused in a paused sandbox: a pause that lands between the
        command's recorded start and this call freezes it with the rest (the agent, frozen,
        forks it at the resume; an alloc exec waits for the resume), its time standing still."""
        sb = self.running(req.sandbox_id)
        if not req.argv:
            raise InvalidInput("command must not be empty", field="command")
        if req.execution_id in self._executions:
            raise IllegalTransition(f"execution {req.execution_id} is already running")
        envelope = command_envelope(self.command_env(sb, req.env), req.cwd)
        tag, argv = envelope["tag"], [ENVELOPE, json.dumps({**envelope, "noStdin": not req.stdin}), *req.argv]
        execution = RunningCommand(sandbox_id=sb.id, stop=asyncio.Event())
        self._executions[req.execution_id] = execution
        timed_out = False

        async def deadline() -> None:
            nonlocal timed_out
            if req.timeout is not None:
                await runclock.sleep(req.timeout, self._agents.clock(sb.id))  # paused time is not the command's
                timed_out = True
                execution.stop.set()

        timer = asyncio.create_task(deadline())
        try:
            code = await commands.run_command(self._agents, self._client, sb, req, envelope, argv,
                                              execution.stop, sink, kill=lambda: self.kill_tagged(sb, tag),
                                              alloc_exec_turn=lambda: self._alloc_exec_turn(sb, execution))
        except ExecFailed as err:
            refused(err, sb.id, gone=self.gone(sb.id), cwd=envelope["cwd"])
            raise
        finally:
            timer.cancel()
            self._executions.pop(req.execution_id, None)
            execution.ended.set()
        if execution.cancelled:
            return ExecResult(exit_code=EXIT_CANCELLED, cancelled=True)
        if timed_out:
            return ExecResult(exit_code=EXIT_TIMEOUT, timed_out=True)
        if code is None:
            raise DriverFailure(f"sandbox {sb.id} ended while the command ran")
        return ExecResult(exit_code=code)

    async def kill_tagged(self, sb: NomadSandbox, tag: str) -> None:
        """Kill everything a running exec started (the plugin's kill verb, itself an alloc exec:
        its tree and every process carrying its tag, scanned until none is left). A command
        cancelled the moment it started may not be the plugin's yet: asked again, briefly."""
        for _ in range(KILL_TRIES):
            if sb.id not in self._sandboxes:
                return
            try:
                await self._verb(sb, {"kill": tag})
                return
            except HutchError:
                await asyncio.sleep(0.1)

    async def cancel(self, execution_id: str) -> None:
        execution = self._executions.get(execution_id)
        if execution is None:
            return
        execution.cancelled = True
        execution.stop.set()
