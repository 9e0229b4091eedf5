"""cgroup plumbing for the local driver: v1 (one hierarchy per controller) or v2 (unified,
cgroups_v2.py; which of the two a host has: cgroups_detect.py).

Tree: ``hutch/<instance>`` bounds the pids of all its sandboxes together (pidstotal.py);
``hutch/<instance>/<sandbox>/`` carries the limits (``instance`` names one data
dir, so two servers on a host never touch each other's sandboxes); its leaves are ``init`` (the sandbox's
pid 1) and one ``x-<execution>`` per execution, so a timeout or cancel can kill exactly
the processes an execution started, background children included, and nothing else.
Leaves only, because cgroup v2 forbids processes in inner nodes.

Organizations: where pids are limited, a sandbox's pids cgroup is under its organization's,
``hutch/<instance>/_org-<org>/<sandbox>``, whose ``pids.max`` is the organization's share
(pidstotal.py): one organization's fork bombs stop at its share, not at the instance's bound
that every organization's sandboxes share. On v1 only the pids hierarchy has that level (the
others stay flat, so the warm pool's renames are as before), and a sandbox's pid 1 is in the
instance's pids cgroup, as it is in the instance's memory and cpu ones (below): a pooled
sandbox is started before its organization is known, v1 renames only among siblings, and
moving a live pid 1 into another cgroup waits for an RCU grace period (~6 ms measured here,
as ``cgroup.procs`` below), so its claim makes the organization's and its own pids cgroups
(two mkdirs, ~20 us each) and nothing moves. Pid 1 is our own code: it forks each command
(the zygote), whose child joins the command's leaf before it runs anything of the sandbox's.
An organization's cgroup goes with its last sandbox. On v2 (one hierarchy, no pool) the
whole sandbox cgroup is under its organization's.

On v1 (which allows processes in inner cgroups) pid 1 lives in the sandbox's cgroup
itself, and an execution gets its own leaf only where it must: the freezer (kill
exactly its tree) and memory (its OOM kills are counted there); in cpu, cpuacct and
pids it joins the sandbox's cgroup, under the same limits. Every cgroup made is a
mkdir and an rmdir per sandbox (a memory cgroup's are among the dearest): 7 on v1
instead of 12 with an ``init`` leaf everywhere. Processes join through
v1's ``tasks`` file with "0" (the calling thread, which is the whole process: the
helper is single-threaded): unlike ``cgroup.procs`` that migration skips the
threadgroup rwsem, whose write side waits for an RCU grace period (measured here:
~6 ms per join).

An ended execution's memory leaf, once empty, is kept as its sandbox's spare (v1: renamed
to ``SPARE_MEMORY_LEAF``) and renamed for the sandbox's next execution: a memory cgroup's
mkdir costs 0.3-0.65 ms on this host (its per-cgroup shrinker map, docs/idle.md), a rename
7 us. Its OOM kill counter carries on, so an execution's kills are counted from where the
counter stood when the leaf was kept. Spares cost a memory cgroup each: at most
``spare_cap`` on the host, and one unused for ``SPARE_MAX_AGE`` seconds goes.

A sandbox's cpu limit is written before its first command (``apply_cpu``), not at its
create: each write of a quota walks every cpu cgroup on the host (the kernel checks the
whole tree's bandwidth: ``walk_tg_tree``), which made a create dearer the more sandboxes there
were (docs/idle.md). On v1 (cpu not mounted with another controller we use) the sandbox's cpu
cgroup itself is made then too, so an idle sandbox adds no task group to that walk: a first
command's write walks the groups of the sandboxes that have run something, not of every idle
one (~3 ms at 10,000 idle). Until then pid 1 (our own code, which runs nothing of the
sandbox's) is in the instance's cpu cgroup, and stays there, as with memory below; a pooled
sandbox's is made at its start, marked idle (``set_idle``), and pid 1 starts in it.

On v1 a sandbox's memory cgroup, with its limit, is made before its first command too
(``apply_memory``), not at its create: every memory cgroup holds the kernel's shrinker map,
one 520-byte unit per 64 superblocks the host ever held at once, so with 5 superblocks a
sandbox each memory cgroup cost ``5 x sandboxes / 64`` KiB, 781 KiB at 10,000 idle
(docs/idle.md), and its mkdir and rmdir were a create's and a destroy's dearest cgroup steps.
Until then pid 1 (our own code, which runs nothing of the sandbox's and allocates nothing
after its start) is charged to the instance's memory cgroup, and stays there: every process
of the sandbox's own enters through a leaf under the sandbox's memory cgroup, made with its
limit before the leaf. v2 cannot split one process's controllers: its memory is made at the
create, as before.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import errno
import math
import os
import re
import signal
import time
from pathlib import Path

from hutch.core.errors import DriverFailure, InvalidInput
from hutch.drivers.local import cgroupfs as fs

PARENT = "hutch"
# v1 hierarchies where each execution gets its own leaf (see the module docstring).
LEAF_CONTROLLERS_V1 = frozenset({"freezer", "memory"})
CFS_PERIOD_US = 100_000
SPARE_MEMORY_LEAF = "spare"  # not an execution's (x-, t-, w-, f-), nor v2's "init"
SPARE_CAP = 64
SPARE_MAX_AGE = 30.0
# An organization's cgroup (module docstring): never a sandbox's name (state.SAFE_ID, POOL_NAME).
ORG_PREFIX = "_org-"
ORG_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")  # a directory name, nothing more


def check_org(org: str) -> None:
    """An organization id its cgroup's name can carry; InvalidInput naming it otherwise."""
    if not isinstance(org, str) or not ORG_ID.match(org):
        raise InvalidInput(f"org_id: expected letters, digits, '_', '.' and '-', got {org!r}", field="org_id")



