"""Shared state across replicas (issue 20): an execution's output stream written through one
API server is read through another, and outlives the server (and host) that ran it.

Server A and server B (each its own data dir, the production profile on one Kafka topic and
one PostgreSQL database) are up; a command runs through A and writes output; a reader on B
follows the stream live. A is killed -9: B's reader gets every byte A saved and ends (the
stream reads as closed once A's database session is gone), and B serves the stream again,
whole, after A's data dir is deleted.
"""

from __future__ import annotations

import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.system.server import Server

pytestmark = pytest.mark.slow


def stream_path(url: str) -> str:
    return "/" + url.split("://", 1)[1].split("/", 1)[1]


class Follower(threading.Thread):
    """Reads a stream URL to its end, noting when the first line came and when it ended."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.got = b""
        self.first_line = threading.Event()
        self.ended_at: float | None = None

    def run(self) -> None:
        with urllib.request.urlopen(self.url, timeout=60) as resp:
            while line := resp.readline():
                self.got += line
                self.first_line.set()
        self.ended_at = time.monotonic()


def test_a_stream_outlives_the_server_that_ran_its_command(
    tmp_path: Path, shared: Callable[[], dict[str, str]]
) -> None:
    a = Server(tmp_path / "a", **shared()).start()
    b = Server(tmp_path / "b", **shared()).start()
    try:
        sid = a.data("POST", "/sandbox", {"name": "writer"})["sandboxId"]
        ex = a.data("POST", f"/sandbox/{sid}/execute",
                    {"command": ["sh", "-c", "echo one; echo two; sleep 600"]})
        path = stream_path(ex["stdoutStreamUrl"])
        follower = Follower(b.url + path)  # through B: the stream id is good on every replica
        follower.start()
        assert follower.first_line.wait(30), "B's reader got nothing of A's live stream"
        assert follower.is_alive()  # the command still runs on A: the stream is open
        while follower.got != b"one\ntwo\n":
            time.sleep(0.01)
        killed = time.monotonic()
        a.kill9()
        follower.join(30)
        assert not follower.is_alive(), "B's reader did not end after A died"
        assert follower.got == b"one\ntwo\n"
        assert follower.ended_at is not None
        print(f"B's reader ended {follower.ended_at - killed:.3f}s after A was killed")

        shutil.rmtree(a.data_dir)  # A's host is gone, and its disk with it
        with urllib.request.urlopen(b.url + path, timeout=30) as resp:
            assert resp.read() == b"one\ntwo\n"
        unknown = path[:-4] + ("0000" if not path.endswith("0000") else "1111")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(b.url + unknown, timeout=30)
        assert refused.value.code == 404
        refused.value.close()
    finally:
        a.stop()
        b.stop()
