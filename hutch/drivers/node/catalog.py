"""Where the node agents are: Nomad's service catalog, followed with blocking queries.

The hutch-node system job registers one Nomad-native service ``hutch-node`` per client
(infra/terraform/modules/hutch-on-nomad/jobs/node.nomad.hcl.tftpl). The directory follows
``GET /v1/service/<name>`` and ``GET /v1/nodes`` with Nomad's blocking queries (``index``,
``wait``), so a node that joins is known as soon as its agent's allocation registers, and a
node that goes down, is marked ineligible or drained drops out of placement as soon as the
servers know: nothing restarts and nothing polls faster than Nomad changes.

A registration is not proof that an agent answers (the node driver's hello and watch are);
it is where to knock. Several registrations of one node (an allocation still stopping next to
its replacement) count once: the newest.

Nomad's own drains (``nomad node drain -enable``) are told apart from the node list alone
(``drains``), not from the join: a drain stops the node's system allocations too (the agent's,
unless ``-ignore-system``), and their registrations go as soon as Nomad stops them (0.05 s
after the drain, measured on the one-box cluster), leaving the node out of the join.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import attrs

from hutch.core.errors import DriverFailure, InvalidInput
from hutch.drivers.nomad.client import NomadClient, NomadNotFound

log = logging.getLogger(__name__)

SERVICE = "hutch-node"
NAMESPACE = "hutch-system"
WAIT = "30s"  # how long Nomad holds a blocking query open when nothing changes
FIRST_ANSWER_TIMEOUT = 15.0  # seconds agents() waits for the first view of the catalog
RETRY_FIRST, RETRY_MAX = 0.5, 10.0  # back-off after a failed query, doubling


@attrs.frozen
class AgentNode:
    """One client node's agent as the catalog and the node list tell of it."""

    name: str  # the Nomad node's name (the agent's --name)
    node_id: str
    address: str  # host:port, from the service registration
    status: str  # the node's: ready, down, disconnected, initializing
    eligible: bool
    draining: bool

    @property
    def placeable(self) -> bool:
        """New sandboxes may go here."""
        return self.status == "ready" and self.eligible and not self.draining

    @property
    def reachable(self) -> bool:
        """Its agent is worth calling about sandboxes it already runs (a drained or ineligible
        node's agent still serves them; a down one cannot)."""
        return self.status == "ready"


@attrs.frozen
class NodeDrain:
    """A drain an operator asked Nomad for, as the node list tells of it."""

    started: str  # its identity: LastDrain.StartedAt, one per `nomad node drain -enable`
    active: bool  # Nomad still drains the node (a node running only system jobs is done at once)


def drains(nodes: Iterable[Mapping[str, Any]]) -> dict[str, NodeDrain]:
    """Node name -> its latest drain, for the nodes Nomad drains or has drained (a cancelled
    drain, ``-disable`` before it completed, is none). A Nomad that keeps no ``LastDrain``
    (before 1.2) tells only that a node drains now."""
    found: dict[str, NodeDrain] = {}
    for node in nodes:
        name = str(node.get("Name") or node.get("ID") or "")
        last = node.get("LastDrain") or {}
        started = str(last.get("StartedAt") or "")
        if name and node.get("Drain"):
            found[name] = NodeDrain(started or "draining", active=True)
        elif name and started and last.get("Status") == "complete":
            found[name] = NodeDrain(started, active=False)
    return found


def host_port(address: str, port: int) -> str:
    try:
        if ipaddress.ip_address(address).version == 6:
            return f"[{address}]:{port}"
    except ValueError:
        pass  # a host name
    return f"{address}:{port}"


def join(registrations: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]]) -> dict[str, AgentNode]:
    """Node name -> its agent, from a ``/v1/service/<name>`` answer and a ``/v1/nodes`` answer.

    One entry per NodeID (the registration with the highest CreateIndex); a registration whose
    node the list does not (yet) name is left out, as is one without an address or port."""
    newest: dict[str, Mapping[str, Any]] = {}
    for reg in registrations:
        node_id = reg.get("NodeID")
        if not node_id or not reg.get("Address") or not reg.get("Port"):
            continue
        seen = newest.get(node_id)
        if seen is None or int(reg.get("CreateIndex") or 0) > int(seen.get("CreateIndex") or 0):
            newest[node_id] = reg
    by_id = {n["ID"]: n for n in nodes if n.get("ID")}
    found: dict[str, AgentNode] = {}
    for node_id, reg in newest.items():
        node = by_id.get(node_id)
        if node is None:
            continue
        name = str(node.get("Name") or node_id)
        found[name] = AgentNode(
            name=name, node_id=node_id, address=host_port(str(reg["Address"]), int(reg["Port"])),
            status=str(node.get("Status") or "unknown"),
            eligible=node.get("SchedulingEligibility") == "eligible",
            draining=bool(node.get("Drain")))
    return found


