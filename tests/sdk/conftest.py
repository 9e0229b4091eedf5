from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from hutch import SandboxClient
from tests.sdk.fakewire import KEY, FakeWire


@pytest.fixture
def wire() -> FakeWire:
    return FakeWire()


@pytest.fixture
async def client(wire: FakeWire, aiohttp_server, monkeypatch) -> AsyncIterator[SandboxClient]:  # type: ignore[no-untyped-def]
    for var in ("HUTCH_URL", "HUTCH_API_KEY", "HUTCH_DATA_DIR"):
        monkeypatch.delenv(var, raising=False)
    server = await aiohttp_server(wire.app)
    async with SandboxClient(str(server.make_url("")), api_key=KEY) as c:
        yield c
    for ex in [*wire.executions.values(), *wire.jobs.values()]:
        if ex.task is not None:
            ex.task.cancel()
