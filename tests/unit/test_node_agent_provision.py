"""The agent's provision: a retried create of a sandbox it runs is answered without making a
second one, and one provision asks for the node's whole list of sandboxes once (its admission),
not once more to see whether that one sandbox exists: a node of thousands of sandboxes reads a
/proc entry per sandbox for each list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hutch.core.driver_types import Capabilities, ProvisionRequest, ResourceLimits
from hutch.core.serde import converter
from hutch.drivers.node import wire
from hutch.node.app import make_app
from hutch.node.config import NodeSettings

SECRET = b"s" * 32


class _Driver:
    capabilities = Capabilities()

    def __init__(self) -> None:
        self.live: set[str] = {"sbx_other"}
        self.lists = 0
        self.made: list[str] = []

    def set_listener(self, listener: Any) -> None:
        pass

    async def alive(self) -> set[str]:
        self.lists += 1
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
        self.made.append(req.sandbox_id)
        self.live.add(req.sandbox_id)

    async def destroy(self, sandbox_id: str) -> None:
        self.live.discard(sandbox_id)


async def test_provision_lists_once_and_a_retry_makes_nothing(aiohttp_client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = NodeSettings(name="t1", host="127.0.0.1", port=0, data_dir=tmp_path, runtime_cache=tmp_path, secret=SECRET)
    driver = _Driver()
    client = await aiohttp_client(make_app(settings, driver, "0" * 64, own_driver=False))  # type: ignore[arg-type]
    body = converter.unstructure(ProvisionRequest("sbx_new", "base:latest"))
    data = wire.json.dumps(body).encode()

    async def put() -> int:
        url = "/v1/sandboxes/sbx_new"
        headers = {**wire.sign(SECRET, "PUT", url, body=wire.body_digest(data)), "Content-Type": "application/json"}
        resp = await client.put(url, data=data, headers=headers)
        assert resp.status == 200, await resp.text()
        return resp.status

    await put()
    assert (driver.made, driver.lists) == (["sbx_new"], 1)
    await put()  # its answer lost, the create is sent again: nothing more is made or listed
    assert (driver.made, driver.lists) == (["sbx_new"], 1)


async def test_capacity_counts_without_reading_every_sandbox(aiohttp_client, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Creates, capacity reads and ends are counted as they happen: the node's sandboxes are
    read whole at the first read and then only every RECOUNT seconds, which also heals a miss."""
    from hutch.node import sandboxes

    settings = NodeSettings(name="t1", host="127.0.0.1", port=0, data_dir=tmp_path, runtime_cache=tmp_path, secret=SECRET)
    driver = _Driver()
    listener: list[Any] = []
    driver.set_listener = listener.append  # type: ignore[method-assign]
    client = await aiohttp_client(make_app(settings, driver, "0" * 64, own_driver=False))  # type: ignore[arg-type]

    async def call(method: str, url: str, body: object = None) -> Any:
        data = b"" if body is None else wire.json.dumps(body).encode()
        headers = {**wire.sign(SECRET, method, url, body=wire.body_digest(data)), "Content-Type": "application/json"}
        resp = await client.request(method, url, data=data or None, headers=headers)
        assert resp.status == 200, await resp.text()
        return await resp.json()

    assert (await call("GET", "/v1/node"))["sandboxes"] == 1  # sbx_other, made before this agent started
    for sid in ("sbx_a", "sbx_b"):
        await call("PUT", f"/v1/sandboxes/{sid}", converter.unstructure(ProvisionRequest(sid, "base:latest")))
    assert (await call("GET", "/v1/node"))["sandboxes"] == 3
    driver.live.discard("sbx_a")
    await call("DELETE", "/v1/sandboxes/sbx_a")
    driver.live.discard("sbx_b")
    await listener[0]("sbx_b", "its init ended", True)  # ended on the node, no destroy
    assert (await call("GET", "/v1/node"))["sandboxes"] == 1
    assert driver.lists == 1
    driver.live.add("sbx_stray")  # never told: the next whole read, RECOUNT later, finds it
    monkeypatch.setattr(sandboxes.Census, "RECOUNT", 0.0)
    assert (await call("GET", "/v1/node"))["sandboxes"] == 2
    assert driver.lists == 2


async def test_an_idle_node_is_read_whole_once_a_minute(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The whole read is a /proc read per sandbox on the agent's loop: with 1,000 idle sandboxes
    an agent spent 2.0 -> 7.0 ms a second of CPU on it at a 10 s recount (bench/idle_cluster.py),
    in one stall each time. Capacity reads every second in between are answered from the count."""
    from hutch.node import census

    now = [1000.0]
    monkeypatch.setattr(census.time, "monotonic", lambda: now[0])
    driver = _Driver()
    counted = census.Census()
    await counted.current(driver)  # type: ignore[arg-type]
    for _ in range(59):
        now[0] += 1.0
        await counted.current(driver)  # type: ignore[arg-type]
    assert driver.lists == 1
    now[0] += 1.0
    await counted.current(driver)  # type: ignore[arg-type]
    assert driver.lists == 2
