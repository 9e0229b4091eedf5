"""Starting a local sandbox: its directory and upper layer, its cgroup (or rlimits), its
network and its pid 1.

pid 1 is started by ``hutch-nsexec launch`` with new mount, pid, ipc, uts and net
namespaces (rootless: a user namespace too) over an overlay of the read-only layers and
the sandbox's own upper layer, mounted only inside its mount namespace.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from pathlib import Path

from hutch.core import phases
from hutch.core.driver_types import check_user, home_of
from hutch.core.errors import DriverFailure, InvalidInput
from hutch.drivers import trust
from hutch.drivers.base import DEFAULT_PIDS, ProvisionRequest
from hutch.drivers.egress import flatten
from hutch.drivers.local import disks, helper, layers, network, rootfs, slirp, uids, zygote
from hutch.drivers.local.cgroups import Cgroups
from hutch.drivers.local.helper import start_time
from hutch.drivers.local.nsexec import Nsexec, rlimit_args
from hutch.drivers.local.sandboxnet import SandboxNetwork
from hutch.drivers.local.smallfiles import put as _put
from hutch.drivers.local.spares import SpareDirs
from hutch.drivers.local.state import LocalSandbox, Registry

# Rootless mode: the sandbox user's uid inside its user namespace (mapped to the server's).
ROOTLESS_UID = 1000
# Where pid 1 mounts its overlay before pivoting into it: one empty directory per data dir,
# shared by every sandbox, not a ``merged`` of each. The mount is made in the sandbox's own
# mount namespace (private from the host's first), where it is the only one on that
# directory, and pivot_root leaves it at "/": nothing on the host ever sees it, and a
# directory per sandbox was one more inode a create allocates on the data dir's file system
# (on this host's journal-less ext4 each a scan past recently freed ones, docs/idle.md).
MOUNT_POINT = ".mnt"
ROOTLESS_TMP = ("/tmp", "/var/tmp")  # made writable in the upper layer (see populate_upper)
HOME = rootfs.SANDBOX_HOME
USER = rootfs.SANDBOX_USER
READY_TIMEOUT = 15.0
# /dev (and so /dev/shm) of a rootless sandbox: no memory cgroup counts its pages, so it stays
# small whatever the sandbox's (per-process) memory limit.
ROOTLESS_DEV_BYTES = 64 * 2**20


def dev_bytes(memory: int | None, rootless: bool) -> int | None:
    """The size of a sandbox's /dev tmpfs: its memory limit (tmpfs pages are charged to the
    memory cgroup, so /dev/shm is inside the limit either way; sized to it, a full /dev/shm
    is ENOSPC, not an OOM kill of whoever touches memory next)."""
    if rootless:
        return min(memory or ROOTLESS_DEV_BYTES, ROOTLESS_DEV_BYTES)
    return memory


def layers_key(lower: list[Path]) -> str:
    """What spare skeletons (spares.py) are kept by: the layers they were made over."""
    return ":".join(map(str, lower))


class Launcher:
    """Makes new sandboxes, and starts pid 1 over an existing one's upper layer."""

    def __init__(self, registry: Registry, nsexec: Nsexec, cgroups: Cgroups | None, net: SandboxNetwork,
                 spares: SpareDirs, *, rootless: bool) -> None:
        self._registry = registry
        self._nsexec = nsexec
        self._cgroups = cgroups
        self._net = net
        self._spares = spares
        self._rootless = rootless

    async def create(self, req: ProvisionRequest, lower: list[Path], layer: str | None, *,
                     pooled: bool = False) -> LocalSandbox:
        """Start a sandbox from scratch (``pooled``: for the warm pool, its organization not
        known yet: cgroups.py).

        On the event loop, not in worker threads: the file and cgroup work is ~1 ms of
        small syscalls, and a worker thread doing it fights the loop for the GIL at every
        one of them (measured: ~130 context switches per handed-off job, most of the
        server's system time under load). The launcher's wait is awaited, not blocked on.
        """
        sid = req.sandbox_id
        d = self._registry.sandbox_root / sid
        user = check_user(req.user)  # before anything is made: a bad name makes nothing
        with phases.span("launch: directory and uid"):
            uid = self._make_dir(d, lower, req.resources.disk_bytes, spare=req.user is None)
        slirp_net = self._rootless and (req.network_enabled or req.port is not None)
        with phases.span("launch: upper layer's skeleton"):
            populate_upper(lower, d / "upper", uid, self._rootless,
                           slirp.resolv_conf() if slirp_net and req.network_enabled else None, user=user)
        res = req.resources
        sb = LocalSandbox(id=sid, uid=uid, runtime=req.runtime, env=dict(req.env), init_pid=0, init_start=0, layer=layer,
                     dev_bytes=dev_bytes(res.memory_bytes, self._rootless), memory_bytes=res.memory_bytes,
                     cpu_millis=res.cpu_millis, disk_bytes=res.disk_bytes, user=req.user,
                     # its network is made after (provisioning.py): until then its record says so
                     making=not self._rootless and (req.network_enabled or req.port is not None))
        if self._cgroups is not None:
            with phases.span("launch: cgroups"):
                self._cgroups.create_sandbox(sid, org=None if pooled else req.org_id, memory=res.memory_bytes,
                                             cpu_millis=res.cpu_millis, pids=res.pids or DEFAULT_PIDS)
        else:
            sb.rlimit_data, sb.rlimit_nproc = res.memory_bytes, res.pids or DEFAULT_PIDS
        if req.network_allow:  # resolved first: a name that does not resolve makes nothing
            sb.allow = await self._net.allow.first(sid, req.network_allow)
        sb.deny = list(req.network_deny)
        rules = slirp.egress_rules(outbound=req.network_enabled, allow=flatten(sb.allow) if sb.allow else None) \
            if slirp_net else None
        sb.init_pid, sb.init_start = await self.launch(d, sb, lower, rules)
        if slirp_net:
            await self._net.start_slirp(sb, outbound=req.network_enabled, port=req.port)
        with phases.span("launch: meta.json"):
            self._registry.write_meta(sb)
        return sb

    def _make_dir(self, d: Path, lower: list[Path], disk: int | None, *, spare: bool = True) -> int:
        """The sandbox's directory (upper and work) and its uid, claimed for it."""
        # A skeleton of an earlier sandbox (spares.py); never for a disk limit (disks.py), nor
        # for another account than agentuity (a skeleton has agentuity's home).
        spare = spare and not disk and self._spares.take(layers_key(lower), d)
        if not spare:
            d.mkdir(mode=0o700)
            if disk:
                disks.attach(d, disk)  # upper and work: symlinks into the limited file system
            else:
                (d / "upper").mkdir()
                (d / "work").mkdir()
        uid = ROOTLESS_UID if self._rootless else uids.claim(d)
        uids.record(d, uid)
        return uid

    async def launch(self, d: Path, sb: LocalSandbox, lower: list[Path], netfilter: bytes | None = None) -> tuple[int, int]:
        """Start the sandbox's pid 1 over ``d``'s upper layer; returns its (pid, start time).

        The launcher forks pid 1, prints its host pid and exits; pid 1 says "ready" on
        another pipe once it is the sandbox user. Both are awaited on the loop.
        """
        sid = sb.id
        t0 = phases.start()
        procs = self._cgroups.create_leaf(sid, "init") if self._cgroups is not None else []
        loop = asyncio.get_running_loop()
        ready_r, ready_w = os.pipe()
        info_r, info_w = os.pipe()
        err_r, err_w = os.pipe()
        pass_fds = [ready_w, info_w]
        cmd = self._command(d, sb, lower, netfilter, procs, ready_w=ready_w, info_w=info_w, pass_fds=pass_fds)
        phases.end("launch: pid 1's leaf, pipes, socket, command", t0)
        t0 = phases.start()
        try:
            try:
                # A vfork+exec of a static binary: well under a millisecond.
                launcher = subprocess.Popen(  # noqa: ASYNC220
                    cmd, env={}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err_w,
                    pass_fds=pass_fds)
            finally:
                for fd in (*pass_fds, err_w):
                    os.close(fd)
            phases.end("launch: Popen of the launcher", t0)
            t0 = phases.start()
            # pid 1 closes its inherited stderr once set up, so EOF on it means "set up or
            # failed"; the ready line then tells which.
            async with asyncio.timeout(READY_TIMEOUT):
                stderr, info, ready = await helper.read_to_eof(loop, (err_r, 8192), (info_r, 64), (ready_r, 64))
        except TimeoutError:
            raise DriverFailure(f"sandbox {sid} did not come up within {READY_TIMEOUT:g}s") from None
        finally:
            for fd in (err_r, info_r, ready_r):
                os.close(fd)
        phases.end("launch: pid 1 up (its pipes' EOF)", t0)
        code = launcher.wait()  # it exited before closing its pipes: no real wait
        if code != 0 or ready != b"ready\n":
            raise DriverFailure(f"starting sandbox {sid} failed: {_text(stderr)}")
        try:
            pid = int(info)
        except ValueError as err:
            raise DriverFailure(f"the launcher gave no pid for sandbox {sid}: {info!r}") from err
        start = start_time(pid)
        if start is None:
            raise DriverFailure(f"sandbox {sid} died at start: {_text(stderr)}")
        return pid, start

    def _command(self, d: Path, sb: LocalSandbox, lower: list[Path], netfilter: bytes | None, procs: list[Path], *,
                 ready_w: int, info_w: int, pass_fds: list[int]) -> list[str]:
        """The launcher's command line (``procs``: its init leaf's cgroup.procs files); adds
        the fds the launcher inherits to ``pass_fds``."""
        path = self._nsexec.path
        assert path is not None
        # Rootless: the user namespace, and the rlimits that stand in for cgroups.
        rootless_args = ["--userns", *rlimit_args(sb)] if self._rootless else []
        cmd = [str(path), "launch", "--uid", str(sb.uid), "--gid", str(sb.uid),
               "--ready-fd", str(ready_w), "--info-fd", str(info_w), *rootless_args]
        if netfilter is not None:  # rootless network: rules for its own namespace (slirp.py)
            rules_r, rules_w = os.pipe()
            os.write(rules_w, netfilter)  # a few hundred bytes: well within a pipe's buffer
            os.close(rules_w)
            cmd += ["--netfilter-fd", str(rules_r)]
            pass_fds.append(rules_r)
        for p in procs:
            cmd += ["--cgroup-procs", str(p)]
        if sb.dev_bytes:
            cmd += ["--dev-size", str(sb.dev_bytes)]
        if zygote.enabled():  # pid 1 forks the commands (zygote.py)
            listener = zygote.listen(d)
            cmd += ["--zygote-fd", str(listener)]
            pass_fds.append(listener)
        cmd += ["--ov-lower", ":".join(str(p) for p in lower), "--ov-upper", str(d / "upper"),
                "--ov-work", str(d / "work"), "--ov-target", str(self._registry.sandbox_root / MOUNT_POINT),
                "--boot-id", new_boot_id()]
        return cmd


