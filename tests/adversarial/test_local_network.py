"""The local driver's network, from inside a sandbox: private ranges (a LAN, other services of
the host's network, another driver's sandboxes) are out of reach by default, the sandbox's
own name servers answer DNS and nothing else, and no IPv6 packet leaves or enters a sandbox
veth, with network on, with an allow-list, and with only a port.

A "private LAN" is a network namespace this test makes (192.168.231.0/29, routed from the
host) with a server on tcp 8080 and a name-server stand-in on udp/tcp 53.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from hutch.drivers.base import ExecRequest, ProvisionRequest
from hutch.drivers.local import firewall_peers, network, slirp
from hutch.drivers.local.driver import UID_BASE, LocalDriver
from tests.drivers_support import (
    Recorder,
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    local_driver_fixture,
    new_id,
)
from tests.isolation.test_local_network import fake_internet_running, probe

pytestmark = pytest.mark.isolation

PY = "python:3.13"
LAN_HOST, LAN_SERVER, LAN_PREFIX = "192.168.231.1", "192.168.231.2", 29
LAN = f"192.168.231.0/{LAN_PREFIX}"

# The LAN's server: HTTP on 8080, a "name server" on tcp 53 (answers like HTTP, so the
# connect probe shows it open) and udp 53 (echoes).
LAN_SERVER_SCRIPT = r"""
import socket, threading
def tcp(port, answer):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(16)
    while True:
        c, _ = s.accept()
        try: c.recv(64); c.sendall(answer)
        except OSError: pass
        c.close()
def udp():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", 53))
    while True:
        data, peer = u.recvfrom(512); u.sendto(b"dns:" + data, peer)
threading.Thread(target=tcp, args=(53, b"HTTP/1.0 200 dns\r\n\r\n"), daemon=True).start()
threading.Thread(target=udp, daemon=True).start()
tcp(8080, b"HTTP/1.0 200 lan\r\n\r\n")
"""

UDP_PROBE = r"""
import socket, sys
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)
try:
    u.sendto(b"q", (sys.argv[1], int(sys.argv[2]))); print(u.recv(64).decode())
except OSError as err:
    print(type(err).__name__)
