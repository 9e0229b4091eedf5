"""A tagged alloc exec whose end survives Nomad cutting its stream.

Nomad 1.10's HTTP exec handler (command/agent/alloc_endpoint.go) checks for an input error
before reading each frame back, so when a command exits while its stdin is still streaming
in (``head -c 10`` fed an endless upload), the websocket may close before the exit frame and
the last output are passed on. The plugin keeps how each tagged exec ended (exit and a tail
of each stream with byte counts: containerd-driver/exits.go) and hands it out through its
``{"exit": tag}`` verb; ``run_tagged`` counts what it received and takes the rest from there.
Commands and file operations (a write that meets ENOSPC mid-upload) both run through it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncIterable, Awaitable, Callable, Sequence

from core.errors import HutchError
from drivers.nomad.client import ExecFailed, NomadClient

log = logging.getLogger(__name__)

ENVELOPE = "hutch-exec:v1"
Emit = Callable[[str, bytes], Awaitable[None] | None]


async def noop() -> None:
    return None


async def run_tagged(client: NomadClient, alloc_id: str, task: str, argv: Sequence[str], tag: str, *,
                     stdin: bytes | AsyncIterable[bytes] | None, on_output: Emit, stop: asyncio.Event,
                     kill: Callable[[], Awaitable[None]]) -> int | None:
    """``client.exec`` of ``argv`` (an envelope carrying ``tag`` first); its exit code."""
    received = {"stdout": 0, "stderr": 0}

    async def counted(stream: str, data: bytes) -> None:
        received[stream] += len(data)
        pending = on_output(stream, data)
        if pending is not None:
            await pending

    try:
        return await client.exec(alloc_id, task, argv, stdin=stdin, on_output=counted, stop=stop, kill=kill)
    except ExecFailed:
        if stdin is None:  # nothing in flight: not this race
            raise
        code = await _recover_end(client, alloc_id, task, tag, received, on_output)
        if code is None:
            raise
        return code


async def _recover_end(client: NomadClient, alloc_id: str, task: str, tag: str, received: dict[str, int],
                       emit: Emit) -> int | None:
    """The exit of a cut exec, after writing the output we missed; None if the plugin does not know it."""
    out = bytearray()
    with contextlib.suppress(HutchError):
        code = await client.exec(alloc_id, task, [ENVELOPE, json.dumps({"exit": tag})], stdin=None,
                                 on_output=lambda _s, d: out.extend(d), stop=asyncio.Event(), kill=noop)
        if code == 0:
            end = json.loads(bytes(out))
            for stream in ("stdout", "stderr"):
                tail = base64.b64decode(end[stream]["tail"] or "")
                missing = int(end[stream]["total"]) - received[stream]
                if 0 < missing <= len(tail):
                    pending = emit(stream, tail[len(tail) - missing:])
                    if pending is not None:
                        await pending
                elif missing > len(tail):
                    log.warning("exec %s: %d bytes of %s lost with Nomad's stream", tag, missing, stream)
            log.info("exec %s: Nomad cut its stream; its end came from the plugin", tag)
            return int(end["exitCode"])
    return None
