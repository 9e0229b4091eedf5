"""The node agent as an attacker meets it: on the network without the secret, with an old
request, from inside a sandbox, or as an impostor at an agent's address."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from hutch.core.errors import DriverFailure
from hutch.drivers.base import Driver, ExecRequest, ProvisionRequest
from hutch.drivers.local import network
from hutch.drivers.node import wire
from tests.drivers_support import (
    NODE_SECRET,
    NodeAgents,
    Recorder,
    built_runtimes,  # noqa: F401  (fixture)
    new_id,
    require_root,
    start_node,
)
from tests.isolation import connect_probe
from tests.isolation.test_local_network import host_addresses

pytestmark = pytest.mark.isolation


@pytest.fixture(scope="module")
def agent(built_runtimes: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[NodeAgents]:  # noqa: F811
    """One agent on every address of the host, as it listens on a cluster's node."""
    require_root()
    agents = NodeAgents(tmp_path_factory.mktemp("node-attack"), ("a1",), listen="0.0.0.0")
    agents.addresses["a1"] = agents.addresses["a1"].replace("0.0.0.0", "127.0.0.1")
    yield agents  # type: ignore[misc]
    agents.stop()


@pytest.fixture
async def driver(agent: NodeAgents) -> AsyncIterator[Driver]:
    d = await start_node(agent)
    yield d
    for sid in await d.alive():
        await d.destroy(sid)
    await d.close()


async def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
    # ssl=False: the attacker trusts any certificate; the agent's own checks are under test
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers or {}, ssl=False) as resp:
        return resp.status, await resp.json()


async def test_unsigned_wrong_secret_and_replayed_requests_are_refused(agent: NodeAgents, driver: Driver) -> None:
    base = f"https://{agent.addresses['a1']}"
    sid = new_id()
    await driver.provision(ProvisionRequest(sid, "base:latest"))
    path = f"/v1/sandboxes/{sid}/list?path=."
    status, body = await _get(base + path)
    assert (status, body["code"]) == (401, "UNAUTHORIZED") and "unsigned" in str(body["message"])
    status, body = await _get(base + path, wire.sign(b"w" * 32, "GET", path))
    assert (status, body["code"]) == (401, "UNAUTHORIZED") and "bad signature" in str(body["message"])
    headers = wire.sign(NODE_SECRET.encode(), "GET", path)
    status, body = await _get(base + path, headers)
    assert status == 200 and "entries" in body  # the one it signed
    status, body = await _get(base + path, headers)
    assert status == 401 and "replayed" in str(body["message"])
    old = wire.sign(NODE_SECRET.encode(), "GET", path, now=1_000_000)
    status, body = await _get(base + path, old)
    assert status == 401 and "stale" in str(body["message"])
    # What anyone may ask says nothing about the node.
    assert await _get(base + "/healthz") == (200, {"ok": True})
    # An unsigned exec runs nothing.
    async with aiohttp.ClientSession() as s, s.post(f"{base}/v1/sandboxes/{sid}/exec", ssl=False,
                                                    json={"execution_id": "ex-x", "argv": ["touch", "pwned"]}) as resp:
        assert resp.status == 401
    assert {e.name for e in await driver.list_files(sid, ".")}.isdisjoint({"pwned"})
    # A signed request whose body was swapped on the way, or passed off as a stream, runs nothing.
    exec_path = f"/v1/sandboxes/{sid}/exec"
    signed = json.dumps({"execution_id": "ex-y", "argv": ["true"]}).encode()
    evil = json.dumps({"execution_id": "ex-y", "argv": ["touch", "pwned"]}).encode()
    for marker, body, refusal in ((wire.body_digest(signed), evil, "not the one that was signed"),
                                  (wire.STREAM, evil, "takes no streamed body")):
        headers = {**wire.sign(NODE_SECRET.encode(), "POST", exec_path, body=marker), "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as s, s.post(base + exec_path, data=body, headers=headers, ssl=False) as resp:
            answer = await resp.json()
            assert (resp.status, answer["code"]) == (401, "UNAUTHORIZED") and refusal in answer["message"], answer
    assert {e.name for e in await driver.list_files(sid, ".")}.isdisjoint({"pwned"})


async def test_a_networked_sandbox_cannot_reach_its_agent(agent: NodeAgents, driver: Driver) -> None:
    port = int(agent.addresses["a1"].rsplit(":", 1)[1])
    targets = [f"{a}:{port}" for a in host_addresses()] + [f"{network.GATEWAY}:{port}", f"127.0.0.1:{port}"]
    # The agent does answer there, from the host: the probe below can fail.
    for target in targets[:-2]:
        assert await _get(f"https://{target}/healthz") == (200, {"ok": True}), target
    sid = new_id()
    await driver.provision(ProvisionRequest(sid, "python:3.13", network_enabled=True))
    gateway = Recorder()
    await driver.exec(ExecRequest(new_id("ex"), sid, ["sh", "-c", "ip route | awk '/default/ {print $3}'"]), gateway)
    if gateway.stdout.strip():
        targets.append(f"{gateway.stdout.strip()}:{port}")
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, ["python3", "-c", connect_probe.SCRIPT, *targets],
                                           timeout=60), sink)
    assert result.exit_code == 0, sink.stderr
    seen = json.loads(sink.stdout)
    assert not any(v.startswith("open") for v in seen.values()), seen


