"""Can one tenant starve another with bodies that are cheap to send and dear to read? Tenant A,
with a member key and no rate limit (what a fresh ``hutch serve`` gives), sends one JSON body
of many tiny values, within the server's 64 MiB body cap; tenant B lists its sandboxes meanwhile.

A JSON body is decoded on the server's event loop (api/http.py ``parse_json``), and what that
costs grows with the number of values, not the bytes. A real ``hutch serve`` (fake driver: the
API's cost is what is measured), the attacker and B in this test process.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.adversarial.test_held_requests import call, key_of
from tests.system.server import Server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "data", driver="fake").start()
    try:
        yield srv
    finally:
        srv.stop()


def test_a_body_of_many_values_leaves_another_tenant_served(server: Server) -> None:
    a, b = key_of(server, "attacker"), key_of(server, "victim")
    values = b"[" + b",".join([b"1"] * (31 << 20)) + b"]"  # 62 MiB: 32 million numbers
    body = b'{"runtime": "base:latest", "metadata": ' + values + b"}"
    head = (f"POST /sandbox HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {a}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    sent = threading.Event()
    answer: dict[str, Any] = {}

    def attack() -> None:
        with socket.create_connection(("127.0.0.1", server.port), timeout=600) as sock:
            sock.sendall(head + body)
            sent.set()
            got = b""
            while chunk := sock.recv(65536):
                got += chunk
        answer["status"] = int(got.split(b" ", 2)[1])
        answer["body"] = json.loads(got.split(b"\r\n\r\n", 1)[1])

    thread = threading.Thread(target=attack)
    thread.start()
    try:
        assert sent.wait(60)
        # B, while the server has A's body: answered within a generous bound (before: only
        # once A's body was decoded, 20 s and more on a 2-core machine).
        status, listed = call(server, b, "GET", "/sandbox", timeout=10)
        assert status == 200, ("B's list while A's body is read", status, listed)
    finally:
        thread.join(600)
    assert answer["status"] == 413, answer
    assert "100000 values" in answer["body"]["message"] and answer["body"]["field"] == "body", answer