"""


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


@contextlib.contextmanager
def private_lan() -> Iterator[None]:
    tag = uuid.uuid4().hex[:6]
    ns, veth = f"hutch-lan-{tag}", f"tlan{tag}"
    sh("ip", "netns", "add", ns)
    server = None
    try:
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "addr", "add", f"{LAN_HOST}/{LAN_PREFIX}", "dev", veth)
        sh("ip", "link", "set", veth, "up")
        for cmd in (["ip", "addr", "add", f"{LAN_SERVER}/{LAN_PREFIX}", "dev", "eth0"], ["ip", "link", "set", "eth0", "up"],
                    ["ip", "link", "set", "lo", "up"], ["ip", "route", "add", "default", "via", LAN_HOST]):
            sh("ip", "netns", "exec", ns, *cmd)
        server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", LAN_SERVER_SCRIPT],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection((LAN_SERVER, 8080), 1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "the private LAN never served"
                time.sleep(0.05)
        yield
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@contextlib.contextmanager
def own_rules() -> Iterator[None]:
    """This process's rules alone (its name server stand-in, its permits) in force until the
    block ends: another test process's server start on this host installs its own, and would
    otherwise replace them between this test's install and its probes; and every live hutch
    process's walls are installed together (firewall_peers.py: another live test process, an
    xdist worker, denies the LAN this test permits). The host lock keeps other installers out
    meanwhile; the walls of all are back when it ends."""
    with network.host_firewall_lock():
        strictest = firewall_peers.strictest
        firewall_peers.strictest = lambda own: own
        try:
            network.install_firewall()
            yield
        finally:
            firewall_peers.strictest = strictest
            network.install_firewall()


@pytest.fixture
async def driver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalDriver]:
    # The LAN's server stands in for the host's name server (10.255.255.53 here: a private
    # address too), so the DNS opening is tested without sending anything off this machine.
    monkeypatch.setattr(network, "resolv_conf", lambda: f"nameserver {LAN_SERVER}\n")
    monkeypatch.delenv("HUTCH_SANDBOX_EGRESS_PERMIT", raising=False)
    network._firewall_ready = False  # installed anew with this process's settings
    async for d in local_driver_fixture(request):
        assert isinstance(d, LocalDriver)
        yield d
    network._firewall_ready = False


@pytest.fixture
async def host_service_v6() -> AsyncIterator[int]:
    """A service of the host bound to [::], every IPv6 address of the host."""
    server = await asyncio.start_server(lambda r, w: w.close(), "::", 0, family=socket.AF_INET6)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


def host_ipv6() -> list[str]:
    out = subprocess.run(["ip", "-6", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True).stdout
    out += subprocess.run(["ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link"],
                          capture_output=True, text=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines()]


async def udp(driver: LocalDriver, sid: str, host: str, port: int) -> str:
    sink = Recorder()
    await driver.exec(ExecRequest(new_id("ex"), sid, ["python3", "-c", UDP_PROBE, host, str(port)], timeout=30), sink)
    return sink.stdout.strip()


async def test_private_ranges_are_denied_but_dns_to_the_name_servers_is_not(driver: LocalDriver) -> None:
    with private_lan(), fake_internet_running() as inet:
        open_sid, listed_sid = new_id(), new_id()
        await driver.provision(ProvisionRequest(sandbox_id=open_sid, runtime=PY, network_enabled=True))
        # An allow-list naming the LAN does not open it: a list narrows, never widens.
        await driver.provision(ProvisionRequest(sandbox_id=listed_sid, runtime=PY, network_enabled=True,
                                                network_allow=(f"{inet[0]}/32", LAN)))
        try:
            for sid in (open_sid, listed_sid):
                with own_rules():
                    seen = await probe(driver, sid, [inet, (LAN_SERVER, 8080), (LAN_SERVER, 53), (LAN_HOST, 8080)])
                    assert seen[f"{inet[0]}:{inet[1]}"].startswith("open HTTP/1."), seen  # the internet still is
                    assert not seen[f"{LAN_SERVER}:8080"].startswith("open"), (sid, seen)
                    assert not seen[f"{LAN_HOST}:8080"].startswith("open"), (sid, seen)
                    assert seen[f"{LAN_SERVER}:53"].startswith("open HTTP/1.0 200"), (sid, seen)  # DNS over tcp
                    assert await udp(driver, sid, LAN_SERVER, 53) == "dns:q"  # and over udp
                    assert await udp(driver, sid, LAN_SERVER, 54) != "dns:q"
        finally:
            for sid in (open_sid, listed_sid):
                await driver.destroy(sid)


# Connects to each target as fast as it can for a few seconds; prints how many got through.
KNOCK = r"""
import socket, sys, time
targets = [(a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in sys.argv[2:]]
end, opened, tries = time.monotonic() + float(sys.argv[1]), 0, 0
while time.monotonic() < end:
    for target in targets:
        tries += 1
        try:
            socket.create_connection(target, 0.05).close(); opened += 1
        except OSError:
            pass
print(opened, tries)
"""


async def test_a_server_start_never_opens_the_walls_while_it_rewrites_them(driver: LocalDriver) -> None:
    """Every hutch process on a host (a restarted server, another node agent, a CLI's engine)
    installs the chains at its start while other processes' sandboxes run. An attacker's
    sandbox knocks on a private LAN and on the host without pause meanwhile: not one
    connection may get through a half-written rule set."""
    host = await asyncio.start_server(lambda r, w: w.close(), "0.0.0.0", 0)
    host_port = host.sockets[0].getsockname()[1]
    with private_lan():
        sid = new_id()
        await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=PY, network_enabled=True))
        try:
            stop = time.monotonic() + 6
            def restarts() -> int:
                n = 0
                while time.monotonic() < stop:
                    network._firewall_ready = False
                    network.ensure_firewall()
                    n += 1
                return n
            sink = Recorder()
            knock = driver.exec(ExecRequest(new_id("ex"), sid, ["python3", "-c", KNOCK, "5", f"{LAN_SERVER}:8080",
                                                               f"{LAN_HOST}:{host_port}"], timeout=60), sink)
            _, installs = await asyncio.gather(knock, asyncio.to_thread(restarts))
            opened, tries = map(int, sink.stdout.split())
            assert installs >= 5 and tries >= 50, (installs, tries, sink.stderr)
            assert opened == 0, f"{opened} of {tries} connections got through during {installs} installs"
        finally:
            await driver.destroy(sid)
            host.close()
            await host.wait_closed()


# Another hutch process of this host (a CLI's engine, a test server, a second server) that
# installs the firewall with its own settings and then lives on, as a server does.
OTHER_INSTALLER = r"""
import os, sys
os.environ["HUTCH_SANDBOX_EGRESS_PERMIT"] = sys.argv[1]
from hutch.drivers.local import network
network.ensure_firewall()
print("installed", flush=True)
sys.stdin.read()
"""


async def test_another_process_s_start_never_widens_this_one_s_walls(driver: LocalDriver) -> None:
    """The chains are host-wide, and each process rewrote them whole with its own settings at
    its start. Before: a server started with ``HUTCH_SANDBOX_EGRESS_PERMIT`` (a LAN opened for
    its own tenants) opened that LAN to every other server's sandboxes on the host, which
    denied it; the last installer's settings held for every sandbox of the host."""
    with private_lan():
        sid = new_id()
        await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=PY, network_enabled=True))
        other = await asyncio.create_subprocess_exec(sys.executable, "-c", OTHER_INSTALLER, LAN,
                                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert other.stdout is not None
            assert (await asyncio.wait_for(other.stdout.readline(), 60)).strip() == b"installed"
            seen = await probe(driver, sid, [(LAN_SERVER, 8080)])
            assert not seen[f"{LAN_SERVER}:8080"].startswith("open"), seen
        finally:
            await other.communicate(b"")
            await driver.destroy(sid)


async def test_an_operator_permits_a_private_range_by_name(driver: LocalDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUTCH_SANDBOX_EGRESS_PERMIT", LAN)
    network._firewall_ready = False
    with private_lan():
        sid = new_id()
        await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=PY, network_enabled=True))
        try:
            with own_rules():
                seen = await probe(driver, sid, [(LAN_SERVER, 8080)])
                assert seen[f"{LAN_SERVER}:8080"].startswith("open HTTP/1.0 200"), seen
        finally:
            await driver.destroy(sid)
            network._firewall_ready = False


