"""What a node agent's sandboxes leave on the host, read from the kernel: processes, cgroups
(every v1 controller and cgroup2), mounts, loop devices, network namespaces, veths and
iptables chains. The chaos test (test_node_chaos.py) takes one look as an agent is killed
and one after it came back, and compares them."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
from pathlib import Path

import attrs

from hutch.drivers.local import network, uids

CGROUP_ROOT = Path("/sys/fs/cgroup")


def instance(data_dir: Path) -> str:
    """The cgroup subtree of one agent's local driver (drivers/local/driver.py names it so)."""
    return hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]


def cgroup_dirs(data_dir: Path) -> list[Path]:
    """The agent's cgroup subtree in every hierarchy mounted (v1 controllers, cgroup2)."""
    inst = instance(data_dir)
    out = []
    for hierarchy in sorted(CGROUP_ROOT.iterdir()):
        d = hierarchy / "hutch" / inst
        if d.is_dir():
            out.append(d)
    return out


def start_time(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


@attrs.define
class Look:
    """One agent's sandboxes as the host shows them."""

    sandboxes: set[str] = attrs.field(factory=set)  # cgroups named after a sandbox, anywhere
    processes: set[tuple[int, int]] = attrs.field(factory=set)  # (pid, start time) in its cgroups
    cgroups: set[str] = attrs.field(factory=set)
    netns: set[int] = attrs.field(factory=set)  # inodes of its processes' network namespaces
    uids: set[int] = attrs.field(factory=set)  # sandbox uids claimed for its sandboxes
    at: int = attrs.field(factory=lambda: _ticks_now())  # when it was taken, in /proc's start-time ticks


def _ticks_now() -> int:
    return int(float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK")) + 1


def look(data_dir: Path) -> Look:
    seen = Look()
    for root in cgroup_dirs(data_dir):
        for dirpath, _dirs, _files in os.walk(root):
            rel = Path(dirpath).relative_to(root)
            if rel.parts:
                seen.sandboxes.add(rel.parts[0])
                seen.cgroups.add(f"{root.parent.parent.name}:{rel}")
            with contextlib.suppress(OSError):
                for pid in map(int, Path(dirpath, "cgroup.procs").read_text().split()):
                    if (st := start_time(pid)) is not None:
                        seen.processes.add((pid, st))
                        with contextlib.suppress(OSError):
                            seen.netns.add(os.stat(f"/proc/{pid}/ns/net").st_ino)
    # A sandbox's launcher joins its cgroups before it unshares: seen then, it is in the host's
    # network namespace, which is no sandbox's (every process of the host would "hold" it after).
    for shared in ("/proc/1/ns/net", "/proc/self/ns/net"):
        with contextlib.suppress(OSError):
            seen.netns.discard(os.stat(shared).st_ino)
    owner = str(data_dir)
    with contextlib.suppress(OSError):
        for held in uids.UID_REGISTRY.iterdir():
            if held.name.isdigit():
                with contextlib.suppress(OSError):
                    if held.read_text().startswith(owner):
                        seen.uids.add(int(held.name))
    return seen


def leftovers(data_dir: Path, before: Look) -> list[str]:
    """What is still on the host of the sandboxes ``before`` saw (and of any other sandbox of
    this agent: the caller has ended them all)."""
    left: list[str] = []
    now = look(data_dir)
    left += [f"cgroup {c}" for c in sorted(now.cgroups)]
    left += [f"process {pid} (in the agent's cgroups)" for pid, _ in sorted(now.processes)]
    left += [f"process {pid} (seen at the kill: {_described(pid)})" for pid, st in sorted(before.processes)
             if start_time(pid) == st and _state(pid) != "Z"]
    lost_uids = {u for u in before.uids if not _claimed_elsewhere(u, data_dir)}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            # A namespace's inode number is handed out again once it is freed (the lowest free
            # one): a process started after the look that shares one is another's, and a child
            # of a lost sandbox's process would be in its cgroups, counted above.
            if os.stat(proc / "ns" / "net").st_ino in before.netns and (start_time(int(proc.name)) or 0) <= before.at:
                left.append(f"network namespace of process {proc.name} ({_described(int(proc.name))})")
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("Uid:"):
                    if {int(u) for u in line.split()[1:]} & lost_uids:
                        left.append(f"process {proc.name} runs as a lost sandbox's uid")
                    break
    sandbox_names = before.sandboxes | now.sandboxes
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        point, source = fields[4], fields[fields.index("-") + 2] if "-" in fields else ""
        if point.startswith(str(data_dir) + "/") or any(f"net:[{ino}]" in source for ino in before.netns):
            left.append(f"mount {point}")
    for loop in Path("/sys/block").glob("loop*"):
        with contextlib.suppress(OSError):
            backing = (loop / "loop" / "backing_file").read_text().strip()
            if backing.startswith(str(data_dir) + "/") or any(f"/{sid}/" in backing for sid in sandbox_names):
                left.append(f"loop device {loop.name} over {backing}")
    links = _run("ip", "-o", "link", "show")
    rules = _run("iptables", "-w", "-S") + _run("iptables", "-w", "-t", "nat", "-S")
    for uid in sorted(lost_uids):  # less those handed to another's sandbox since (rare: round robin)
        index = uid - uids.UID_BASE
        names = (network.host_veth(index, True), network.host_veth(index, False))
        for name in names:
            if f" {name}:" in links or f" {name}@" in links:
                left.append(f"veth {name}")
        chain = f"HUTCH-A{index:x}"
        for rule in rules.splitlines():
            words = rule.split()
            if chain in words or any(n in words for n in names):
                left.append(f"iptables: {rule}")
    return left


def _state(pid: int) -> str | None:
    """A zombie is ended: reaping it is its new parent's business (pid 1's, once its own died)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _described(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        cgroup = Path(f"/proc/{pid}/cgroup").read_text().replace("\n", " ")
    except (OSError, IndexError):
        return "gone"
    return f"state {_state(pid)}, parent {parent}, {argv[:120]!r}, cgroups {cgroup[:300]}"


def _claimed_elsewhere(uid: int, data_dir: Path) -> bool:
    try:
        owner = (uids.UID_REGISTRY / str(uid)).read_text()
    except OSError:
        return False
    return not owner.startswith(str(data_dir)) and os.path.exists(owner)


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
