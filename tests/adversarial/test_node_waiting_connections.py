"""Can a peer that never sends a request hold a node agent's connections? As against
``hutch serve``'s listeners (test_waiting_connections.py): a real ``hutch node serve`` (root,
its local driver; no sandbox is made) with a request-head deadline of 2 s. A TLS connection
that trickles a head, one that sends nothing after its handshake, and a TCP connection that
never sends a ClientHello are all closed at the deadline; before, aiohttp's keep-alive timer
(75 s) and asyncio's handshake timeout (60 s) were their only bounds.

The agent's clients (the API's node driver) let an idle connection go before its deadline, so a
call is never sent on a connection the agent is closing."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hutch.core.waiting import HEAD_SECONDS as DEFAULT_HEAD_SECONDS
from hutch.drivers.node import client
from tests.adversarial.test_waiting_connections import HEAD_SECONDS, PARTIAL, SLACK, closed
from tests.drivers_support import NodeAgents, require_root


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    require_root()
    agents = NodeAgents(tmp_path_factory.mktemp("node-head"), ("n1",),
                        env={"HUTCH_REQUEST_HEAD_SECONDS": str(HEAD_SECONDS)})
    try:
        host, port = agents.addresses["n1"].rsplit(":", 1)
        yield host, int(port)
    finally:
        agents.stop()
        agents.reap()


def _tls(address: tuple[str, int]) -> ssl.SSLSocket:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # the pin is the driver's; not under test
    return context.wrap_socket(socket.create_connection(address, timeout=5))


def _closed_within(socks: list[socket.socket], seconds: float,
                   trickle: tuple[socket.socket, ...] = ()) -> list[socket.socket]:
    """Those of ``socks`` still open ``seconds`` on, sending a byte of header each half second on
    those of them in ``trickle``."""
    until = time.monotonic() + seconds
    open_ones = list(socks)
    while open_ones and time.monotonic() < until:
        for sock in open_ones:
            if sock in trickle:
                with contextlib.suppress(OSError):
                    sock.send(b"a")
        time.sleep(0.5)
        open_ones = [sock for sock in open_ones if not closed(sock)]
    return open_ones


def test_tls_connections_that_trickle_a_head_or_send_nothing_are_closed_at_the_deadline(agent: tuple[str, int]) -> None:
    with contextlib.ExitStack() as stack:
        made: dict[ssl.SSLSocket, float] = {}

        def tls() -> ssl.SSLSocket:
            sock = stack.enter_context(_tls(agent))
            made[sock] = time.monotonic()  # its deadline runs from here
            return sock

        trickling = [tls() for _ in range(5)]
        idle = [tls() for _ in range(5)]
        for sock in trickling:
            sock.sendall(PARTIAL)
        time.sleep(HEAD_SECONDS / 2)
        # On a loaded machine the ten handshakes may take longer than the deadline: only those
        # made less than a deadline ago are due open (the last one always is).
        now = time.monotonic()
        young = [sock for sock, at in made.items() if now - at < HEAD_SECONDS - 0.25]
        assert young and not any(closed(sock) for sock in young), "closed before the deadline"
        assert not _closed_within(trickling + idle, HEAD_SECONDS / 2 + SLACK + 1, tuple(trickling)), \
            f"connections open {HEAD_SECONDS + SLACK + 1}s after their handshake"


def test_a_connection_that_never_sends_a_client_hello_is_closed_at_the_deadline(agent: tuple[str, int]) -> None:
    with contextlib.ExitStack() as stack:
        silent = [stack.enter_context(socket.create_connection(agent, timeout=5)) for _ in range(5)]
        assert not _closed_within(silent, HEAD_SECONDS + SLACK), \
            f"connections with no TLS handshake open {HEAD_SECONDS + SLACK}s after their start"


def test_the_node_driver_lets_an_idle_connection_go_before_the_agents_deadline() -> None:
    assert client.IDLE_SECONDS < DEFAULT_HEAD_SECONDS


def test_a_bad_deadline_setting_stops_the_agent_by_name(tmp_path: Path) -> None:
    from hutch.node import config

    with pytest.raises(config.SettingError) as caught:
        config.settings("n1", "127.0.0.1:7700", str(tmp_path), {"HUTCH_NODE_SECRET": "k" * 40,
                                                              "HUTCH_REQUEST_HEAD_SECONDS": "soon"})
    assert str(caught.value) == "HUTCH_REQUEST_HEAD_SECONDS: expected a number of seconds above 0, got 'soon'"
