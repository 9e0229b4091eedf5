"""Two API replicas on one log, on the node driver: a node's loss is recorded by each
sandbox's owner replica, once. A replica that merely lost its own connection to a node (the
node answers the other replica) does not fail the other replica's sandboxes there."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.drivers_support import (
    NODE_SECRET,
    NodeAgents,
    built_runtimes,  # noqa: F401  (fixture)
    require_root,
)
from tests.system.server import Server

pytestmark = pytest.mark.slow


class Relay:
    """A TCP relay to one agent that the test can cut: one replica's own connection to it."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self._target)
                self._open += [client, upstream]
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        """Connections refused from now on, those open reset."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self._listener.close()
        for s in self._open:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)  # a close alone leaves a socket a pump reads from open
            s.close()


def _failed_events(server: Server, sid: str) -> int:
    events = server.data("GET", f"/sandbox/sandboxes/{sid}/events")["events"]
    return sum(1 for e in events if e["type"].endswith("failed"))


def test_a_node_loss_is_recorded_once_by_the_owner(tmp_path: Path, built_runtimes: Path,  # noqa: F811
                                                    shared: Callable[[], dict[str, str]]) -> None:
    require_root()
    agents = NodeAgents(tmp_path / "nodes")
    relay = Relay(agents.addresses["n1"])
    env = {"HUTCH_NODE_SECRET": NODE_SECRET, **shared()}
    a = Server(tmp_path / "a", driver="node", HUTCH_NODE_AGENTS=agents.spec, **env).start()
    b = Server(tmp_path / "b", driver="node",
               HUTCH_NODE_AGENTS=f"n1={relay.address},n2={agents.addresses['n2']}", **env).start()
    on_n1 = tmp_path / "nodes" / "n1" / "sandboxes"
    try:
        made = {s: [s.data("POST", "/sandbox", {"runtime": "base:latest", "resources": {"cpu": "250m"}})["sandboxId"]
                    for _ in range(6)] for s in (a, b)}
        for s, other in ((a, b), (b, a)):
            for sid in made[s]:  # read through the other replica too: its driver learns where each runs
                assert other.data("GET", f"/sandbox/{sid}")["status"] == "idle"
        a_on_n1 = [sid for sid in made[a] if (on_n1 / sid).exists()]
        b_on_n1 = [sid for sid in made[b] if (on_n1 / sid).exists()]
        assert a_on_n1 and b_on_n1, "placement put no sandbox of each replica on n1: nothing to judge"

        # B alone loses n1: A's sandboxes there are A's to judge, and n1 answers A.
        relay.cut()
        deadline = time.monotonic() + 15
        for sid in b_on_n1:  # B's own there: B cannot reach them, and fails them (docs/node.md)
            while a.data("GET", f"/sandbox/{sid}")["status"] != "failed":
                assert time.monotonic() < deadline, f"B's {sid} not failed 15 s after B lost n1"
                time.sleep(0.2)
        time.sleep(1.5)  # B has judged every sandbox it knew on n1
        for sid in a_on_n1:
            assert a.data("GET", f"/sandbox/{sid}")["status"] == "idle", f"{sid} failed by a replica cut off from n1"
            ex = b.data("POST", f"/sandbox/{sid}/execute", {"command": ["true"]})  # through B, run by A
            assert a.data("GET", f"/sandbox/execution/{ex['executionId']}?wait=10s")["exitCode"] == 0

        # n1 really goes: each of its sandboxes failed once, by its owner.
        agents.kill("n1")
        deadline = time.monotonic() + 15
        for sid in a_on_n1:
            while a.data("GET", f"/sandbox/{sid}")["status"] != "failed":
                assert time.monotonic() < deadline, f"{sid} not failed 15 s after n1 died"
                time.sleep(0.2)
        time.sleep(2)  # both replicas' reads have run since
        for sid in a_on_n1 + b_on_n1:
            assert _failed_events(a, sid) == 1, (sid, a.data("GET", f"/sandbox/sandboxes/{sid}/events"))
    finally:
        for s in (a, b):
            with contextlib.suppress(Exception):
                s.destroy_every_sandbox()
            s.stop()
        relay.cut()
        agents.stop()
        agents.reap()  # n1's failed sandboxes: the node was killed and not restarted
