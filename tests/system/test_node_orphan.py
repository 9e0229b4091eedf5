"""Nothing half-made on the node path (issue 35). A node-driver create is one append after the
agent made the sandbox (Create and Start together): an API replica killed -9 between the two
leaves the agent holding a sandbox no event records. Once the dead replica's lease lapsed, the
surviving replica that takes its sandboxes over ends it on its node, and nothing of it is left
on the host (process, cgroup, mount, loop device, network namespace, veth, iptables chain). A
live replica's create on its way to the log is left to it, by the take-over and by a replica
starting meanwhile (its recovery). An append that began while the lease held and lands after a
survivor ended the sandbox records it failed, naming why, never live, and its client is told so."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import urllib.error
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hutch.core.replicas import LEASE_SECONDS, RENEW_SECONDS
from tests.drivers_support import (
    NODE_SECRET,
    NodeAgents,
    built_runtimes,  # noqa: F401  (fixture)
    require_root,
)
from tests.system import host_traces
from tests.system.server import Server

pytestmark = pytest.mark.slow

# Every kind of host state a sandbox holds: a network with an allow-list (a veth, an iptables
# chain) and a disk limit (a loop device, a mount), besides its processes and cgroups.
SPEC: dict[str, Any] = {"runtime": "base:latest", "resources": {"cpu": "250m", "disk": "32Mi"},
                        "network": {"enabled": True, "allow": ["192.0.2.0/24"]}}
KINDS = {"cgroup", "process", "network", "mount", "loop", "veth", "iptables:"}
# The lease lapses, a survivor's take-over round (every RENEW_SECONDS) claims it; the rest is
# this shared machine's slack.
ENDED_WITHIN = LEASE_SECONDS + 2 * RENEW_SECONDS + 10


def _on_nodes(agents: NodeAgents) -> dict[str, set[str]]:
    return {name: {s for s in host_traces.look(agents.root / name).sandboxes if s.startswith("sbx_")}
            for name in agents.addresses}


def test_a_sandbox_its_replica_died_before_recording_is_ended(tmp_path: Path, built_runtimes: Path,  # noqa: F811
                                                              shared: Callable[[], dict[str, str]]) -> None:
    require_root()
    # No warm spares: the agent's every cgroup is then the orphan's, and "nothing left" exact.
    agents = NodeAgents(tmp_path / "nodes", env={"HUTCH_WARM_POOL": "0"})
    env = {"HUTCH_NODE_SECRET": NODE_SECRET, "HUTCH_NODE_AGENTS": agents.spec, **shared()}
    survivor = Server(tmp_path / "b", driver="node", **env).start()
    doomed = Server(tmp_path / "a", driver="node", HUTCH_CRASH_AT="create-made-unrecorded", **env).start()
    try:
        before = _on_nodes(agents)
        with pytest.raises((ConnectionError, urllib.error.URLError)):  # no answer: the replica is gone, the create never acknowledged
            doomed.call("POST", "/sandbox", SPEC)
        assert doomed.proc is not None and doomed.proc.wait(10) == -9, "the replica did not die at the crash point"
        killed = time.monotonic()
        made = {name: sids - before[name] for name, sids in _on_nodes(agents).items()}
        orphans = [(name, sid) for name, sids in made.items() for sid in sids]
        assert len(orphans) == 1, f"expected the agent to hold the one sandbox made: {made}"
        node, orphan = orphans[0]
        node_dir = agents.root / node
        at_kill = host_traces.look(node_dir)
        held = {t.split()[0] for t in host_traces.leftovers(node_dir, at_kill)}
        assert held >= KINDS, f"the orphan holds no {KINDS - held}: its end would prove nothing"
        # No event records it: nobody can reach it through the API.
        status, _ = survivor.call("GET", f"/sandbox/{orphan}?includeDeleted=true")
        assert status == 404

        while orphan in host_traces.look(node_dir).sandboxes:
            assert time.monotonic() - killed < ENDED_WITHIN, (
                f"{orphan} still runs on {node} {ENDED_WITHIN:.0f} s after its replica died: nothing recorded it")
            time.sleep(0.5)
        print(f"the orphan was ended {time.monotonic() - killed:.1f} s after its replica died")
        assert not host_traces.leftovers(node_dir, at_kill)
        status, _ = survivor.call("GET", f"/sandbox/{orphan}?includeDeleted=true")
        assert status == 404  # ended, not recorded after the fact
    finally:
        with contextlib.suppress(Exception):
            survivor.destroy_every_sandbox()
        for s in (doomed, survivor):
            s.stop()
        agents.stop()
        agents.reap()


def test_a_live_replicas_create_on_its_way_to_the_log_is_left_to_it(
        tmp_path: Path, built_runtimes: Path, shared: Callable[[], dict[str, str]]) -> None:  # noqa: F811
    """The create is held between the agent's answer and its append for longer than a lease
    (its replica renews meanwhile): the other replica's take-over rounds and a third replica's
    start-up recovery see a sandbox no event records, owned by a live replica, and leave it."""
    require_root()
    agents = NodeAgents(tmp_path / "nodes")
    env = {"HUTCH_NODE_SECRET": NODE_SECRET, "HUTCH_NODE_AGENTS": agents.spec, **shared()}
    hold = LEASE_SECONDS + 3 * RENEW_SECONDS
    other = Server(tmp_path / "b", driver="node", **env).start()
    slow = Server(tmp_path / "a", driver="node", HUTCH_CRASH_AT=f"create-made-unrecorded:{hold:.0f}", **env).start()
    late: Server | None = None
    try:
        answer: list[Any] = []
        creating = threading.Thread(target=lambda: answer.append(slow.call("POST", "/sandbox", SPEC, timeout=60)))
        began = time.monotonic()
        creating.start()
        deadline = began + 10
        while not any(_on_nodes(agents).values()):  # made, and held before its append
            assert time.monotonic() < deadline, "the agent made no sandbox within 10 s"
            time.sleep(0.1)
        late = Server(tmp_path / "c", driver="node", **env).start()  # its recovery runs during the hold
        creating.join(hold + 30)
        status, body = answer[0]
        assert status in (200, 201), (status, body)
        sid = body["data"]["sandboxId"]
        assert body["data"]["status"] == "idle"
        assert time.monotonic() - began >= hold
        for s in (slow, other, late):
            assert s.data("GET", f"/sandbox/{sid}")["status"] == "idle"
        ex = other.data("POST", f"/sandbox/{sid}/execute", {"command": ["echo", "kept"]})
        done = other.data("GET", f"/sandbox/execution/{ex['executionId']}?wait=10s")
        assert done["exitCode"] == 0, done
    finally:
        for s in (slow, other, late):
            if s is not None:
                with contextlib.suppress(Exception):
                    s.destroy_every_sandbox()
                s.stop()
        agents.stop()
        agents.reap()


def _stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP): its state in /proc is T."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    return False


def test_an_append_landing_after_a_survivor_ended_the_sandbox_records_it_failed(
        tmp_path: Path, built_runtimes: Path, shared: Callable[[], dict[str, str]]) -> None:  # noqa: F811
    """The replica vouched for its lease, then froze whole (SIGSTOP: its renewals too) before its
    append: the lease lapses, a survivor claims the sandbox no event records and ends it on its
    node. Then the frozen replica resumes and its append lands: the sandbox is recorded
    ``failed`` with the survivor's reason (not ``idle``: it is gone), and the client that waited
    on the append is answered an error naming why."""
    require_root()
    agents = NodeAgents(tmp_path / "nodes", env={"HUTCH_WARM_POOL": "0"})
    env = {"HUTCH_NODE_SECRET": NODE_SECRET, "HUTCH_NODE_AGENTS": agents.spec, **shared()}
    survivor = Server(tmp_path / "b", driver="node", **env).start()
    frozen = Server(tmp_path / "a", driver="node", HUTCH_CRASH_AT="create-vouched-unrecorded:stop", **env).start()
    try:
        before = _on_nodes(agents)
        answer: list[Any] = []

        def create() -> None:
            try:
                answer.append(frozen.call("POST", "/sandbox", SPEC, timeout=120))
            except (ConnectionError, urllib.error.URLError) as err:
                answer.append(err)

        creating = threading.Thread(target=create)
        creating.start()
        assert frozen.proc is not None
        deadline = time.monotonic() + 30
        while not _stopped(frozen.proc.pid):
            assert time.monotonic() < deadline, "the replica did not stop at its append within 30 s"
            time.sleep(0.1)
        stopped = time.monotonic()
        orphans = [(name, sid) for name, sids in _on_nodes(agents).items() for sid in sids - before[name]]
        assert len(orphans) == 1, orphans
        node, orphan = orphans[0]
        node_dir = agents.root / node
        while orphan in host_traces.look(node_dir).sandboxes:
            assert time.monotonic() - stopped < ENDED_WITHIN, f"{orphan} was not ended by the survivor"
            time.sleep(0.5)
        os.kill(frozen.proc.pid, signal.SIGCONT)  # its append goes on, and lands late
        creating.join(120)
        assert answer, "the create was never answered"
        deadline = time.monotonic() + 20
        while (found := survivor.call("GET", f"/sandbox/{orphan}?includeDeleted=true"))[0] == 404:
            assert time.monotonic() < deadline, f"the late append never landed; the create's answer: {answer[0]}"
            time.sleep(0.2)
        status, body = found
        assert status == 200, found
        sb = body["data"]
        assert sb["status"] == "failed", f"recorded {sb['status']}, but it is gone from {node}: {sb}"
        assert "was lost" in sb.get("reason", "") and "ended" in sb.get("reason", ""), sb
        late = answer[0]
        print(f"recorded late: {sb['status']} ({sb['reason']}); the client was answered {late}")
        assert isinstance(late, tuple), f"the client got no answer: {late!r}"
        code, reply = late
        assert code == 503, late
        assert reply["code"] == "REPLICA_UNAVAILABLE" and "ended" in reply["message"], reply
        assert orphan not in host_traces.look(node_dir).sandboxes
    finally:
        if frozen.proc is not None and frozen.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.kill(frozen.proc.pid, signal.SIGCONT)
        with contextlib.suppress(Exception):
            survivor.destroy_every_sandbox()
        for s in (frozen, survivor):
            s.stop()
        agents.stop()
        agents.reap()
