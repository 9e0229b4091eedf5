"""The node driver: sandboxes placed on ``hutch node`` agents and driven there.

Each call goes to the agent that runs the sandbox (``_where``: filled by provision; after a
restart from the event log, which records each sandbox's node (``recall``, ``adopt``); no agent
is asked where a sandbox is). Placement (placement.py) uses
the nodes' capacity, refreshed every second, minus this driver's own reservations, and is
decided in ``reserve``, before the engine records the sandbox: a cluster with no room answers
503 and records nothing. The agents prove themselves at start (hello) and their certificates
and instances are pinned (client.py). What is only forwarded to the sandbox's agent (commands,
files, terminals, ports, ...) is in calls.py; what is not done yet is in docs/node.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping

import attrs

from hutch.core.driver_types import Capabilities, Metric, NodeInfo, ProvisionRequest, Usage
from hutch.core.errors import (
    DriverFailure,
    HutchError,
    NodeFull,
    NotFound,
    SandboxNotFound,
    from_wire,
)
from hutch.core.models import SandboxState
from hutch.core.serde import converter
from hutch.drivers import roles
from hutch.drivers.base import Driver
from hutch.drivers.node import placement, wire
from hutch.drivers.node.calls import AgentCalls
from hutch.drivers.node.client import AgentClient, AgentUnreachable
from hutch.drivers.node.directory import AgentDirectory
from hutch.drivers.node.ports import PortTunnels

log = logging.getLogger(__name__)

REFRESH = 1.0  # seconds between capacity reads of every agent
RESERVATION = 30.0  # seconds a placement holds room for its provision
MOVED_TREE = "."  # what a move carries: the workspace (HOME), as snapshots do
READ_TIMEOUT = 5.0  # seconds for each read of the refresh (hello, capacity, ends, runtimes)
# An agent silent this long is lost: its sandboxes are failed (within LOST_AFTER + REFRESH
# + 1 s, under the 15 s the issue allows).
LOST_AFTER = 8.0
# Why a node whose agent answers takes no new sandbox: the directory does not offer it.
NOT_OFFERED = "is not offered for placement (drained, ineligible or down)"


# AgentCalls first: its methods are what the roles below leave abstract.
class NodeDriver(AgentCalls, roles.SandboxFiles, roles.DirectoryWatching, roles.FileMetadata, roles.TreeTransfer,
                 roles.Checkpointing, roles.Pausing, roles.Terminals, roles.PortForwarding, roles.NetworkRules,
                 roles.UsageReporting, roles.Adoption, roles.NodeFleet, Driver):
    name = "node"

    def __init__(self, directory: AgentDirectory, secret: bytes, *, lost_after: float = LOST_AFTER) -> None:
        self._directory = directory
        self._secret = wire.check_secret(secret, "HUTCH_NODE_SECRET")
        self._lost_after = lost_after
        self._seen: dict[str, float] = {}  # node -> when its agent last answered (monotonic)
        self._lost: set[str] = set()  # nodes lost (their sandboxes failed) and not back yet
        # node -> sandboxes to end there when it answers: those failed while it was lost, and
        # creates whose answer never came (the agent may have made the sandbox, then died).
        self._to_end: dict[str, set[str]] = {}
        self._agents: dict[str, AgentClient] = {}
        self._states: dict[str, placement.NodeState] = {}
        self._where: dict[str, str] = {}  # sandbox -> node
        self._held: dict[str, tuple[int, int]] = {}  # sandbox placed here -> its (memory, cpu) counted
        self._running: dict[str, str] = {}  # execution -> node, while it runs
        self._reserved: dict[str, tuple[str, int, int, float]] = {}  # sandbox -> (node, memory, cpu, until)
        self._refresher: asyncio.Task[None] | None = None
        self._tunnels = PortTunnels(self._tunnel)
        self._caps: dict[str, dict[str, bool]] = {}  # node -> its capability flags
        # Nodes whose agent answers a DELETE ?usage=1 with the usage (an older one ignores it).
        self._measures: set[str] = set()
        self._placeable: set[str] = set()  # nodes the directory offers for new sandboxes
        self._built: dict[str, dict[str, dict[str, object]]] = {}  # node -> runtime -> size, build time
        self._building: Counter[str] = Counter()  # runtimes this driver is having built
        self._drains: dict[str, str] | None = None  # node -> the orchestrator's drain last seen
        self._untold: dict[str, str] = {}  # node -> a drain seen, not told to the listener yet
        # Until the agents answer: nothing promised.
        self.capabilities = Capabilities()

    # -- agents ----------------------------------------------------------------

    async def start(self) -> None:
        if (start := getattr(self._directory, "start", None)) is not None:
            await start()  # Nomad's catalog follows its blocking queries from here
        agents = await self._directory_view()
        self._agents = {name: AgentClient(name, address, self._secret) for name, address in agents.items()}
        results = await asyncio.gather(*(a.hello() for a in self._agents.values()), return_exceptions=True)
        failed = {name: r for name, r in zip(self._agents, results, strict=True) if isinstance(r, BaseException)}
        for name, err in failed.items():
            log.warning("node agent %s: %s", name, err)
        if len(failed) == len(self._agents):
            # Said to the operator (the server does not start): where each agent was called
            # (before close(), which forgets the agents).
            said = "; ".join(f"{n} at {self._agents[n].address}: {e}" for n, e in failed.items())
            await self.close()
            raise DriverFailure(f"no node agent answered with this cluster's secret: {said}")
        now = time.monotonic()
        self._seen = {name: now for name in self._agents}  # a node down at start is lost after lost_after too
        await self._refresh()
        self._refresher = asyncio.create_task(self._refresh_forever())

    async def close(self) -> None:
        if (close := getattr(self._directory, "close", None)) is not None:
            await close()
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        await self._tunnels.close()
        for agent in self._agents.values():
            await agent.close()
        self._agents = {}  # a closed driver calls no agent (alive() is empty, not an error)

    def _common_capabilities(self) -> Capabilities:
        """What every answering node can do: a mixed fleet never promises what one cannot."""
        seen = list(self._caps.values())
        if not seen:
            return Capabilities()
        fields = {f: all(c.get(f, False) for c in seen) for f in seen[0]}
        return converter.structure(fields, Capabilities)

    async def _directory_view(self) -> dict[str, str]:
        """Every agent worth calling: the placeable ones (``agents()``), and where the directory
        tells them apart (Nomad's catalog: ``reachable()``) those of drained or ineligible nodes,
        which still serve the sandboxes they run."""
        self._placeable = set(placeable := await self._directory.agents())
        reachable = getattr(self._directory, "reachable", None)
        return {**placeable, **(await reachable())} if reachable is not None else placeable

    async def _follow_directory(self) -> None:
        """A node that joins is placed on at the next read; one whose address changed is
        called at its new one (and proves itself again)."""
        try:
            view = await self._directory_view()
        except HutchError as err:  # the last view stands; reads go on
            log.warning("the node directory did not answer: %s", err.message)
            return
        for name, address in view.items():
            if name not in self._agents or self._agents[name].address != address:
                old = self._agents.get(name)
                self._agents[name] = AgentClient(name, address, self._secret)
                self._seen.setdefault(name, time.monotonic())
                if old is not None:
                    await old.close()

    async def _follow_drains(self) -> None:
        """A drain the orchestrator was asked for (Nomad's catalog: ``drained()``) is told to
        the listener once. Those already done when this driver starts are not told (another
        process, or this one before a restart, did); those still under way are. One that comes
        before the service listens (it does once its recovery ran) is told when it does: a
        drain of a node running only the agent is complete within half a second."""
        drained = getattr(self._directory, "drained", None)
        if drained is None:
            return
        try:
            now = await drained()
        except HutchError as err:  # told at a later read
            log.warning("the node directory did not say which nodes drain: %s", err.message)
            return
        seen, self._drains = self._drains, {name: d.started for name, d in now.items()}
        for name, drain in now.items():
            if name in self._agents and (drain.active if seen is None else seen.get(name) != drain.started):
                log.warning("node %s was drained by %s (drain of %s)", name, self._drained_by, drain.started)
                self._untold[name] = drain.started
        while self._untold and self._drained_listener is not None:
            name = next(iter(self._untold))
            del self._untold[name]
            await self._drained_listener(name, self._drained_by)

    @property
    def _drained_by(self) -> str:
        return str(getattr(self._directory, "drained_by", "its orchestrator"))

    async def _refresh(self) -> None:
        await self._follow_directory()
        await self._follow_drains()
        names = list(self._agents)
        states = await asyncio.gather(*(self._read_node(n, self._agents[n]) for n in names))
        self._states = {n: state if n in self._placeable or state.unusable
                        else attrs.evolve(state, unusable=NOT_OFFERED)
                        for n, state in zip(names, states, strict=True)}
        if self._caps:  # a node that answers later (down at start) counts too
            self.capabilities = self._common_capabilities()

    async def _read_node(self, name: str, agent: AgentClient) -> placement.NodeState:
        """One agent's capacity; the sandbox ends it saw; and whether it is lost or back."""
        # A read gives up when its node would be lost anyway: a silent host is declared lost
        # LOST_AFTER after its last answer, not a whole READ_TIMEOUT later.
        silent = time.monotonic() - self._seen.get(name, time.monotonic())
        timeout = min(READ_TIMEOUT, max(1.0, self._lost_after - silent + 0.1))
        try:
            if agent.instance is None:
                await agent.hello(timeout=timeout)
                agent.ended_seq = 0  # a new process counts its ends from 1
            s = await agent.json("GET", agent.path("node"), timeout=timeout)
        except HutchError as err:
            await self._missed(name, agent)
            said = err.message.removeprefix(f"node {name} ")  # "did not answer: …", not said twice
            return placement.NodeState(name=name, unusable=said if said != err.message else f"did not answer ({said})")
        if s.get("instance") != agent.instance:
            log.warning("node agent %s restarted (instance %s, was %s)", name, s.get("instance"), agent.instance)
            agent.instance = None  # proven again at the next refresh
            return placement.NodeState(name=name, unusable="restarted and has not proven itself again yet")
        self._seen[name] = time.monotonic()
        if name in self._lost:
            self._lost.discard(name)
            log.warning("node %s answers again", name)
        if self._to_end.get(name):
            await self._end_there(name, agent)
        if int(s.get("ended_seq", 0)) > agent.ended_seq:
            await self._report_ends(name, agent)
        if set(s["runtimes"]) != set(self._built.get(name, {})):
            self._built[name] = await agent.json("GET", agent.path("runtimes"), timeout=READ_TIMEOUT)
        self._caps = {**self._caps, name: {k: bool(v) for k, v in s["capabilities"].items()}}
        (self._measures.add if s.get("destroy_measures") else self._measures.discard)(name)
        return placement.NodeState(
            name=name, cpus=int(s["cpus"]), memory_total=int(s["memory_total"]),
            memory_available=int(s["memory_available"]), memory_committed=int(s["memory_committed"]),
            cpu_committed_millis=int(s["cpu_committed_millis"]), sandboxes=int(s["sandboxes"]),
            max_sandboxes=int(s.get("max_sandboxes", placement.MAX_SANDBOXES)), runtimes=frozenset(s["runtimes"]),
            memory_limit=None if s.get("memory_limit") is None else int(s["memory_limit"]),
            draining=bool(s.get("draining")))

    async def _missed(self, name: str, agent: AgentClient) -> None:
        silent = time.monotonic() - self._seen.get(name, 0.0)
        if name in self._lost or silent < self._lost_after:
            return
        known = {sid for sid, node in self._where.items() if node == name}
        self._lost.add(name)
        await agent.abort()  # what runs there (executions, terminals) ends now, failed, not hung
        gone: set[str] = set()
        for sid in known:
            self._where.pop(sid, None)
            self._held.pop(sid, None)
            await self._tunnels.drop(sid)
            # Recorded by the replica that drives it, once: another replica's sandbox is that
            # replica's to judge (its own connection to the node may be fine).
            if await self._drives_safely(sid):
                gone.add(sid)
        self._to_end.setdefault(name, set()).update(gone)
        log.warning("node %s is lost: its agent has not answered for %.0f s; failing the %d of its sandboxes "
                    "this replica drives (%d known)", name, silent, len(gone), len(known))
        reason = f"node {name} was lost: its agent has not answered for {self._lost_after:.0f} s"
        for sid in gone:
            await self.report_ended(sid, reason, failed=True)

    async def _drives_safely(self, sandbox_id: str) -> bool:
        try:
            return await self.drives(sandbox_id)
        except Exception as err:  # the replicas' store away: judged at the next report, not guessed
            log.warning("whether this replica drives sandbox %s is unknown: %s", sandbox_id, err)
            return False

    async def _end_there(self, name: str, agent: AgentClient) -> None:
        """A node that answers (back after it was lost, or after a create whose answer never
        came): what it still runs of the sandboxes the log says are over is ended there. One
        it could not end is tried again at its next answer."""
        pending = self._to_end[name]
        log.warning("node %s: ending %d sandboxes the log says are over", name, len(pending))
        for sid in list(pending):
            try:
                await agent.json("DELETE", agent.path("sandboxes", sid), timeout=30)
            except HutchError as err:
                log.warning("node %s: ending sandbox %s: %s", name, sid, err.message)
                continue
            pending.discard(sid)

    async def _report_ends(self, name: str, agent: AgentClient) -> None:
        """Sandboxes whose init ended on the node without a destroy (killed on the host)."""
        answer = await agent.json("GET", agent.path("ended", after=agent.ended_seq), timeout=READ_TIMEOUT)
        for end in answer["ended"]:
            agent.ended_seq = max(agent.ended_seq, int(end["seq"]))
            sid = str(end["sandbox"])
            if self._where.get(sid) == name:
                self._where.pop(sid, None)
                self._held.pop(sid, None)
                await self._tunnels.drop(sid)
                if await self._drives_safely(sid):
                    await self.report_ended(sid, f"on node {name}: {end['reason']}", failed=bool(end["failed"]))

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(REFRESH)
            try:
                await self._refresh()
            except Exception:  # never let the refresher die
                log.exception("refreshing the node agents' capacity")

    async def _owner(self, sandbox_id: str) -> AgentClient:
        node = self._where.get(sandbox_id)
        if node is None and self._locator is not None:
            # Not placed here (another replica's): the log says where. Not kept in _where,
            # which holds what this driver answers for (a lost node fails those).
            node = await self._locator(sandbox_id)
        if node is None or node not in self._agents:
            raise SandboxNotFound(f"sandbox {sandbox_id} not found")
        return self._agents[node]

    # -- where each sandbox is (the log records it) ------------------------------

    def node_of(self, sandbox_id: str) -> str | None:
        return self._where.get(sandbox_id)

    def recall(self, placements: Mapping[str, str]) -> None:
        """After a restart, from the log: no agent is asked where a sandbox is."""
        self._where.update(placements)

    async def nodes(self) -> list[NodeInfo]:
        return [self._info(name) for name in sorted(self._agents)]

    def _info(self, name: str) -> NodeInfo:
        state = self._states.get(name) or placement.NodeState(name, unusable="has not been read yet")
        if name in self._lost:
            status, reason = "lost", f"its agent has not answered for {self._lost_after:.0f} s"
        elif state.unusable == NOT_OFFERED:
            # Its agent answers and serves what it runs: up, and draining as far as hutch places
            # (Nomad drained it or marked it ineligible), not "unreachable".
            return attrs.evolve(state, draining=True).info("up", None)
        elif state.unusable:
            status, reason = "unreachable", state.unusable
        else:
            status, reason = "up", None
        return state.info(status, reason)

    async def drain(self, node: str, draining: bool) -> NodeInfo:
        agent = self._agent(node)
        await agent.json("POST", agent.path("node", "drain"), {"draining": draining}, timeout=READ_TIMEOUT)
        # Seen by the next placement here at once; other replicas read it within REFRESH, and
        # the agent refuses a create meanwhile itself.
        if (state := self._states.get(node)) is not None:
            self._states[node] = attrs.evolve(state, draining=draining)
        return self._info(node)

    async def move_target(self, req: ProvisionRequest) -> str:
        here = self._where.get(req.sandbox_id)
        node = self._choose(req, {here: "is the node it moves from"} if here else {})
        memory, cpu = placement.need(req.resources)
        self._reserved[req.sandbox_id] = (node, memory, cpu, time.monotonic() + RESERVATION)
        return node

    async def move(self, req: ProvisionRequest, to: str, workspace: AsyncIterable[bytes]) -> None:
        sid = req.sandbox_id
        old, new = await self._owner(sid), self._agent(to)
        try:
            if req.dependencies or req.packages:
                await new.json("POST", new.path("sandboxes", sid, "prepare"), converter.unstructure(req))
            await new.json("PUT", new.path("sandboxes", sid), converter.unstructure(req))
            try:
                await new.upload("PUT", new.path("sandboxes", sid, "tar", dest=MOVED_TREE, gzip="0"), workspace)
            except BaseException:
                with contextlib.suppress(Exception):
                    await new.json("DELETE", new.path("sandboxes", sid))
                raise
        finally:
            self._reserved.pop(sid, None)
        # From here every call goes to the new copy; the old one is ended (an old node that
        # fails to answer now ends it when it is lost or back: the log says it is on ``to``).
        await self._tunnels.drop(sid)
        self._where[sid] = to
        memory, cpu = self._held.get(sid, placement.need(req.resources))
        self._count(old.name, memory, cpu, -1)
        self._count(to, memory, cpu, +1)
        try:
            await old.json("DELETE", old.path("sandboxes", sid))
        except HutchError as err:
            log.warning("sandbox %s moved to %s; ending its old copy on %s: %s", sid, to, old.name, err.message)

    def _agent(self, node: str) -> AgentClient:
        if node not in self._agents:
            known = ", ".join(sorted(self._agents)) or "none"
            raise NotFound(f"node {node!r} not found; the nodes are: {known}", field="node")
        return self._agents[node]

    # -- placement and lifecycle -----------------------------------------------

    def _reservations(self, *, but: str | None = None) -> dict[str, placement.Held]:
        now = time.monotonic()
        for sid in [sid for sid, r in self._reserved.items() if r[3] < now]:
            del self._reserved[sid]
        totals: dict[str, placement.Held] = {}
        for sid, (node, memory, cpu, _) in self._reserved.items():
            if sid != but:
                m, c, n = totals.get(node, (0, 0, 0))
                totals[node] = (m + memory, c + cpu, n + 1)
        return totals

    def _choose(self, req: ProvisionRequest, excluded: dict[str, str]) -> str:
        states = [placement.NodeState(name=n, unusable=why) if (why := excluded.get(n)) else self._states[n]
                  for n in self._agents if n in self._states]
        return placement.choose(states, req.resources, req.runtime, self._reservations(but=req.sandbox_id))

    async def reserve(self, req: ProvisionRequest) -> None:
        if req.sandbox_id in self._reserved:
            return
        node = self._choose(req, {})
        memory, cpu = placement.need(req.resources)
        self._reserved[req.sandbox_id] = (node, memory, cpu, time.monotonic() + RESERVATION)

    def release(self, sandbox_id: str) -> None:
        self._reserved.pop(sandbox_id, None)

    async def provision(self, req: ProvisionRequest) -> None:
        await self.reserve(req)
        node, memory, cpu, _ = self._reserved[req.sandbox_id]
        excluded: dict[str, str] = {}
        try:
            while True:
                agent = self._agents[node]
                try:
                    await agent.json("PUT", agent.path("sandboxes", req.sandbox_id), converter.unstructure(req))
                    break
                except NodeFull as full:
                    # Another replica took the room first: the agent's own check is the last word.
                    excluded[node] = f"refused it: {full.message}"
                    node = self._choose(req, excluded)  # NoCapacity once every node refused
                    self._reserved[req.sandbox_id] = (node, memory, cpu, time.monotonic() + RESERVATION)
                except AgentUnreachable as gone:
                    # Died since the last read: another node takes it, and the creates after it
                    # skip this one until it answers. Should the agent have made it before dying,
                    # it is ended there when it answers.
                    self._to_end.setdefault(node, set()).add(req.sandbox_id)
                    excluded[node] = gone.message.removeprefix(f"node {node} ")
                    self._states[node] = placement.NodeState(name=node, unusable=excluded[node])
                    node = self._choose(req, excluded)
                    self._reserved[req.sandbox_id] = (node, memory, cpu, time.monotonic() + RESERVATION)
                except BaseException:
                    # Its answer never came, or said it failed: the agent may have made it all the
                    # same (and a restarted one adopts it), while the log records a failed create.
                    self._to_end.setdefault(node, set()).add(req.sandbox_id)
                    raise
        finally:
            self._reserved.pop(req.sandbox_id, None)
        self._where[req.sandbox_id] = node
        self._held[req.sandbox_id] = (memory, cpu)
        # Counted at once, not at the next read: creates in a row must see each other.
        self._count(node, memory, cpu, +1)

    def _count(self, node: str, memory: int, cpu: int, sign: int) -> None:
        """A sandbox placed on (+1) or gone from (-1) ``node``, in this driver's copy of it."""
        state = self._states.get(node)
        if state is None or state.unusable is not None or state.sandboxes + sign < 0:
            return
        self._states[node] = attrs.evolve(state, sandboxes=state.sandboxes + sign,
                                          memory_committed=max(0, state.memory_committed + sign * memory),
                                          cpu_committed_millis=max(0, state.cpu_committed_millis + sign * cpu))

    async def prepare(self, req: ProvisionRequest) -> None:
        await self.reserve(req)
        node, memory, cpu, _ = self._reserved[req.sandbox_id]
        agent = self._agents[node]
        await agent.json("POST", agent.path("sandboxes", req.sandbox_id, "prepare"), converter.unstructure(req))
        # An install may take longer than the reservation: the provision must land where it was built.
        self._reserved[req.sandbox_id] = (node, memory, cpu, time.monotonic() + RESERVATION)

    async def destroy(self, sandbox_id: str) -> None:
        await self._destroy(sandbox_id, measured=False)

    async def destroy_measured(self, sandbox_id: str, measure: Callable[[], Awaitable[Usage]]) -> Usage:
        """One call: the agent reads the usage, best effort, as it ends the sandbox."""
        if self._where.get(sandbox_id) not in self._measures:
            # Nothing of it to end here, or an agent that cannot measure as it ends: two calls.
            return await super().destroy_measured(sandbox_id, measure)
        answer = await self._destroy(sandbox_id, measured=True)
        used = answer.get("usage") if isinstance(answer, dict) else None
        return converter.structure(used, Usage) if isinstance(used, dict) else Usage()

    async def _destroy(self, sandbox_id: str, *, measured: bool) -> object:
        self._reserved.pop(sandbox_id, None)
        await self._tunnels.drop(sandbox_id)
        node = self._where.get(sandbox_id)
        if node is None or node not in self._agents:
            return None  # idempotent: never placed, or gone already (a lost node's were failed with it)
        agent = self._agents[node]
        answer = await agent.json("DELETE", agent.path("sandboxes", sandbox_id, usage=1 if measured else None))
        self._where.pop(sandbox_id, None)
        # Released at once too, as a create is counted: one-shots at concurrency 16 otherwise
        # filled every node's copy with sandboxes already gone, and creates were refused
        # NO_CAPACITY until the next read.
        memory, cpu = self._held.pop(sandbox_id, (0, 0))
        self._count(node, memory, cpu, -1)
        return answer

    async def alive(self) -> set[str]:
        """What every answering agent runs (asked at once: a silent node costs one timeout),
        and what the log placed on a node that did not answer: its loss, not a guess here,
        ends those. A sandbox an agent runs that the log did not place (the log says it is
        over, or has no record of it) is noted where it runs, for its destroy."""
        async def listed(name: str, agent: AgentClient) -> list[str] | None:
            try:
                answer = await agent.json("GET", agent.path("sandboxes"), timeout=10)
            except HutchError as err:
                log.warning("node agent %s: cannot list its sandboxes: %s", name, err.message)
                return None
            return [str(sid) for sid in answer["sandboxes"]]

        found: set[str] = set()
        lists = await asyncio.gather(*(listed(n, a) for n, a in self._agents.items()))
        silent = {name for name, sids in zip(self._agents, lists, strict=True) if sids is None}
        for name, sids in zip(self._agents, lists, strict=True):
            for sid in sids or ():
                self._where.setdefault(sid, name)
                found.add(sid)
        return found | {sid for sid, node in self._where.items() if node in silent}

    # -- runtimes --------------------------------------------------------------

    def runtimes_available(self) -> set[str]:
        """On any answering node (a placement prefers one that has it; another builds it)."""
        out: set[str] = set()
        for state in self._states.values():
            out |= state.runtimes
        return out

    async def build_runtime(self, name: str, progress: Callable[[str], None]) -> None:
        """Built on every answering node, so any can take a sandbox of it."""
        async def on(node: str, agent: AgentClient) -> None:
            async for line in _lines(agent.stream("POST", agent.path("runtimes", name, "build"))):
                answer = json.loads(line)
                if "progress" in answer:
                    progress(f"{node}: {answer['progress']}")
                elif "error" in answer:
                    raise from_wire(int(answer.get("status", 500)), answer["error"])

        usable = {n: a for n, a in self._agents.items() if not self._states.get(n, placement.NodeState(n)).unusable}
        self._building[name] += 1
        try:
            await asyncio.gather(*(on(n, a) for n, a in usable.items()))
        finally:
            self._building[name] -= 1
            if not self._building[name]:
                del self._building[name]
        await self._refresh()

    def runtimes_building(self) -> set[str]:
        return set(self._building)

    def runtime_info(self, name: str) -> dict[str, object]:
        """As the first node that has it built says (the nodes build from the same recipe)."""
        for built in self._built.values():
            if built.get(name):
                return dict(built[name])
        return {}

    # -- metrics ---------------------------------------------------------------

    def metrics(self) -> list[Metric]:
        """Per node, as last read: up, its sandboxes, its committed memory and cpu."""
        out: list[Metric] = []
        for name in self._agents:
            state = self._states.get(name)
            up = state is not None and state.unusable in (None, NOT_OFFERED)
            labels = {"node": name}
            out.append(Metric("hutch_node_up", 1.0 if up else 0.0, "gauge", "the node's agent answered its last read", labels))
            if state is not None and up:
                out += [Metric("hutch_node_sandboxes", state.sandboxes, "gauge", "sandboxes the node runs", labels),
                        Metric("hutch_node_memory_committed_bytes", state.memory_committed, "gauge",
                               "memory limits of the node's sandboxes", labels),
                        Metric("hutch_node_memory_available_bytes", state.memory_available, "gauge",
                               "the node's MemAvailable", labels),
                        Metric("hutch_node_cpu_committed_millis", state.cpu_committed_millis, "gauge",
                               "cpu limits of the node's sandboxes", labels)]
        return out

    # -- adoption --------------------------------------------------------------

    def handle(self, sandbox_id: str) -> dict[str, str] | None:
        node = self._where.get(sandbox_id)
        return {"node": node} if node else None

    async def adopt(self, sandbox: SandboxState, handle: dict[str, str]) -> bool:
        node = sandbox.node or handle.get("node")  # the log's word first
        if node not in self._agents:
            return False
        agent = self._agents[node]
        try:
            answer = await agent.json("GET", agent.path("sandboxes", sandbox.sandbox_id), timeout=5)
        except HutchError:
            return False
        if answer.get("alive"):
            self._where[sandbox.sandbox_id] = node
            return True
        return False

    async def discard_unrecorded(self, sandbox_id: str, handle: dict[str, str]) -> None:
        """Ended on every node at once: the lost replica's placement died with it and no event
        recorded one. An agent's DELETE is idempotent and waits for a provision of the same id
        still under way there (node/sandboxes.py), so a create the agent finishes after the
        replica died ends too. A node that does not answer ends it when it answers again."""
        self._where.pop(sandbox_id, None)
        self._held.pop(sandbox_id, None)
        self._reserved.pop(sandbox_id, None)
        await self._tunnels.drop(sandbox_id)

        async def end(name: str, agent: AgentClient) -> None:
            try:
                await agent.json("DELETE", agent.path("sandboxes", sandbox_id), timeout=30)
            except HutchError as err:
                log.warning("node %s: ending unrecorded sandbox %s when it answers: %s", name, sandbox_id,
                            err.message)
                self._to_end.setdefault(name, set()).add(sandbox_id)

        await asyncio.gather(*(end(n, a) for n, a in self._agents.items()))



async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    buf = b""
    async for chunk in chunks:
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield line
