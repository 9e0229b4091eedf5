"""The API end of a sandbox's exec agent: many commands over one alloc exec session.

A runc exec costs about 45 ms (most of the +66 ms an execute paid over bare python); Nomad's
alloc-exec websocket about 3. So each sandbox gets one long-lived alloc exec running
``hutch-exec-agent`` (scripts/services.d/nomad/exec-agent), which forks the commands itself:
it has exactly the sandbox's confinement (it is an ordinary exec of the task), and so do they.

The agent's binary travels as the first bytes of that exec's stdin (``head -c`` writes it to the
sandbox's /tmp, the agent unlinks it as it starts), so it reaches any client node with no
host-side install. Its stdin and stdout then carry frames (the protocol is described in
exec-agent/main.go): a 9-byte header (kind, command id, payload length) and the payload.
Each direction is windowed per command, so a slow consumer slows only its own command.

What comes back is a tenant's words, not the agent's: the start script is an ordinary shell of
the sandbox, so the sandbox's own processes can take its pipes (through /proc) or its binary
and speak in the agent's place. The session only takes what the real agent sends: frames of
its size (``MAX_FRAME``), output within each command's window, JSON where JSON is due; the
first thing past that ends the session. Its stderr is logged a few lines per session.

A paused sandbox's agent is frozen with its commands (containerd's freeze): what waits on the
agent (its heartbeat, a command's start) counts on the sandbox's run clock (drivers/runclock.py),
which stands still while it is frozen, so a pause is not taken for a stopped agent.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import struct
from collections.abc import AsyncIterable, Awaitable, Callable, Sequence
from typing import Any

import aiohttp

from hutch.core.errors import DriverFailure
from hutch.drivers.nomad.client import KILL_GRACE, STDIN_CHUNK, ExecFailed, NomadClient
from hutch.drivers.nomad.execs import ENVELOPE, plugin_verb
from hutch.drivers.runclock import RunClock

log = logging.getLogger(__name__)

HEADER = struct.Struct(">cII")
WINDOW = 1 << 20  # the agent's window (exec-agent/main.go): bytes in flight per command and direction
CHUNK = 32 * 1024
# The largest frame the agent sends is an output chunk (32 KiB, exec-agent/main.go); anything
# much larger is not the agent. Without a bound, one header claiming 4 GiB had the server buffer
# whatever followed, for as long as the sandbox kept writing.
MAX_FRAME = 4 * CHUNK
STDERR_LINES = 10  # the agent's stderr, logged per session: it only ever says why it stopped
READY_TIMEOUT = 30.0  # seconds for the agent to say it runs (its start is one runc exec + 2 MiB)
# Seconds (of the run clock) for the agent to say a command started (a fork): one that does
# not is stopped or wedged; its session is ended (Nomad then kills it) and the command runs
# the old way.
START_TIMEOUT = 5.0
SIGKILL = 9
# The agent writes a heartbeat every 2 s (exec-agent/main.go): a session silent this long (on
# the run clock: a frozen agent is silent) is a stopped or wedged agent, ended (the plugin's
# kill verb) so its commands fail instead of waiting for their timeouts.
SILENT_SECONDS = 10.0
# Writes the binary (the first $1 bytes of stdin) to /tmp and runs it; the agent removes the file.
# Execute-only (0100): the kernel execs an unreadable binary not dumpable, so the sandbox's own
# processes never get at the agent's memory, not even in the instant before it says so itself.
START_SCRIPT = ('f=$(mktemp /tmp/.hutch-exec-agent.XXXXXX) && head -c "$1" >"$f" && chmod 100 "$f" '
                '&& exec "$f" "$f"')
Emit = Callable[[str, bytes], Awaitable[None] | None]


class AgentMisbehaved(DriverFailure):
    """What came on the agent's stdout is not what the agent sends (a process of the sandbox
    speaking in its place): the session ends."""


class NotStarted(Exception):
    """The agent did not start the command (it ended first, or could not fork): nothing of the
    command ran, so the caller runs it the old way."""


class NoPidLeft(NotStarted):
    """The agent's fork was refused at the sandbox's pids limit (EAGAIN): nothing of the command
    ran. Its alloc exec would need more pids than the fork (commands.run_command waits for one)."""


class _Command:
    def __init__(self) -> None:
        self.events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.started = False
        self.forked = asyncio.Event()  # set with ``started``: a streamed stdin is read from then on
        self.exited = False  # its exit came: the agent has let go of it
        self.consumed = False  # a streamed stdin's first block was taken: it cannot be run again
        self.sent = 0
        self.acked = 0
        self.acks = asyncio.Event()
        self.unacked = 0  # output received and not yet acknowledged: the agent's window bounds it


class ExecAgent:
    """One sandbox's agent session (``start`` it, then ``run`` commands, concurrently)."""

    def __init__(self, client: NomadClient, alloc_id: str, task: str, sandbox_id: str,
                 clock: RunClock | None = None) -> None:
        self.client, self.alloc_id, self.task, self.sandbox_id = client, alloc_id, task, sandbox_id
        # The sandbox's run clock: stopped while it is paused (the driver's pause and resume).
        self.clock = clock if clock is not None else RunClock()
        self.pid: int | None = None  # the agent's pid in the sandbox, once ready
        self.tag: str | None = None  # its alloc exec's tag (the plugin's kill verb ends it)
        self.alive = False
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._send_lock = asyncio.Lock()
        self._cmds: dict[int, _Command] = {}
        self._next_id = 1
        self._buffer = bytearray()
        self._stderr_logged = 0
        self._heartbeat = b""  # the last heartbeat's payload, kept raw: read only when asked (load)
        self.ended = asyncio.Event()

    async def start(self, binary: bytes, envelope: str) -> None:
        """Start the agent through one alloc exec (``envelope``: the plugin's JSON for it) and
        wait until it says it runs; ExecFailed/DriverFailure if it does not."""
        self.tag = json.loads(envelope).get("tag")
        self._ws = await self.client.exec_socket(
            self.alloc_id, self.task, [ENVELOPE, envelope, "sh", "-c", START_SCRIPT, "sh", str(len(binary))])
        try:
            for at in range(0, len(binary), STDIN_CHUNK):
                await self._stdin(binary[at:at + STDIN_CHUNK])
            async with asyncio.timeout(READY_TIMEOUT):
                while not self.alive:
                    if not await self._receive():
                        raise DriverFailure(f"sandbox {self.sandbox_id}: the exec agent ended as it started")
        except BaseException:
            await self.close()
            raise
        self._reader = asyncio.create_task(self._read(), name=f"exec-agent-{self.sandbox_id}")

    async def close(self) -> None:
        """End the session: the agent sees its stdin end and exits (and Nomad ends the exec)."""
        self._ended()
        if self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self._ws.close()

    async def terminate(self) -> None:
        """End an agent that does not answer: a stopped one writes nothing, so Nomad would never
        notice its session closed; the plugin's kill verb ends it by its exec's tag."""
        await self.close()
        if self.tag is None:
            return
        with contextlib.suppress(Exception):
            await plugin_verb(self.client, self.alloc_id, self.task, {"kill": self.tag})

    # -- the session ---------------------------------------------------------------------

    async def _stdin(self, data: bytes) -> None:
        if self._ws is None or self._ws.closed:
            raise ConnectionResetError("the exec agent's session is closed")
        async with self._send_lock:
            await self._ws.send_str(json.dumps({"stdin": {"data": base64.b64encode(data).decode()}}))

    async def _send(self, *frames: tuple[bytes, int, bytes]) -> None:
        await self._stdin(b"".join(HEADER.pack(kind, cid, len(p)) + p for kind, cid, p in frames))

    async def _read(self) -> None:
        silent = False
        receiving: asyncio.Task[bool] | None = None
        heard = self.clock()
        try:
            while True:
                if receiving is None:
                    receiving = asyncio.create_task(self._receive())
                left = SILENT_SECONDS - (self.clock() - heard)
                if left > 0:  # the run clock: a paused sandbox's agent is silent, not stopped
                    await asyncio.wait({receiving}, timeout=left)
                if receiving.done():
                    more, receiving, heard = receiving.result(), None, self.clock()
                    if not more:
                        break
                elif self.clock() - heard >= SILENT_SECONDS:
                    silent = True
                    log.warning("sandbox %s: the exec agent sent nothing for %.0f s (not even its heartbeat); "
                                "ending it", self.sandbox_id, SILENT_SECONDS)
                    break
        except AgentMisbehaved as err:
            silent = True  # ended from here: whatever holds the agent's place is killed too
            log.warning("sandbox %s: %s; its exec agent session is ended", self.sandbox_id, err.message)
        except Exception as err:  # the session is over however it ended
            log.info("sandbox %s: exec agent session ended: %s", self.sandbox_id, err)
        finally:
            if receiving is not None and not receiving.done():
                receiving.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await receiving
            self._ended()
        if silent:
            await self.terminate()

    def _ended(self) -> None:
        if self.ended.is_set():
            return
        self.alive = False
        self.ended.set()
        for cmd in self._cmds.values():
            cmd.events.put_nowait(("gone", None))

    async def _receive(self) -> bool:
        """Handle one websocket message; False once the session has ended."""
        assert self._ws is not None
        msg = await self._ws.receive()
        if msg.type != aiohttp.WSMsgType.TEXT:
            return False
        frame = json.loads(msg.data)
        if (frame.get("stderr") or {}).get("data"):
            self._log_stderr(base64.b64decode(frame["stderr"]["data"]))
        if (frame.get("stdout") or {}).get("data"):
            self._buffer += base64.b64decode(frame["stdout"]["data"])
            self._dispatch()
        return not frame.get("exited")

    def _log_stderr(self, data: bytes) -> None:
        """The agent's stderr (why it stopped), a few lines per session: a sandbox's process
        holding that pipe wrote 5,000 lines, and each came out as a warning of the server."""
        if self._stderr_logged > STDERR_LINES:
            return
        self._stderr_logged += 1
        if self._stderr_logged > STDERR_LINES:
            log.warning("sandbox %s: exec agent: more on its stderr, not logged", self.sandbox_id)
            return
        log.warning("sandbox %s: exec agent: %s", self.sandbox_id, data.decode(errors="replace").strip()[:500])

    def _dispatch(self) -> None:
        """The complete frames of the buffer, handed on; AgentMisbehaved at the first one the
        agent would not send."""
        while len(self._buffer) >= HEADER.size:
            kind, cid, size = HEADER.unpack_from(self._buffer)
            if size > MAX_FRAME:
                raise AgentMisbehaved(f"a frame of {size} bytes on the exec agent's stdout (at most {MAX_FRAME})")
            if len(self._buffer) < HEADER.size + size:
                return
            payload = bytes(self._buffer[HEADER.size:HEADER.size + size])
            del self._buffer[:HEADER.size + size]
            try:
                self._frame(kind, cid, payload)
            except (ValueError, TypeError, KeyError, struct.error) as err:  # JSON or a count that is not
                raise AgentMisbehaved(f"a malformed {kind!r} frame on the exec agent's stdout: {err}") from None

    def _frame(self, kind: bytes, cid: int, payload: bytes) -> None:
        if kind == b"R":
            self.pid = int(json.loads(payload)["pid"])
            self.alive = True
            return
        if kind == b"H":
            self._heartbeat = payload
            return
        cmd = self._cmds.get(cid)
        if cmd is None:
            return
        if kind == b"a":
            cmd.acked += struct.unpack(">I", payload)[0]
            cmd.acks.set()
        elif kind in (b"1", b"2"):
            cmd.unacked += len(payload)
            if cmd.unacked > WINDOW + MAX_FRAME:
                raise AgentMisbehaved(f"{cmd.unacked} bytes of output past the exec agent's window of {WINDOW}")
            cmd.events.put_nowait(("stdout" if kind == b"1" else "stderr", payload))
        elif kind == b"P":
            cmd.started = True
            cmd.forked.set()
        elif kind == b"X":
            report = json.loads(payload)
            if not isinstance(report, dict) or not isinstance(report.get("code"), int):
                raise ValueError(f"exit report {report!r}")
            cmd.exited = True
            cmd.events.put_nowait(("exit", report))

    def load(self) -> dict[str, int]:
        """What the agent said it holds at its last heartbeat: ``commands`` (running, or their
        output not yet all sent) and ``goroutines``; empty before the first, or from an agent
        that does not say. The sandbox's word, as all the agent says: for seeing, not deciding."""
        try:
            said = json.loads(self._heartbeat or b"{}")
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth: not a load
            return {}
        if not isinstance(said, dict):
            return {}
        return {k: v for k, v in said.items() if k in ("commands", "goroutines") and isinstance(v, int)}

    # -- commands ------------------------------------------------------------------------

    async def run(self, argv: Sequence[str], env: list[str], cwd: str, tag: str, *,
                  stdin: bytes | AsyncIterable[bytes] | None, on_output: Emit, stop: asyncio.Event,
                  kill: Callable[[], Awaitable[None]], helper: bool = False) -> int | None:
        """Run a command; its exit code (None: killed after ``stop`` and no exit came in time).

        NotStarted: nothing ran, run it another way. ExecFailed("working directory ...") for a
        missing cwd. DriverFailure if the agent ended while the command ran.

        Left without its exit (a cancel while the sandbox is frozen, no exit in time, an
        error), the command is dropped in the agent ('D'): nothing here acknowledges its output
        any more, and the agent would hold it, its pump waiting on a full window, for the rest
        of the session."""
        if not self.alive:
            raise NotStarted("the exec agent is not running")
        cid, self._next_id = self._next_id, self._next_id + 1
        cmd = _Command()
        self._cmds[cid] = cmd
        # helper: argv is one of the agent's own helpers (drivers/nomad/helpers.py), not a program
        request = json.dumps({"argv": list(argv), "env": env, "cwd": cwd, "tag": tag,
                              "stdin": stdin is not None, "helper": helper}).encode()
        feeder: asyncio.Task[None] | None = None
        sent = False  # the start went out: the agent may hold the command
        try:
            frames = [(b"S", cid, request)]
            if isinstance(stdin, bytes) and len(stdin) <= CHUNK:  # the whole command in one message
                frames += [(b"I", cid, stdin)] if stdin else []
                frames.append((b"E", cid, b""))
                cmd.sent = len(stdin)
            try:
                await self._send(*frames)
            except (ConnectionResetError, aiohttp.ClientError) as err:
                raise NotStarted(str(err)) from err
            sent = True
            if stdin is not None and len(frames) == 1:
                feeder = asyncio.create_task(self._feed(cid, cmd, stdin))
            return await self._wait(cid, cmd, cwd, on_output, stop, kill)
        finally:
            self._cmds.pop(cid, None)
            if feeder is not None:
                feeder.cancel()
                await asyncio.gather(feeder, return_exceptions=True)
            if sent and not cmd.exited and self.alive:
                with contextlib.suppress(ConnectionResetError, aiohttp.ClientError):
                    await self._send((b"D", cid, b""))

    async def _feed(self, cid: int, cmd: _Command, stdin: bytes | AsyncIterable[bytes]) -> None:
        async def blocks() -> AsyncIterable[bytes]:
            if isinstance(stdin, bytes):
                yield stdin
                return
            # Not read before the fork is reported: a fork the pids limit refused is asked again
            # (commands.run_command), and a block taken for it was lost, or this wait in the
            # stream, cancelled, closed an async generator (a stream another replica holds): the
            # command asked again ran with an empty stdin, its bytes gone without a word.
            await cmd.forked.wait()
            async for block in stdin:
                cmd.consumed = True
                yield block

        async for block in blocks():
            for at in range(0, len(block), CHUNK):
                while cmd.sent - cmd.acked >= WINDOW:
                    cmd.acks.clear()
                    await cmd.acks.wait()
                piece = block[at:at + CHUNK]
                cmd.sent += len(piece)
                await self._send((b"I", cid, piece))
        await self._send((b"E", cid, b""))

    async def _wait(self, cid: int, cmd: _Command, cwd: str, on_output: Emit, stop: asyncio.Event,
                    kill: Callable[[], Awaitable[None]]) -> int | None:
        loop = asyncio.get_running_loop()
        killed_at: float | None = None
        sent_at = self.clock()  # the start is waited for on the run clock: a frozen agent forks nothing
        stopper = asyncio.create_task(stop.wait())
        try:
            while True:
                getter = asyncio.create_task(cmd.events.get())
                waiting = {getter} if killed_at is not None else {getter, stopper}
                timeout = None if killed_at is None else max(0.0, killed_at + KILL_GRACE - loop.time())
                if not cmd.started and killed_at is None:
                    timeout = max(0.0, sent_at + START_TIMEOUT - self.clock())
                done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    if killed_at is not None:  # no exit in time: the plugin kills by the command's tag
                        await kill()
                        return None
                    if not done and (cmd.started or self.clock() < sent_at + START_TIMEOUT):
                        continue  # it started meanwhile (that frame wakes nobody), or the sandbox is paused
                    if not done:  # no word of the command's start: the agent is stopped or wedged
                        log.warning("sandbox %s: the exec agent did not start a command within %.0f s; "
                                    "ending it", self.sandbox_id, START_TIMEOUT)
                        await self.terminate()
                        await kill()  # had it forked after all, the copy must not run beside the retry
                        if cmd.consumed:
                            raise DriverFailure(f"sandbox {self.sandbox_id}: its exec agent stopped answering "
                                                "after part of the command's stdin was taken")
                        raise NotStarted("the exec agent did not answer")
                    if self.clock.frozen:  # paused: the frozen agent would take no signal, nor report
                        await kill()       # an end; the plugin kills the command's processes by its tag
                        return None
                    killed_at = loop.time()
                    with contextlib.suppress(ConnectionResetError, aiohttp.ClientError):
                        await self._send((b"K", cid, bytes([SIGKILL])))
                    continue
                what, value = getter.result()
                if what == "exit":
                    try:
                        return self._exit_code(value, cwd)
                    except NotStarted:
                        if cmd.consumed:
                            raise DriverFailure(f"sandbox {self.sandbox_id}: the command did not start, and "
                                                "part of its streamed stdin was already taken") from None
                        raise
                if what == "gone":
                    if killed_at is not None or stop.is_set():  # a cancel, a timeout, a destroy
                        await kill()
                        return None
                    if not cmd.started and not cmd.consumed:
                        raise NotStarted("the exec agent ended before the command started")
                    await kill()  # what the agent started would run on unowned
                    raise DriverFailure(f"sandbox {self.sandbox_id}: its exec agent ended while the command ran"
                                        + ("" if cmd.started else " (part of its stdin was already sent)"))
                pending = on_output(what, value)
                if pending is not None:
                    await pending
                cmd.unacked -= len(value)
                with contextlib.suppress(ConnectionResetError, aiohttp.ClientError):
                    await self._send((b"A", cid, struct.pack(">I", len(value))))
        finally:
            stopper.cancel()

    @staticmethod
    def _exit_code(report: dict[str, Any], cwd: str) -> int:
        error = report.get("error")
        if error == "cwd":
            raise ExecFailed(f"working directory {cwd} does not exist or is not a directory")
        if error == "pids":
            raise NoPidLeft(f"the sandbox's pids limit refused the command's fork: {report.get('reason')}")
        if error:
            raise NotStarted(f"the exec agent could not start the command: {report.get('reason')}")
        return int(report["code"])
