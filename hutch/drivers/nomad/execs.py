"""A tagged alloc exec whose end survives Nomad cutting its stream.

Nomad 1.10's HTTP exec handler (command/agent/alloc_endpoint.go) checks for an input error
before reading each frame back, so when a command exits while its stdin is still streaming
in (``head -c 10`` fed an endless upload), the websocket may close before the exit frame and
the last output are passed on. The plugin keeps how each tagged exec ended (exit and a tail
of each stream with byte counts: containerd-driver/exits.go) and hands it out through its
``{"exit": tag}`` verb; ``run_tagged`` counts what it received and takes the rest from there.
Commands and file operations (a write that meets ENOSPC mid-upload) both run through it.

The same handler drops the stream without a word (``StreamLost``) for other reasons too (any
frame of ours reaching Nomad's client after the exec ended; a broken connection). A command
is never run again for it: its end comes from the plugin's record, or, with none, it is killed
by its tag and the caller is told so. A plugin verb starts no process and is asked again.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import posixpath
import uuid
from collections.abc import AsyncIterable, Awaitable, Callable, Sequence
from typing import Any

from hutch.core.errors import HutchError, InvalidInput, SandboxNotFound
from hutch.drivers.nomad.client import ExecFailed, NomadClient, StreamLost
from hutch.drivers.nomad.jobs import HOME

log = logging.getLogger(__name__)

ENVELOPE = "hutch-exec:v1"
Emit = Callable[[str, bytes], Awaitable[None] | None]
VERB_TRIES = 3  # a plugin verb whose stream Nomad lost is asked again (it starts no process)


async def noop() -> None:
    return None


def command_envelope(env: list[str], cwd: str | None) -> dict[str, Any]:
    """What the plugin runs a command with (the JSON after ENVELOPE), executions and terminals
    alike: ``env`` (the driver's ``_env``), ``cwd`` relative to the workspace, and a new tag,
    which the kill verb ends and the exit verb tells the end of."""
    return {"env": env, "cwd": posixpath.normpath(posixpath.join(HOME, cwd)) if cwd else HOME,
            "tag": f"x-{uuid.uuid4().hex}"}


def refused(err: ExecFailed, sid: str, *, gone: bool, cwd: str) -> None:
    """A command the plugin would not start: raises the caller's error when it is one (else
    the caller re-raises ``err``)."""
    if gone:
        raise SandboxNotFound(f"sandbox {sid} was destroyed") from err
    if "working directory" in err.reason:
        raise InvalidInput(f"working directory {cwd} does not exist", field="cwd") from err


async def run_tagged(client: NomadClient, alloc_id: str, task: str, argv: Sequence[str], tag: str, *,
                     stdin: bytes | AsyncIterable[bytes] | None, on_output: Emit, stop: asyncio.Event,
                     kill: Callable[[], Awaitable[None]], verify: bool = False) -> int | None:
    """``client.exec`` of ``argv`` (an envelope carrying ``tag`` first); its exit code.

    ``verify``: also after a normal end, check with the plugin that every output byte arrived
    and take any missing tail from it. Nomad can drop the last stdout frame of a large output
    even when the exit frame arrives (seen: a 30 MiB checkpoint export 8 KiB short, once in a
    few runs); file reads and exports, whose bytes must be whole, ask for it."""
    received = {"stdout": 0, "stderr": 0}

    async def counted(stream: str, data: bytes) -> None:
        received[stream] += len(data)
        pending = on_output(stream, data)
        if pending is not None:
            await pending

    try:
        code = await client.exec(alloc_id, task, argv, stdin=stdin, on_output=counted, stop=stop, kill=kill)
    except ExecFailed as err:
        # A stream lost without a word (StreamLost), or one cut with a reason while stdin still
        # streamed in: the command may have ended, and only the plugin knows. Never run again
        # from here: it may have done its work, or part of it, already.
        if stdin is None and not isinstance(err, StreamLost):
            raise  # refused, in Nomad's words
        end = await _end_of(client, alloc_id, task, tag)
        if end is None:
            if not isinstance(err, StreamLost):
                raise
            await kill()  # no record of its end: it runs on, or was starting; nothing of it is left running
            raise StreamLost(f"{err.reason}; the plugin has no record of the command's end, so it may have run "
                             "in part: it was stopped, and is not run again") from err
        log.info("exec %s: Nomad cut its stream; its end came from the plugin", tag)
        await _emit_missing(end, tag, received, on_output, strict=verify)
        return int(end["exitCode"])
    if verify and code is not None:
        end = await _end_of(client, alloc_id, task, tag)
        if end is None:
            raise ExecFailed(f"exec {tag}: cannot confirm its output arrived whole (the plugin has no record)")
        await _emit_missing(end, tag, received, on_output, strict=True)
    return code


async def recover(client: NomadClient, alloc_id: str, task: str, tag: str, received: dict[str, int],
                  on_output: Emit) -> int | None:
    """The exit code of the tagged exec whose stream closed before its exit frame came, from the
    plugin's record, with the output missing from ``received`` passed on; None if the plugin
    does not know the exec (still running, or its sandbox gone)."""
    end = await _end_of(client, alloc_id, task, tag)
    if end is None:
        return None
    await _emit_missing(end, tag, received, on_output, strict=False)
    return int(end["exitCode"])


async def plugin_verb(client: NomadClient, alloc_id: str, task: str, verb: dict[str, Any]) -> tuple[int | None, bytes]:
    """A plugin verb (kill, freeze, usage, exit, allow, egress: containerd-driver/driver.go)
    carried by an alloc exec, which starts no process in the sandbox; its exit code and output.

    A verb whose stream Nomad lost (StreamLost) is asked again: each one reads, or sets a state
    whole (rules replaced, frozen or not, a tag's processes killed), so asking twice changes
    nothing more than asking once."""
    for attempt in range(1, VERB_TRIES):
        try:
            return await _verb_once(client, alloc_id, task, verb)
        except StreamLost as lost:
            log.warning("plugin verb %s: %s; asking again", next(iter(verb), "?"), lost.reason)
            await asyncio.sleep(0.05 * attempt)
    return await _verb_once(client, alloc_id, task, verb)


async def _verb_once(client: NomadClient, alloc_id: str, task: str, verb: dict[str, Any]) -> tuple[int | None, bytes]:
    out = bytearray()
    code = await client.exec(alloc_id, task, [ENVELOPE, json.dumps(verb)], stdin=None,
                             on_output=lambda _s, d: out.extend(d), stop=asyncio.Event(), kill=noop)
    return code, bytes(out)


async def _end_of(client: NomadClient, alloc_id: str, task: str, tag: str) -> dict | None:
    """How the exec ``tag`` ended, as the plugin recorded it; None if it does not know. Asked
    again when the asking itself fails (a busy Nomad refusing an exec now and then)."""
    for attempt in range(4):
        try:
            code, out = await plugin_verb(client, alloc_id, task, {"exit": tag})
        except HutchError as err:
            log.warning("exec %s: asking the plugin how it ended failed (%s)", tag, err)
            await asyncio.sleep(0.1 * (attempt + 1))
            continue
        return json.loads(out) if code == 0 else None
    return None


async def _emit_missing(end: dict, tag: str, received: dict[str, int], emit: Emit, *, strict: bool) -> None:
    """Write the output we missed (from the recorded tail); ``strict``: raise if more is missing
    than the tail holds (a file's bytes), else only say so (a command's output)."""
    for stream in ("stdout", "stderr"):
        tail = base64.b64decode(end[stream]["tail"] or "")
        missing = int(end[stream]["total"]) - received[stream]
        if 0 < missing <= len(tail):
            log.warning("exec %s: %d bytes of %s came from the plugin's record, not Nomad's stream",
                        tag, missing, stream)
            pending = emit(stream, tail[len(tail) - missing:])
            if pending is not None:
                await pending
        elif missing > len(tail):
            log.warning("exec %s: %d bytes of %s lost with Nomad's stream", tag, missing, stream)
            if strict and stream == "stdout":
                raise ExecFailed(f"exec {tag}: {missing} bytes of its output were lost on the way")
