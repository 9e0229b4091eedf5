"""cgroup v2 (one unified hierarchy) for the local driver: the tree and its rules are in
cgroups.py, whose ``Cgroups`` this implements; v1's is ``CgroupV1`` there. Found by
cgroups_detect.py."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import time
from pathlib import Path

from hutch.core.errors import DriverFailure, NotSupported
from hutch.drivers.local import cgroupfs as fs
from hutch.drivers.local.cgroups import CFS_PERIOD_US, ORG_PREFIX, PARENT, Cgroups


class CgroupV2(Cgroups):
    def __init__(self, mount: Path, controllers: frozenset[str]) -> None:
        self.mount = mount
        self.controllers = controllers
        self._cpu_applied: set[str] = set()  # sandboxes whose cpu limit is written (apply_cpu)
        self._memory_applied: set[str] = set()  # v2 makes it at the create: nothing to apply
        self._orgs: dict[str, str] = {}

    def paths(self, sandbox: str, leaf: str | None = None) -> list[Path]:
        org = self._orgs.get(sandbox)
        path = self.mount / PARENT / self.instance / (sandbox if org is None else f"{ORG_PREFIX}{org}/{sandbox}")
        return [path / leaf if leaf else path]

    def _org_root(self) -> Path | None:
        return self.mount / PARENT / self.instance if "pids" in self.controllers else None

    def _enable_org(self, path: Path) -> None:
        self._enable(path)  # its sandboxes' cgroups get every controller, as the instance's do

    def _enable(self, path: Path) -> None:
        for c in sorted(self.controllers):
            with contextlib.suppress(OSError):
                fs.write(path / "cgroup.subtree_control", f"+{c}")

    def setup(self, pids_total: int | None = None, org_pids: int | None = None) -> None:
        self._enable(self.mount)
        (self.mount / PARENT).mkdir(exist_ok=True)
        self._enable(self.mount / PARENT)
        (self.mount / PARENT / self.instance).mkdir(exist_ok=True)
        self._enable(self.mount / PARENT / self.instance)
        if pids_total is not None and "pids" in self.controllers:
            fs.write(self.mount / PARENT / self.instance / "pids.max", str(pids_total))
        self.org_pids = org_pids
        self._set_org_shares()
        self._org_sandboxes()

    def create_sandbox(self, sandbox: str, *, org: str | None, memory: int | None, cpu_millis: int | None,
                       pids: int | None) -> None:
        # No pool on v2, so the organization is always known; None: flat, as before.
        if org is not None and self._org_dir(org) is not None:
            self._orgs[sandbox] = org
        path = self.paths(sandbox)[0]
        try:
            path.mkdir(exist_ok=True)
        except FileNotFoundError:  # the organization's went with its last sandbox meanwhile
            assert org is not None
            self._org_dir(org)
            path.mkdir(exist_ok=True)
        self._enable(path)
        self._cpu_applied.discard(sandbox)
        self.set_limits(sandbox, memory=memory, cpu_millis=None, pids=pids)  # cpu: apply_cpu

    def set_limits(self, sandbox: str, *, memory: int | None, cpu_millis: int | None, pids: int | None) -> None:
        path = self.paths(sandbox)[0]
        if memory and "memory" in self.controllers:
            fs.write(path / "memory.max", str(memory))
            with contextlib.suppress(OSError):
                fs.write(path / "memory.swap.max", "0")
        if cpu_millis and "cpu" in self.controllers:
            self._set_cpu(sandbox, cpu_millis)
            self._cpu_applied.add(sandbox)
        if pids and "pids" in self.controllers:
            fs.write(path / "pids.max", str(pids))

    def rename(self, old: str, new: str, *, org: str) -> None:
        raise NotSupported("cgroup v2 cannot rename a cgroup")

    def _set_cpu(self, sandbox: str, cpu_millis: int) -> None:
        path = self.paths(sandbox)[0] / "cpu.max"
        want = f"{max(1000, cpu_millis * CFS_PERIOD_US // 1000)} {CFS_PERIOD_US}"
        with contextlib.suppress(OSError):
            if path.read_text().strip() == want:
                return
        fs.write(path, want)  # walks every cpu cgroup on the host, as on v1

    def create_leaf(self, sandbox: str, leaf: str) -> list[Path]:
        path = self.paths(sandbox, leaf)[0]
        path.mkdir(exist_ok=True)
        return [path / "cgroup.procs"]

    def usage(self, sandbox: str) -> tuple[float | None, int | None]:
        path = self.paths(sandbox)[0]
        cpu = None
        with contextlib.suppress(OSError, ValueError):
            for line in (path / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    cpu = int(value) / 1e6
        return cpu, fs.as_int(fs.number(path, "memory.peak", 1))  # memory.peak: kernels from 5.19

    def memory_now(self, sandbox: str) -> tuple[int | None, int | None, int | None]:
        path = self.paths(sandbox)[0]
        limit = None
        with contextlib.suppress(OSError, ValueError):
            raw = (path / "memory.max").read_text().strip()
            limit = None if raw == "max" else int(raw)
        return fs.as_int(fs.number(path, "memory.current", 1)), fs.stat(path, "memory.stat", "file"), limit

    def oom_kills(self, sandbox: str, leaf: str) -> int:
        try:
            for line in (self.paths(sandbox, leaf)[0] / "memory.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except FileNotFoundError:
            pass
        return 0

    def clean_cache(self, sandbox: str) -> int:
        if "memory" not in self.controllers:
            return 0
        stat = fs.stats(self.paths(sandbox)[0], "memory.stat")
        if stat.get("file_dirty", 0) or stat.get("file_writeback", 0):
            return 0
        return stat.get("file", 0)

    def release_memory(self, sandbox: str) -> None:
        path = self.paths(sandbox)[0]
        held = fs.number(path, "memory.current", 1)
        # EAGAIN when less than asked could be reclaimed: what is left stays charged.
        with contextlib.suppress(OSError):
            if held:
                fs.write(path / "memory.reclaim", str(int(held)))

    def _freeze(self, path: Path, frozen: bool) -> None:
        try:
            fs.write(path / "cgroup.freeze", "1" if frozen else "0")
        except OSError as err:  # gone, or removed while we held it (as v1's)
            if err.errno not in (errno.ENOENT, errno.ENODEV):
                raise

    def is_frozen(self, sandbox: str) -> bool:
        try:
            return (self.paths(sandbox)[0] / "cgroup.freeze").read_text().strip() == "1"
        except FileNotFoundError:
            return False

    async def kill(self, sandbox: str, leaf: str | None = None, *, deadline: float = 10.0) -> None:
        path = self.paths(sandbox, leaf)[0]
        if (path / "cgroup.kill").exists():  # 5.14+: atomic, no freeze dance needed
            fs.write(path / "cgroup.kill", "1")
            end = time.monotonic() + deadline
            while fs.pids_below(path):
                if time.monotonic() > end:
                    raise DriverFailure(f"could not kill the processes of sandbox {sandbox}")
                await asyncio.sleep(0.005)
            return
        await super().kill(sandbox, leaf, deadline=deadline)

    def sandboxes(self) -> set[str]:
        root = self.mount / PARENT / self.instance
        flat = {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(ORG_PREFIX)} \
            if root.is_dir() else set()
        return flat | self._org_sandboxes()