class NomadAgentDirectory:
    """The agents of a Nomad cluster, kept current by two blocking queries.

    ``agents()`` is what placement may use (node ready, eligible, not draining);
    ``reachable()`` adds drained and ineligible nodes, whose agents still serve the sandboxes
    they run; ``nodes()`` tells everything known, flags included. The token needs ``read-job``
    in the agents' namespace (service registrations) and ``node { policy = "read" }``:
    infra/terraform/README.md's hutch-driver policy.
    """

    def __init__(self, addr: str, token: str | None, service: str = SERVICE, namespace: str = NAMESPACE,
                 *, wait: str = WAIT) -> None:
        if not service:
            raise InvalidInput("HUTCH_NODE_SERVICE: the node agents' Nomad service name is empty",
                               field="HUTCH_NODE_SERVICE")
        if not namespace:
            raise InvalidInput("HUTCH_NODE_NAMESPACE: the node agents' Nomad namespace is empty",
                               field="HUTCH_NODE_NAMESPACE")
        self.service, self.namespace = service, namespace
        self._client = NomadClient(addr, token=token, namespace=namespace)
        self._wait = wait
        self._registrations: list[Mapping[str, Any]] | None = None
        self._nodes: list[Mapping[str, Any]] | None = None
        self._view: dict[str, AgentNode] = {}
        self._ready = asyncio.Event()
        self._changed = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []
        self.error: str | None = None  # the last query's failure, None once one succeeds again

    async def start(self) -> None:
        """Starts following the catalog (the first agents() does, if no one did); close() stops."""
        if self._tasks:
            return
        await self._client.start()
        self._tasks = [asyncio.create_task(self._follow_services(), name=f"nomad catalog {self.service}"),
                       asyncio.create_task(self._follow_nodes(), name="nomad nodes")]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self._client.close()

    async def __aenter__(self) -> NomadAgentDirectory:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def nodes(self, timeout: float = FIRST_ANSWER_TIMEOUT) -> dict[str, AgentNode]:
        await self._first_view(timeout)
        return dict(self._view)

    async def agents(self) -> dict[str, str]:
        """Nomad node name -> "host:port" of every agent new sandboxes may be placed on."""
        return {name: a.address for name, a in (await self.nodes()).items() if a.placeable}

    async def reachable(self) -> dict[str, str]:
        """Nomad node name -> "host:port" of every agent on a node that is up."""
        return {name: a.address for name, a in (await self.nodes()).items() if a.reachable}

    drained_by = "Nomad"  # who drains the nodes ``drained`` tells of, said in each move's reason

    async def drained(self) -> dict[str, NodeDrain]:
        """Node name -> its latest drain in Nomad, if it drains or was drained (``drains``)."""
        await self._first_view(FIRST_ANSWER_TIMEOUT)
        return drains(self._nodes or ())

    async def changed(self, timeout: float | None = None) -> bool:
        """Waits until the view changes; False if ``timeout`` passed first."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except TimeoutError:
                return False
        return True

    async def _first_view(self, timeout: float) -> None:
        if self._ready.is_set():
            return
        if not self._tasks:  # a caller that knows only agents() (drivers/node/directory.py)
            await self.start()
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            raise DriverFailure(
                f"no answer from Nomad at {self._client.address} about service {self.service!r} in "
                f"namespace {self.namespace!r} within {timeout:.0f} s: {self.error or 'still waiting'}") from None

    async def _follow_services(self) -> None:
        async for answer in self._follow(f"/v1/service/{self.service}"):
            self._registrations = answer
            await self._update()

    async def _follow_nodes(self) -> None:
        async for answer in self._follow("/v1/nodes"):
            self._nodes = answer
            await self._update()

    async def _follow(self, path: str) -> AsyncIterator[list[Any]]:
        index, pause = 0, RETRY_FIRST
        while True:
            try:
                body, new_index = await self._client.blocking_get(path, index, self._wait)
            except NomadNotFound:  # no registration yet reads as an empty list, but be safe
                body, new_index = [], index
            except DriverFailure as err:
                self.error = f"GET {path}: {err}"
                log.warning("node agents' directory: %s; again in %.1f s", self.error, pause)
                await asyncio.sleep(pause)
                pause = min(RETRY_MAX, pause * 2)
                continue
            self.error, pause = None, RETRY_FIRST
            # An index that goes back means a new server state (a restarted dev server, a
            # snapshot restore): start over rather than wait for a number it may never reach.
            index = new_index if new_index > index else (0 if new_index < index else index)
            yield list(body or [])

    async def _update(self) -> None:
        if self._registrations is None or self._nodes is None:
            return
        view = join(self._registrations, self._nodes)
        first = not self._ready.is_set()
        self._ready.set()
        if view == self._view and not first:
            return
        if view != self._view:
            log.info("node agents: %s", ", ".join(
                f"{a.name}={a.address}{'' if a.placeable else f' ({a.status}, eligible={a.eligible}, draining={a.draining})'}"
                for a in sorted(view.values(), key=lambda a: a.name)) or "none")
        self._view = view
        async with self._changed:
            self._changed.notify_all()
