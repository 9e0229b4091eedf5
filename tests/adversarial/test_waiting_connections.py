"""Can a client that never sends a request exhaust the server? Connections that have not sent
a request belong to no organization, so the per-organization count of requests at once
(api/at_once.py) does not bound them: an unauthenticated client opens connections and sends
nothing, or trickles a request head a byte a second (slowloris), on each HTTP listener.

A real ``hutch serve`` (the fake driver), with the API's listener and E2B's (plain and TLS),
started with the open-file limit a shell or a plain systemd unit gives (1024) and a request
head deadline of 2 s (``HUTCH_REQUEST_HEAD_SECONDS``) so the tests take seconds. The attacker
is this test process (its own limit is far higher), so only the server runs out.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.system.server import KEY, Server, free_port

NOFILE = 1024  # a shell's and a plain systemd unit's soft limit (ulimit -n)
HEAD_SECONDS = 2.0
SLACK = 2.0  # the server notices a deadline within a second; a busy machine adds some


class Listeners:
    def __init__(self, server: Server, ports: dict[str, int], ca_file: Path) -> None:
        self.server, self.ports, self.ca_file = server, ports, ca_file

    def connect(self, listener: str, timeout: float = 5) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.ports[listener]), timeout=timeout)
        if listener != "e2b-tls":
            return sock
        context = ssl.create_default_context(cafile=str(self.ca_file))
        return context.wrap_socket(sock, server_hostname="e2b.localhost")


@pytest.fixture(scope="module")
def listeners(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Listeners]:
    data = tmp_path_factory.mktemp("waiting") / "data"
    e2b, e2b_tls = free_port(), free_port()
    server = Server(data, driver="fake", nofile=(NOFILE, NOFILE), HUTCH_E2B_PORT=str(e2b),
                    HUTCH_E2B_TLS_PORT=str(e2b_tls), HUTCH_REQUEST_HEAD_SECONDS=str(HEAD_SECONDS)).start()
    try:
        yield Listeners(server, {"api": server.port, "e2b": e2b, "e2b-tls": e2b_tls}, data / "e2b-tls" / "ca.pem")
        server.destroy_every_sandbox()
    finally:
        server.stop()


def request(listener: str, *, close: bool = False) -> bytes:
    """A normal client's request on ``listener``: the organization's sandboxes, with its key."""
    head = ("GET /sandbox HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n" if listener == "api" else
            "GET /sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-Key: {key}\r\n").format(key=KEY)
    return (head + ("Connection: close\r\n" if close else "") + "\r\n").encode()


def served(listeners: Listeners, listener: str, timeout: float = 10) -> int:
    """A normal client's request on a connection of its own: its status (0: not answered)."""
    try:
        with listeners.connect(listener, timeout) as sock:
            sock.sendall(request(listener, close=True))
            got = sock.recv(65536)
    except OSError:
        return 0
    return int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/1.1 ") else 0


def closed(sock: socket.socket) -> bool:
    """Has the server closed ``sock`` (read without waiting)?"""
    if not isinstance(sock, ssl.SSLSocket):  # (TLS reads records it holds, not what is readable)
        poll = select.poll()  # not select(): the attacker's descriptors go past 1024
        poll.register(sock, select.POLLIN)
        if not poll.poll(0):
            return False
    try:
        sock.setblocking(False)
        return sock.recv(1) == b""
    except (ssl.SSLWantReadError, BlockingIOError):
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


@contextlib.contextmanager
def opened(listeners: Listeners, listener: str, count: int, first: bytes) -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            try:
                sock = listeners.connect(listener, timeout=2)
                if first:
                    sock.sendall(first)
            except OSError:
                break  # the server's backlog is full: it holds all it can
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close()


PARTIAL = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


@pytest.mark.parametrize("listener", ["api", "e2b"])
def test_trickled_request_heads_leave_others_served_and_are_closed_at_the_deadline(
        listeners: Listeners, listener: str) -> None:
    """More connections than the server has descriptors, each sending part of a head and then
    a byte a second: a normal client is served meanwhile, and every trickling connection is
    closed once the head deadline passes, however often it sends."""
    with opened(listeners, listener, 1100, PARTIAL) as socks:
        began = time.monotonic()
        assert len(socks) > 1000, len(socks)
        assert served(listeners, listener) == 200, "a normal client while 1,100 connections trickle"
        open_ones = list(socks)
        while open_ones and time.monotonic() < began + HEAD_SECONDS + SLACK + 1:
            for sock in open_ones:
                with contextlib.suppress(OSError):
                    sock.send(b"a")
            time.sleep(0.5)
            open_ones = [sock for sock in open_ones if not closed(sock)]
        assert not open_ones, f"{len(open_ones)} trickling connections still open {HEAD_SECONDS}s past their start"
        assert served(listeners, listener) == 200


