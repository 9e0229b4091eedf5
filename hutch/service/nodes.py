"""The machines sandboxes are placed on (the node driver's nodes), for their operator: list
them, drain one (no new sandbox goes there) or put it back in service."""

from __future__ import annotations

from hutch.core.driver_types import NodeInfo
from hutch.drivers.roles import NodeFleet


class Nodes:
    def __init__(self, fleet: NodeFleet) -> None:
        self._fleet = fleet

    async def list(self) -> list[NodeInfo]:
        return await self._fleet.nodes()

    async def drain(self, node: str, *, draining: bool) -> NodeInfo:
        return await self._fleet.drain(node, draining)
