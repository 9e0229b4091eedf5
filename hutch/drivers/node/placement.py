"""Where a new sandbox goes (pure): spread over the nodes that can take it, the one with the
least committed first; none fits -> NoCapacity naming every node's state. Whether one node
has room is core/capacity.py's check, which the local driver asks of its own host too."""

from __future__ import annotations

import random
from collections.abc import Mapping

import attrs

from hutch.core import capacity
from hutch.core.capacity import DEFAULT_CPU, DEFAULT_MEMORY, MAX_SANDBOXES, Held, need
from hutch.core.driver_types import NodeInfo, ResourceLimits
from hutch.core.errors import NoCapacity

__all__ = ["DEFAULT_CPU", "DEFAULT_MEMORY", "MAX_SANDBOXES", "Held", "NodeState", "choose", "need", "refusal"]


@attrs.frozen
class NodeState:
    """A node as the driver last saw it (``GET /v1/node``), or why it cannot be used."""

    name: str
    cpus: int = 0
    memory_total: int = 0
    memory_available: int = 0
    memory_committed: int = 0
    cpu_committed_millis: int = 0
    sandboxes: int = 0
    runtimes: frozenset[str] = frozenset()
    max_sandboxes: int = MAX_SANDBOXES
    memory_limit: int | None = None  # its agent's HUTCH_MEMORY_COMMIT_LIMIT; None: 32x memory_total
    draining: bool = False  # its operator drained it: it takes no new sandbox
    unusable: str | None = None  # "did not answer: …"

    def info(self, state: str, reason: str | None) -> NodeInfo:
        """As the operator sees it: NodeInfo's figures are this one's, named alike."""
        return NodeInfo(state=state, reason=reason, **{name: getattr(self, name) for name in _SHARED})


# The figures NodeInfo shares with NodeState (all of its fields but the operator's verdict).
_SHARED = tuple(f.name for f in attrs.fields(NodeInfo) if f.name not in ("state", "reason"))


def refusal(node: NodeState, resources: ResourceLimits, reserved: Held = (0, 0, 0)) -> str | None:
    """Why ``node`` cannot take a sandbox of ``resources``, or None: the driver's placement
    and the agent's own admission ask the same."""
    memory, cpu = need(resources)
    return _fits(node, memory, cpu, reserved)


def _fits(node: NodeState, memory: int, cpu: int, reserved: Held) -> str | None:
    """Why ``node`` cannot take it, or None."""
    if node.unusable:
        return f"{node.name} {node.unusable}"
    if node.draining:
        return f"{node.name} is draining"
    return capacity.shortfall(_room(node), memory, cpu, reserved)


def _room(node: NodeState) -> capacity.Room:
    return capacity.Room(name=node.name, memory_total=node.memory_total, memory_available=node.memory_available,
                         memory_committed=node.memory_committed, sandboxes=node.sandboxes,
                         max_sandboxes=node.max_sandboxes, memory_limit=node.memory_limit, cpus=node.cpus,
                         cpu_committed_millis=node.cpu_committed_millis)


def choose(nodes: list[NodeState], resources: ResourceLimits, runtime: str,
           reserved: Mapping[str, Held] | None = None, rng: random.Random | None = None) -> str:
    """The node to place on: among those with room, the ones with the runtime built first (the
    others would build it), then the least committed fraction after this sandbox; ties random."""
    memory, cpu = need(resources)
    reserved = reserved or {}
    reasons: list[str] = []
    fitting: list[NodeState] = []
    for node in nodes:
        why = _fits(node, memory, cpu, reserved.get(node.name, (0, 0, 0)))
        if why:
            reasons.append(why)
        else:
            fitting.append(node)
    if not fitting:
        # Larger than every node could hold even empty: a 400, as no wait helps. A node whose
        # figures are unknown (it did not answer) might hold it: then a 503 as before.
        if nodes and all(n.memory_total > 0 for n in nodes):
            most = max(capacity.largest(_room(n)) for n in nodes)
            if memory > most:
                raise capacity.too_large(memory, most, "on any node")
        where = "; ".join(reasons) if reasons else "no node agent is known"
        raise NoCapacity(f"no node can take a sandbox of {capacity.human(memory)} memory and {cpu}m cpu: {where}",
                         field="resources")

    def load(node: NodeState) -> tuple[float, float]:
        """The fuller of memory and cpu after this sandbox, then both: a cpu fraction that
        ties (every sandbox asks the default core) leaves memory to decide."""
        r = reserved.get(node.name, (0, 0, 0))
        mem = (node.memory_committed + r[0] + memory) / max(node.memory_total, 1)
        cpus = (node.cpu_committed_millis + r[1] + cpu) / max(node.cpus * 1000, 1)
        return round(max(mem, cpus), 6), round(mem + cpus, 6)

    rng = rng or random.Random()
    best = min((runtime not in n.runtimes, load(n), rng.random(), n.name) for n in fitting)
    return best[3]