async def test_an_impostor_without_the_secret_is_not_used(aiohttp_server) -> None:  # type: ignore[no-untyped-def]
    """A process squatting on an agent's address, answering whatever it is asked, over TLS of
    its own."""
    from aiohttp import web

    from hutch.node import certificate

    own = certificate.make("a1")

    async def hello(request: web.Request) -> web.Response:
        return web.json_response({"name": "a1", "instance": "i-1", "fingerprint": own.fingerprint, "proof": "0" * 64})

    app = web.Application()
    app.router.add_get("/v1/hello", hello)
    server = await aiohttp_server(app, ssl=own.context)
    squatter = NodeAgents.__new__(NodeAgents)
    squatter.addresses = {"a1": f"127.0.0.1:{server.port}"}
    with pytest.raises(DriverFailure, match="could not prove it holds the cluster's node secret"):
        await start_node(squatter)


async def test_an_execution_whose_api_side_goes_away_is_ended(driver: Driver) -> None:
    """An API replica that dies (or drops the request) leaves nothing running unwatched, even
    a command that prints nothing."""
    sid = new_id()
    await driver.provision(ProvisionRequest(sid, "base:latest"))
    count = ["sh", "-c", "for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done | grep -c '^sleep$' || true"]
    task = asyncio.create_task(driver.exec(ExecRequest(new_id("ex"), sid, ["sleep", "300"]), Recorder()))
    await asyncio.sleep(1)
    sink = Recorder()
    await driver.exec(ExecRequest(new_id("ex"), sid, count), sink)
    assert sink.stdout.strip() == "1"  # it runs: the check below can fail
    task.cancel()  # the request goes away with it
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(50):
        sink = Recorder()
        await driver.exec(ExecRequest(new_id("ex"), sid, count), sink)
        if sink.stdout.strip() == "0":
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the execution outlived its request")


async def test_plain_http_to_the_agent_runs_nothing(agent: NodeAgents, driver: Driver) -> None:
    """The agent speaks TLS only: plain HTTP, even signed, gets no answer at all."""
    sid = new_id()
    await driver.provision(ProvisionRequest(sid, "base:latest"))
    path = f"/v1/sandboxes/{sid}/exec"
    body = json.dumps({"execution_id": new_id("ex"), "argv": ["touch", "pwned"]}).encode()
    headers = {**wire.sign(NODE_SECRET.encode(), "POST", path, body=wire.body_digest(body)),
               "Content-Type": "application/json"}
    with pytest.raises(aiohttp.ClientError):
        async with aiohttp.ClientSession() as s, s.post(f"http://{agent.addresses['a1']}{path}", data=body,
                                                        headers=headers) as resp:
            raise AssertionError(f"plain HTTP was answered: {resp.status}")
    assert {e.name for e in await driver.list_files(sid, ".")}.isdisjoint({"pwned"})


async def test_a_man_in_the_middle_with_valid_signatures_runs_nothing(agent: NodeAgents, driver: Driver,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Something on the path ends TLS with its own certificate and relays every byte to the
    real agent: a driver that starts through it is refused at hello; one pinned to the agent
    and then diverted through it sends no request, so nothing runs and nothing is overheard."""
    from hutch.drivers.node.driver import NodeDriver
    from tests.node_mitm import Mitm

    mitm = Mitm(agent.addresses["a1"])
    through = await mitm.start()
    try:
        diverted = NodeAgents.__new__(NodeAgents)
        diverted.addresses = {"a1": through}
        with pytest.raises(DriverFailure, match="something between the API and the agent ends TLS"):
            await start_node(diverted)
        sid = new_id()
        await driver.provision(ProvisionRequest(sid, "base:latest"))
        assert isinstance(driver, NodeDriver)
        client = driver._agents["a1"]

        async def unfollowed() -> None:  # the directory would put the agent's own address back
            return None

        monkeypatch.setattr(driver, "_follow_directory", unfollowed)
        client.address = through  # the route to the agent now runs through it
        try:
            with pytest.raises(DriverFailure, match="node a1 did not answer: it could not prove its certificate"):
                await driver.exec(ExecRequest(new_id("ex"), sid, ["touch", "pwned"]), Recorder())
            async def data() -> AsyncIterator[bytes]:  # a streamed body: the signature does not cover it
                yield b"the tenant's data"

            with pytest.raises(DriverFailure, match="could not prove its certificate"):
                await driver.write_file(sid, "secret.txt", data())
        finally:
            client.address = agent.addresses["a1"]
        assert {e.name for e in await driver.list_files(sid, ".")}.isdisjoint({"pwned", "secret.txt"})
        assert b"GET /v1/hello?" in mitm.heard  # it did relay
        assert b"/v1/sandboxes" not in mitm.heard and b"tenant's data" not in mitm.heard
    finally:
        await mitm.close()
