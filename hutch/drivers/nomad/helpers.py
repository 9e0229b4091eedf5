"""What the nomad driver does in a sandbox with its exec agent's own helpers, for what no
runtime ships a tool for: a file's metadata (``user.e2b.*`` extended attributes) and
directory watches (inotify). The agent runs its binary again as an ordinary command
(exec-agent/helper.go), so a helper has exactly a command's confinement: the sandbox's uid,
its seccomp filter, its view of the files, its tag (a kill ends it). The operations and
their records are the local driver's (``hutch-nsexec fs``): the same watch reads both.

Without an agent (``HUTCH_NOMAD_EXEC=alloc``) there is no helper: those sandboxes cannot
watch or keep metadata (the driver's capabilities say so). What comes back is the sandbox's
own words (agent.py): parsed within bounds, never trusted past its own files.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import uuid
from collections.abc import AsyncIterator

from hutch.core.errors import (
    DriverFailure,
    HutchError,
    InvalidInput,
    NotSupported,
    PayloadTooLarge,
    SandboxBusy,
    SandboxNotFound,
)
from hutch.drivers.fserrors import from_errno
from hutch.drivers.local.watches import LocalDirWatch
from hutch.drivers.nomad.access import SandboxAccess
from hutch.drivers.nomad.agent import ExecAgent, NoPidLeft, NotStarted
from hutch.drivers.nomad.agents import ExecAgents
from hutch.drivers.nomad.jobs import HOME
from hutch.drivers.nomad.state import NomadSandbox

log = logging.getLogger(__name__)

_FAILURE = re.compile(rb"hutch-fs: errno (\d+) ")
MAX_LISTED = 32 * 2**20  # what an xattrs listing may print (files.MAX_OUTPUT)
_QUEUE = 16  # output pieces a watch holds for a slow reader before the helper is slowed down
# Seconds a helper may take (a metadata change or listing, a watch's start); then it is killed
# and the call fails naming the sandbox. Each is one fork and a few system calls: a listing of
# 150,000 entries takes about a second. Without a bound, a helper whose exit never came (a
# zombie the agent did not report: exec-agent/main.go's reap) held CI's file write 300 s.
HELPER_TIMEOUT = 30.0


class _Run:
    """One helper running through the agent: its stdout as a queue (bounded: the agent's
    window stops the helper when nobody reads), its stderr kept for the failure."""

    def __init__(self, agent: ExecAgent, access: SandboxAccess, sb: NomadSandbox, args: list[str],
                 stdin: AsyncIterator[bytes] | None) -> None:
        self.out: asyncio.Queue[bytes] = asyncio.Queue(_QUEUE)
        self.err = bytearray()
        self.stop = asyncio.Event()
        self.sandbox_id = sb.id
        tag = f"h-{uuid.uuid4().hex}"

        async def on_output(stream: str, data: bytes) -> None:
            if stream == "stderr":
                self.err.extend(data)
                del self.err[:-4096]
            else:
                await self.out.put(data)

        self.task = asyncio.ensure_future(agent.run(
            args, access.command_env(sb, {}), HOME, tag, stdin=stdin, on_output=on_output,
            stop=self.stop, kill=lambda: access.kill_tagged(sb, tag), helper=True))

    async def read(self) -> bytes:
        """The next piece of stdout; b"" once the helper ended and all it said was read."""
        while True:
            if not self.out.empty():
                return self.out.get_nowait()
            if self.task.done():
                return b""
            getter = asyncio.ensure_future(self.out.get())
            try:
                await asyncio.wait({getter, self.task}, return_when=asyncio.FIRST_COMPLETED)
            finally:  # a reader cancelled (HELPER_TIMEOUT) leaves no getter waiting on the queue
                if not getter.done():
                    getter.cancel()
            if getter.done() and not getter.cancelled():
                return getter.result()

    async def code(self) -> int | None:
        """Its exit code (None: killed); DriverFailure if the agent did not run it or ended."""
        try:
            return await self.task
        except NoPidLeft as err:  # the sandbox's own processes hold its limit: its tenant's to free
            raise SandboxBusy(f"sandbox {self.sandbox_id} is at its pids limit: the helper of this file operation "
                              f"could not start ({err}); end some of its processes, or create it with a higher "
                              "pids limit") from None
        except NotStarted as err:
            raise DriverFailure(f"the exec agent did not start its helper: {err}") from None

    def poll(self) -> int | None:
        if not self.task.done():
            return None
        return 0 if self.task.cancelled() or self.task.exception() is not None else self.task.result()

    def kill(self) -> None:
        self.stop.set()

    def abandon(self) -> None:
        """Nobody waits for it any more: it is killed (the agent's signal, then the plugin's
        kill by its tag: agent.py) and its end, whatever it is, taken when it comes."""
        self.kill()
        self.task.add_done_callback(lambda t: t.cancelled() or t.exception())


class _Stdin:
    """A watch's stdin: each ``write`` is one piece sent to the helper, in order."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    def put(self, data: bytes | None) -> None:
        self._queue.put_nowait(data)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (data := await self._queue.get()) is not None:
            yield data


