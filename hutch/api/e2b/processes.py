"""envd names a process by a pid (and an optional tag); hutch names a command by its
execution id. This is the table between them, per sandbox, on the server that started the
command: enough for envd's List, Connect and SendSignal of the commands started over the E2B
wire. It is not kept across a restart (the commands themselves are: they are executions)."""

from __future__ import annotations

import asyncio

import attrs


@attrs.frozen
class Process:
    pid: int
    execution_id: str
    cmd: str
    args: tuple[str, ...]
    envs: dict[str, str]
    cwd: str | None
    tag: str | None
    # What SendInput sends to the command's stdin (None: closed, CloseStdin); None when it was
    # started without stdin.
    stdin: asyncio.Queue[bytes | None] | None = attrs.field(default=None, eq=False)


class Processes:
    FIRST_PID = 1000  # below it: what a real init and its daemons would hold

    def __init__(self) -> None:
        self._by_sandbox: dict[str, dict[int, Process]] = {}

    def add(self, sandbox_id: str, execution_id: str, *, cmd: str, args: tuple[str, ...], envs: dict[str, str],
            cwd: str | None, tag: str | None, stdin: asyncio.Queue[bytes | None] | None = None) -> Process:
        table = self._by_sandbox.setdefault(sandbox_id, {})
        pid = max(table, default=self.FIRST_PID - 1) + 1
        table[pid] = proc = Process(pid, execution_id, cmd, args, envs, cwd, tag, stdin)
        return proc

    def of(self, sandbox_id: str) -> list[Process]:
        return list(self._by_sandbox.get(sandbox_id, {}).values())

    def find(self, sandbox_id: str, *, pid: int | None = None, tag: str | None = None) -> Process | None:
        for proc in self.of(sandbox_id):
            if (pid is not None and proc.pid == pid) or (tag is not None and proc.tag == tag):
                return proc
        return None

    def forget(self, sandbox_id: str, pid: int) -> None:
        self._by_sandbox.get(sandbox_id, {}).pop(pid, None)
