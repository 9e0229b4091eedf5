"""The local driver these tests drive, started on the machine's real namespaces, cgroups and
runtimes for each test (a module of node-agent tests names its own ``driver``), and a python:3.13
sandbox on it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from hutch.drivers.local.driver import LocalDriver
from tests.drivers_support import local_driver_fixture, provision


@pytest.fixture
async def driver(request: pytest.FixtureRequest) -> AsyncIterator[LocalDriver]:
    async for d in local_driver_fixture(request):
        assert isinstance(d, LocalDriver)
        yield d


@pytest.fixture
async def sandbox(driver: LocalDriver) -> AsyncIterator[str]:
    sid = await provision(driver, "python:3.13")
    yield sid
    await driver.destroy(sid)
