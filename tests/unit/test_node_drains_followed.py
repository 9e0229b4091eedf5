"""A drain Nomad was asked for (``nomad node drain -enable``) is told by the node driver to
its listener once per drain (the service moves the node's idle sandboxes on it): drains done
before the driver started are not told, those still under way are, and one seen before the
service listens is told when it does; a node drained anew (a new LastDrain.StartedAt) is told
again. The catalog's reading of Nomad's node list is
tests/unit/test_node_catalog.py's; the moves themselves tests/api/test_node_fleet.py's."""

from __future__ import annotations

import attrs

from hutch.drivers.node import placement
from hutch.drivers.node.catalog import NodeDrain
from hutch.drivers.node.client import AgentClient
from hutch.drivers.node.driver import NOT_OFFERED, NodeDriver

SECRET = b"k" * 40


class _Catalog:
    """What the driver reads of Nomad's catalog, changed as the test says."""

    drained_by = "Nomad"

    def __init__(self) -> None:
        self.drains: dict[str, NodeDrain] = {}

    async def agents(self) -> dict[str, str]:
        return {}

    async def drained(self) -> dict[str, NodeDrain]:
        return dict(self.drains)


def _driver(catalog: _Catalog) -> tuple[NodeDriver, list[tuple[str, str]]]:
    driver = NodeDriver(catalog, SECRET)
    # The agents the driver knows (no call is made to them here).
    driver._agents = {n: AgentClient(n, f"127.0.0.1:{4750 + i}", SECRET) for i, n in enumerate(("c1", "c2", "c3"))}
    told: list[tuple[str, str]] = []

    async def listener(node: str, by: str) -> None:
        told.append((node, by))

    driver.set_drain_listener(listener)
    return driver, told


async def test_each_drain_is_told_once_and_those_done_before_the_first_look_not_at_all() -> None:
    catalog = _Catalog()
    catalog.drains = {"c1": NodeDrain("2026-11-29T10:00:00Z", active=False),  # done before: not redone
                      "c2": NodeDrain("2026-11-29T12:00:00Z", active=True)}  # under way: its moves are due
    driver, told = _driver(catalog)
    await driver._follow_drains()
    assert told == [("c2", "Nomad")]
    await driver._follow_drains()
    # Completed since (with -ignore-system at once): the same drain, not told again.
    catalog.drains["c2"] = NodeDrain("2026-11-29T12:00:00Z", active=False)
    await driver._follow_drains()
    assert told == [("c2", "Nomad")]
    # c3 drained now, c1 drained anew: both told, once.
    catalog.drains["c3"] = NodeDrain("2026-11-29T12:05:00Z", active=True)
    catalog.drains["c1"] = NodeDrain("2026-11-29T12:05:01Z", active=True)
    await driver._follow_drains()
    await driver._follow_drains()
    assert sorted(told[1:]) == [("c1", "Nomad"), ("c3", "Nomad")], told
    # Undone (drain -disable, eligible again) and drained again: a new drain, told.
    del catalog.drains["c3"]
    await driver._follow_drains()
    catalog.drains["c3"] = NodeDrain("2026-11-29T12:09:00Z", active=True)
    await driver._follow_drains()
    assert told[3:] == [("c3", "Nomad")], told
    await driver.close()


async def test_a_drained_node_the_driver_has_no_agent_for_is_not_told() -> None:
    catalog = _Catalog()
    driver, told = _driver(catalog)
    await driver._follow_drains()
    catalog.drains = {"c9": NodeDrain("2026-11-29T12:00:00Z", active=True)}  # a client without an agent
    await driver._follow_drains()
    assert told == []
    await driver.close()


async def test_a_drain_before_the_listener_is_told_when_it_listens() -> None:
    """The service listens once its recovery ran; the driver started (and first looked) before."""
    catalog = _Catalog()
    catalog.drains = {"c1": NodeDrain("2026-11-29T10:00:00Z", active=False)}
    driver = NodeDriver(catalog, SECRET)
    driver._agents = {n: AgentClient(n, f"127.0.0.1:{4750 + i}", SECRET) for i, n in enumerate(("c1", "c2"))}
    await driver._follow_drains()  # at start
    catalog.drains["c2"] = NodeDrain("2026-11-29T12:38:36Z", active=False)  # complete within 0.4 s
    await driver._follow_drains()
    told: list[tuple[str, str]] = []

    async def listener(node: str, by: str) -> None:
        told.append((node, by))

    driver.set_drain_listener(listener)
    await driver._follow_drains()
    await driver._follow_drains()
    assert told == [("c2", "Nomad")]
    await driver.close()


async def test_a_node_nomad_drained_is_shown_up_and_draining_not_unreachable() -> None:
    """Its agent answered the last read and serves what it runs; hutch places nothing there."""
    driver, _ = _driver(_Catalog())
    read = placement.NodeState(name="c1", cpus=2, memory_total=8 << 30, memory_available=6 << 30, sandboxes=1,
                               runtimes=frozenset({"base:latest"}))
    driver._states = {"c1": attrs.evolve(read, unusable=NOT_OFFERED),
                      "c2": placement.NodeState(name="c2", unusable="did not answer (it refused the connection)")}
    c1, c2, _c3 = await driver.nodes()
    assert (c1.state, c1.draining, c1.reason, c1.sandboxes, c1.memory_available) == ("up", True, None, 1, 6 << 30)
    assert (c2.state, c2.reason) == ("unreachable", "did not answer (it refused the connection)")
    up = {m.labels["node"]: m.value for m in driver.metrics() if m.name == "hutch_node_up"}
    assert up == {"c1": 1.0, "c2": 0.0, "c3": 0.0}
    await driver.close()
