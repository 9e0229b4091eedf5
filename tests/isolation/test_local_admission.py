"""The local driver's admission (drivers/local/admission.py) as the driver wires it: a create
waiting for its runtime's build keeps the room it holds, however long the build runs.

The real driver and its build bookkeeping (drivers/builds.py); the build itself is a wait the
test ends (a real one takes minutes). Needs root and the base runtime; nothing here skips.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from hutch.core.errors import NoCapacity
from hutch.drivers.base import ProvisionRequest
from hutch.drivers.local import admission
from hutch.drivers.local.admission import HostLimits
from hutch.drivers.local.driver import LocalDriver
from tests.drivers_support import built_runtimes, new_id  # noqa: F401  (fixture)

pytestmark = pytest.mark.isolation

RT = "base:latest"


async def test_a_create_waiting_for_its_runtimes_build_keeps_its_room(
        tmp_path: Path, built_runtimes: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    driver = LocalDriver(tmp_path, built_runtimes, host_limits=HostLimits(max_sandboxes=1))
    await driver.start()
    gate = threading.Event()

    def building(log: object) -> None:
        gate.wait(30)

    build = asyncio.create_task(driver._builds.run(RT, lambda line: None, building))
    made: list[str] = []
    try:
        monkeypatch.setattr(admission, "RESERVATION", -1.0)  # a hold lapses at once, unless it waits on a step
        waits = ProvisionRequest(new_id(), RT)
        await driver.reserve(waits)
        await asyncio.sleep(0.05)
        with pytest.raises(NoCapacity, match="maximum of 1 sandboxes"):
            await driver.reserve(ProvisionRequest(new_id(), RT))  # lapsed, it left this one its room
        gate.set()
        await build
        monkeypatch.setattr(admission, "RESERVATION", 30.0)
        await driver.provision(waits)  # its hold, or room all the same: the other was refused
        made.append(waits.sandbox_id)
        with pytest.raises(NoCapacity, match="maximum of 1 sandboxes"):
            await driver.reserve(ProvisionRequest(new_id(), RT))
    finally:
        gate.set()
        await build
        for sid in made:
            await driver.destroy(sid)
        await driver.close()
