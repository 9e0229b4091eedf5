"""The second adversarial pass of issue 32 on the nomad driver: its sandboxes' network. From a
sandbox with network, one with an allow-list, one with only a port and one with none, on the
dev agent, and from a sandbox of the three-client cluster: TCP and UDP, IPv4 and IPv6, to the
orchestrator's ports on every address of the host and of the cluster's nodes, to neighbours
on the same node and on another. tests/adversarial/test_pass2_nomad.py is the rest of the
view from inside."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess

import pytest

from hutch.drivers.nomad.driver import NomadDriver
from tests.adversarial.nomad_pass2 import PY, driver, make, python, run

__all__ = ["driver"]  # the module's fixture

pytestmark = pytest.mark.asyncio(loop_scope="module")


# ------------------------------------------------------------------------ the network, both families

# Datagrams to each host:port given (IPv4 and IPv6; broadcast allowed): what sending gave.
UDP_PROBE = r'''
import errno, json, socket, sys
out = {}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    try:
        addr = socket.getaddrinfo(host, int(port), family, socket.SOCK_DGRAM)[0][4]
        for _ in range(3):
            s.sendto(b"hutch-udp " + target.encode(), addr)
        out[target] = "sent"
    except OSError as e:
        out[target] = errno.errorcode.get(e.errno, type(e).__name__)
    finally:
        s.close()
print(json.dumps(out))
'''

SERVICE_PORTS = (22, 80, 4646, 4647, 4648, 4656, 4657, 4658, 5000, 9092, 15432, 19092, 2024)


class UdpSink:
    """UDP sockets of the host on every address, both families, one port: what arrives."""

    def __init__(self) -> None:
        self.v4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.v4.bind(("0.0.0.0", 0))
        self.port = self.v4.getsockname()[1]
        self.v6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        self.v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        self.v6.bind(("::", self.port))
        for s in (self.v4, self.v6):
            s.setblocking(False)

    def received(self) -> list[str]:
        got = []
        for s in (self.v4, self.v6):
            while True:
                try:
                    data, source = s.recvfrom(2048)
                except BlockingIOError:
                    break
                got.append(f"{data.decode(errors='replace')} from {source[0]}")
        return got

    def close(self) -> None:
        self.v4.close()
        self.v6.close()


def host_addresses_v4() -> list[str]:
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines()]


def host_addresses_v6() -> list[str]:
    """As a sandbox would name them: link-local ones through its own eth0."""
    out = subprocess.run(["ip", "-6", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    addrs = [line.split()[3].split("/")[0] for line in out.splitlines()]
    return [f"{a}%eth0" if a.startswith("fe80:") else a for a in addrs if a != "::1"]


def resolvers() -> list[str]:
    from hutch.drivers.local import network as sandbox_network

    return [line.split()[1] for line in sandbox_network.resolv_conf().splitlines() if line.startswith("nameserver")]


async def test_no_kind_of_sandbox_reaches_the_orchestrator_the_host_or_its_neighbours(driver: NomadDriver) -> None:
    """From a sandbox with network, one with an allow-list, one with only a port and one with
    none: TCP to every service port of Nomad (HTTP, RPC, Serf; the dev agent's and the
    cluster's), the registry, Kafka, PostgreSQL, SSH and hutch's SSH gateway on every address
    of the host (IPv4 and IPv6, link-local too), on the cluster's client nodes, the bridge's
    gateway, cloud metadata and the name server's other ports; TCP to another sandbox's
    bridge address on its served port and another; UDP (broadcast and multicast too) to a
    host socket on every address. Any one answering would be a way to the orchestrator (Nomad
    with a token lying around, a registry to push to, the event log to write) or a tenant.
    The fake internet answers the sandbox with network (the probe works)."""
    from tests.isolation import connect_probe
    from tests.isolation.test_local_network import fake_internet_running

    served = await make(driver, port=8000)
    await run(driver, served, ["sh", "-c", "(python3 -m http.server 8000 & python3 -m http.server 9000 &) "
                                           ">/dev/null 2>&1"])
    neighbour = await python(driver, served, "import json, socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                                             "\ns.connect(('192.0.2.1', 9))\nprint(json.dumps(s.getsockname()[0]))")
    sink = UdpSink()
    opened: dict[str, list[str]] = {}
    udp: dict[str, dict[str, str]] = {}
    try:
        with fake_internet_running() as internet:
            kinds = {"network": {"network_enabled": True},
                     "allow-list": {"network_enabled": True, "network_allow": (f"{internet[0]}/32", "10.77.0.0/16",
                                                                               f"{neighbour}/32")},
                     "port only": {"port": 8001}, "no network": {}}
            sandboxes = {kind: await make(driver, **kw) for kind, kw in kinds.items()}
            v4 = [*host_addresses_v4(), "172.26.64.1", "10.77.0.11", "10.77.0.12", "10.77.0.13", "169.254.169.254"]
            tcp = [f"{h}:{p}" for h in [*v4, *host_addresses_v6()] for p in SERVICE_PORTS]
            tcp += [f"{r}:{p}" for r in resolvers() for p in (22, 80, 443, 4646)]
            tcp += [f"{neighbour}:8000", f"{neighbour}:9000"]
            inet = f"{internet[0]}:{internet[1]}"
            datagrams = [f"{h}:{sink.port}" for h in [*host_addresses_v4(), "172.26.64.1", "172.26.79.255",
                                                      "255.255.255.255", "224.0.0.1", *host_addresses_v6(),
                                                      "ff02::1%eth0"]]
            for kind, sid in sandboxes.items():
                code, out, err = await run(driver, sid, ["python3", "-c", connect_probe.SCRIPT, inet, *tcp], timeout=120)
                assert code == 0, err
                seen = json.loads(out)
                opened[kind] = sorted(t for t, v in seen.items() if v.startswith("open"))
                udp[kind] = await python(driver, sid, UDP_PROBE, *datagrams)
            await asyncio.sleep(0.5)
            arrived = sink.received()
    finally:
        sink.close()
        await driver.destroy(served)
        for sid in list(locals().get("sandboxes", {}).values()):
            await driver.destroy(sid)
    assert opened == {"network": [inet], "allow-list": [inet], "port only": [], "no network": []}, \
        json.dumps(opened, indent=1)
    assert not arrived, f"datagrams reached the host: {arrived}\n{json.dumps(udp, indent=1)}"
    assert any(v == "sent" for v in udp["network"].values()), udp  # the probe did send


def cluster_settings() -> tuple[str, str, str]:
    names = ("HUTCH_TEST_CLUSTER_ADDR", "HUTCH_TEST_CLUSTER_REGISTRY", "HUTCH_TEST_CLUSTER_TOKEN")
    values = [os.environ.get(n) for n in names]
    if not all(values):
        pytest.fail(f"{', '.join(names)} must be set: start the cluster with ./scripts/services start cluster",
                    pytrace=False)
    return values[0], values[1], values[2]  # type: ignore[return-value]


async def test_a_cluster_sandbox_reaches_no_node_and_no_other_nodes_sandbox(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """On the three-client cluster: a sandbox with network, on one client, tries the Nomad
    server's HTTP/RPC/Serf and the registry (10.77.0.1), every client's Nomad, this host's
    addresses, and a sandbox of another client through the port Nomad mapped for it on that
    client's address. Each is the cluster's own network (the plugin's denied_cidrs, the
    server's private ranges); the sandbox on the other node serves (the host reaches it)."""
    from hutch.blobs.files import FileBlobStore
    from tests.drivers_support import RUNTIME_CACHE
    from tests.isolation import connect_probe

    addr, registry, token = cluster_settings()
    data = tmp_path_factory.mktemp("nomad-pass2-cluster")
    d = NomadDriver(address=addr, data_dir=data, registry=registry, token=token, blobs=FileBlobStore(data),
                    runtime_cache=RUNTIME_CACHE)
    await d.start()
    made: list[str] = []
    try:
        if PY not in d.runtimes_available():
            await d.build_runtime(PY, lambda line: None)
        attacker = await make(d, network_enabled=True)
        made.append(attacker)
        node_of = {}
        node_of[attacker] = (await d._client.allocation(d.running(attacker).alloc_id))["NodeName"]
        victim = None
        for _ in range(3):  # spread placement: the next one lands on another client
            sid = await make(d, port=8000)
            made.append(sid)
            node_of[sid] = (await d._client.allocation(d.running(sid).alloc_id))["NodeName"]
            if node_of[sid] != node_of[attacker]:
                victim = sid
                break
        assert victim is not None, f"every sandbox landed on one client: {node_of}"
        await run(d, victim, ["sh", "-c", "python3 -m http.server 8000 >/dev/null 2>&1 &"])
        host, port = await d.port_target(victim)
        for _ in range(100):  # it serves: the host reaches it
            with contextlib.suppress(OSError):
                socket.create_connection((host, port), 1).close()
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"the victim never served on {host}:{port}")
        targets = [f"10.77.0.1:{p}" for p in (4656, 4657, 4658, 5000, 22)]
        targets += [f"10.77.0.{n}:{p}" for n in (11, 12, 13) for p in (4656, 4657, 4658)]
        targets += [f"{a}:{p}" for a in host_addresses_v4() if not a.startswith("127.") for p in (4646, 4656, 5000, 2024)]
        targets += [f"{host}:{port}"]
        code, out, err = await run(d, attacker, ["python3", "-c", connect_probe.SCRIPT, *targets], timeout=120)
        assert code == 0, err
        opened = sorted(t for t, v in json.loads(out).items() if v.startswith("open"))
    finally:
        for sid in made:
            await d.destroy(sid)
        await d.close()
    assert opened == [], f"from {node_of[attacker]}: {opened}"
