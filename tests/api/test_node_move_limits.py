"""A sandbox moved to another node (``hutch node drain NODE --move``) is made again there from
its recorded spec: it must come back with every limit the server gives a sandbox, and with the
network rules it has now, not those of its create. Checked on the real agents' cgroups and
firewall (tests/drivers_support.py runs two local agents), not on what the API says."""

from __future__ import annotations

import glob
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hutch.api.keys import ENGINE
from hutch.core.driver_types import DEFAULT_PIDS
from hutch.service.defaults import SandboxDefaults
from tests.api.conftest import NODE, Api, AppFactory


def _cgroup(controller: str, sid: str, name: str) -> str:
    """The value of a sandbox's own cgroup file on this host (either agent's: the id is unique)."""
    found = glob.glob(f"/sys/fs/cgroup/{controller}/hutch/*/{sid}/{name}") \
        or glob.glob(f"/sys/fs/cgroup/{controller}/hutch/*/_org-*/{sid}/{name}") \
        or glob.glob(f"/sys/fs/cgroup/hutch/*/_org-*/{sid}/{name}") \
        or glob.glob(f"/sys/fs/cgroup/hutch/*/{sid}/{name}")  # cgroup v2
    assert len(found) == 1, (controller, sid, name, found)
    return Path(found[0]).read_text().strip()


async def _move_off_n1(api: Api, sid: str) -> None:
    drained = await api.data("POST", "/nodes/n1/drain", json={"move": True})
    assert [m["sandboxId"] for m in drained["moved"]] == [sid], drained
    assert (await api.data("GET", f"/sandbox/{sid}"))["node"] == "n2"


async def _run(api: Api, sid: str, script: str) -> bytes:
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sh", "-c", script]})
    done = await api.wait_execution(ex["executionId"])
    assert done["exitCode"] == 0, done
    return await api.stream(done["stdoutStreamUrl"])


@pytest.mark.runs_on(*NODE)  # moving is the node driver's
async def test_a_sandbox_recorded_without_limits_gets_the_servers_defaults_when_it_moves(
        make_api: AppFactory, node_agents: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A create recorded before service/defaults.py filled the spec (its resources empty):
    before, a move made it again with no memory and no cpu limit at all; now the server's
    defaults, as every create gets them (the disk's too, when the operator sets one)."""
    api = await make_api(default_memory="96Mi", default_cpu="500m", default_disk="64Mi")
    try:
        await api.data("POST", "/nodes/n2/drain", json={})  # made on n1
        with monkeypatch.context() as old_server:  # a server of before defaults.py: records what was asked
            old_server.setattr(SandboxDefaults, "apply", lambda self, spec, cpu_limit=True: spec)
            sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
        recorded = await api.client.app[ENGINE].parts.store.get_sandbox(sid)
        assert recorded is not None
        resources = recorded.spec.resources
        assert (resources.memory_bytes, resources.cpu_millis, resources.disk_bytes) == (None, None, None)
        await api.data("POST", "/nodes/n2/drain", json={"undo": True})

        await _move_off_n1(api, sid)
        await _run(api, sid, "true")  # the cpu limit is written before the first command (cgroups.py)
        assert int(_cgroup("memory", sid, "memory.limit_in_bytes")) == 96 * 2**20
        quota, period = int(_cgroup("cpu", sid, "cpu.cfs_quota_us")), int(_cgroup("cpu", sid, "cpu.cfs_period_us"))
        assert quota * 1000 // period == 500, (quota, period)
        assert int(_cgroup("pids", sid, "pids.max")) == DEFAULT_PIDS
        # And the kernel holds it there: 200 MiB of the moved sandbox's memory is killed.
        ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": [
            "sh", "-c", "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo kept ${#x}"]})
        done = await api.wait_execution(ex["executionId"])
        assert str(done.get("error")).startswith("killed: out of memory"), done
        assert b"kept" not in await api.stream(done["stdoutStreamUrl"]), done
        # The disk: a write past it is ENOSPC, and df shows the bound, not the node's disk.
        out = (await _run(api, sid, "dd if=/dev/zero of=big bs=1M count=100 2>&1; echo rc=$?; rm -f big; "
                                    "df -k . | tail -1")).decode()
        assert "No space left on device" in out and "rc=1" in out, out
        assert int(out.strip().splitlines()[-1].split()[1]) <= 64 * 1024, out
    finally:
        for name in ("n1", "n2"):
            await api.data("POST", f"/nodes/{name}/drain", json={"undo": True})


def _firewall() -> str:
    return subprocess.run(["iptables-save", "-t", "filter"], capture_output=True, text=True, check=True).stdout


@pytest.mark.runs_on(*NODE)
async def test_a_moved_sandbox_keeps_the_network_rules_it_has_now_not_those_of_its_create(api: Api) -> None:
    """``PUT /sandbox/{id}/network`` after the create: the move carries the rules in force."""
    first, then = (f"198.51.100.{n}/32" for n in random.sample(range(1, 255), 2))  # TEST-NET-2: reaches nothing
    try:
        await api.data("POST", "/nodes/n2/drain", json={})
        allowed = (await api.data("POST", "/sandbox", json={
            "runtime": "base:latest", "network": {"enabled": True, "allow": [first]}}, expect=201))["sandboxId"]
        off = (await api.data("POST", "/sandbox", json={
            "runtime": "base:latest", "network": {"enabled": True}}, expect=201))["sandboxId"]
        await api.data("PUT", f"/sandbox/{allowed}/network", json={"enabled": True, "allow": [then]})
        await api.data("PUT", f"/sandbox/{off}/network", json={"enabled": False})
        assert first not in _firewall() and then in _firewall()
        await api.data("POST", "/nodes/n2/drain", json={"undo": True})

        drained = await api.data("POST", "/nodes/n1/drain", json={"move": True})
        assert sorted(m["sandboxId"] for m in drained["moved"]) == sorted([allowed, off]), drained
        # The old copies are gone with their chains: what is in force is the new copy's.
        rules = _firewall()
        assert then in rules and first not in rules, rules
        shown = await api.data("GET", f"/sandbox/{allowed}")
        assert shown["networkAllow"] == [then], shown
        # Turned off before the move: the new copy has no way out at all, only loopback.
        devices = (await _run(api, off, "cat /proc/net/dev")).decode()
        assert [line.split(":")[0].strip() for line in devices.splitlines()[2:]] == ["lo"], devices
    finally:
        for name in ("n1", "n2"):
            await api.data("POST", f"/nodes/{name}/drain", json={"undo": True})