@pytest.mark.parametrize("listener", ["api", "e2b", "e2b-tls"])
def test_connections_that_send_nothing_are_closed_at_the_deadline(listeners: Listeners, listener: str) -> None:
    with opened(listeners, listener, 20, b"") as socks:
        began = time.monotonic()
        time.sleep(HEAD_SECONDS / 2)
        assert not any(closed(sock) for sock in socks), "closed before the deadline"
        while time.monotonic() < began + HEAD_SECONDS + SLACK and not all(closed(sock) for sock in socks):
            time.sleep(0.2)
        assert all(closed(sock) for sock in socks), f"idle connections open {HEAD_SECONDS + SLACK}s after their start"


def test_a_connection_that_never_sends_a_client_hello_is_closed_at_the_deadline(listeners: Listeners) -> None:
    """On E2B's TLS port a connection reaches aiohttp (its head deadline, the bound) only once
    its handshake is done: one that opens TCP and sends no ClientHello was held for asyncio's
    60 s. The handshake has the head deadline too (edge/listener.Site)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.create_connection(("127.0.0.1", listeners.ports["e2b-tls"]), timeout=5))
                 for _ in range(20)]
        began = time.monotonic()
        time.sleep(HEAD_SECONDS / 2)
        assert not any(closed(sock) for sock in socks), "closed before the deadline"
        while time.monotonic() < began + HEAD_SECONDS + SLACK and not all(closed(sock) for sock in socks):
            time.sleep(0.2)
        assert all(closed(sock) for sock in socks), f"connections with no ClientHello open {HEAD_SECONDS + SLACK}s on"


def _answer(sock: socket.socket) -> bytes:
    """One whole answer (its Content-Length body) off ``sock``."""
    got = b""
    while b"\r\n\r\n" not in got:
        got += sock.recv(65536) or b"<closed>"
        assert not got.endswith(b"<closed>"), got
    head, body = got.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        body += sock.recv(65536)
    return head


@pytest.mark.parametrize("listener", ["api", "e2b", "e2b-tls"])
def test_a_keep_alive_connection_is_closed_after_the_deadline_from_its_last_answer(
        listeners: Listeners, listener: str) -> None:
    with listeners.connect(listener) as sock:
        for _ in range(3):  # each answer's end starts the deadline anew: not counted from the start
            time.sleep(HEAD_SECONDS * 0.6)
            sock.sendall(request(listener))
            assert _answer(sock).startswith(b"HTTP/1.1 200 ")
            answered = time.monotonic()
        while time.monotonic() < answered + HEAD_SECONDS + SLACK and not closed(sock):
            time.sleep(0.2)
        assert closed(sock), f"an idle keep-alive connection open {HEAD_SECONDS + SLACK}s after its answer"


def test_past_the_bound_the_longest_waiting_are_closed_and_requests_under_way_are_not(
        listeners: Listeners) -> None:
    """More waiting connections than the bound (a quarter of the open-file limit: 256) are
    closed oldest first, on the API's and E2B's listeners alike (one count: the process's
    descriptors); a long-poll under way past the head deadline and past the bound gets its
    answer."""
    sandbox = listeners.server.data("POST", "/sandbox", {})["sandboxId"]
    poll = socket.create_connection(("127.0.0.1", listeners.ports["api"]), timeout=30)
    with poll:
        sent = time.monotonic()
        poll.sendall(f"GET /sandbox/status/{sandbox}?waitForStatus=terminated&waitMs={int(HEAD_SECONDS * 2500)} "
                     f"HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode())
        with opened(listeners, "api", 150, b"") as older, opened(listeners, "e2b", 150, PARTIAL) as newer:
            time.sleep(0.5)
            assert sum(closed(sock) for sock in older) >= 300 - 256, "the oldest past the bound"
            assert not any(closed(sock) for sock in newer[-100:]), "the newest, within the bound"
            assert served(listeners, "api") == 200
        head = _answer(poll)
        assert head.startswith(b"HTTP/1.1 200 "), head
        assert time.monotonic() - sent > HEAD_SECONDS * 2.4, "the long-poll was answered at once, not waited out"


def test_out_of_descriptors_it_sheds_waiting_connections_and_serves_again(tmp_path: Path) -> None:
    """The bound set above the open-file limit and a deadline far off: connections that send
    nothing run the server out of descriptors. It closes the longest-waiting of them (not
    waiting for their deadline) and serves a normal client, and says so in one line, where
    asyncio logged a traceback for each failed accept() (128 a second: the listen backlog)."""
    server = Server(tmp_path / "data", driver="fake", nofile=(NOFILE, NOFILE), HUTCH_REQUEST_HEAD_SECONDS="60",
                    HUTCH_MAX_WAITING_CONNECTIONS=str(NOFILE * 4)).start()
    try:
        attacked = Listeners(server, {"api": server.port}, Path())
        with opened(attacked, "api", NOFILE + 76, b"") as socks:
            assert len(socks) == NOFILE + 76, len(socks)
            assert served(attacked, "api") == 200, "a normal client while the server is out of descriptors"
            assert any(closed(sock) for sock in socks), "no waiting connection closed"
    finally:
        server.stop()
    log = server.log.read_text()
    assert log.count("out of open files (Too many open files)") == 1, log[-4000:]
    assert "Traceback" not in log, log[-4000:]