class _WatchHelper:
    """A running watch helper, as LocalDirWatch drives one (watches._Helper)."""

    def __init__(self, run: _Run, stdin: _Stdin) -> None:
        self._run, self._stdin = run, stdin

    def poll(self) -> int | None:
        return self._run.poll()

    async def read(self, n: int = 0) -> bytes:
        return await self._run.read()

    async def write(self, data: bytes | memoryview) -> bool:
        if self._run.task.done():
            return False
        self._stdin.put(bytes(data))
        return True

    def kill(self) -> None:
        self._stdin.put(None)
        self._run.kill()


class AgentHelpers:
    """Metadata and watches of the driver's sandboxes, through their exec agents."""

    def __init__(self, access: SandboxAccess, agents: ExecAgents) -> None:
        self._access, self._agents = access, agents

    async def _agent(self, sb: NomadSandbox, what: str) -> ExecAgent:
        if self._agents.mode != "agent":
            raise NotSupported(f"{what}: the nomad driver does it with its exec agent, which "
                               "HUTCH_NOMAD_EXEC=alloc turns off", field="HUTCH_NOMAD_EXEC")
        if not self._agents.available:
            raise NotSupported(f"{what}: the nomad driver does it with its exec agent, which this server "
                               "could not build (its log says why)", field="HUTCH_NOMAD_EXEC")
        agent = await self._agents.ready(sb)
        if agent is None:
            if self._access.gone(sb.id):
                raise SandboxNotFound(f"sandbox {sb.id} was destroyed")
            raise DriverFailure(f"sandbox {sb.id}: {what} needs its exec agent, which is not running "
                                "(the server's log says why)")
        return agent

    async def _start(self, sb: NomadSandbox, what: str, args: list[str],
                     stdin: AsyncIterator[bytes] | None = None) -> _Run:
        self._access.check_not_paused(sb)
        return _Run(await self._agent(sb, what), self._access, sb, args, stdin)

    def _failure(self, sb: NomadSandbox, op: str, path: str, code: int | None, err: bytes) -> HutchError:
        if self._access.gone(sb.id):
            return SandboxNotFound(f"sandbox {sb.id} was destroyed")
        found = _FAILURE.search(err)
        if found:
            num = int(found[1])
            return from_errno(op, path, num, os.strerror(num), sb.id)
        text = err.decode(errors="replace").strip()[-300:]
        return DriverFailure(f"sandbox {sb.id}: the {op} helper failed ({text or f'exit {code}'})")

    async def _collect(self, sb: NomadSandbox, op: str, path: str, args: list[str]) -> bytes:
        """The helper's stdout once it exited 0; its failure else. Past HELPER_TIMEOUT it is
        killed and DriverFailure names the sandbox; a caller that goes away (a cancel, its own
        deadline: the disk reading's) has it killed too, never left running unowned."""
        seconds = HELPER_TIMEOUT
        run = await self._start(sb, op, [op, path, *args])
        out = bytearray()
        try:
            async with asyncio.timeout(seconds):
                while data := await run.read():
                    out += data
                    if len(out) > MAX_LISTED:
                        raise PayloadTooLarge(f"{op} {path}: the sandbox's answer passed {MAX_LISTED} bytes",
                                              field="path")
                code = await run.code()
        except TimeoutError:
            run.abandon()
            raise DriverFailure(f"sandbox {sb.id}: the {op} helper did not finish within {seconds:.0f} s "
                                "(killed)") from None
        except BaseException:
            run.abandon()
            raise
        if code != 0:
            raise self._failure(sb, op, path, code, bytes(run.err))
        return bytes(out)

    async def set_metadata(self, sandbox_id: str, path: str, metadata: dict[str, str]) -> None:
        sb = self._access.running(sandbox_id)
        pairs = [part for item in metadata.items() for part in item]
        await self._collect(sb, "meta", _usable(path), pairs)

    async def metadata_of(self, sb: NomadSandbox, path: str) -> dict[str, dict[str, str]]:
        """The metadata of ``path`` (a directory: of each entry), by name; entries without any
        are left out. {} where the agent cannot say (none runs, alloc mode): a listing is not
        refused for the metadata it cannot add."""
        if self._agents.mode != "agent" or not self._agents.available:
            return {}
        try:
            out = await self._collect(sb, "xattrs", _usable(path), [])
        except (DriverFailure, NotSupported) as err:
            log.warning("sandbox %s: the metadata of %s was not read: %s", sb.id, path, err.message)
            return {}
        return _parse_metadata(out, sb.id)

    async def disk(self, sb: NomadSandbox, *, limited: bool) -> tuple[int, int]:
        """(bytes the sandbox's files take, bytes of the file system they are on), read inside
        it (helper.go's diskUsage: with a disk limit, that file system's own counts)."""
        out = await self._collect(sb, "disk", HOME, ["1" if limited else "0"])
        try:
            found = json.loads(out)
            used, total = found["used"], found["total"]
            if not (isinstance(used, int) and isinstance(total, int) and used >= 0 and total >= 0):
                raise ValueError(f"not two byte counts: {out[:100]!r}")
        except (ValueError, KeyError, TypeError) as err:
            raise DriverFailure(f"sandbox {sb.id}: a malformed disk reading from its exec agent: {err}") from None
        return used, total

    async def watch_dir(self, sandbox_id: str, path: str, *, recursive: bool) -> LocalDirWatch:
        sb = self._access.running(sandbox_id)
        stdin = _Stdin()
        run = await self._start(sb, "watch", ["watch", _usable(path), "1" if recursive else "0"], aiter(stdin))
        helper = _WatchHelper(run, stdin)
        head = b""
        try:
            async with asyncio.timeout(HELPER_TIMEOUT):
                while len(head) < 3 and (data := await run.read()):
                    head += data
                if head[:3] != b"ok\n":
                    helper.kill()
                    code = await run.code()
                    raise self._failure(sb, "watch", path, code, bytes(run.err))
        except TimeoutError:
            helper.kill()
            run.abandon()
            raise DriverFailure(f"sandbox {sb.id}: the watch helper did not start within {HELPER_TIMEOUT:.0f} s "
                                "(killed)") from None
        except BaseException:
            helper.kill()
            run.abandon()
            raise
        def finish() -> None:
            helper.kill()
            run.task.add_done_callback(lambda t: t.cancelled() or t.exception())  # its end is the watch's

        return LocalDirWatch(helper, finish, head[3:], path)


