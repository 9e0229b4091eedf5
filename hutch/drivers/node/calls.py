"""What the node driver forwards to the one agent that runs the sandbox, unchanged in meaning:
commands, files, checkpoints, pause, network rules, usage, terminals, watches and ports.

A mixin of ``NodeDriver`` (driver.py), kept apart so that file holds the state it keeps
(placement, loss, drains, where each sandbox is) and this one the calls that keep none beyond
the executions running. ``NodeDriver`` supplies ``_owner`` (which agent runs a sandbox) and the
attributes declared below.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import contextlib
import json
import socket
from collections.abc import AsyncIterable, AsyncIterator, Sequence

import aiohttp

from hutch.core import phases
from hutch.core.driver_types import (
    DirWatch,
    ExecRequest,
    ExecResult,
    FileInfo,
    FileWrite,
    OutputSink,
    PtySession,
    TerminalRequest,
    Usage,
)
from hutch.core.errors import DriverFailure, HutchError, from_wire
from hutch.core.serde import converter
from hutch.drivers.node import wire
from hutch.drivers.node.client import AgentClient
from hutch.drivers.node.ports import PortTunnels
from hutch.drivers.node.terminal import NodeTerminal
from hutch.drivers.node.watch import NodeDirWatch

INLINE_STDIN = 64 << 10  # stdin up to this travels in the exec request; more is streamed


class AgentCalls(abc.ABC):
    _agents: dict[str, AgentClient]
    _running: dict[str, str]  # execution -> node, while it runs (cancel and signal go there)
    _tunnels: PortTunnels

    @abc.abstractmethod
    async def _owner(self, sandbox_id: str) -> AgentClient:
        """The agent that runs ``sandbox_id``; SandboxNotFound if none does."""

    # -- commands --------------------------------------------------------------

    async def exec(self, req: ExecRequest, sink: OutputSink) -> ExecResult:
        agent = await self._owner(req.sandbox_id)
        body: dict[str, object] = {"execution_id": req.execution_id, "argv": list(req.argv), "env": dict(req.env),
                                   "cwd": req.cwd, "timeout": req.timeout}
        stdin = req.stdin
        feeder: asyncio.Task[object] | None = None
        if isinstance(stdin, bytes) and len(stdin) <= INLINE_STDIN:
            body["stdin"] = base64.b64encode(stdin).decode()
        elif stdin is not None:
            body["stdin"] = "attach"
            chunks = _one(stdin) if isinstance(stdin, bytes) else stdin
            feeder = asyncio.create_task(agent.upload("PUT", agent.path("executions", req.execution_id, "stdin"), chunks))
        self._running[req.execution_id] = agent.name
        reader = wire.FrameReader()
        t0 = phases.start()
        try:
            async for data in agent.stream("POST", agent.path("sandboxes", req.sandbox_id, "exec"), body):
                for kind, payload in reader.feed(data):
                    if kind == wire.STDOUT:
                        sink.write("stdout", payload)
                    elif kind == wire.STDERR:
                        sink.write("stderr", payload)
                    elif kind == wire.RESULT:
                        phases.end("node hop: exec, its request to its result frame", t0)
                        return converter.structure(json.loads(payload), ExecResult)
                    else:
                        answer = json.loads(payload)
                        raise from_wire(int(answer.pop("status", 500)), answer)
        except ValueError as err:
            raise DriverFailure(f"node agent {agent.name} sent a broken answer while the command ran: {err}") from err
        finally:
            self._running.pop(req.execution_id, None)
            if feeder is not None:
                if not feeder.done():
                    feeder.cancel()
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await feeder
        raise DriverFailure(f"node agent {agent.name} stopped answering while the command ran")

    async def cancel(self, execution_id: str) -> None:
        node = self._running.get(execution_id)
        if node is not None:  # unknown or finished: a no-op, as on the local driver
            agent = self._agents[node]
            await agent.json("POST", agent.path("executions", execution_id, "cancel"))

    async def signal(self, execution_id: str, signum: int) -> None:
        node = self._running.get(execution_id)
        if node is not None:
            agent = self._agents[node]
            await agent.json("POST", agent.path("executions", execution_id, "signal"), {"signum": signum})

    # -- files -----------------------------------------------------------------

    async def write_files(self, sandbox_id: str, files: Sequence[FileWrite]) -> None:
        agent = await self._owner(sandbox_id)
        body = {"files": [{"path": f.path, "content": base64.b64encode(f.content).decode(), "mode": f.mode}
                          for f in files]}
        await agent.json("POST", agent.path("sandboxes", sandbox_id, "files"), body)

    async def read_file(self, sandbox_id: str, path: str) -> AsyncIterator[bytes]:
        agent = await self._owner(sandbox_id)
        async for chunk in agent.stream("GET", agent.path("sandboxes", sandbox_id, "file", path=path)):
            yield chunk

    async def write_file(
        self, sandbox_id: str, path: str, chunks: AsyncIterable[bytes], *, mode: int = 0o644, parents: bool = True
    ) -> int:
        agent = await self._owner(sandbox_id)
        answer = await agent.upload("PUT", agent.path("sandboxes", sandbox_id, "file", path=path, mode=mode,
                                                      parents="1" if parents else "0"), chunks)
        return int(answer["written"])

    async def list_files(self, sandbox_id: str, path: str) -> list[FileInfo]:
        agent = await self._owner(sandbox_id)
        answer = await agent.json("GET", agent.path("sandboxes", sandbox_id, "list", path=path))
        return [converter.structure(e, FileInfo) for e in answer["entries"]]

    async def mkdir(self, sandbox_id: str, path: str, *, parents: bool) -> None:
        agent = await self._owner(sandbox_id)
        await agent.json("POST", agent.path("sandboxes", sandbox_id, "mkdir"), {"path": path, "parents": parents})

    async def remove(self, sandbox_id: str, path: str, *, directory: bool, recursive: bool) -> bool:
        agent = await self._owner(sandbox_id)
        answer = await agent.json("POST", agent.path("sandboxes", sandbox_id, "remove"),
                                  {"path": path, "directory": directory, "recursive": recursive})
        return bool(answer["existed"])

    async def symlink(self, sandbox_id: str, path: str, target: str) -> None:
        agent = await self._owner(sandbox_id)
        await agent.json("POST", agent.path("sandboxes", sandbox_id, "symlink"), {"path": path, "target": target})

    async def rename(self, sandbox_id: str, source: str, destination: str) -> None:
        agent = await self._owner(sandbox_id)
        await agent.json("POST", agent.path("sandboxes", sandbox_id, "rename"),
                         {"source": source, "destination": destination})

    async def set_metadata(self, sandbox_id: str, path: str, metadata: dict[str, str]) -> None:
        agent = await self._owner(sandbox_id)
        await agent.json("POST", agent.path("sandboxes", sandbox_id, "metadata"), {"path": path, "metadata": metadata})

    async def export_tar(self, sandbox_id: str, path: str) -> AsyncIterator[bytes]:
        agent = await self._owner(sandbox_id)
        async for chunk in agent.stream("GET", agent.path("sandboxes", sandbox_id, "tar", path=path)):
            yield chunk

    async def import_tar(self, sandbox_id: str, dest: str, archive: AsyncIterable[bytes], *, gzipped: bool) -> None:
        agent = await self._owner(sandbox_id)
        await agent.upload("PUT", agent.path("sandboxes", sandbox_id, "tar", dest=dest, gzip="1" if gzipped else "0"),
                           archive)

    # -- checkpoints, pause, usage ---------------------------------------------

    async def checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        agent = await self._owner(sandbox_id)
        await agent.json("POST", agent.path("sandboxes", sandbox_id, "checkpoints", checkpoint_id))

    async def restore(self, sandbox_id: str, checkpoint_id: str) -> None:
        agent = await self._owner(sandbox_id)
        await agent.json("POST", agent.path("sandboxes", sandbox_id, "checkpoints", checkpoint_id, "restore"))

    async def delete_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        agent = await self._owner(sandbox_id)
        await agent.json("DELETE", agent.path("sandboxes", sandbox_id, "checkpoints", checkpoint_id))

    async def checkpoint_sizes(self, sandbox_id: str) -> dict[str, int]:
        agent = await self._owner(sandbox_id)
        answer = await agent.json("GET", agent.path("sandboxes", sandbox_id, "checkpoints"))
        return {str(k): int(v) for k, v in answer.items()}

    async def pause(self, sandbox_id: str, *, memory: bool = True) -> None:
        agent = await self._owner(sandbox_id)
        # memory=0 only when asked: a memory pause's call is what an older agent knows.
        query = {} if memory else {"memory": "0"}
        await agent.json("POST", agent.path("sandboxes", sandbox_id, "pause", **query))

    async def update_network(self, sandbox_id: str, *, enabled: bool, allow: tuple[str, ...],
                             deny: tuple[str, ...]) -> None:
        agent = await self._owner(sandbox_id)
        await agent.json("PUT", agent.path("sandboxes", sandbox_id, "network"),
                         {"enabled": enabled, "allow": list(allow), "deny": list(deny)})

    async def resume(self, sandbox_id: str) -> None:
        agent = await self._owner(sandbox_id)
        await agent.json("POST", agent.path("sandboxes", sandbox_id, "resume"))

    async def usage(self, sandbox_id: str, *, disk: bool = False) -> Usage:
        try:
            agent = await self._owner(sandbox_id)
            answer = await agent.json("GET", agent.path("sandboxes", sandbox_id, "usage", disk=1 if disk else None),
                                      timeout=2)
        except HutchError:  # stats are best effort, as the nomad driver's
            return Usage()
        return converter.structure(answer, Usage)

    # -- terminals and ports ---------------------------------------------------

    async def open_terminal(self, req: TerminalRequest) -> PtySession:
        agent = await self._owner(req.sandbox_id)
        ws = await agent.websocket(agent.path("sandboxes", req.sandbox_id, "terminal"))
        return await NodeTerminal.open(ws, agent.name, {"argv": list(req.argv), "env": dict(req.env), "cwd": req.cwd,
                                                        "rows": req.rows, "cols": req.cols})

    async def watch_dir(self, sandbox_id: str, path: str, *, recursive: bool) -> DirWatch:
        agent = await self._owner(sandbox_id)
        ws = await agent.websocket(agent.path("sandboxes", sandbox_id, "watch"))
        return await NodeDirWatch.open(ws, agent.name, path, recursive)

    async def port_target(self, sandbox_id: str) -> tuple[str, int]:
        await self._owner(sandbox_id)
        return await self._tunnels.target(sandbox_id)

    async def port_connect(self, sandbox_id: str, port: int) -> socket.socket:
        return await self._tunnels.connect(sandbox_id, port)

    async def _tunnel(self, sandbox_id: str, port: int | None) -> aiohttp.ClientWebSocketResponse:
        agent = await self._owner(sandbox_id)
        return await agent.websocket(agent.path("sandboxes", sandbox_id, "port", port=port))


async def _one(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), INLINE_STDIN):
        yield data[i:i + INLINE_STDIN]

