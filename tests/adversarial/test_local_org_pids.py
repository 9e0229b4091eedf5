"""Can one organization's fork bombs starve another organization's sandboxes of pids? Every
sandbox of a server is under one bound (HUTCH_SANDBOX_PIDS_TOTAL, test_local_pids_total.py):
an organization whose sandboxes each forked well within their own limit filled that bound,
and then no other organization's sandbox could fork until those processes ended. Now each
organization's sandboxes are under a share of it (HUTCH_ORG_PIDS; unset, half the bound), in
a cgroup of their own: the attacker's forks fail inside its own share, and another
organization's sandbox forks as before.

The bound is made small by its setting (not the host's pid_max filled). In process, the
local driver, embedded profile; the other organization's sandbox is claimed from the warm
pool, the attacker's made from scratch or claimed, as the pool has them.
"""

from __future__ import annotations

import asyncio
import glob
import time
from pathlib import Path
from typing import Any

import pytest

from hutch.api.keys import ENGINE
from hutch.core.errors import DriverFailure
from hutch.drivers.local.driver import LocalDriver
from tests.adversarial.test_local_pids_total import FORKS, HOLD, instance_pids, run
from tests.api.conftest import NODE, AppFactory
from tests.api.test_tenancy import bearer, new_key, new_org
from tests.drivers_support import built_runtimes, node_agents  # noqa: F401  (fixtures)

TOTAL = 64  # each organization's share: 32 (half); the attacker's 80 sleeps would fill it all


@pytest.mark.runs_on("local-embedded")
async def test_one_organizations_fork_bombs_leave_another_its_pids(make_api: AppFactory) -> None:
    api = await make_api(sandbox_pids_total=TOTAL)
    instance = instance_pids(api)
    attacker_org = await new_org(api, "attacker")
    attacker = bearer((await new_key(api, attacker_org, "member"))["secret"])
    victim_org = await new_org(api, "victim")
    victim = bearer((await new_key(api, victim_org, "member"))["secret"])
    mine = [(await api.data("POST", "/sandbox", json={}, headers=attacker, expect=201))["sandboxId"]
            for _ in range(2)]
    share = instance / f"_org-{attacker_org}"
    assert int((share / "pids.max").read_text()) == TOTAL // 2
    for sid in mine:  # together past the bound, each well within its own limit
        await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sh", "-c", HOLD]}, headers=attacker)
    end = time.monotonic() + 10
    while int((share / "pids.current").read_text()) < TOTAL // 2 - 2:
        assert time.monotonic() < end, f"the share was not reached: {(share / 'pids.current').read_text()}"
        await asyncio.sleep(0.05)
    # The attacker's further forks fail, in its own sandboxes.
    forked = await run(api, mine[0], ["sh", "-c", FORKS], headers=attacker)
    assert forked["exitCode"] != 0 and "forked" not in str(forked["stdout"]), forked
    # The other organization's sandbox, claimed from the warm pool (started before its
    # organization was known), forks as before.
    driver = api.client.server.app[ENGINE].parts.driver
    end = time.monotonic() + 30
    while not any(driver._pool.idle.values()) or driver._pool._filling:  # type: ignore[attr-defined]
        assert time.monotonic() < end, "the warm pool did not fill"
        await asyncio.sleep(0.02)
    pooled = {sb.init_pid for idle in driver._pool.idle.values() for sb in idle}  # type: ignore[attr-defined]
    other = (await api.data("POST", "/sandbox", json={}, headers=victim, expect=201))["sandboxId"]
    assert driver._registry.sandboxes[other].init_pid in pooled  # type: ignore[attr-defined]
    forked = await run(api, other, ["sh", "-c", FORKS], headers=victim)
    assert forked["exitCode"] == 0 and forked["stdout"] == "forked\n", forked
    assert (instance / f"_org-{victim_org}" / other).is_dir()
    assert int((instance / "pids.current").read_text()) <= TOTAL
    # Destroyed, an organization's last sandbox takes its share's cgroup with it.
    for sid in mine:
        await api.call("DELETE", f"/sandbox/{sid}", headers=attacker)
    assert not share.exists()
    status: dict[str, Any] = await api.data("GET", f"/sandbox/{other}", headers=victim)
    assert status["status"] in ("idle", "running"), status


def test_a_share_above_the_bound_is_refused_naming_its_setting(tmp_path: Path) -> None:
    with pytest.raises(DriverFailure, match=r"HUTCH_ORG_PIDS: expected at most the pids all sandboxes may hold "
                                            r"together \(HUTCH_SANDBOX_PIDS_TOTAL: 64\), got 100"):
        LocalDriver(tmp_path, tmp_path, pids_total=64, org_pids=100)


@pytest.mark.runs_on(*NODE)
async def test_a_node_agent_puts_each_sandbox_under_its_organizations_share(make_api: AppFactory) -> None:
    """The organization travels with the create to the agent (its ProvisionRequest), whose
    local driver holds its sandboxes to a share of its bound (half, unset)."""
    api = await make_api()
    org = await new_org(api, "nodeorg")
    key = bearer((await new_key(api, org, "member"))["secret"])
    sid = (await api.data("POST", "/sandbox", json={}, headers=key, expect=201))["sandboxId"]
    found = glob.glob(f"/sys/fs/cgroup/pids/hutch/*/_org-{org}/{sid}")
    assert len(found) == 1, found
    share, instance = Path(found[0]).parent, Path(found[0]).parent.parent
    assert int((share / "pids.max").read_text()) == int((instance / "pids.max").read_text()) // 2
    forked = await run(api, sid, ["sh", "-c", FORKS], headers=key)
    assert forked["exitCode"] == 0 and forked["stdout"] == "forked\n", forked
    await api.call("DELETE", f"/sandbox/{sid}", headers=key)
    assert not share.exists()
