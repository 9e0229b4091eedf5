"""Sandbox networking on the nomad driver, from the attacker's side (as for the local driver
in tests/isolation/test_local_network.py, whose fake internet and probe this reuses): a
sandbox with network.enabled sits on Nomad's bridge and reaches the internet through NAT,
but not the client host's own services, not another sandbox, not link-local/metadata
addresses; a sandbox without it has loopback only."""

from __future__ import annotations

import subprocess

from hutch.drivers.base import ExecRequest, ProvisionRequest
from hutch.drivers.nomad.driver import NomadDriver
from tests.drivers_support import Recorder, new_id
from tests.isolation.test_local_network import (  # noqa: F401  (fixtures)
    INET_HOST,
    INET_SERVER,
    INET_SERVER2,
    fake_internet,
    host_addresses,
    host_server,
    hosts_entry,
    network_state,
    probe,
)


async def bridge_ip(driver: NomadDriver, sid: str) -> str:
    """The sandbox's own address on the bridge: the source address of a route out."""
    sink = Recorder()
    code = "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(('203.0.113.2', 9)); " \
           "print(s.getsockname()[0])"
    result = await driver.exec(ExecRequest(new_id("ex"), sid, ["python3", "-c", code]), sink)
    assert result.exit_code == 0, sink.stderr
    return sink.stdout.strip()


async def test_network_reaches_the_internet_but_not_the_host_or_other_sandboxes(
    driver: NomadDriver, fake_internet: tuple[str, int], host_server: int  # noqa: F811
) -> None:
    other = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=other, runtime="python:3.13", network_enabled=True))
    await driver.exec(ExecRequest(new_id("ex"), other, ["sh", "-c", "python3 -m http.server 8000 >/dev/null 2>&1 &"]),
                      Recorder())
    other_ip = await bridge_ip(driver, other)
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="python:3.13", network_enabled=True))
    forbidden = [(a, host_server) for a in host_addresses()] + [
        (INET_HOST, host_server), ("172.26.64.1", host_server), ("169.254.169.254", 80), (other_ip, 8000),
        ("127.0.0.1", host_server)]
    seen = await probe(driver, sid, [fake_internet, *forbidden])  # type: ignore[arg-type]
    inet = f"{fake_internet[0]}:{fake_internet[1]}"
    assert seen[inet].startswith("open HTTP/1."), f"{seen}\n{network_state()}"
    for host, port in forbidden:
        assert not seen[f"{host}:{port}"].startswith("open"), (host, port, seen)
    # That address is right and its server is up (the host reaches it): only the sandbox cannot.
    import asyncio
    import urllib.request

    body = await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://{other_ip}:8000/", timeout=5).read())
    assert b"Directory listing" in body
    sink = Recorder()
    await driver.exec(ExecRequest(new_id("ex"), sid, ["cat", "/etc/resolv.conf"]), sink)
    assert "nameserver" in sink.stdout
    # Without network: loopback only.
    plain = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=plain, runtime="python:3.13"))
    seen = await probe(driver, plain, [fake_internet, (INET_HOST, host_server), (other_ip, 8000)])  # type: ignore[arg-type]
    assert not any(v.startswith("open") for v in seen.values()), seen


def test_the_sandbox_firewall_is_installed() -> None:
    rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=True).stdout
    assert "-A INPUT -i nomad -j HUTCH-NOMAD-IN" in rules and "-A HUTCH-NOMAD-IN -j DROP" in rules


async def fwd_rules() -> str:
    import asyncio

    done = await asyncio.to_thread(subprocess.run, ["iptables", "-S", "HUTCH-NOMAD-FWD"], capture_output=True, text=True)
    return done.stdout


async def test_a_port_alone_serves_but_reaches_nothing(driver: NomadDriver, fake_internet: tuple[str, int],  # noqa: F811
                                                       host_server: int) -> None:  # noqa: F811
    import asyncio
    import urllib.request

    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="python:3.13", port=8000))
    await driver.exec(ExecRequest(new_id("ex"), sid, ["sh", "-c", "python3 -m http.server 8000 >/dev/null 2>&1 &"]),
                      Recorder())
    host, port = await driver.port_target(sid)
    body = b""
    for _ in range(50):
        try:
            body = await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://{host}:{port}/", timeout=5).read())
            break
        except OSError:
            await asyncio.sleep(0.1)
    assert b"Directory listing" in body
    seen = await probe(driver, sid, [fake_internet, (INET_HOST, host_server), ("169.254.169.254", 80)])  # type: ignore[arg-type]
    assert not any(v.startswith("open") for v in seen.values()), seen
    assert "hutch:" in await fwd_rules()
    await driver.destroy(sid)
    for _ in range(100):  # the per-sandbox rule goes with its task
        if "hutch:" not in await fwd_rules():
            break
        await asyncio.sleep(0.2)
    else:
        raise AssertionError("the port-only sandbox's outbound rule outlived it")


async def test_an_allow_list_limits_the_network_and_follows_its_names(
    driver: NomadDriver, fake_internet: tuple[str, int], host_server: int  # noqa: F811
) -> None:
    import asyncio
    import uuid

    port = fake_internet[1]
    name = f"allowed-{uuid.uuid4().hex[:8]}.hutch.test"
    with hosts_entry(name, INET_SERVER) as point:
        sid = new_id()
        await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="python:3.13", network_enabled=True,
                                                network_allow=(name, f"{INET_HOST}/32", "169.254.169.254/32")))
        targets = [(INET_SERVER, port), (INET_SERVER2, port), (INET_HOST, host_server), ("169.254.169.254", 80)]
        seen = await probe(driver, sid, targets)  # type: ignore[arg-type]
        assert seen[f"{INET_SERVER}:{port}"].startswith("open HTTP/1."), f"{seen}\n{network_state()}"
        assert seen[f"{INET_SERVER2}:{port}"] == "ConnectionRefusedError", seen  # refused at connect
        assert not seen[f"{INET_HOST}:{host_server}"].startswith("open"), seen  # a list narrows, never widens
        assert not seen["169.254.169.254:80"].startswith("open"), seen
        point(INET_SERVER2)  # the name moves: the next refresh follows it, through the plugin's allow verb
        await driver._allow.refresh()
        seen = await probe(driver, sid, targets[:2])  # type: ignore[arg-type]
        assert seen[f"{INET_SERVER2}:{port}"].startswith("open HTTP/1."), seen
        assert seen[f"{INET_SERVER}:{port}"] == "ConnectionRefusedError", seen
        chain = next(line.split()[-1] for line in (await fwd_rules()).splitlines() if "-j HNA-" in line)
        await driver.destroy(sid)
    for _ in range(100):  # the plugin removes the chain when Nomad destroys the task
        done = await asyncio.to_thread(subprocess.run, ["iptables", "-S", chain], capture_output=True, text=True)
        if done.returncode != 0:
            break
        await asyncio.sleep(0.2)
    assert done.returncode != 0, done.stdout
