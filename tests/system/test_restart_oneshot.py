"""kill -9 the server while one-shots are being created, on both profiles: a one-shot's
lifecycle:started and execution:started are one append, so after the restart every sandbox has
both or neither (never started without its command, the signature of a kill between two
appends), and recovery ends each one cleanly: sandbox ended, its command ended too."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.system.server import Server

pytestmark = pytest.mark.slow

CREATES = 48  # 8 at a time: the kill lands with several creates part way through


@pytest.mark.parametrize("profile", ["embedded", "production"])
def test_kill9_while_oneshots_start_then_each_has_both_starts_or_neither(
        tmp_path: Path, profile: str, request: pytest.FixtureRequest) -> None:
    env: dict[str, str] = {}
    if profile == "production":
        kafka_log: Callable[[str], str] = request.getfixturevalue("kafka_log")
        env = {"HUTCH_EVENT_LOG": kafka_log("restart-oneshot"), "HUTCH_STORE": request.getfixturevalue("database")}
    server = Server(tmp_path / "data", **env).start()
    try:
        body = {"command": {"exec": ["sleep", "60"], "mode": "oneshot"}}
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            calls = [pool.submit(server.call, "POST", "/sandbox", body, 10) for _ in range(CREATES)]
            deadline = time.monotonic() + 60
            while sum(c.done() for c in calls) < 12 and time.monotonic() < deadline:
                time.sleep(0.005)
            server.kill9()
            answers = [c.result() if not c.exception() else (None, None) for c in calls]
        acked = [b["data"] for status, b in answers if status == 201]
        assert len(acked) >= 12 and len(acked) < CREATES, "the kill landed after the creates ended"

        server.start()
        listed = server.data("GET", "/sandbox?limit=100")["sandboxes"]
        assert {a["sandboxId"] for a in acked} <= {s["sandboxId"] for s in listed}
        halves = 0
        for sb in listed:
            sid = sb["sandboxId"]
            ended = server.data("GET", f"/sandbox/status/{sid}?waitForStatus=terminated,failed&waitMs=20000")
            assert ended["status"] in ("terminated", "failed"), (sid, ended)
            events = server.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100")["events"]
            types = [e["type"] for e in events]
            if "lifecycle:started" not in types:  # the kill came before: only the create, then the end
                assert "execution:started" not in types, types
                continue
            at = types.index("lifecycle:started")
            started, running = events[at], events[at + 1]
            assert running["type"] == "execution:started", types  # never started without its command
            assert running["position"] == started["position"] + 1, (started, running)
            halves += 1
            ex = server.data("GET", f"/sandbox/execution/{running['event']['executionId']}")
            assert ex["status"] in ("cancelled", "failed") and "restart" in ex["error"], ex
        assert halves >= len(acked)  # every acknowledged create had its command's start recorded
        assert all(_status(server, a["sandboxId"]) in ("terminated", "failed") for a in acked)
        server.destroy_every_sandbox()
    finally:
        server.stop()


def _status(server: Server, sandbox_id: str) -> Any:
    return server.data("GET", f"/sandbox/{sandbox_id}")["status"]
