"""The agent's error envelope: a HutchError crosses as itself; anything else is named by its
kind only (its text can carry the host's paths), never a bare 500."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hutch.core.errors import FileNotFound
from hutch.drivers.node import wire
from hutch.node.app import make_app
from hutch.node.config import NodeSettings

SECRET = b"s" * 32


class _Driver:
    def set_listener(self, listener: Any) -> None:
        pass

    async def list_files(self, sandbox_id: str, path: str) -> list[Any]:
        if path == "missing":
            raise FileNotFound("no such file or directory: missing", field="path")
        raise OSError(2, "No such file or directory", "/var/lib/hutch/secret-host-path")


async def test_errors_cross_as_their_kind(aiohttp_client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = NodeSettings(name="t1", host="127.0.0.1", port=0, data_dir=tmp_path, runtime_cache=tmp_path, secret=SECRET)
    client = await aiohttp_client(make_app(settings, _Driver(), "0" * 64, own_driver=False))  # type: ignore[arg-type]
    for path, status, code, words in (("missing", 404, "FILE_NOT_FOUND", "no such file or directory: missing"),
                                      ("other", 502, "DRIVER_ERROR", "node agent t1 failed (FileNotFoundError); "
                                                                     "its log has the details")):
        url = f"/v1/sandboxes/sb-1/list?path={path}"
        resp = await client.get(url, headers=wire.sign(SECRET, "GET", url))
        body = await resp.json()
        assert (resp.status, body["code"], body["message"]) == (status, code, words)
        assert "secret-host-path" not in str(body)


class _NetworkDriver(_Driver):
    def __init__(self) -> None:
        self.updates: list[tuple[str, bool, tuple[str, ...], tuple[str, ...]]] = []

    async def update_network(self, sandbox_id: str, *, enabled: bool, allow: tuple[str, ...],
                             deny: tuple[str, ...]) -> None:
        self.updates.append((sandbox_id, enabled, allow, deny))


async def test_a_malformed_network_update_is_a_400_naming_it(aiohttp_client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = NodeSettings(name="t1", host="127.0.0.1", port=0, data_dir=tmp_path, runtime_cache=tmp_path, secret=SECRET)
    driver = _NetworkDriver()
    client = await aiohttp_client(make_app(settings, driver, "0" * 64, own_driver=False))  # type: ignore[arg-type]
    url = "/v1/sandboxes/sb-1/network"
    for body in ({"enabled": True}, {"enabled": "yes", "allow": [], "deny": []}, [], {"enabled": True, "allow": [],
                                                                                      "deny": [7]}):
        data = json.dumps(body).encode()
        resp = await client.put(url, data=data, headers={**wire.sign(SECRET, "PUT", url, body=wire.body_digest(data)),
                                                          "Content-Type": "application/json"})
        answer = await resp.json()
        assert (resp.status, answer["code"]) == (400, "INVALID_INPUT") and "network" in answer["message"], answer
    assert driver.updates == []
    data = json.dumps({"enabled": True, "allow": [], "deny": ["192.0.2.0/24"]}).encode()
    resp = await client.put(url, data=data, headers={**wire.sign(SECRET, "PUT", url, body=wire.body_digest(data)),
                                                      "Content-Type": "application/json"})
    assert resp.status == 200 and driver.updates == [("sb-1", True, (), ("192.0.2.0/24",))]