class Cgroups(abc.ABC):
    """One sandbox's limits and its per-execution leaves."""

    controllers: frozenset[str]
    instance: str = "default"
    org_pids: int | None = None  # an organization's share of the pids (setup; None: unbounded)
    _orgs: dict[str, str]  # sandbox -> its organization, whose cgroup it is under
    _cpu_applied: set[str]
    _memory_applied: set[str]

    @abc.abstractmethod
    def setup(self, pids_total: int | None = None, org_pids: int | None = None) -> None:
        """Make the instance's cgroups, all its sandboxes' pids bounded by ``pids_total`` and
        each organization's by ``org_pids`` (pidstotal.py; None: left as it is)."""

    @abc.abstractmethod
    def create_sandbox(self, sandbox: str, *, org: str | None, memory: int | None, cpu_millis: int | None,
                       pids: int | None) -> None:
        """``org``: the organization whose share it is under; None: not known yet (a pooled
        sandbox, v1 only: its pids cgroup is made at its claim, ``rename``)."""

    def _org_root(self) -> Path | None:
        """The directory the organizations' cgroups are in; None where pids are not limited."""
        return None

    def _enable_org(self, path: Path) -> None:  # noqa: B027 - v2 only
        """Whatever an organization's new cgroup needs before a sandbox's is made in it."""

    def _org_dir(self, org: str) -> Path | None:
        """The organization's cgroup, made with its share if it is not there yet."""
        root = self._org_root()
        if root is None:
            return None
        check_org(org)
        path = root / f"{ORG_PREFIX}{org}"
        try:
            os.mkdir(path)
        except FileExistsError:
            return path
        self._enable_org(path)
        if self.org_pids is not None:
            fs.write(path / "pids.max", str(self.org_pids))
        return path

    def _org_of(self, sandbox: str) -> str | None:
        """The sandbox's organization: noted when this server made its cgroup, or found there
        at ``setup`` (one an earlier server made); None: its cgroup is not under one (a pooled
        sandbox; one made before organizations had their own, pids flat under the instance)."""
        return self._orgs.get(sandbox)

    def _org_sandboxes(self) -> set[str]:
        """The sandboxes under an organization's cgroup (their organizations noted: setup
        calls it, before anything asks for a sandbox's paths)."""
        root = self._org_root()
        found: set[str] = set()
        with contextlib.suppress(OSError):
            for entry in os.scandir(root) if root is not None else ():
                if entry.name.startswith(ORG_PREFIX) and entry.is_dir():
                    org = entry.name.removeprefix(ORG_PREFIX)
                    for sandbox in os.scandir(entry.path):
                        if sandbox.is_dir():
                            self._orgs.setdefault(sandbox.name, org)
                            found.add(sandbox.name)
        return found

    def _set_org_shares(self) -> None:
        """Each organization's cgroup left by an earlier server: the share set now."""
        root = self._org_root()
        with contextlib.suppress(OSError):
            for entry in os.scandir(root) if root is not None and self.org_pids is not None else ():
                if entry.name.startswith(ORG_PREFIX) and entry.is_dir():
                    fs.write(Path(entry.path, "pids.max"), str(self.org_pids))

    @abc.abstractmethod
    def set_limits(self, sandbox: str, *, memory: int | None, cpu_millis: int | None, pids: int | None) -> None: ...

    @abc.abstractmethod
    def rename(self, old: str, new: str, *, org: str) -> None: ...

    @abc.abstractmethod
    def _set_cpu(self, sandbox: str, cpu_millis: int) -> None:
        """Write the sandbox's cpu limit, unless its cgroup has it already."""

    def apply_cpu(self, sandbox: str, cpu_millis: int | None) -> None:
        """The sandbox's cpu limit, written once, before the first command of its own runs
        (create_sandbox leaves it out). ``_cpu_applied`` only saves the read: a server
        restarted before the first command finds the cgroup without it and writes it."""
        if sandbox in self._cpu_applied:
            return
        if cpu_millis and "cpu" in self.controllers:
            self._set_cpu(sandbox, cpu_millis)
        self._cpu_applied.add(sandbox)

    def apply_memory(self, sandbox: str, memory: int | None) -> None:
        """The sandbox's memory cgroup and limit, made once, before the first command of its
        own runs (v1: create_sandbox leaves it out; v2 makes it there). ``_memory_applied``
        only saves the syscalls: a server restarted before the first command makes it."""
        if sandbox in self._memory_applied:
            return
        self._make_memory(sandbox, memory)
        self._memory_applied.add(sandbox)

    def _make_memory(self, sandbox: str, memory: int | None) -> None:  # noqa: B027 - v1 only
        """Make the sandbox's memory cgroup with its limit, if it has none yet."""

    @abc.abstractmethod
    def create_leaf(self, sandbox: str, leaf: str) -> list[Path]:
        """Make a leaf and return the files a process writes "0" to, to join it."""

    @abc.abstractmethod
    def paths(self, sandbox: str, leaf: str | None = None) -> list[Path]: ...

    @abc.abstractmethod
    def oom_kills(self, sandbox: str, leaf: str) -> int: ...

    @abc.abstractmethod
    def usage(self, sandbox: str) -> tuple[float | None, int | None]:
        """(cpu seconds used, peak memory bytes) of the whole sandbox so far; None if unknown."""

    @abc.abstractmethod
    def memory_now(self, sandbox: str) -> tuple[int | None, int | None, int | None]:
        """(bytes held now, of which page cache, its limit) of the whole sandbox; None if
        unknown, the limit None where it has none."""

    @abc.abstractmethod
    def _freeze(self, path: Path, frozen: bool) -> None: ...

    @abc.abstractmethod
    def clean_cache(self, sandbox: str) -> int:
        """Bytes of clean page cache charged to the sandbox and its leaves; 0 while any of
        it is dirty or under writeback (reclaiming would write out files about to be
        deleted with the sandbox's directory), or unknown."""

    @abc.abstractmethod
    def release_memory(self, sandbox: str) -> None:
        """Reclaim what is charged to the sandbox's memory cgroup and its leaves, before they
        are removed: a removed memory cgroup otherwise lives on, dying, while any page
        charged to it stays cached (a runtime file the sandbox was the first to read), and
        each dying one keeps its per-cgroup kernel state: a shrinker map sized by the most
        superblocks the host ever held at once (784 KiB a cgroup on a host that once ran
        10,000 sandboxes; docs/idle.md). A few milliseconds of reclaim: call it from a
        worker thread. Best effort: what cannot be reclaimed stays charged."""

    @abc.abstractmethod
    def sandboxes(self) -> set[str]: ...

    def pids(self, sandbox: str, leaf: str | None = None) -> list[int]:
        return fs.pids_below(self.paths(sandbox, leaf)[0])

    def leaves(self, sandbox: str) -> list[str]:
        """The sandbox's leaves (one per execution, kept while its background processes live)."""
        with contextlib.suppress(OSError):
            return [p.name for p in self.paths(sandbox)[0].iterdir() if p.is_dir()]
        return []

    def _pids_dir(self, sandbox: str) -> Path | None:
        return self.paths(sandbox)[0]

    def fork_refusals(self, sandbox: str) -> int:
        """How many forks the sandbox's pids limit has refused (pids.events "max")."""
        path = self._pids_dir(sandbox)
        with contextlib.suppress(OSError, ValueError):
            for line in (path / "pids.events").read_text().splitlines() if path else ():
                key, _, value = line.partition(" ")
                if key == "max":
                    return int(value)
        return 0

    async def kill(self, sandbox: str, leaf: str | None = None, *, deadline: float = 10.0) -> None:
        """SIGKILL every process in the sandbox (or one leaf) until none is left.

        Freezing first means a fork bomb cannot outrun the kill loop: nothing in the
        cgroup runs between our listing its processes and killing them.
        """
        path = self.paths(sandbox, leaf)[0]
        if not fs.pids_below(path):  # also when the cgroup is gone
            return
        # In a thread: freezing polls the freezer state, which must not block the event loop.
        await asyncio.to_thread(self._kill_sync, sandbox, path, deadline)

    def _kill_sync(self, sandbox: str, path: Path, deadline: float) -> None:
        end = time.monotonic() + deadline
        while True:
            pids = fs.pids_below(path)
            if not pids:
                return
            self._freeze(path, True)
            for pid in fs.pids_below(path):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self._freeze(path, False)
            if time.monotonic() > end:
                raise DriverFailure(f"could not kill the processes of sandbox {sandbox}: {pids}")
            time.sleep(0.005)

    def signal(self, sandbox: str, leaf: str, signum: int) -> None:
        """Send ``signum`` to every process of a leaf, frozen while it is listed and
        signalled (no fork escapes, no pid is reused meanwhile). Not for a frozen sandbox's
        leaf: the thaw here would wake it."""
        path = self.paths(sandbox, leaf)[0]
        if not fs.pids_below(path):
            return
        self._freeze(path, True)
        try:
            for pid in fs.pids_below(path):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)
        finally:
            self._freeze(path, False)

    def freeze(self, sandbox: str, frozen: bool) -> None:
        self._freeze(self.paths(sandbox)[0], frozen)

    def freeze_leaves(self, sandbox: str, frozen: bool, leaves: list[str] | None = None) -> list[str]:
        """Freeze (or thaw) each of the sandbox's leaves on its own (``leaves``, or all it has
        now but v2's ``init``, pid 1's); the ones done. A leaf frozen on its own stays frozen
        while its sandbox thaws, and one thawed on its own stays frozen while its sandbox is
        (both v1 and v2)."""
        root = self.paths(sandbox)[0]
        if leaves is None:
            leaves = [leaf for leaf in self.leaves(sandbox) if leaf != "init"]
        for leaf in leaves:
            self._freeze(root / leaf, frozen)
        return leaves

    @abc.abstractmethod
    def is_frozen(self, sandbox: str) -> bool: ...

    def remove_instance(self) -> None:
        root = self._org_root()
        with contextlib.suppress(OSError):
            for entry in os.scandir(root) if root is not None else ():
                if entry.name.startswith(ORG_PREFIX):
                    fs.rmdir(Path(entry.path))  # only an empty one: no sandbox is left in it
        for path in self.paths("x"):
            fs.rmdir(path.parent)

    def make_spare(self, sandbox: str) -> None:  # noqa: B027 - v1 only
        """Make the sandbox's spare execution leaf ahead of its first command (v1 only)."""

    def drop_stale_spares(self, max_age: float = SPARE_MAX_AGE) -> None:  # noqa: B027 - v1 only
        """Remove the spare leaves (module docstring) kept longer than ``max_age`` seconds."""

    def set_idle(self, sandbox: str, idle: bool) -> bool:
        """Mark the sandbox's cpu cgroup idle or not (``cpu.idle``, kernel 5.15+: an idle
        group runs only when its siblings leave a cpu unused); False where it cannot be
        marked (v1 only: v2 has no pool; no cpu controller or an older kernel)."""
        return False

    def remove(self, sandbox: str, leaf: str | None = None) -> bool:
        """rmdir the sandbox (or one leaf) in every hierarchy; False if processes remain."""
        if leaf is None:
            self._cpu_applied.discard(sandbox)
            self._memory_applied.discard(sandbox)
        ok = True
        for path in self.paths(sandbox, leaf):
            ok = fs.rmtree(path) and ok
        if leaf is None and ok:
            self._drop_org(sandbox)
        return ok

    def _drop_org(self, sandbox: str) -> None:
        """The sandbox's cgroups are gone: its organization's goes too if it was the last
        (an rmdir the kernel refuses while another sandbox's is in it)."""
        org = self._orgs.pop(sandbox, None)
        root = self._org_root()
        if org is not None and root is not None:
            fs.rmdir(root / f"{ORG_PREFIX}{org}")


