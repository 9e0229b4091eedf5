"""A sandbox a lost replica had made and never recorded (it died between the agent's create and
the append: tests/system/test_node_orphan.py does it for real). The take-over of its owner row
ends it wherever it runs instead of forgetting it; the node driver asks every agent, and a
silent one ends it when it answers; an agent's destroy waits for a create of the same sandbox
still under way there, so a create the agent finishes after its replica died ends too."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from hutch.core.driver_types import Capabilities, ProvisionRequest, ResourceLimits
from hutch.core.replicas import Tenant
from hutch.core.serde import converter
from hutch.drivers.node import wire
from hutch.drivers.node.client import AgentClient
from hutch.drivers.node.directory import StaticDirectory
from hutch.drivers.node.driver import NodeDriver
from hutch.node import certificate
from hutch.node.app import make_app
from hutch.node.config import NodeSettings
from hutch.service.takeover import Takeover

SECRET = b"k" * 40


class _Adoption:
    def __init__(self, done: list[str]) -> None:
        self.discarded: list[tuple[str, dict[str, str]]] = []
        self.done = done

    async def adopt(self, sandbox: Any, handle: dict[str, str]) -> bool:
        raise AssertionError("a sandbox no event records is not adopted")

    async def discard_unrecorded(self, sandbox_id: str, handle: dict[str, str]) -> None:
        self.discarded.append((sandbox_id, handle))
        self.done.append("ended")


class _Recorder:
    def __init__(self, done: list[str]) -> None:
        self.reasons: list[tuple[str, str, Tenant | None]] = []
        self.done = done

    async def discard(self, sandbox_id: str, reason: str, tenant: Tenant | None = None) -> None:
        self.reasons.append((sandbox_id, reason, tenant))
        self.done.append("recorded")


async def test_a_taken_over_sandbox_no_event_records_is_ended() -> None:
    waited: list[int] = []

    async def last_position() -> int:
        return 41

    async def wait_for(position: int) -> None:
        waited.append(position)

    async def get_sandbox(sandbox_id: str) -> None:
        return None  # the dead replica's append never came

    done: list[str] = []
    adoption, recorder, n = _Adoption(done), _Recorder(done), cast(Any, None)
    takeover = Takeover(log=cast(Any, SimpleNamespace(last_position=last_position)),
                        store=cast(Any, SimpleNamespace(get_sandbox=get_sandbox)),
                        projector=cast(Any, SimpleNamespace(wait_for=wait_for)), reads=n,
                        recorder=cast(Any, recorder), control=n, reaper=n, lifecycle=n, adoption=cast(Any, adoption))
    kept = await takeover.adopt("sbx_orphan", None, "the replica running it (r1) was lost", Tenant("org_acme"))
    assert kept is False  # its owner row goes
    # Judged on the whole log: the dead replica's last append, had it landed, would be seen.
    assert waited == [41]
    assert adoption.discarded == [("sbx_orphan", {})]
    # Recorded ended before it is ended: an append of its create that lands late cannot make it live.
    assert done == ["recorded", "ended"]
    [(sid, reason, tenant)] = recorder.reasons
    assert sid == "sbx_orphan" and "(r1) was lost" in reason and "ended" in reason
    assert tenant == Tenant("org_acme")  # its end is filed under whose it is (its owner row's)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_node_driver_ends_it_on_every_node_and_on_a_silent_one_later() -> None:
    deleted: list[str] = []
    cert = certificate.make("up")

    async def destroy(request: web.Request) -> web.Response:
        deleted.append(request.match_info["id"])
        return web.json_response({"ok": True})

    async def hello(request: web.Request) -> web.Response:
        nonce = request.query["nonce"]
        return web.json_response({"name": "up", "instance": "i-1", "fingerprint": cert.fingerprint,
                                  "proof": wire.hello_proof(SECRET, nonce, "up", "i-1", cert.fingerprint)})

    app = web.Application()
    app.router.add_delete("/v1/sandboxes/{id}", destroy)
    app.router.add_get("/v1/hello", hello)
    up = TestServer(app, host="127.0.0.1")
    await up.start_server(ssl=cert.context)
    silent = f"127.0.0.1:{_closed_port()}"
    driver = NodeDriver(StaticDirectory(f"up=127.0.0.1:{up.port},silent={silent}"), SECRET)
    driver._agents = {"up": AgentClient("up", f"127.0.0.1:{up.port}", SECRET),
                      "silent": AgentClient("silent", silent, SECRET)}
    try:
        await driver.discard_unrecorded("sbx_orphan", {})
        assert deleted == ["sbx_orphan"]
        to_end: Any = driver._to_end
        assert to_end == {"silent": {"sbx_orphan"}}  # ended there when it answers (_end_there)
        assert driver.handle("sbx_orphan") is None
    finally:
        await driver.close()
        await up.close()


class _SlowDriver:
    """A local driver whose provision of one sandbox waits for the test."""

    capabilities = Capabilities()

    def __init__(self) -> None:
        self.live: set[str] = set()
        self.go = asyncio.Event()
        self.provisioning = asyncio.Event()

    def set_listener(self, listener: Any) -> None:
        pass

    async def alive(self) -> set[str]:
        return set(self.live)

    def is_alive(self, sandbox_id: str) -> bool:
        return sandbox_id in self.live

    def limits(self, sandbox_id: str) -> ResourceLimits:
        return ResourceLimits()

    def runtimes_available(self) -> set[str]:
        return {"base:latest"}

    def runtimes_building(self) -> set[str]:
        return set()

    async def provision(self, req: ProvisionRequest) -> None:
        self.provisioning.set()
        await self.go.wait()
        self.live.add(req.sandbox_id)

    async def destroy(self, sandbox_id: str) -> None:
        self.live.discard(sandbox_id)  # an id it does not run: nothing (idempotent)


async def test_an_agents_destroy_waits_for_a_create_under_way(aiohttp_client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = NodeSettings(name="t1", host="127.0.0.1", port=0, data_dir=tmp_path, runtime_cache=tmp_path,
                            secret=b"s" * 32)
    driver = _SlowDriver()
    client = await aiohttp_client(make_app(settings, driver, "0" * 64, own_driver=False))  # type: ignore[arg-type]

    async def call(method: str, url: str, body: object = None) -> int:
        data = b"" if body is None else wire.json.dumps(body).encode()
        headers = {**wire.sign(settings.secret, method, url, body=wire.body_digest(data)),
                   "Content-Type": "application/json"}
        resp = await client.request(method, url, data=data or None, headers=headers)
        assert resp.status == 200, await resp.text()
        return resp.status

    create = asyncio.ensure_future(
        call("PUT", "/v1/sandboxes/sbx_1", converter.unstructure(ProvisionRequest("sbx_1", "base:latest"))))
    await asyncio.wait_for(driver.provisioning.wait(), 10)
    destroy = asyncio.ensure_future(call("DELETE", "/v1/sandboxes/sbx_1"))
    await asyncio.sleep(0.2)
    assert not destroy.done(), "the destroy answered before the create it must end was made"
    driver.go.set()
    await asyncio.gather(create, destroy)
    assert driver.live == set()  # made, then ended: not made after the destroy and left


async def test_an_unrecorded_sandbox_is_ended_even_when_its_end_cannot_be_recorded() -> None:
    """The log away during the take-over: the sandbox is ended all the same (left running it
    would hold a node's room with nobody able to reach it), and the failure is raised."""
    done: list[str] = []

    async def failing_discard(sandbox_id: str, reason: str, tenant: Tenant | None = None) -> None:
        raise ConnectionError("the log is away")

    async def last_position() -> int:
        return 0

    async def wait_for(position: int) -> None:
        pass

    async def get_sandbox(sandbox_id: str) -> None:
        return None

    adoption, n = _Adoption(done), cast(Any, None)
    takeover = Takeover(log=cast(Any, SimpleNamespace(last_position=last_position)),
                        store=cast(Any, SimpleNamespace(get_sandbox=get_sandbox)),
                        projector=cast(Any, SimpleNamespace(wait_for=wait_for)), reads=n,
                        recorder=cast(Any, SimpleNamespace(discard=failing_discard)), control=n, reaper=n,
                        lifecycle=n, adoption=cast(Any, adoption))
    with pytest.raises(ConnectionError):
        await takeover.adopt("sbx_orphan", None, "the replica running it (r1) was lost")
    assert done == ["ended"]
