from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from hutch.api.app import create_app
from hutch.api.keys import ENGINE
from hutch.service.config import Config
from tests.drivers_support import NODE_SECRET, built_runtimes, node_agents  # noqa: F401  (fixtures)
from tests.services import drop_database, drop_topics, fresh_database, kafka_url

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


class Api:
    """A thin helper over the test client: JSON in, envelope checked, data out."""

    def __init__(self, client: TestClient) -> None:
        self.client = client

    async def call(self, method: str, path: str, *, expect: int = 200, **kw: Any) -> dict[str, Any]:
        headers = {**AUTH, **kw.pop("headers", {})}
        resp = await self.client.request(method, path, headers=headers, **kw)
        body = await resp.json()
        assert resp.status == expect, (resp.status, body)
        assert resp.content_type == "application/json"
        assert body["success"] is (resp.status < 400), body
        return body

    async def data(self, method: str, path: str, **kw: Any) -> Any:
        return (await self.call(method, path, **kw))["data"]

    async def stream(self, url: str) -> bytes:
        # Stream URLs are absolute and need no credentials.
        path = url.split("://", 1)[1].split("/", 1)[1]
        resp = await self.client.get("/" + path)
        assert resp.status == 200
        return await resp.read()

    async def wait_execution(self, execution_id: str) -> dict[str, Any]:
        return await self.data("GET", f"/sandbox/execution/{execution_id}?wait=10s")


AppFactory = Callable[..., Awaitable[Api]]

# Where an API test runs (``@pytest.mark.runs_on(*WIRE)`` etc., tests/conftest.py); unmarked, on all
# six pairs. The drivers' behaviour is proven by tests/contracts/test_driver.py on every backend and
# the profiles' by tests/contracts and tests/system: an API test on a real driver or the production
# profile earns its run by exercising what they bring through the API.
WIRE = ("fake-embedded",)  # the wire, validation, routing, tenancy rules: no driver or store involved
STORE = ("fake-embedded", "fake-production")  # the service over the log and the store, both profiles
# What a driver does, seen through the API (files, processes, terminals, ports, disk, installs):
# each real driver once and each profile once. The local driver keeps nothing in the store; the
# nomad driver keeps checkpoints in the blob store, which the production profile puts in PostgreSQL.
REAL = ("local-embedded", "nomad-production")
# The node driver (two agents on this host, shared per module): what its wire carries that the
# contract suite does not (terminals, ports, stdin streams, archives through the API).
NODE = ("node-embedded",)


# The test servers made on each production profile's database (by its URL): ``profile`` checks
# they stopped before it drops the database and topic.
_SERVING: dict[str, list[TestClient]] = {}


@pytest.fixture(params=["fake", "local", "nomad"])
def driver_name(request: pytest.FixtureRequest) -> str:
    """An API test runs on every driver unless it says where (``runs_on``): the same wire,
    whatever makes it real."""
    return str(request.param)


@pytest.fixture(params=["embedded", "production"])
async def profile(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, str]]:
    """Both profiles unless a test says where it runs (``runs_on``): the embedded log and
    in-memory projections, and Kafka + PostgreSQL (a fresh topic and database per test; the
    services must be running)."""
    if request.param == "embedded":
        yield {}
        return
    url, database = await fresh_database("api")
    log = kafka_url("api")
    yield {"event_log": log, "store": url}
    # A server still running would stop against a dropped topic: a command it cuts short
    # records its end there, and the append retries for 2 x append_timeout (120 s) per test.
    running = [c for c in _SERVING.pop(url, []) if not c.server.closed]
    assert not running, f"{len(running)} server(s) on {database} still running as it is dropped"
    await drop_database(database)
    await drop_topics(log)


@pytest.fixture
async def make_api(aiohttp_client, data_dir: Path, driver_name: str, profile: dict[str, str],  # type: ignore[no-untyped-def]
                   request: pytest.FixtureRequest) -> AsyncIterator[AppFactory]:
    apps: list[web.Application] = []
    clients: list[TestClient] = []
    if driver_name == "node":
        agents = request.getfixturevalue("node_agents")
        profile = {**profile, "node_agents": agents.spec, "node_secret": NODE_SECRET}

    async def factory(**overrides: Any) -> Api:
        # Warm pools are off in the API tests (their idle allocations would crowd the one dev
        # agent the whole suite shares); tests/nomad/test_pools.py covers them.
        # The dev agent's ACLs are on: its token as `services start nomad` printed it.
        overrides = {"nomad_pool": "off", "nomad_token": os.environ.get("HUTCH_NOMAD_TOKEN"), **profile, **overrides}
        config = Config(data_dir=data_dir, api_key=KEY, driver=overrides.pop("driver", driver_name), **overrides)
        app: web.Application = create_app(config)
        client = Api(await aiohttp_client(app))
        apps.append(app)
        clients.append(client.client)
        _SERVING.setdefault(profile.get("store", ""), []).append(client.client)
        return client

    yield factory
    # A stopping server leaves its sandboxes running (a restart adopts them); a test must not.
    for app in apps:
        engine = app[ENGINE]
        for sandbox_id in await engine.parts.driver.alive():
            await engine.parts.driver.destroy(sandbox_id)
    # Stopped here, before ``profile`` drops their database and topic (aiohttp_client would
    # stop them after it): a stopping server records the commands it cuts short.
    for client in clients:
        await client.close()


@pytest.fixture
async def api(make_api: AppFactory) -> Api:
    return await make_api()
