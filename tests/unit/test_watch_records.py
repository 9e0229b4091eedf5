"""A watch's records as LocalDirWatch reads them (drivers/local/watches.py), from a stand-in
helper: on the nomad driver the stream passes through a process the sandbox can impersonate
(drivers/nomad/agent.py), so what is not a record ends the watch with a clear error instead of
a 500 or a buffer that grows for as long as the sandbox writes."""

from __future__ import annotations

import pytest

from hutch.core.errors import DriverFailure, RateLimited
from hutch.drivers.local.watches import LocalDirWatch


class _Said:
    """A helper that says ``chunks`` then ends; flush bytes are answered with an F mark."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)
        self.ended = False

    def poll(self) -> int | None:
        return 0 if self.ended else None

    async def read(self, n: int = 0) -> bytes:
        if self.chunks:
            return self.chunks.pop(0)
        self.ended = True
        return b""

    async def write(self, data: bytes | memoryview) -> bool:
        self.chunks.append(b"F 0\n")
        return True

    def kill(self) -> None:
        self.ended = True


async def test_records_become_events() -> None:
    watch = LocalDirWatch(_Said(b"C 5\na.txtW 5\na.txt"), lambda: None, b"", "w")
    assert [(e.kind, e.name) for e in await watch.flush()] == [("create", "a.txt"), ("write", "a.txt")]


@pytest.mark.parametrize("stream", [b"C five\na", b"C 99999999999\n", b"C -1\n"], ids=["not-a-number", "huge", "negative"])
async def test_what_is_not_a_record_ends_the_watch_naming_it(stream: bytes) -> None:
    watch = LocalDirWatch(_Said(stream), lambda: None, b"", "w")
    with pytest.raises(DriverFailure, match="the watch of w was ended: its helper's stream is not its records"):
        await watch.flush()
    assert watch.ended


async def test_an_overflow_mark_ends_the_watch_saying_events_were_lost() -> None:
    watch = LocalDirWatch(_Said(b"C 1\naO 0\n"), lambda: None, b"", "w")
    with pytest.raises(RateLimited, match="some were lost"):
        await watch.flush()
