"""Two API replicas placing at once: the agent's own admission is the last word, and a
driver whose view was stale places elsewhere or answers NO_CAPACITY."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from hutch.core.errors import NoCapacity
from hutch.drivers.base import Driver, ProvisionRequest, ResourceLimits
from hutch.drivers.local.state import POOL_PREFIX
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


async def _end(agents: NodeAgents, first: Driver, *others: Driver) -> None:
    """What a test made, gone: the sandboxes (every driver of the agents lists them all: the
    first is asked), the drivers, the agents."""
    for sid in await first.alive():
        await first.destroy(sid)
    for driver in (first, *others):
        await driver.close()
    await asyncio.to_thread(agents.stop)


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
        await _end(agents, a, b)


async def test_an_agents_memory_commit_limit_bounds_what_it_takes(built_runtimes: Path,  # noqa: F811
                                                                   tmp_path: Path) -> None:
    """HUTCH_MEMORY_COMMIT_LIMIT on an agent, as on a server's local driver: the driver
    places by it and the agent refuses past it."""
    require_root()
    agents = NodeAgents(tmp_path, ("m1",), env={"HUTCH_MEMORY_COMMIT_LIMIT": "1Gi"})
    driver = await start_node(agents)
    try:
        await driver.provision(ProvisionRequest(new_id(), "base:latest"))  # 512Mi, the default
        with pytest.raises(NoCapacity, match="m1 has 512Mi memory free"):
            await driver.provision(ProvisionRequest(new_id(), "base:latest", resources=ResourceLimits(600 << 20)))
        await driver.provision(ProvisionRequest(new_id(), "base:latest"))
    finally:
        await _end(agents, driver)


class _Directory:
    """A directory whose nodes change, as Nomad's catalog does when nodes join or drain."""

    def __init__(self, placeable: dict[str, str], reachable: dict[str, str]) -> None:
        self.placeable, self.reach = placeable, reachable

    async def agents(self) -> dict[str, str]:
        return dict(self.placeable)

    async def reachable(self) -> dict[str, str]:
        return dict(self.reach)


async def test_a_node_that_joins_is_placed_on_and_a_drained_one_is_not(built_runtimes: Path,  # noqa: F811
                                                                         tmp_path: Path) -> None:
    require_root()
    from tests.drivers_support import NODE_SECRET

    agents = NodeAgents(tmp_path, ("j1", "j2"))
    directory = _Directory({"j1": agents.addresses["j1"]}, {"j1": agents.addresses["j1"]})
    driver = NodeDriver(directory, NODE_SECRET.encode())
    await driver.start()
    try:
        first = new_id()
        await driver.provision(ProvisionRequest(first, "base:latest"))
        assert driver.handle(first) == {"node": "j1"}
        # j2 joins and j1 drains (its agent still serves what it runs).
        directory.placeable = {"j2": agents.addresses["j2"]}
        directory.reach = {"j1": agents.addresses["j1"], "j2": agents.addresses["j2"]}
        for _ in range(50):
            if "j2" in driver._states and driver._states["j1"].unusable:
                break
            await asyncio.sleep(0.1)
        second = new_id()
        await driver.provision(ProvisionRequest(second, "base:latest"))
        assert driver.handle(second) == {"node": "j2"}
        assert await driver.alive() == {first, second}  # the drained node is still asked
        directory.placeable = {}
        await asyncio.sleep(1.5)
        with pytest.raises(NoCapacity, match="j1 is not offered for placement"):
            await driver.provision(ProvisionRequest(new_id(), "base:latest"))
    finally:
        await _end(agents, driver)


def _spares(agents: NodeAgents, name: str) -> list[str]:
    """The agent's warm pool: its idle sandboxes' directories (drivers/local/pool.py)."""
    return sorted(p.name for p in (agents.root / name / "sandboxes").glob(f"{POOL_PREFIX}*"))


async def _settled(agents: NodeAgents, name: str, want: int) -> list[str]:
    """The spares once ``want`` of them started (within 10 s) and no more followed for 1.5 s
    (a refill waits at most 1 s for quiet before each start: pool.REFILL_DEFER_MAX)."""
    for _ in range(200):
        if len(_spares(agents, name)) >= want:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.5)
    return _spares(agents, name)


async def test_an_agent_at_its_bound_grows_no_spares_and_a_claim_is_counted_once(
        built_runtimes: Path, tmp_path: Path) -> None:  # noqa: F811
    """HUTCH_NODE_MAX_SANDBOXES=2 and a pool of 2: a sandbox and one spare fill the node. The
    driver still places the second create there (spares are claimable: not in the node's
    reported count), which claims the spare, is admitted once, and no refill follows."""
    require_root()
    agents = NodeAgents(tmp_path, ("p1",), env={"HUTCH_NODE_MAX_SANDBOXES": "2", "HUTCH_WARM_POOL": "2"})
    driver = await start_node(agents)
    assert isinstance(driver, NodeDriver)
    try:
        await driver.provision(ProvisionRequest(new_id(), "base:latest"))
        spares = await _settled(agents, "p1", 1)
        assert len(spares) == 1, f"one sandbox and {len(spares)} spares on a node that takes 2"
        agent = driver._agents["p1"]
        node = await agent.json("GET", agent.path("node"))
        assert (node["sandboxes"], node["max_sandboxes"]) == (1, 2), node  # the spare is room to place in
        second = new_id()
        await driver.provision(ProvisionRequest(second, "base:latest"))
        assert spares[0] not in _spares(agents, "p1"), "the second create was made from scratch"
        assert await _settled(agents, "p1", 0) == [], "a node at its bound refilled its pool"
        assert (await agent.json("GET", agent.path("node")))["sandboxes"] == 2
        with pytest.raises(NoCapacity, match="p1 runs its maximum of 2 sandboxes"):
            await driver.provision(ProvisionRequest(new_id(), "base:latest"))
        await driver.destroy(second)
        await driver.provision(ProvisionRequest(new_id(), "base:latest"))  # its room is free again
    finally:
        await _end(agents, driver)