def new_boot_id() -> str:
    """A fresh random boot id for the sandbox's next boot (its create, a filesystem-only
    resume, a restore): pid 1 binds it read-only over /proc/sys/kernel/random/boot_id, so the
    sandbox sees a boot of its own, never the host's (hutch-nsexec's mask_boot_id)."""
    return str(uuid.uuid4())


def populate_upper(lower: list[Path], upper: Path, uid: int, rootless: bool = False,
                   resolv: str | None = None, user: str = USER) -> None:
    """The sandbox user's passwd entry, home and workspace, in this sandbox's layer only.
    ``lower``: the read-only layers, top first (an install layer may have added users).
    Over a spare skeleton (spares.py) the same calls rewrite what is there.

    Rootless, what we make here is ours, i.e. the sandbox user's inside (no chown
    needed or possible), and the world-writable directories of the runtime are made
    here too: overlayfs in a user namespace cannot copy up a directory whose owner
    (host root) has no uid inside, so /tmp would not be writable otherwise."""
    etc = upper / "etc"
    etc.mkdir(exist_ok=True)
    st = os.stat(layers.find_in_lowers(lower, "etc"))
    os.chmod(etc, st.st_mode & 0o7777)
    home = home_of(user)
    passwd, group = _lower_text(lower, "etc/passwd"), _lower_text(lower, "etc/group")
    for name, text in (("an account", passwd), ("a group", group)):
        if any(line.split(":", 1)[0] == user for line in text.splitlines()):
            # Two entries of one name: whose files are whose would be a guess.
            raise InvalidInput(f"user: {user!r} is already {name} of the runtime", field="user")
    _put(etc / "passwd", (passwd + f"{user}:x:{uid}:{uid}:{user}:{home}:/bin/bash\n").encode(), 0o644)
    _put(etc / "group", (group + f"{user}:x:{uid}:\n").encode(), 0o644)
    # Used only when the sandbox has network; harmless (unreachable) otherwise.
    _put(etc / "resolv.conf", (resolv or network.resolv_conf()).encode(), 0o644)
    for name in ("passwd", "group", "resolv.conf"):
        os.chmod(etc / name, 0o644)
    if trust.extra_certs() is not None:  # the operator's CAs (drivers/trust.py), root's: read-only here
        _put_in_lower_dirs(lower, upper, trust.BUNDLE,
                           trust.bundle(_lower_bytes(lower, trust.BUNDLE.lstrip("/"))))
    for rel, mode in [(home, 0o755), (rootfs.WORKSPACE, 0o755)] + [(t, 0o1777) for t in ROOTLESS_TMP if rootless]:
        path = upper / rel.lstrip("/")
        parent = path.parent
        if parent != upper and not parent.exists():
            parent.mkdir(parents=True)
            os.chmod(parent, os.stat(layers.find_in_lowers(lower, str(parent.relative_to(upper)))).st_mode & 0o7777)
        path.mkdir(exist_ok=True)
        if not rootless:
            os.chown(path, uid, uid)
        os.chmod(path, mode)


