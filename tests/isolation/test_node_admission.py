"""Two API replicas placing at once: the agent's own admission is the last word, and a
driver whose view was stale places elsewhere or answers NO_CAPACITY."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from hutch.core.errors import NoCapacity
from hutch.drivers.base import Driver, ProvisionRequest
from hutch.drivers.node.driver import NodeDriver
from tests.drivers_support import (
    NodeAgents,
    built_runtimes,  # noqa: F401  (fixture)
    new_id,
    require_root,
    start_node,
)

pytestmark = pytest.mark.isolation


async def _stale(driver: Driver) -> None:
    """Its view of the nodes stops where it is, as a replica's can lag a second behind."""
    assert isinstance(driver, NodeDriver) and driver._refresher is not None
    driver._refresher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await driver._refresher


async def test_a_full_node_refuses_what_a_stale_placement_sends_it(built_runtimes: Path,  # noqa: F811
                                                                    tmp_path: Path) -> None:
    require_root()
    agents = NodeAgents(tmp_path, ("m1", "m2"), env={"HUTCH_NODE_MAX_SANDBOXES": "1"})
    a, b = await start_node(agents), await start_node(agents)
    try:
        await _stale(b)
        first = new_id()
        await a.provision(ProvisionRequest(first, "base:latest"))
        # b still sees two empty nodes: whichever it picks, it lands on the other one.
        second = new_id()
        await b.provision(ProvisionRequest(second, "base:latest"))
        assert {a.handle(first)["node"], b.handle(second)["node"]} == {"m1", "m2"}  # type: ignore[index]
        # Now both are full: b knows of its own, not of a's, which refuses; it says both.
        a_node, b_node = a.handle(first)["node"], b.handle(second)["node"]  # type: ignore[index]
        with pytest.raises(NoCapacity) as caught:
            await b.provision(ProvisionRequest(new_id(), "base:latest"))
        message = caught.value.message
        assert f"{a_node} refused it: {a_node} runs its maximum of 1 sandboxes" in message, message
        assert f"; {b_node} runs its maximum of 1 sandboxes" in message or \
            message.split(": ", 1)[1].startswith(f"{b_node} runs its maximum of 1 sandboxes"), message
        assert len(await a.alive()) == 2
    finally:
        for sid in await a.alive():
            await a.destroy(sid)
        await a.close()
        await b.close()
        await asyncio.to_thread(agents.stop)