async def test_no_ipv6_reaches_the_host_or_leaves_a_sandbox(driver: LocalDriver, host_service_v6: int) -> None:
    targets = [(a, host_service_v6) for a in host_ipv6()]
    assert any(a.startswith("fd00:") for a, _ in targets) and any(a.startswith("fe80:") for a, _ in targets), targets
    sids = {"network": new_id(), "allow-list": new_id(), "port only": new_id()}
    await driver.provision(ProvisionRequest(sandbox_id=sids["network"], runtime=PY, network_enabled=True))
    await driver.provision(ProvisionRequest(sandbox_id=sids["allow-list"], runtime=PY, network_enabled=True,
                                            network_allow=("192.0.2.0/24",)))
    await driver.provision(ProvisionRequest(sandbox_id=sids["port only"], runtime=PY, port=8000))
    try:
        for kind, sid in sids.items():
            scoped = [(f"{a}%eth0" if a.startswith("fe80:") else a, p) for a, p in targets]
            seen = await probe(driver, sid, scoped)
            assert not any(v.startswith("open") for v in seen.values()), (kind, seen)
        # The second wall: were IPv6 turned on at both ends of a sandbox's veth (the first wall
        # down), ip6tables still drops what comes from it.
        sb = driver._registry.running(sids["network"])
        veth = network.host_veth(sb.uid - UID_BASE, True)
        ns = f"--net=/proc/{sb.init_pid}/ns/net"
        sh("sysctl", "-q", "-w", f"net.ipv6.conf.{veth}.disable_ipv6=0")
        sh("nsenter", ns, "sysctl", "-q", "-w", "net.ipv6.conf.eth0.disable_ipv6=0")
        sh("nsenter", ns, "ip", "-6", "addr", "add", "fd77::2/64", "dev", "eth0", "nodad")
        sh("ip", "-6", "addr", "add", "fd77::1/64", "dev", veth, "nodad")
        for _ in range(3):  # the first try may meet neighbour discovery still under way
            seen = await probe(driver, sids["network"], [("fd77::1", host_service_v6)])
            assert not seen[f"fd77::1:{host_service_v6}"].startswith("open"), seen
        rules = (await asyncio.to_thread(subprocess.run, ["ip6tables", "-S"], capture_output=True, text=True)).stdout
        assert "-A INPUT -i hz+ -j DROP" in rules and "-A FORWARD -i hz+ -j DROP" in rules, rules
    finally:
        for sid in sids.values():
            await driver.destroy(sid)


def test_the_rootless_rules_deny_private_ranges_and_keep_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The slirp path's rules (loaded into the sandbox's own namespace; the rootless suite
    runs them): DNS to slirp's resolver first, then every private range rejected."""
    monkeypatch.delenv("HUTCH_SANDBOX_EGRESS_PERMIT", raising=False)
    lines = slirp.egress_rules().decode().splitlines()
    dns = lines.index(f"-A OUTPUT -d {slirp.DNS}/32 -p udp --dport 53 -j ACCEPT")
    for cidr in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16"):
        rejected = [i for i, line in enumerate(lines) if line.startswith(f"-A OUTPUT -d {cidr} -j REJECT")]
        assert rejected and rejected[0] > dns, (cidr, lines)
    monkeypatch.setenv("HUTCH_SANDBOX_EGRESS_PERMIT", "192.168.0.0/16")
    assert not any("192.168.0.0/16" in line for line in slirp.egress_rules().decode().splitlines())