def _put_in_lower_dirs(lower: list[Path], upper: Path, path: str, data: bytes) -> None:
    """Write ``path`` in the upper layer, its missing parents made with the runtime's modes."""
    target = upper / path.lstrip("/")
    missing = [p for p in target.parents if p != upper and upper in p.parents and not p.exists()]
    for parent in reversed(missing):
        parent.mkdir()
        os.chmod(parent, os.stat(layers.find_in_lowers(lower, str(parent.relative_to(upper)))).st_mode & 0o7777)
    if target.is_symlink():  # a spare's earlier copy is a file; a runtime's bundle is never a link
        target.unlink()
    _put(target, data, 0o644)
    os.chmod(target, 0o644)


def _lower_bytes(lower: list[Path], rel: str) -> bytes:
    try:
        return (layers.find_in_lowers(lower, rel)).read_bytes()
    except (OSError, FileNotFoundError):
        return b""


_LOWER_TEXT: dict[str, tuple[float, str]] = {}


def _lower_text(lower: list[Path], rel: str) -> str:
    """A file of the read-only layers, read once per change (layers never change in
    place, but a rebuilt runtime may replace one)."""
    path = layers.find_in_lowers(lower, rel)
    mtime = os.stat(path).st_mtime
    key = str(path)
    hit = _LOWER_TEXT.get(key)
    if hit is None or hit[0] != mtime:
        hit = (mtime, path.read_text())
        _LOWER_TEXT[key] = hit
    return hit[1]


def _text(raw: bytes) -> str:
    return raw.decode(errors="replace").strip()[-2000:] or "(no output)"
