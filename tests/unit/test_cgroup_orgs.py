"""cgroup v2's layout of organizations (cgroups.py): a sandbox's cgroup under its
organization's, whose pids.max is the organization's share. This host's controllers are on
cgroup v1 (where tests/adversarial/test_local_org_pids.py has the kernel enforce the share),
so v2 is checked here on a plain directory: which directories and files the code makes and
finds, not the kernel's enforcement."""

from __future__ import annotations

from pathlib import Path

import pytest

from hutch.core.errors import InvalidInput
from hutch.drivers.local.cgroups_v2 import CgroupV2


def test_v2_puts_each_sandbox_under_its_organizations_share(tmp_path: Path) -> None:
    cg = CgroupV2(tmp_path, frozenset({"pids", "memory"}))
    cg.setup(pids_total=100, org_pids=50)
    cg.create_sandbox("sbx_a", org="org_one", memory=None, cpu_millis=None, pids=20)
    cg.create_sandbox("sbx_b", org="org_two", memory=None, cpu_millis=None, pids=20)
    instance = tmp_path / "hutch" / "default"
    assert (instance / "pids.max").read_text() == "100"
    assert (instance / "_org-org_one" / "pids.max").read_text() == "50"
    assert (instance / "_org-org_one" / "cgroup.subtree_control").read_text()  # its sandboxes get controllers
    assert (instance / "_org-org_one" / "sbx_a" / "pids.max").read_text() == "20"
    assert cg.paths("sbx_b", "x-1") == [instance / "_org-org_two" / "sbx_b" / "x-1"]
    assert cg.sandboxes() == {"sbx_a", "sbx_b"}
    # A later server over the same instance finds each one under its organization's, and
    # writes the share it is given now.
    later = CgroupV2(tmp_path, frozenset({"pids", "memory"}))
    later.setup(pids_total=100, org_pids=30)
    assert later.paths("sbx_a") == cg.paths("sbx_a")
    assert (instance / "_org-org_two" / "pids.max").read_text() == "30"
    with pytest.raises(InvalidInput, match=r"org_id: expected letters, digits, '_', '.' and '-', got '../x'"):
        later.create_sandbox("sbx_c", org="../x", memory=None, cpu_millis=None, pids=20)
