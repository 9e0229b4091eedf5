"""The machines sandboxes are placed on (the node driver's nodes), for their operator: list
them, drain one (no new sandbox goes there) or put it back in service, and move the idle
sandboxes of a drained one to other nodes: when asked (``hutch node drain --move``), or when
the orchestrator says it drained the node (``nomad node drain``, ``drained_by``).

A move makes the sandbox again elsewhere, same id and spec, from its workspace's files (a tar
out of the old copy, checked as an upload is, unpacked into the new one); its env is the
sandbox's own and goes with every command. Its processes do not follow: only an idle sandbox
moves, and anything it left running in the background is gone, which the ``lifecycle:moved``
event and the answer say. The move runs under the sandbox's lock, so a command asked for
meanwhile starts after it, on the new node."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import IO

import attrs

from hutch.core.driver_types import NodeInfo
from hutch.core.errors import HutchError
from hutch.core.lifecycle import Move
from hutch.core.models import SandboxState, SandboxStatus
from hutch.core.replicas import Replicas
from hutch.drivers.base import DriverRoles, ProvisionRequest
from hutch.projections.base import SandboxQuery
from hutch.service import archives
from hutch.service.defaults import SandboxDefaults
from hutch.service.reads import Reads
from hutch.service.recorder import Recorder
from hutch.service.snapshots import WORKSPACE

log = logging.getLogger(__name__)

Spool = Callable[[AsyncIterable[bytes], int], Awaitable[IO[bytes]]]
NOT_CARRIED = ("processes do not follow a move: a moved sandbox keeps its id, files (its workspace) and env, "
               "not what was running in it")


@attrs.frozen
class Moved:
    sandbox_id: str
    from_node: str
    to_node: str


@attrs.frozen
class Left:
    sandbox_id: str
    reason: str


@attrs.frozen
class Drained:
    node: NodeInfo
    moved: tuple[Moved, ...] | None = None  # None: no move was asked
    left: tuple[Left, ...] | None = None
    note: str | None = None


class Nodes:
    def __init__(self, driver: DriverRoles, *, reads: Reads, recorder: Recorder, replicas: Replicas,
                 limits: archives.Limits, spool: Spool, defaults: SandboxDefaults) -> None:
        self._fleet = driver.fleet
        self._driver = driver
        self._reads = reads
        self._recorder = recorder
        self._replicas = replicas
        self._limits = limits
        self._spool = spool  # the snapshots' spool: a private directory on the API's disk
        self._defaults = defaults  # what a spec recorded without resources gets (service/defaults.py)

    async def list(self) -> list[NodeInfo]:
        return await self._fleet.nodes()

    async def drain(self, node: str, *, draining: bool, move: bool = False) -> Drained:
        info = await self._fleet.drain(node, draining)
        if not move:
            return Drained(info)
        # The reason is shown to the sandbox's tenant: it names no node (NODE_FIELDS).
        moved, left = await self._move_idle(node, "its node was drained")
        return Drained(await self._node(node), moved, left, NOT_CARRIED)

    async def drained_by(self, node: str, by: str) -> tuple[tuple[Moved, ...], tuple[Left, ...]]:
        """``node`` was drained outside hutch (``nomad node drain``): its idle sandboxes move
        as ``drain --move`` moves them, the others stay, each with its reason in the log."""
        log.warning("node %s was drained by %s: moving the idle sandboxes this replica drives there", node, by)
        # Every replica is told; each moves those it drives, and says nothing of the others'.
        moved, left = await self._move_idle(node, f"its node was drained by {by}", others=False)
        for stay in left:
            log.warning("left sandbox %s on %s (drained by %s): %s", stay.sandbox_id, node, by, stay.reason)
        if moved:
            log.info("%s", NOT_CARRIED)
        return moved, left

    async def _move_idle(self, node: str, reason: str, *,
                         others: bool = True) -> tuple[tuple[Moved, ...], tuple[Left, ...]]:
        moved: list[Moved] = []
        left: list[Left] = []
        live, _ = await self._reads.store.list_sandboxes(SandboxQuery(live=True, limit=10**9))
        for sb in sorted((sb for sb in live if sb.node == node), key=lambda sb: sb.created_at):
            if not await self._replicas.mine(sb.sandbox_id):
                if others:
                    left.append(Left(sb.sandbox_id, "another API replica drives it: move it through that one"))
            elif sb.status is not SandboxStatus.IDLE:
                left.append(Left(sb.sandbox_id, f"it is {sb.status.value}: only an idle sandbox moves"))
            elif sb.checkpoints:
                left.append(Left(sb.sandbox_id, f"its checkpoints are kept on {node} and would not follow"))
            else:
                try:
                    moved.append(await self._move(sb, reason=reason))
                except HutchError as err:
                    left.append(Left(sb.sandbox_id, err.message))
        return tuple(moved), tuple(left)

    async def _node(self, name: str) -> NodeInfo:
        return next(n for n in await self._fleet.nodes() if n.name == name)

    async def _move(self, sb: SandboxState, *, reason: str) -> Moved:
        sid, here = sb.sandbox_id, str(sb.node)
        # Made again from its record, as a create makes it: a spec recorded before the defaults
        # were filled in (or by any path that left them out) gets them here, not no limit at
        # all. Its network is the record's too, so a rule changed since the create (a
        # ``network`` event, folded into the spec) is what the new copy gets.
        spec = self._defaults.apply(sb.spec, cpu_limit=self._driver.lifecycle.capabilities.cpu_limit)
        req = ProvisionRequest.for_spec(sid, spec)
        to = await self._fleet.move_target(req)

        async def carry(command: Move) -> None:
            export = archives.tar_gz(self._driver, sid, WORKSPACE, compress=False,
                                     max_bytes=archives.export_bound(self._limits))
            with await self._spool(export, archives.export_bound(self._limits)) as fh:
                members = await asyncio.to_thread(archives.check_tar, fh.name, self._limits)
                await self._fleet.move(req, command.to_node, archives.checked_tar(fh.name, members))

        # Decided first (idle, on ``here``, no checkpoints), then carried, then recorded, all
        # under the sandbox's lock: a command asked for meanwhile waits and runs on ``to``.
        await self._recorder.act(sid, lambda _: Move(from_node=here, to_node=to, reason=reason), carry)
        log.info("sandbox %s moved from %s to %s (%s)", sid, here, to, reason)
        return Moved(sid, here, to)


__all__ = ["NOT_CARRIED", "Drained", "Left", "Moved", "Nodes"]
