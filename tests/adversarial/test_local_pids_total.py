"""Can one tenant's sandboxes take every pid of the host? Each sandbox has its own pids limit
(1024 unless asked), but the host has one pid_max (32768 here): ~32 sandboxes of one tenant,
each well within its own limit, took every pid, and then the server, every other tenant's
sandbox and the host's own services could not fork. Now every sandbox of a server is under
one bound (HUTCH_SANDBOX_PIDS_TOTAL; unset, pid_max less a reserve for the host): the
attacker's forks fail inside its own sandboxes, and the server still makes sandboxes (with a
network: it runs ``ip``), runs commands in them and destroys them.

The bound is made small by its setting (not the host's pid_max filled), and one
organization's share of it (HUTCH_ORG_PIDS, test_local_org_pids.py) is the whole of it here,
so that one tenant reaches it. In process, the local driver, embedded profile.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path
from typing import Any

import pytest

from hutch.api.keys import ENGINE
from tests.api.conftest import AUTH, Api, AppFactory
from tests.api.test_tenancy import bearer, new_key, new_org

pytestmark = pytest.mark.runs_on("local-embedded")

TOTAL = 48
# 40 sleeps a sandbox, 80 in all: the bound stops them first (leaving at most 2 pids).
HOLD = "i=0; while [ $i -lt 40 ]; do sleep 600 & i=$((i+1)); done; wait"
FORKS = "sleep 0 & sleep 0 & sleep 0 & wait; echo forked"  # 4 forks: more than the 2 the bound may leave


def instance_pids(api: Api) -> Path:
    driver = api.client.server.app[ENGINE].parts.driver
    instance = hashlib.sha256(str(driver.data_dir.resolve()).encode()).hexdigest()[:12]  # type: ignore[attr-defined]
    return Path("/sys/fs/cgroup/pids/hutch", instance)


async def run(api: Api, sid: str, argv: list[str], headers: dict[str, str] = AUTH) -> dict[str, Any]:
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": argv}, headers=headers)
    done: dict[str, Any] = await api.data("GET", f"/sandbox/execution/{ex['executionId']}?wait=10s", headers=headers)
    done["stdout"] = (await api.stream(ex["stdoutStreamUrl"])).decode()
    return done


async def test_one_tenants_sandboxes_cannot_take_every_pid(make_api: AppFactory) -> None:
    api = await make_api(sandbox_pids_total=TOTAL, org_pids=TOTAL)
    cgroup = instance_pids(api)
    assert int((cgroup / "pids.max").read_text()) == TOTAL
    attacker = bearer((await new_key(api, await new_org(api, "attacker"), "member"))["secret"])
    mine = [(await api.data("POST", "/sandbox", json={}, headers=attacker, expect=201))["sandboxId"]
            for _ in range(2)]
    for sid in mine:  # together past the bound, each well within its own limit
        await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sh", "-c", HOLD]}, headers=attacker)
    # A shell ends at its first refused fork, its sleeps left; one that got all 40 waits on them.
    end = time.monotonic() + 10
    while int((cgroup / "pids.current").read_text()) < TOTAL - 2:
        assert time.monotonic() < end, f"the bound was not reached: {(cgroup / 'pids.current').read_text()}"
        await asyncio.sleep(0.05)
    # The attacker's further forks fail, in its own sandboxes.
    forked = await run(api, mine[0], ["sh", "-c", FORKS], headers=attacker)
    assert forked["exitCode"] != 0 and "forked" not in str(forked["stdout"]), forked
    # Another tenant still gets a sandbox, with a network (the server runs ip for it), and
    # runs a command in it; the server's own forks are not counted against the bound. A
    # memory the warm pool is not filled for: its pid 1 is launched at the bound.
    body = {"network": {"enabled": True}, "resources": {"memory": "300Mi"}}
    other = (await api.data("POST", "/sandbox", json=body, expect=201))["sandboxId"]
    said = await run(api, other, ["echo", "still here"])
    assert said["exitCode"] == 0 and said["stdout"] == "still here\n", said
    # A destroy works at the bound, and gives its room back at once.
    await api.call("DELETE", f"/sandbox/{mine[0]}", headers=attacker)
    forked = await run(api, other, ["sh", "-c", FORKS])
    assert forked["exitCode"] == 0 and forked["stdout"] == "forked\n", forked
    assert int((cgroup / "pids.current").read_text()) <= TOTAL
