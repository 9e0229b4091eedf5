"""Where the agents are: a directory answers node name -> "host:port". The static one reads
``HUTCH_NODE_AGENTS=name=host:port,…``; Nomad's service catalog is the other (catalog.py)."""

from __future__ import annotations

from typing import Protocol

from hutch.core.errors import InvalidInput


class AgentDirectory(Protocol):
    async def agents(self) -> dict[str, str]: ...


class StaticDirectory:
    def __init__(self, text: str, field: str = "HUTCH_NODE_AGENTS") -> None:
        self._agents = parse_agents(text, field)

    async def agents(self) -> dict[str, str]:
        return dict(self._agents)


def parse_agents(text: str, field: str = "HUTCH_NODE_AGENTS") -> dict[str, str]:
    agents: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, address = item.partition("=")
        host, colon, port = address.rpartition(":")
        if not sep or not name or not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidInput(f"{field}: expected name=host:port[,…], got {item!r}", field=field)
        if name in agents:
            raise InvalidInput(f"{field}: node {name!r} is listed twice", field=field)
        agents[name] = address
    if not agents:
        raise InvalidInput(f"{field}: no node agent listed (name=host:port[,…])", field=field)
    return agents
