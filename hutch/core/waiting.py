"""Connections waiting for a request head, bounded: what one HTTP server process holds of
connections that have not sent a request (yet, or since their last answer), which belong to no
organization. Past the bound, those that have waited longest are closed first.

The bookkeeping only: each listener (edge/listener.py: aiohttp's; mcp_listener.py: uvicorn's)
says whether one of its connections waits and since when, and how to close it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

HEAD_SETTING = "HUTCH_REQUEST_HEAD_SECONDS"
WAITING_SETTING = "HUTCH_MAX_WAITING_CONNECTIONS"
HEAD_SECONDS = 10.0
# A quarter of the open files the process may have (as an organization's share of requests,
# api/at_once.py), at most this many: more idle keep-alive connections than busy clients hold,
# and each waiting connection's buffers are memory too.
MOST_WAITING = 10_000

C = TypeVar("C")


def read_settings(env: Mapping[str, str]) -> tuple[float, int | None]:
    """(the head deadline, the bound or None for ``default_waiting``'s) from ``env``'s
    ``HUTCH_REQUEST_HEAD_SECONDS`` and ``HUTCH_MAX_WAITING_CONNECTIONS``, for the servers that
    do not read the service's config (``hutch mcp --http``, the node agent); a bad one is a
    ValueError naming it, in the words service/config.py uses."""
    head, most = env.get(HEAD_SETTING, ""), env.get(WAITING_SETTING, "")
    try:
        seconds = float(head) if head else HEAD_SECONDS
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < math.inf:
        raise ValueError(f"{HEAD_SETTING}: expected a number of seconds above 0, got {head!r}")
    if not most:
        return seconds, None
    if not most.isdigit() or int(most) < 1:
        raise ValueError(f"{WAITING_SETTING}: expected a positive whole number, got {most!r}")
    return seconds, int(most)


def default_waiting(open_files: int | None) -> int:
    """The bound for a process that may have ``open_files`` descriptors (its soft
    RLIMIT_NOFILE; None: unlimited), read by its caller (service/config.py, mcp_listener.py)."""
    if open_files is None:
        return MOST_WAITING
    return max(1, min(MOST_WAITING, open_files // 4))


class WaitingBound(Generic[C]):
    """The open connections of a process's listeners, and the bound on those waiting for a
    request head. ``since(conn)``: when ``conn`` began to wait (any clock, the same for all),
    None while it has a request under way or is closed; ``close(conn)`` ends it."""

    def __init__(self, limit: int, since: Callable[[C], float | None], close: Callable[[C], None]) -> None:
        self.limit = limit
        self._since, self._close = since, close
        self._open: dict[C, None] = {}
        self._unchecked = 0

    def made(self, conn: C) -> None:
        self._open[conn] = None
        self._unchecked += 1
        # Counting the waiting ones takes a pass over every connection: made once per a tenth
        # of the bound's connections made, trimming to that much below it, so that the bound
        # holds between passes and a flood of connections does not cost a pass each.
        slack = self.limit // 10
        if len(self._open) > self.limit and self._unchecked > slack:
            self._unchecked = 0
            self._trim(self.limit - slack)

    def lost(self, conn: C) -> None:
        self._open.pop(conn, None)

    def shed(self) -> int:
        """Close the longer-waiting half of the connections waiting for a request head (the
        process is out of descriptors: edge/out_of_files.py); how many it closed."""
        return self._trim(None)

    def _trim(self, keep: int | None) -> int:
        """Close the longest-waiting connections past ``keep`` of them (None: half); how many."""
        waiting = [(since, n, conn) for n, conn in enumerate(self._open) if (since := self._since(conn)) is not None]
        keep = len(waiting) // 2 if keep is None else keep
        if len(waiting) <= keep:
            return 0
        waiting.sort(key=lambda entry: entry[:2])
        for _since, _n, conn in waiting[:len(waiting) - keep]:
            self._close(conn)
        return len(waiting) - keep
