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
