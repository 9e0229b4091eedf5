"""What the local driver knows of its sandboxes: their records, their running executions
and a lock per sandbox.

A sandbox's record lives in memory and in ``<data_dir>/sandboxes/<id>/meta.json``, so a
restarted server finds its live sandboxes again (``load``). A record is only trusted while
its init still runs: the pid *and* its start time must match (pids are reused).
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import attrs

from hutch.core.driver_types import check_user, home_of
from hutch.core.errors import DriverFailure, IllegalTransition, SandboxNotFound
from hutch.drivers.local.cgroups import Cgroups
from hutch.drivers.local.helper import start_time
from hutch.drivers.local.smallfiles import get as _get
from hutch.drivers.local.smallfiles import put as _put
from hutch.drivers.runclock import RunClock

# Ids that may name a directory (sandboxes, checkpoints): no dots first, no slashes.
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")
# Pooled sandboxes (pool.py): ``_pool-<server pid>-<its start time>-<token>-<seq>``,
# never a valid sandbox id.
POOL_PREFIX = "_pool-"
POOL_NAME = re.compile(r"^_pool-(\d+)-(\d+)-[0-9a-f]+-\d+\Z")


@attrs.define
class LocalSandbox:
    id: str
    uid: int
    runtime: str
    env: dict[str, str]
    init_pid: int
    init_start: int
    network: bool = False  # outbound network (veth + NAT); see network.py
    port: int | None = None  # the one exposed port, reached through port_target()
    layer: str | None = None  # its install layer (drivers/local/layers.py), if it asked for installs
    # Rootless mode only (no cgroups): the rlimits every process of the sandbox gets.
    rlimit_data: int | None = None
    rlimit_nproc: int | None = None
    # Rootless network: its slirp4netns (pid and start time; see slirp.py).
    slirp_pid: int | None = None
    slirp_start: int | None = None
    host_port: int | None = None  # rootless port: slirp4netns forwards 127.0.0.1:host_port to it
    allow: dict[str, list[str]] = attrs.field(factory=dict)  # network.allow: each entry's CIDRs (egress.py)
    deny: list[str] = attrs.field(factory=list)  # network.deny's CIDRs; ["0.0.0.0/0"]: turned off by an update
    rules_generation: int = 0  # bumped by each update of its rules (network.GENERATION_MASK)
    dev_bytes: int | None = None  # the size of its /dev tmpfs (/dev/shm): its memory limit (launch.py)
    # The limits it was given, so a restarted driver (a node agent) knows the capacity it has
    # committed; None: no limit, or a meta.json written before they were kept.
    memory_bytes: int | None = None
    cpu_millis: int | None = None
    disk_bytes: int | None = None
    user: str | None = None  # its account's name (ProvisionRequest.user); None: agentuity
    # Paused filesystem-only (fspause.py): no pid 1 and no process, its files kept; init_pid
    # and init_start are 0 until the resume boots it again.
    asleep: bool = False
    # Its create is still making its network (provisioning.py): a start that finds it so (the
    # server killed half-way) ends it, network and all, rather than adopt a sandbox without it.
    making: bool = False

    @property
    def user_name(self) -> str:
        return check_user(self.user)

    @property
    def home(self) -> str:
        return home_of(self.user)


@attrs.define
class LocalExecution:
    sandbox_id: str
    leaf: str
    cancelled: bool = False
    ended: asyncio.Event = attrs.field(factory=asyncio.Event)  # its exec returned (a thaw-kill waits)


def is_live(sb: LocalSandbox) -> bool:
    """Whether the sandbox's init still runs (the same process, not a reused pid), or it is
    paused filesystem-only (no init to run: its files are all it is until the resume). One
    whose create never finished is not: nobody was told it exists."""
    return not sb.making and (sb.asleep or start_time(sb.init_pid) == sb.init_start)


class Registry:
    """The sandboxes and executions of one driver, and the per-sandbox locks."""

    def __init__(self, sandbox_root: Path, cgroups: Cgroups | None) -> None:
        self.sandbox_root = sandbox_root
        self._cgroups = cgroups
        self.sandboxes: dict[str, LocalSandbox] = {}
        self.executions: dict[str, LocalExecution] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._clocks: dict[str, RunClock] = {}  # each sandbox's run clock (drivers/runclock.py)

    def lock(self, sid: str) -> asyncio.Lock:
        return self._locks.setdefault(sid, asyncio.Lock())

    def clock(self, sid: str) -> RunClock:
        """The seconds the sandbox has not been frozen: its commands' time limits count on it.
        Made stopped for a sandbox found frozen (a driver restarted under a paused one)."""
        clock = self._clocks.get(sid)
        if clock is None:
            clock = self._clocks[sid] = RunClock()
            if self._cgroups is not None and self._cgroups.is_frozen(sid):
                clock.freeze()
        return clock

    def drop_lock(self, sid: str) -> None:
        self._locks.pop(sid, None)
        self._clocks.pop(sid, None)

    def load(self, sid: str) -> LocalSandbox | None:
        sb = self.sandboxes.get(sid)
        if sb is not None:
            return sb
        try:
            data = json.loads(_get(self.sandbox_root / sid / "meta.json"))
            if data.get("id") != sid:
                # A pooled sandbox whose claim was cut short (pool.py: its meta is written last,
                # after the tenant's limits): nobody's, and with the pool's cgroup (no CPU quota).
                return None
            return LocalSandbox(**data)
        except (OSError, ValueError, TypeError):
            return None

    def running(self, sid: str) -> LocalSandbox:
        sb = self.load(sid) if SAFE_ID.match(sid) else None
        if sb is None:
            raise SandboxNotFound(f"sandbox {sid} not found")
        if sb.asleep:
            raise IllegalTransition(f"sandbox {sid} is paused (filesystem only: nothing of it runs); resume it first")
        if start_time(sb.init_pid) != sb.init_start:
            raise DriverFailure(f"sandbox {sid} is no longer running")
        self.sandboxes[sid] = sb
        return sb

    def write_meta(self, sb: LocalSandbox) -> None:
        # In place (see _put). A server killed in the middle of this write leaves a torn
        # meta.json: the next start then treats the sandbox as dead and ends it (with a
        # lifecycle event), as it does any sandbox it cannot account for.
        _put(self.sandbox_root / sb.id / "meta.json", json.dumps(attrs.asdict(sb)).encode())

    def check_not_paused(self, sb: LocalSandbox) -> None:
        if self._cgroups is not None and self._cgroups.is_frozen(sb.id):
            raise IllegalTransition(f"sandbox {sb.id} is paused; resume it first")

    def has_executions(self, sid: str) -> bool:
        return any(ex.sandbox_id == sid for ex in self.executions.values())

    def execution_leaves(self, sid: str) -> set[str]:
        return {ex.leaf for ex in self.executions.values() if ex.sandbox_id == sid}

    def mark_cancelled(self, sid: str) -> None:
        """The sandbox's running executions are about to be killed: they return cancelled."""
        for ex in self.executions.values():
            if ex.sandbox_id == sid:
                ex.cancelled = True
