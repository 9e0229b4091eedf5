"""Can a client that never sends a request exhaust ``hutch mcp --http``? As against ``hutch
serve``'s listeners (tests/adversarial/test_waiting_connections.py): connections that send
nothing, or trickle a request head a byte a second, and a keep-alive connection left idle; and
the process run out of descriptors all the same (a bound set above its open-file limit).

A real ``hutch mcp --http`` started with an open-file limit of 256 (set in the child, so the
figures do not depend on the shell's) and a head deadline of 2 s: more connections than that
are few enough to open in well under the deadline on a busy machine. Its stderr goes to a file:
a pipe no one reads fills, and a process that writes to it stops (as the test's own PIPE once
stopped it: asyncio logged a traceback per failed accept()). What it is answered is a request
without a key (401: the gate answers it without asking the hutch server, so none runs here).
"""

from __future__ import annotations

import contextlib
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.adversarial.test_waiting_connections import (
    HEAD_SECONDS,
    PARTIAL,
    SLACK,
    Listeners,
    _answer,
    closed,
    opened,
)
from tests.mcp.test_mcp import _env, _free_port, _wait_for

NOFILE = 256  # its default bound: a quarter, 64
ATTACK = NOFILE + 44  # more connections than it may have descriptors


@contextlib.contextmanager
def mcp_http(log: Path, **settings: str) -> Iterator[Listeners]:
    port = _free_port()
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hutch.cli", "mcp", "--http", f"127.0.0.1:{port}"],
            env=_env(HUTCH_URL="http://127.0.0.1:9", **settings), stdout=subprocess.DEVNULL, stderr=err,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE)))
    try:
        _wait_for(f"http://127.0.0.1:{port}/mcp", proc, "hutch mcp --http")
        yield Listeners(None, {"mcp": port}, Path())  # type: ignore[arg-type]  # no hutch server
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        assert b"Traceback" not in log.read_bytes(), log.read_text()


@pytest.fixture(scope="module")
def listeners(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Listeners]:
    with mcp_http(tmp_path_factory.mktemp("mcp") / "stderr", HUTCH_REQUEST_HEAD_SECONDS=str(HEAD_SECONDS)) as got:
        yield got


def keyless(port: int) -> bytes:
    return (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            "Accept: application/json, text/event-stream\r\nContent-Length: 2\r\n\r\n{}").encode()


def answer(sock: socket.socket, port: int) -> bytes:
    """The head of what a keyless request is answered (its body read too)."""
    sock.sendall(keyless(port))
    return _answer(sock)


def served(listeners: Listeners) -> bool:
    try:
        with listeners.connect("mcp", timeout=10) as sock:
            return answer(sock, listeners.ports["mcp"]).startswith(b"HTTP/1.1 401 ")
    except OSError:
        return False


def test_trickled_request_heads_leave_others_served_and_are_closed_at_the_deadline(listeners: Listeners) -> None:
    with opened(listeners, "mcp", ATTACK, PARTIAL) as socks:
        began = time.monotonic()
        assert len(socks) == ATTACK, len(socks)
        assert served(listeners), f"a normal client while {ATTACK} connections trickle"
        open_ones = list(socks)
        while open_ones and time.monotonic() < began + HEAD_SECONDS + SLACK + 1:
            for sock in open_ones:
                with contextlib.suppress(OSError):
                    sock.send(b"a")
            time.sleep(0.5)
            open_ones = [sock for sock in open_ones if not closed(sock)]
        assert not open_ones, f"{len(open_ones)} trickling connections still open {HEAD_SECONDS}s past their start"


def test_connections_that_send_nothing_are_closed_at_the_deadline(listeners: Listeners) -> None:
    with opened(listeners, "mcp", 20, b"") as socks:
        began = time.monotonic()
        time.sleep(HEAD_SECONDS / 2)
        assert not any(closed(sock) for sock in socks), "closed before the deadline"
        while time.monotonic() < began + HEAD_SECONDS + SLACK and not all(closed(sock) for sock in socks):
            time.sleep(0.2)
        assert all(closed(sock) for sock in socks), f"idle connections open {HEAD_SECONDS + SLACK}s after their start"


def test_a_keep_alive_connection_is_closed_after_the_deadline_from_its_last_answer(listeners: Listeners) -> None:
    with listeners.connect("mcp") as sock:
        for _ in range(3):  # each answer's end starts the deadline anew
            time.sleep(HEAD_SECONDS * 0.6)
            assert answer(sock, listeners.ports["mcp"]).startswith(b"HTTP/1.1 401 ")
            answered = time.monotonic()
        while time.monotonic() < answered + HEAD_SECONDS + SLACK / 2 and not closed(sock):
            time.sleep(0.2)
        assert closed(sock), f"an idle keep-alive connection open {HEAD_SECONDS + SLACK / 2}s after its answer"


def test_out_of_descriptors_it_sheds_waiting_connections_and_serves_again(tmp_path: Path) -> None:
    """The bound set above the open-file limit and a deadline far off: connections that send
    nothing run the process out of descriptors. It closes the longest-waiting of them (not
    waiting for their deadline) and serves a normal client, and says so in one line, not a
    traceback per failed accept()."""
    log = tmp_path / "stderr"
    with mcp_http(log, HUTCH_REQUEST_HEAD_SECONDS="60", HUTCH_MAX_WAITING_CONNECTIONS=str(NOFILE * 4)) as listeners, \
            opened(listeners, "mcp", ATTACK, b"") as socks:
        assert len(socks) == ATTACK, len(socks)
        assert served(listeners), "a normal client while the server is out of descriptors"
        assert any(closed(sock) for sock in socks), "no waiting connection closed"
    assert log.read_text().count("out of open files (Too many open files)") == 1, log.read_text()


@pytest.mark.parametrize(("env", "refusal"), [
    ({"HUTCH_REQUEST_HEAD_SECONDS": "soon"}, "HUTCH_REQUEST_HEAD_SECONDS: expected a number of seconds above 0, got 'soon'"),
    ({"HUTCH_REQUEST_HEAD_SECONDS": "-1"}, "HUTCH_REQUEST_HEAD_SECONDS: expected a number of seconds above 0, got '-1'"),
    ({"HUTCH_MAX_WAITING_CONNECTIONS": "0"}, "HUTCH_MAX_WAITING_CONNECTIONS: expected a positive whole number, got '0'"),
])
def test_a_bad_setting_is_refused_by_name(env: dict[str, str], refusal: str) -> None:
    from hutch import mcp_listener

    assert mcp_listener.settings({"HUTCH_REQUEST_HEAD_SECONDS": "2.5", "HUTCH_MAX_WAITING_CONNECTIONS": "40"}) == (2.5, 40)
    with pytest.raises(ValueError, match=r"^HUTCH_") as caught:
        mcp_listener.settings(env)
    assert str(caught.value) == refusal


def test_hutch_mcp_http_refuses_a_bad_setting_by_name() -> None:
    out = subprocess.run([sys.executable, "-m", "hutch.cli", "mcp", "--http", f"127.0.0.1:{_free_port()}"],
                         env=_env(HUTCH_URL="http://127.0.0.1:9", HUTCH_REQUEST_HEAD_SECONDS="soon"),
                         capture_output=True, timeout=60)
    assert out.returncode == 2, out
    assert "HUTCH_REQUEST_HEAD_SECONDS: expected a number of seconds above 0, got 'soon'" in out.stderr.decode(), out