def _usable(path: str) -> str:
    if not path or "\0" in path or len(path) > 4096:
        raise InvalidInput(f"path: not a usable path: {path[:100]!r}", field="path")
    return path


def _parse_metadata(out: bytes, sandbox_id: str) -> dict[str, dict[str, str]]:
    """Records "<name-len> <meta-len>\\n<name><key>\\0<value>\\0..." (exec-agent/helper.go)."""
    found: dict[str, dict[str, str]] = {}
    pos = 0
    try:
        while pos < len(out):
            nl = out.index(b"\n", pos)
            name_len, meta_len = (int(x) for x in out[pos:nl].split(b" "))
            name = out[nl + 1:nl + 1 + name_len]
            parts = out[nl + 1 + name_len:nl + 1 + name_len + meta_len].split(b"\0")
            pos = nl + 1 + name_len + meta_len
            if pos > len(out) or len(parts) % 2 != 1:
                raise ValueError("a record cut short")
            found[os.fsdecode(name)] = {os.fsdecode(k): os.fsdecode(v)
                                        for k, v in zip(parts[0:-1:2], parts[1:-1:2], strict=True)}
    except ValueError as err:
        raise DriverFailure(f"sandbox {sandbox_id}: a malformed metadata listing from its exec agent: {err}") from None
    return found
