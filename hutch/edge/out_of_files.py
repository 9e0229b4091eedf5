"""What an HTTP server of hutch's does when ``accept()`` finds the process out of descriptors
(EMFILE, ENFILE: too many connections at once, whoever holds them).

asyncio's selector loop (CPython 3.11) answers it by pausing the listener for a second, but it
goes on calling ``accept()`` for the rest of its batch (as many as the listen backlog: uvicorn's
2,048) and reports each failure, a traceback each, through the loop's exception handler: some
0.8 MB of log a second while it lasts. Written to a pipe that is not drained as fast (a test's,
a supervisor's), that write blocked the process: no deadline fired, no connection was closed,
and it never accepted again (``hutch mcp --http`` under 1,100 trickling connections).

Here the loop's handler takes those reports: it closes the connections that have waited longest
for a request head (``shed``: they hold the descriptors a new client needs, and belong to no
one's request), at most once a second, and logs one line at most every ``LOG_SECONDS``.
Anything else goes to the handler there was before. And the open-file limit itself, of which
the bound on connections waiting for a request head is a share (core/waiting.py, which makes
no system call, is passed the number).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import resource
from collections.abc import Callable
from typing import Any

OUT_OF_FILES = frozenset({errno.EMFILE, errno.ENFILE})
LOG_SECONDS = 10.0
SHED_SECONDS = 1.0  # asyncio retries accept() a second after the failure


def open_file_limit() -> int | None:
    """This process's soft limit on open files now (None: unlimited): the bound on connections
    waiting for a request head is a share of it (core/waiting.py, which makes no system call)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def install(loop: asyncio.AbstractEventLoop, shed: Callable[[], int], log: logging.Logger) -> None:
    """On ``loop``, answer ``accept()``'s out-of-descriptors reports as above. ``shed()`` closes
    some of the connections waiting for a request head and says how many."""
    before = loop.get_exception_handler()
    last_shed = last_log = -math.inf

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        nonlocal last_shed, last_log
        exc = context.get("exception")
        if not (isinstance(exc, OSError) and exc.errno in OUT_OF_FILES and "socket" in context):
            if before is None:
                loop.default_exception_handler(context)
            else:
                before(loop, context)
            return
        now = loop.time()
        if now - last_shed < SHED_SECONDS:
            return  # the same batch of accept()s, or the next before its retry
        last_shed = now
        closed = shed()
        if now - last_log >= LOG_SECONDS:
            last_log = now
            log.warning("out of open files (%s) accepting a connection: closed %d of those waiting longest "
                        "for a request head; accepting again in a second (this is logged once every %.0f s)",
                        exc.strerror, closed, LOG_SECONDS)

    loop.set_exception_handler(handle)
