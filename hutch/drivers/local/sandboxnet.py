"""A local sandbox's network: its routed veth with NAT out (as root, network.py) or its
slirp4netns (rootless, slirp.py), its exposed port and its ``network.allow`` list, kept
current as names move (drivers/egress.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import subprocess
import tempfile
from pathlib import Path

from hutch.core.egress import ALL_TRAFFIC
from hutch.core.errors import NotSupported
from hutch.drivers.egress import AllowLists, flatten, resolve
from hutch.drivers.local import network, slirp, uids
from hutch.drivers.local.helper import start_time
from hutch.drivers.local.nsexec import Nsexec
from hutch.drivers.local.state import LocalSandbox, Registry
from hutch.drivers.local.uids import UID_BASE


class SandboxNetwork:
    """The network side of the sandboxes of one driver."""

    def __init__(self, registry: Registry, nsexec: Nsexec, rootless: bool) -> None:
        self._registry = registry
        self._nsexec = nsexec
        self._rootless = rootless
        self.allow = AllowLists(self.apply_allow)  # network.allow, kept current (drivers/egress.py)
        self.slirps: dict[str, subprocess.Popen[bytes]] = {}  # rootless network, to reap
        self._slirp_dir: Path | None = None  # rootless ports: slirp4netns API sockets

    def sync(self, sb: LocalSandbox) -> None:
        """The sandbox's veth (network or a port) and its rules, before the veth: see network.py.

        Its meta.json says it has a network before any of it is made: a server killed half-way
        leaves a sandbox whose teardown (the next start's) undoes what was made. Written after,
        a kill between the two left its chain and jump in the host's firewall for good."""
        self._registry.write_meta(sb)
        if sb.network and (sb.allow or sb.deny):
            self._set_rules(sb, sb.allow)
        network.setup(sb.init_pid, sb.uid - UID_BASE, outbound=sb.network)

    def _set_rules(self, sb: LocalSandbox, allow: dict[str, list[str]]) -> None:
        network.set_rules(sb.uid - UID_BASE, allow=flatten(allow) if allow else None, deny=sb.deny,
                          generation=sb.rules_generation)

    async def apply_allow(self, sid: str, resolved: dict[str, list[str]]) -> None:
        """A refreshed allow-list (AllowLists): the sandbox's rules replaced whole."""
        cidrs = flatten(resolved)
        async with self._registry.lock(sid):
            asleep = self._registry.load(sid)
            if asleep is not None and asleep.asleep:
                # Paused filesystem-only: nothing of it sends; the resume sets these (sync).
                if set(resolved) == set(asleep.allow):
                    asleep.allow = resolved
                    self._registry.write_meta(asleep)
                return
            sb = self._registry.running(sid)
            if set(resolved) != set(sb.allow):
                return  # its list was replaced (update) while these names resolved
            if self._rootless:
                assert self._nsexec.path is not None
                await asyncio.to_thread(slirp.set_allowed, self._nsexec.path, sb.init_pid, cidrs)
            else:
                await asyncio.to_thread(self._set_rules, sb, resolved)
            sb.allow = resolved
            self._registry.write_meta(sb)

    async def update(self, sid: str, *, enabled: bool, allow: tuple[str, ...], deny: tuple[str, ...]) -> None:
        """A live sandbox's rules replaced whole (update_network), as root: its chain swapped in
        one commit under a new generation. Only a sandbox made with outbound network has a veth
        to route it out: one made without keeps none (off is what it has already)."""
        if self._rootless:
            raise NotSupported("network: a rootless server cannot change a running sandbox's egress rules",
                               field="network")
        resolved = await resolve(allow) if allow else {}  # first: a name that does not resolve changes nothing
        async with self._registry.lock(sid):
            sb = self._registry.running(sid)
            if not sb.network:
                if enabled:
                    raise NotSupported(f"network: sandbox {sid} was made without outbound network, and an update "
                                       "cannot give it one; create it with network enabled", field="network")
                return
            listed = {e: sorted(c) for e, c in resolved.items()}
            denied, generation = list(deny) if enabled else [ALL_TRAFFIC], sb.rules_generation + 1
            # Kept only once in force: a failed swap leaves the old rules, and the record says so.
            await asyncio.to_thread(network.set_rules, sb.uid - UID_BASE, allow=flatten(listed) if listed else None,
                                    deny=denied, generation=generation)
            sb.allow, sb.deny, sb.rules_generation = listed, denied, generation
            self._registry.write_meta(sb)
            if sb.allow:
                self.allow.replace(sid, resolved)
            else:
                self.allow.forget(sid)

    def port_target(self, sandbox_id: str) -> tuple[str, int]:
        sb = self._registry.running(sandbox_id)
        if sb.port is None:
            raise NotSupported(f"sandbox {sandbox_id} exposes no port", field="network.port")
        if sb.host_port is not None:  # rootless: slirp4netns's forward
            return "127.0.0.1", sb.host_port
        return str(network.address(sb.uid - UID_BASE)), sb.port

    async def start_slirp(self, sb: LocalSandbox, *, outbound: bool, port: int | None) -> None:
        """Rootless: the sandbox's slirp4netns, and its port forward if it exposes one."""
        api = self._slirp_socket(sb.id) if port is not None else None
        proc = await asyncio.to_thread(slirp.start, sb.init_pid, api)
        self.slirps[sb.id] = proc
        sb.network, sb.slirp_pid, sb.slirp_start = outbound, proc.pid, start_time(proc.pid)
        if api is not None and port is not None:
            sb.port, sb.host_port = port, await asyncio.to_thread(slirp.forward, api, port)

    def _slirp_socket(self, sid: str) -> Path:
        """Where a rootless sandbox's slirp4netns takes port forwards: a directory only we
        can enter (whoever reaches the socket could expose the sandbox's ports), with a
        short path (unix sockets allow 107 bytes)."""
        if self._slirp_dir is None:
            runtime = os.environ.get("XDG_RUNTIME_DIR")
            if runtime and os.path.isdir(runtime) and os.stat(runtime).st_uid == os.geteuid():
                self._slirp_dir = Path(runtime) / f"hutch-{os.getpid()}"
                self._slirp_dir.mkdir(mode=0o700, exist_ok=True)
            else:
                self._slirp_dir = Path(tempfile.mkdtemp(prefix="hutch-slirp-"))  # 0700, ours
        path = self._slirp_socket_path(sid)
        assert path is not None
        path.unlink(missing_ok=True)
        return path

    def _slirp_socket_path(self, sid: str) -> Path | None:
        if self._slirp_dir is None:
            return None
        return self._slirp_dir / f"{hashlib.sha256(sid.encode()).hexdigest()[:16]}.sock"

    async def teardown(self, sb: LocalSandbox) -> None:
        """Undo the sandbox's network, if it has one (its init already killed)."""
        if sb.slirp_pid:
            self.stop_slirp(sb)
        elif sb.network or sb.port is not None:
            await asyncio.to_thread(network.teardown, sb.uid - UID_BASE)

    async def teardown_unaccounted(self, sandbox_dir: Path) -> None:
        """Undo what network a sandbox whose meta.json cannot be read (torn by a kill in the
        middle of its write) may have: the rules and veths its uid's index names, each only if
        there. Its uid is still its own: the claim names its directory, which is still there."""
        if self._rootless:  # its slirp4netns, if any, is a child of its namespace: gone with it
            return
        uid = uids.held_by(sandbox_dir)
        if uid is not None:
            await asyncio.to_thread(network.teardown, uid - UID_BASE)

    def stop_slirp(self, sb: LocalSandbox) -> None:
        """Rootless: end the sandbox's slirp4netns (its namespace is going: teardown, or a
        filesystem-only pause, whose resume starts another)."""
        sock = self._slirp_socket_path(sb.id)
        if sock is not None:
            sock.unlink(missing_ok=True)
        proc = self.slirps.pop(sb.id, None)
        if proc is not None:  # ours: kill and reap
            proc.kill()
            proc.wait()
        elif sb.slirp_pid and start_time(sb.slirp_pid) == sb.slirp_start:  # an earlier server's
            with contextlib.suppress(ProcessLookupError):
                os.kill(sb.slirp_pid, signal.SIGKILL)
