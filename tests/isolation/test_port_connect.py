"""drivers/local/portconnect.py from the attacker's side: a connection the server makes into a
sandbox's network namespace lands on that namespace's loopback, never on the host's port of
the same number; a pid that is no longer the sandbox's init is refused; and a rootless
server, which cannot enter a namespace, says so (the E2B wire answers it as a 501). The
nomad driver's: tests/nomad/test_nomad_port_connect.py."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from hutch.core.errors import DriverFailure, NotSupported
from hutch.drivers.local import portconnect
from hutch.drivers.local.driver import LocalDriver
from hutch.drivers.local.helper import start_time

_INSIDE = """
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("ready", flush=True)
c, _ = s.accept()
s.close()
c.sendall(b"inside")
c.close()
print("closed", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def namespace() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A process in a network namespace of its own (loopback only) listening on a port that
    the host's loopback also has a listener on."""
    host = socket.socket()
    host.bind(("127.0.0.1", 0))
    host.listen()
    port = host.getsockname()[1]
    with host, subprocess.Popen(["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" -c "$1" "$2"',
                                 sys.executable, _INSIDE, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            yield proc, port
        finally:
            proc.kill()


async def test_the_connection_lands_in_the_namespace_not_on_the_host(
        namespace: tuple[subprocess.Popen[str], int]) -> None:
    proc, port = namespace
    started = start_time(proc.pid)
    assert started is not None
    sock = await portconnect.connect("sbx_test", proc.pid, started, port)
    with sock:
        # The host's listener never answers: a connection made on the host would time out here.
        assert await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 16), 10) == b"inside"
    assert proc.stdout is not None and proc.stdout.readline().strip() == "closed"
    with pytest.raises(ConnectionRefusedError):  # it accepted once; nothing else listens in there
        await portconnect.connect("sbx_test", proc.pid, started, port)


async def test_a_pid_that_is_not_the_sandboxs_init_is_refused(namespace: tuple[subprocess.Popen[str], int]) -> None:
    proc, port = namespace
    started = start_time(proc.pid)
    assert started is not None
    with pytest.raises(DriverFailure, match="sbx_test is no longer running"):
        await portconnect.connect("sbx_test", proc.pid, started + 1, port)


async def test_a_rootless_local_server_says_it_reaches_declared_ports_only() -> None:
    me = SimpleNamespace(rootless=True, _registry=SimpleNamespace(running=lambda sid: None))
    with pytest.raises(NotSupported, match="a rootless server reaches only the port a sandbox declared"):
        await LocalDriver.port_connect(me, "sbx_x", 8000)  # type: ignore[arg-type]
