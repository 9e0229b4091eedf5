"""A socket for the server's side of a tunnel to a sandbox's port: one end of a socketpair whose
other end a task pumps over the tunnel (the node driver's agent websocket, drivers/node/ports.py;
the nomad plugin's connect exec, drivers/nomad/portconnect.py)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

Pump = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def pumped_socket(pump: Pump, pumps: set[asyncio.Task[None]], close_tunnel: Callable[[], Awaitable[object]],
                        early: bytes = b"") -> socket.socket:
    """The server's end (non-blocking); ``pump`` carries the other end's bytes, as a task held
    in ``pumps`` until it ends. ``early``: bytes the tunnel sent before the pair existed. A
    failure closes the pair and the tunnel."""
    mine, theirs = socket.socketpair()
    try:
        reader, writer = await asyncio.open_connection(sock=theirs)
    except BaseException:
        mine.close()
        theirs.close()
        await close_tunnel()
        raise
    if early:
        writer.write(early)
    task = asyncio.ensure_future(pump(reader, writer))
    pumps.add(task)
    task.add_done_callback(pumps.discard)
    mine.setblocking(False)
    return mine
