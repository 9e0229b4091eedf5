"""kill -9 the server in the middle of work, restart it on the same data dir: every
sandbox, execution and event acknowledged before the kill is still there, and what was
running when the server died ends through lifecycle events, not silently."""

from __future__ import annotations

import concurrent.futures
import time
import urllib.request
from pathlib import Path

import pytest

from tests.system.server import Server

pytestmark = pytest.mark.slow


def test_kill9_during_executions_then_restart(tmp_path: Path) -> None:
    server = Server(tmp_path / "data").start()
    try:
        done = []
        for i in range(5):
            sid = server.data("POST", "/sandbox", {"name": f"s{i}"})["sandboxId"]
            ex = server.data("POST", f"/sandbox/{sid}/execute", {"command": ["echo", f"hi{i}"]})
            server.data("GET", f"/sandbox/execution/{ex['executionId']}?wait=10s")
            done.append((sid, ex["executionId"]))
        busy = server.data("POST", "/sandbox", {})["sandboxId"]
        running = server.data("POST", f"/sandbox/{busy}/execute", {"command": ["sleep", "60"]})["executionId"]
        # Many acknowledged writes in flight when the kill lands.
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            acked = list(pool.map(lambda i: server.call("POST", "/sandbox", {"name": f"burst{i}"}), range(40)))
        acked_ids = [body["data"]["sandboxId"] for status, body in acked if status == 201]
        events_before = {sid: server.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100")["events"] for sid, _ in done}
        server.kill9()

        server.start()
        for sid, eid in done:
            ex = server.data("GET", f"/sandbox/execution/{eid}")
            assert ex["status"] == "completed" and ex["exitCode"] == 0
            events = server.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100")["events"]
            assert events[: len(events_before[sid])] == events_before[sid]
            # The fake driver's sandboxes died with the process: ended through an event.
            assert events[-1]["type"] == "lifecycle:terminated"
            assert "restarted" in events[-1]["event"]["reason"]
            assert server.data("GET", f"/sandbox/{sid}")["status"] == "terminated"
        ex = server.data("GET", f"/sandbox/execution/{running}")
        assert ex["status"] == "cancelled" and "restarted" in ex["error"]
        listed = server.data("GET", "/sandbox?limit=100&status=terminated")
        assert set(acked_ids) <= {s["sandboxId"] for s in listed["sandboxes"]}
        assert listed["total"] == 5 + 1 + len(acked_ids)
    finally:
        server.stop()


def test_output_is_readable_after_restart(tmp_path: Path) -> None:
    server = Server(tmp_path / "data").start()
    try:
        sid = server.data("POST", "/sandbox", {})["sandboxId"]
        ex = server.data("POST", f"/sandbox/{sid}/execute", {"command": ["echo", "kept"]})
        server.data("GET", f"/sandbox/execution/{ex['executionId']}?wait=10s")
        server.stop()
        server.start()
        path = "/" + ex["stdoutStreamUrl"].split("/", 3)[3]
        import urllib.request

        with urllib.request.urlopen(server.url + path, timeout=10) as resp:
            assert resp.read() == b"kept\n"
    finally:
        server.stop()


def test_local_sandboxes_outlive_a_server_kill9(tmp_path: Path) -> None:
    """With the local driver a sandbox is its own set of processes: a killed server is
    restarted and adopts it, files and all; the command that was running is reported failed."""
    server = Server(tmp_path / "data", driver="local").start()
    try:
        sid = server.data("POST", "/sandbox", {"runtime": "base:latest"})["sandboxId"]
        ex = server.data("POST", f"/sandbox/{sid}/execute", {"command": ["sh", "-c", "echo kept > note.txt"]})
        assert server.data("GET", f"/sandbox/execution/{ex['executionId']}?wait=10s")["exitCode"] == 0
        running = server.data("POST", f"/sandbox/{sid}/execute", {"command": ["sh", "-c", "touch started; exec sleep 60"]})["executionId"]
        deadline = time.monotonic() + 10
        while server.call("GET", f"/fs/list/{sid}?path=started")[0] != 200:  # the command really runs
            assert time.monotonic() < deadline
            time.sleep(0.02)
        server.kill9()

        server.start()
        ex = server.data("GET", f"/sandbox/execution/{running}")
        assert ex["status"] == "failed" and "restarted" in ex["error"]
        assert server.data("GET", f"/sandbox/{sid}")["status"] == "idle"
        # The orphaned command was ended too, not left running unaccounted.
        ps = server.data("POST", f"/sandbox/{sid}/execute", {"command": ["sh", "-c", "ps -eo args"]})
        server.data("GET", f"/sandbox/execution/{ps['executionId']}?wait=10s")
        with urllib.request.urlopen(server.url + "/" + ps["stdoutStreamUrl"].split("/", 3)[3], timeout=10) as resp:
            assert b"sleep 60" not in resp.read()
        again = server.data("POST", f"/sandbox/{sid}/execute", {"command": ["cat", "note.txt"]})
        final = server.data("GET", f"/sandbox/execution/{again['executionId']}?wait=10s")
        assert final["status"] == "completed" and final["exitCode"] == 0
        assert server.call("DELETE", f"/sandbox/{sid}")[0] == 200
    finally:
        server.stop()


def test_a_sandbox_paused_filesystem_only_outlives_a_server_kill9(tmp_path: Path) -> None:
    """Nothing of it runs, so nothing of it dies with the server: the log says how it paused
    (the pause event's mode), the driver finds its files, and the restarted server keeps it
    paused; the execute that wakes it boots it again over them."""
    server = Server(tmp_path / "data", driver="local").start()
    try:
        sid = server.data("POST", "/sandbox", {"runtime": "base:latest"})["sandboxId"]
        ex = server.data("POST", f"/sandbox/{sid}/execute", {"command": ["sh", "-c", "echo kept > note.txt"]})
        assert server.data("GET", f"/sandbox/execution/{ex['executionId']}?wait=10s")["exitCode"] == 0
        status, paused = server.call("POST", f"/sandbox/{sid}/pause", {"memory": False})
        assert status == 200 and paused["memory"] is False
        server.kill9()

        server.start()
        assert server.data("GET", f"/sandbox/{sid}")["status"] == "paused"
        again = server.data("POST", f"/sandbox/{sid}/execute", {"command": ["cat", "note.txt"]})
        final = server.data("GET", f"/sandbox/execution/{again['executionId']}?wait=10s")
        assert final["status"] == "completed" and final["exitCode"] == 0
        assert server.data("GET", f"/sandbox/{sid}")["status"] == "idle"
        assert server.call("DELETE", f"/sandbox/{sid}")[0] == 200
    finally:
        server.stop()
