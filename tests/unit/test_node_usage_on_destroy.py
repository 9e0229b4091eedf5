"""A sandbox's end on the node driver is one agent call: the agent measures what the sandbox
used as it ends it and answers that with the DELETE, where the engine used to read the usage
in a call of its own first (a one-shot made four calls: create, exec, usage, delete). The
usage still travels in the end's event; reading it stays best effort, the destroy does not.
An agent of an older tree (its capacity does not say ``destroy_measures``) would ignore the
query: the driver reads its sandboxes' usage in a call of its own, as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from hutch.core.driver_types import ProvisionRequest, Usage
from hutch.core.serde import converter
from hutch.drivers.node import placement, wire
from hutch.drivers.node.client import AgentClient
from hutch.drivers.node.directory import StaticDirectory
from hutch.drivers.node.driver import NodeDriver
from hutch.node import certificate
from hutch.node.app import make_app
from hutch.node.config import NodeSettings
from tests.unit.test_node_agent_provision import _Driver

SECRET = b"k" * 40
GiB = 1 << 30


class _Measured(_Driver):
    def __init__(self, fails: bool = False) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.fails = fails

    async def usage(self, sandbox_id: str, *, disk: bool = False) -> Usage:
        self.calls.append("usage")
        if self.fails:
            raise RuntimeError("cgroup gone")
        return Usage(cpu_seconds=1.25, memory_peak_bytes=4096)

    async def destroy(self, sandbox_id: str) -> None:
        self.calls.append("destroy")
        await super().destroy(sandbox_id)


async def _agent(aiohttp_client: Any, tmp_path: Path, driver: _Driver) -> Any:
    settings = NodeSettings(name="t1", host="127.0.0.1", port=0, data_dir=tmp_path, runtime_cache=tmp_path, secret=SECRET)
    return await aiohttp_client(make_app(settings, driver, "0" * 64, own_driver=False))


async def _delete(client: Any, url: str) -> Any:
    resp = await client.delete(url, headers=wire.sign(SECRET, "DELETE", url))
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def test_the_agent_answers_a_measured_delete_with_the_usage_read_before_the_end(
        aiohttp_client: Any, tmp_path: Path) -> None:
    driver = _Measured()
    driver.live.add("sbx_a")
    client = await _agent(aiohttp_client, tmp_path, driver)
    answer = await _delete(client, "/v1/sandboxes/sbx_a?usage=1")
    assert driver.calls == ["usage", "destroy"] and "sbx_a" not in driver.live
    assert converter.structure(answer["usage"], Usage) == Usage(cpu_seconds=1.25, memory_peak_bytes=4096)
    assert await _delete(client, "/v1/sandboxes/sbx_b") == {"ok": True}  # unmeasured: as before
    capacity = await client.get("/v1/node", headers=wire.sign(SECRET, "GET", "/v1/node"))
    assert (await capacity.json())["destroy_measures"] is True  # how the driver knows it may ask


async def test_a_usage_the_agent_cannot_read_still_ends_the_sandbox(aiohttp_client: Any, tmp_path: Path) -> None:
    driver = _Measured(fails=True)
    driver.live.add("sbx_a")
    client = await _agent(aiohttp_client, tmp_path, driver)
    answer = await _delete(client, "/v1/sandboxes/sbx_a?usage=1")
    assert driver.calls == ["usage", "destroy"] and "sbx_a" not in driver.live
    assert answer["usage"] is None


async def test_the_driver_ends_a_sandbox_and_learns_its_usage_in_one_call() -> None:
    seen: list[str] = []
    cert = certificate.make("n1")

    async def hello(request: web.Request) -> web.Response:
        nonce = request.query["nonce"]
        return web.json_response({"name": "n1", "instance": "i-1", "fingerprint": cert.fingerprint,
                                  "proof": wire.hello_proof(SECRET, nonce, "n1", "i-1", cert.fingerprint)})

    async def any_call(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.path_qs}")
        if request.method == "DELETE":
            used = converter.unstructure(Usage(cpu_seconds=0.5, memory_peak_bytes=10))
            return web.json_response({"ok": True, "usage": used})
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/v1/hello", hello)
    app.router.add_route("*", "/v1/sandboxes/{tail:.*}", any_call)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server(ssl=cert.context)
    driver = NodeDriver(StaticDirectory(f"n1=127.0.0.1:{server.port}"), SECRET)
    driver._agents = {"n1": AgentClient("n1", f"127.0.0.1:{server.port}", SECRET)}
    driver._states = {"n1": placement.NodeState(name="n1", cpus=4, memory_total=16 * GiB, memory_available=16 * GiB,
                                                runtimes=frozenset({"base:latest"}))}

    async def measure() -> Usage:
        seen.append("measured apart")
        return Usage()

    try:
        driver._measures = {"n1"}  # its capacity said destroy_measures (read every second)
        await driver.provision(ProvisionRequest("sbx_1", "base:latest"))
        used = await driver.destroy_measured("sbx_1", measure)
        assert used == Usage(cpu_seconds=0.5, memory_peak_bytes=10)
        assert seen == ["PUT /v1/sandboxes/sbx_1", "DELETE /v1/sandboxes/sbx_1?usage=1"]
        assert driver.handle("sbx_1") is None  # forgotten, as a destroy forgets it
        seen.clear()
        # Never placed here (or gone already): nothing to call; measured as any driver does.
        assert await driver.destroy_measured("sbx_gone", measure) == Usage()
        assert seen == ["measured apart"]
        seen.clear()
        driver._measures = set()  # an agent of an older tree: usage apart, then the plain delete
        await driver.provision(ProvisionRequest("sbx_2", "base:latest"))
        assert await driver.destroy_measured("sbx_2", measure) == Usage()
        assert seen == ["PUT /v1/sandboxes/sbx_2", "measured apart", "DELETE /v1/sandboxes/sbx_2"]
    finally:
        await driver.close()
        await server.close()