class CgroupV1(Cgroups):
    def __init__(self, mounts: dict[str, Path]) -> None:
        self.mounts = mounts
        self.controllers = frozenset(mounts) - {"freezer"}
        # freezer first: paths()[0] is where we list and freeze processes; pids last (paths).
        self._order = ["freezer", *sorted(self.controllers - {"pids"}), *sorted(self.controllers & {"pids"})]
        self.spare_cap = SPARE_CAP
        self._roots: tuple[str, dict[str, str]] = ("", {})  # (instance, controller -> its dir), see _root
        # sandbox -> (its spare's OOM kill count when kept, when kept); oldest first
        self._spares: dict[str, tuple[int, float]] = {}
        # (sandbox, leaf) -> the OOM kill count a reused leaf came with
        self._oom_base: dict[tuple[str, str], int] = {}
        self._cpu_applied: set[str] = set()  # sandboxes whose cpu limit is written (apply_cpu)
        self._memory_applied: set[str] = set()  # sandboxes whose memory cgroup is made (apply_memory)
        # cpu cgroups made lazily (module docstring), unless cpu shares a hierarchy with another
        # controller (cpu,cpuacct mounted together): there the create makes the directory anyway.
        self._lazy_cpu = "cpu" in mounts and all(m != mounts["cpu"] for c, m in mounts.items() if c != "cpu")
        self._cpu_made: set[str] = set()  # sandboxes whose cpu cgroup this server knows is made
        self._orgs: dict[str, str] = {}

    def paths(self, sandbox: str, leaf: str | None = None) -> list[Path]:
        parts = [PARENT, self.instance, sandbox] + ([leaf] if leaf else [])
        found = [self.mounts[c].joinpath(*parts) for c in self._order]
        if "pids" in self.mounts and (org := self._org_of(sandbox)) is not None:
            found[-1] = self.mounts["pids"].joinpath(PARENT, self.instance, f"{ORG_PREFIX}{org}", *parts[2:])
        return found

    def _org_root(self) -> Path | None:
        return self.mounts["pids"] / PARENT / self.instance if "pids" in self.mounts else None

    def _pids_of(self, sandbox: str) -> str:
        """The sandbox's pids cgroup, as a string (see _root)."""
        org = self._org_of(sandbox)
        return f"{self._root('pids')}/{sandbox}" if org is None else f"{self._root('pids')}/{ORG_PREFIX}{org}/{sandbox}"

    def _root(self, controller: str) -> str:
        """The instance's directory in one hierarchy, as a string: an execution's way (its
        leaf, the pause check, its OOM count, the leaf's removal) builds its paths from these;
        pathlib took ~19 us for the five paths of one call to ``paths`` here."""
        instance, roots = self._roots
        if instance != self.instance:  # set after construction (cgroups_detect.detect)
            roots = {c: str(m / PARENT / self.instance) for c, m in self.mounts.items()}
            self._roots = (self.instance, roots)
        return roots[controller]

    def setup(self, pids_total: int | None = None, org_pids: int | None = None) -> None:
        for c in self._order:
            (self.mounts[c] / PARENT / self.instance).mkdir(parents=True, exist_ok=True)
        if pids_total is not None and "pids" in self.mounts:
            fs.write(self.mounts["pids"] / PARENT / self.instance / "pids.max", str(pids_total))
        self.org_pids = org_pids
        self._set_org_shares()
        self._org_sandboxes()

    def create_sandbox(self, sandbox: str, *, org: str | None, memory: int | None, cpu_millis: int | None,
                       pids: int | None) -> None:
        for c, path in zip(self._order, self.paths(sandbox), strict=True):
            if c == "memory" or (c == "cpu" and self._lazy_cpu):  # made before the first command (apply_*)
                continue
            if c == "pids":
                if org is None:  # pooled: made at its claim (rename), under its organization's
                    pids = None
                else:
                    self._make_pids(sandbox, org)
                continue
            path.mkdir(exist_ok=True)
        self._cpu_applied.discard(sandbox)
        self._memory_applied.discard(sandbox)
        self.set_limits(sandbox, memory=None, cpu_millis=None, pids=pids)  # memory, cpu: apply_*

    def _make_pids(self, sandbox: str, org: str) -> None:
        """The sandbox's pids cgroup, under its organization's (made with it if new)."""
        where = self._org_dir(org)
        if where is None:
            return
        try:
            os.mkdir(where / sandbox)
        except FileExistsError:
            pass
        except FileNotFoundError:  # the organization's went with its last sandbox meanwhile
            where = self._org_dir(org)
            assert where is not None
            os.mkdir(where / sandbox)
        self._orgs[sandbox] = org

    def _make_memory(self, sandbox: str, memory: int | None) -> None:
        if "memory" not in self.mounts:
            return
        path = Path(self._root("memory"), sandbox)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
        self._limit_memory(path, memory)

    def _limit_memory(self, path: Path, memory: int | None) -> None:
        if memory:
            fs.write(path / "memory.limit_in_bytes", str(memory))
            swap = path / "memory.memsw.limit_in_bytes"
            if swap.exists():  # limit + swap == limit: no swapping out of the limit
                fs.write(swap, str(memory))

    def set_limits(self, sandbox: str, *, memory: int | None, cpu_millis: int | None, pids: int | None) -> None:
        base = dict(zip(self._order, self.paths(sandbox), strict=True))
        if memory and "memory" in base:  # a pooled sandbox's (made by apply_memory at its fill)
            base["memory"].mkdir(exist_ok=True)
            self._limit_memory(base["memory"], memory)
        if cpu_millis and "cpu" in base:
            self._set_cpu(sandbox, cpu_millis)
            self._cpu_applied.add(sandbox)
        if pids and "pids" in base:
            fs.write(base["pids"] / "pids.max", str(pids))

    def _make_cpu(self, sandbox: str) -> str:
        """The sandbox's cpu cgroup, made if this server has not seen it made (module docstring)."""
        path = f"{self._root('cpu')}/{sandbox}"
        if sandbox not in self._cpu_made:
            with contextlib.suppress(FileExistsError):
                os.mkdir(path)
            self._cpu_made.add(sandbox)
        return path

    def _set_cpu(self, sandbox: str, cpu_millis: int) -> None:
        # Each write of either file walks every cpu cgroup on the host (the kernel checks the
        # whole tree's bandwidth): ~240 ns a cgroup with 2,500 of them here (perf), so each is
        # read first. A new cgroup already has the default period.
        cpu = Path(self._make_cpu(sandbox))
        if fs.number(cpu, "cpu.cfs_period_us", 1) != CFS_PERIOD_US:
            fs.write(cpu / "cpu.cfs_period_us", str(CFS_PERIOD_US))
        want = max(1000, cpu_millis * CFS_PERIOD_US // 1000)
        if fs.number(cpu, "cpu.cfs_quota_us", 1) != want:
            fs.write(cpu / "cpu.cfs_quota_us", str(want))

    def rename(self, old: str, new: str, *, org: str) -> None:
        """Rename a pooled sandbox's cgroups (v1 allows it among siblings; live processes
        follow), and make its pids cgroup under ``org``'s (module docstring)."""
        done: list[tuple[Path, Path]] = []
        try:
            self._make_pids(new, org)
            for c, src in zip(self._order, self.paths(old), strict=True):
                if c == "pids":  # pooled: none (create_sandbox), just made under its organization's
                    continue
                dst = src.with_name(new)
                if c == "memory" and old not in self._memory_applied and not src.exists():
                    continue  # not made yet (apply_memory)
                if c == "cpu" and self._lazy_cpu and old not in self._cpu_made and not src.exists():
                    continue  # not made yet (apply_cpu, set_idle)
                os.rename(src, dst)
                done.append((src, dst))
        except BaseException:
            for src, dst in reversed(done):
                with contextlib.suppress(OSError):
                    os.rename(dst, src)
            if "pids" in self.mounts and self._orgs.get(new) == org:
                with contextlib.suppress(OSError):
                    os.rmdir(self._pids_of(new))
                self._drop_org(new)
            raise
        for applied in (self._cpu_applied, self._memory_applied, self._cpu_made):
            if old in applied:
                applied.discard(old)
                applied.add(new)
        if old in self._spares:  # renamed with its parent; a pooled one's starts ageing now
            self._spares[new] = (self._spares.pop(old)[0], time.monotonic())

    def set_idle(self, sandbox: str, idle: bool) -> bool:
        if "cpu" not in self.mounts:
            return False
        path = self._make_cpu(sandbox)  # a pooled sandbox's, before its start: pid 1 starts in it
        try:
            with open(f"{path}/cpu.idle", "w") as fh:
                fh.write("1" if idle else "0")
        except FileNotFoundError:  # a kernel before 5.15
            return False
        return True

    def create_leaf(self, sandbox: str, leaf: str) -> list[Path]:
        out = []
        for c in self._order:
            path = f"{self._root(c)}/{sandbox}"
            if leaf == "init" and c == "memory":  # pid 1: the instance's (apply_memory)
                path = self._root(c)
            elif c == "pids":  # pid 1: the instance's (module docstring); a command: the sandbox's
                path = self._root(c) if leaf == "init" else self._pids_of(sandbox)
            elif c == "cpu" and self._lazy_cpu:
                if leaf != "init":  # the sandbox's, under its limit (apply_cpu came first)
                    self._make_cpu(sandbox)
                elif sandbox not in self._cpu_made:  # pid 1: the instance's, but a pooled one's (set_idle)
                    path = self._root(c)
            elif leaf != "init" and c in LEAF_CONTROLLERS_V1:  # else in the sandbox's own cgroup, under its limits
                path = f"{path}/{leaf}"
                if not (c == "memory" and self._take_spare(sandbox, leaf)):
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(path)
            out.append(Path(f"{path}/tasks"))
        return out

    def _take_spare(self, sandbox: str, leaf: str) -> bool:
        kept = self._spares.pop(sandbox, None)
        if kept is None:
            return False
        base = f"{self._root('memory')}/{sandbox}"
        spare = f"{base}/{SPARE_MEMORY_LEAF}"
        try:
            os.rename(spare, f"{base}/{leaf}")
        except OSError:
            with contextlib.suppress(OSError):
                fs.rmdir(Path(spare))
            return False
        self._oom_base[(sandbox, leaf)] = kept[0]
        return True

    def _keep_spare(self, sandbox: str, path: str) -> bool:
        """Keep an ended execution's memory leaf as the sandbox's spare, if it is empty and the
        sandbox has none; the oldest spare goes past the cap. False: the caller removes it."""
        if self.spare_cap <= 0 or sandbox in self._spares:
            return False
        try:
            with open(f"{path}/tasks") as fh:
                if fh.read().strip():
                    return False
            kills = fs.oom_kill_count(path)
            os.rename(path, f"{os.path.dirname(path)}/{SPARE_MEMORY_LEAF}")
        except OSError:
            return False
        self._spares[sandbox] = (kills, time.monotonic())
        while len(self._spares) > self.spare_cap:
            self._drop_spare(next(iter(self._spares)))
        return True

    def _drop_spare(self, sandbox: str) -> None:
        self._spares.pop(sandbox, None)
        with contextlib.suppress(OSError):
            fs.rmdir(Path(self._root("memory"), sandbox, SPARE_MEMORY_LEAF))

    def make_spare(self, sandbox: str) -> None:
        """A spare memory leaf for a pooled sandbox, made ahead of its first command (warm
        pool: off a request's path). It does not age while pooled (``rename`` starts it)."""
        if "memory" not in self.mounts or sandbox in self._spares:
            return
        (self.mounts["memory"] / PARENT / self.instance / sandbox / SPARE_MEMORY_LEAF).mkdir(exist_ok=True)
        self._spares[sandbox] = (0, math.inf)
        while len(self._spares) > self.spare_cap:
            self._drop_spare(next(iter(self._spares)))

    def drop_stale_spares(self, max_age: float = SPARE_MAX_AGE) -> None:
        now = time.monotonic()
        for sandbox, (_kills, kept) in list(self._spares.items()):
            if now - kept >= max_age:
                self._drop_spare(sandbox)

    def remove(self, sandbox: str, leaf: str | None = None) -> bool:
        if leaf is None:
            self._spares.pop(sandbox, None)  # removed with the sandbox's cgroup
            self._cpu_made.discard(sandbox)
            return super().remove(sandbox)
        self._oom_base.pop((sandbox, leaf), None)
        ok = True
        for c in self._order:
            if leaf != "init" and c not in LEAF_CONTROLLERS_V1:
                continue  # no leaf made there (create_leaf)
            path = f"{self._root(c)}/{sandbox}/{leaf}"
            # freezer first: its leaf gone, no process of the execution is left
            if c == "memory" and ok and self._keep_spare(sandbox, path):
                continue
            try:
                os.rmdir(path)  # the common case: an empty leaf
            except FileNotFoundError:
                pass
            except OSError:
                ok = fs.rmtree(Path(path)) and ok
        return ok

    def _unmade_memory(self, sandbox: str, path: Path | None) -> bool:
        """The sandbox lives but its memory cgroup is not made yet (apply_memory): nothing of
        its own has run, so it holds nothing and has held nothing."""
        return path is not None and not path.exists() and Path(self._root("freezer"), sandbox).exists()

    def usage(self, sandbox: str) -> tuple[float | None, int | None]:
        base = dict(zip(self._order, self.paths(sandbox), strict=True))
        memory = base.get("memory")
        return (fs.number(base.get("cpuacct"), "cpuacct.usage", 1e-9),  # hierarchical: init and every leaf
                0 if self._unmade_memory(sandbox, memory) else fs.as_int(fs.number(memory, "memory.max_usage_in_bytes", 1)))

    def memory_now(self, sandbox: str) -> tuple[int | None, int | None, int | None]:
        path = dict(zip(self._order, self.paths(sandbox), strict=True)).get("memory")
        if self._unmade_memory(sandbox, path):
            return 0, 0, None  # its limit: the caller's record (usage.py)
        limit = fs.as_int(fs.number(path, "memory.limit_in_bytes", 1))
        # v1 writes "no limit" as the largest page-aligned number: above any machine's memory.
        unlimited = limit is None or limit >= fs.UNLIMITED_V1
        return (fs.as_int(fs.number(path, "memory.usage_in_bytes", 1)),  # hierarchical: every leaf
                fs.stat(path, "memory.stat", "total_cache"), None if unlimited else limit)

    def oom_kills(self, sandbox: str, leaf: str) -> int:
        # v1 counts an OOM kill in the victim's own memcg, i.e. the execution's leaf.
        if "memory" not in self.mounts:
            return 0
        try:
            kills = fs.oom_kill_count(f"{self._root('memory')}/{sandbox}/{leaf}")
        except FileNotFoundError:
            return 0
        return kills - self._oom_base.get((sandbox, leaf), 0)  # a reused leaf's earlier kills are not its

    def _memory_dir(self, sandbox: str) -> Path | None:
        return self.mounts["memory"] / PARENT / self.instance / sandbox if "memory" in self.mounts else None

    def clean_cache(self, sandbox: str) -> int:
        stat = fs.stats(self._memory_dir(sandbox), "memory.stat")
        if stat.get("total_dirty", 0) or stat.get("total_writeback", 0):
            return 0
        return stat.get("total_cache", 0)  # hierarchical: leaves removed earlier included

    def release_memory(self, sandbox: str) -> None:
        path = self._memory_dir(sandbox)
        # An error (the cgroup already gone, a signal) leaves it as it was: no worse than before.
        with contextlib.suppress(OSError):
            if path is not None:
                fs.write(path / "memory.force_empty", "0")

    def _freeze(self, path: Path, frozen: bool) -> None:
        state = path / "freezer.state"
        try:
            fs.write(state, "FROZEN" if frozen else "THAWED")
            if frozen:
                end = time.monotonic() + 1.0
                while state.read_text().strip() != "FROZEN" and time.monotonic() < end:
                    time.sleep(0.001)
        except OSError as err:
            # Gone, or removed while we held it (ENODEV: its last process ended and its leaf
            # was removed meanwhile): nothing left to freeze, and the kill loop's next listing
            # finds no process. An E2B SendSignal answered "internal error" on this.
            if err.errno not in (errno.ENOENT, errno.ENODEV):
                raise

    def is_frozen(self, sandbox: str) -> bool:
        try:
            with open(f"{self._root('freezer')}/{sandbox}/freezer.state") as fh:
                return fh.read().strip() != "THAWED"
        except FileNotFoundError:
            return False

    def _pids_dir(self, sandbox: str) -> Path | None:
        return Path(self._pids_of(sandbox)) if "pids" in self.mounts else None

    def sandboxes(self) -> set[str]:
        found: set[str] = set()
        for c in self._order:
            root = self.mounts[c] / PARENT / self.instance
            if root.is_dir():
                found |= {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(ORG_PREFIX)}
        return found | self._org_sandboxes()

