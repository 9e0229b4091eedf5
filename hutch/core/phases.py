"""Where a request's time goes: named spans timed with a monotonic clock, only when the
server runs with ``HUTCH_PHASES=1`` (bench/phases.py turns it on and reads the result).

A profiler samples too coarsely for phases of tens of microseconds, and what waits (an
append's fsync, a projection, a child process) shows in no CPU profile; these spans time
them where they happen. Off, which is always outside a bench, a span is one flag test on
entry and one on exit: no clock read, nothing kept. On, each span's duration is kept in
memory under its name (at most ``KEEP`` a name) and written out when the server stops
(edge/phases.py).
"""

from __future__ import annotations

import os
import time
from types import TracebackType

ON = os.environ.get("HUTCH_PHASES") == "1"
KEEP = 200_000  # durations kept per name: a long bench stays bounded

_taken: dict[str, list[int]] = {}


def start() -> int:
    """A start time for ``end`` (0 when off: never read)."""
    return time.perf_counter_ns() if ON else 0


def end(name: str, t0: int) -> None:
    """The span ``name`` from ``t0`` (``start()``) to now."""
    if ON:
        kept = _taken.setdefault(name, [])
        if len(kept) < KEEP:
            kept.append(time.perf_counter_ns() - t0)


class span:  # lower case: read as a statement, ``with phases.span("append"):``
    """``with span(name):`` times its body, on success or not."""

    __slots__ = ("name", "t0")

    def __init__(self, name: str) -> None:
        self.name = name
        self.t0 = 0

    def __enter__(self) -> None:
        if ON:
            self.t0 = time.perf_counter_ns()

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        if ON:
            end(self.name, self.t0)


def taken() -> dict[str, list[float]]:
    """Every duration kept so far, in milliseconds, by name."""
    return {name: [ns / 1e6 for ns in kept] for name, kept in _taken.items()}


def clear() -> None:
    _taken.clear()
