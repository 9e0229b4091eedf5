"""The API server on the node driver, kill -9'd and restarted: its sandboxes live on their
agents, so the new server finds them (the log records each one's node), files and all; the
command that was running is reported failed, and its agent ended it when its request went away."""

from __future__ import annotations

import time
import urllib.request
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


def test_node_sandboxes_outlive_a_server_kill9(tmp_path: Path, built_runtimes: Path) -> None:  # noqa: F811
    require_root()
    agents = NodeAgents(tmp_path / "nodes")
    server = Server(tmp_path / "data", driver="node", HUTCH_NODE_AGENTS=agents.spec,
                    HUTCH_NODE_SECRET=NODE_SECRET).start()
    try:
        sids = [server.data("POST", "/sandbox", {"runtime": "base:latest"})["sandboxId"] for _ in range(2)]
        for sid in sids:
            ex = server.data("POST", f"/sandbox/{sid}/execute", {"command": ["sh", "-c", f"echo {sid} > note.txt"]})
            assert server.data("GET", f"/sandbox/execution/{ex['executionId']}?wait=10s")["exitCode"] == 0
        sid = sids[0]
        running = server.data("POST", f"/sandbox/{sid}/execute", {"command": ["sh", "-c", "touch started; exec sleep 60"]})["executionId"]
        deadline = time.monotonic() + 10
        while server.call("GET", f"/fs/list/{sid}?path=started")[0] != 200:  # the command really runs
            assert time.monotonic() < deadline
            time.sleep(0.02)
        server.kill9()

        server.start()
        ex = server.data("GET", f"/sandbox/execution/{running}")
        assert ex["status"] == "failed" and "restarted" in ex["error"], ex
        for sid in sids:  # both, whichever node each was placed on
            assert server.data("GET", f"/sandbox/{sid}")["status"] == "idle"
            again = server.data("POST", f"/sandbox/{sid}/execute", {"command": ["cat", "note.txt"]})
            final = server.data("GET", f"/sandbox/execution/{again['executionId']}?wait=10s")
            assert final["status"] == "completed" and final["exitCode"] == 0
            with urllib.request.urlopen(server.url + "/" + again["stdoutStreamUrl"].split("/", 3)[3], timeout=10) as resp:
                assert resp.read() == f"{sid}\n".encode()
        # The orphaned command was ended by its agent, not left running unaccounted: the agent
        # looks at a silent command's connection every GONE_CHECK (1 s), so allow a few looks.
        deadline = time.monotonic() + 15
        while True:
            ps = server.data("POST", f"/sandbox/{sids[0]}/execute", {"command": ["sh", "-c", "ps -eo args"]})
            server.data("GET", f"/sandbox/execution/{ps['executionId']}?wait=10s")
            with urllib.request.urlopen(server.url + "/" + ps["stdoutStreamUrl"].split("/", 3)[3], timeout=10) as resp:
                listing = resp.read()
            if b"sleep 60" not in listing:
                break
            assert time.monotonic() < deadline, f"the orphaned command still runs 15 s on: {listing!r}"
            time.sleep(0.5)
        for sid in sids:
            assert server.call("DELETE", f"/sandbox/{sid}")[0] == 200
    finally:
        server.stop()
        agents.stop()
