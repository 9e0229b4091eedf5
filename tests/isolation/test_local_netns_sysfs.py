"""The local driver's network set-up inside a network namespace whose /sys is not its own:
a node agent run in a cluster client's namespace (nsenter --net, or a Nomad raw_exec task of
a client that runs in one) sees the host's sysfs, where its veths do not show."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.drivers_support import require_root

pytestmark = pytest.mark.isolation

PROBE = """
import json, subprocess
from pathlib import Path
from hutch.drivers.local import network
subprocess.run(["ip", "link", "add", "hv0", "type", "veth", "peer", "name", "hv1"], check=True)
shown = json.loads(subprocess.run(["ip", "-j", "link", "show", "hv0"], capture_output=True, text=True, check=True).stdout)
print(json.dumps({"mac": network.link_mac("hv0"), "ip_says": shown[0]["address"],
                  "exists": network.link_exists("hv0"), "gone": network.link_exists("hv-none"),
                  "sysfs_sees_it": Path("/sys/class/net/hv0").exists()}))
"""


def test_links_are_read_in_the_namespace_not_through_sysfs() -> None:
    require_root()
    out = subprocess.run(["unshare", "--net", sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=60, check=False, env={**os.environ})
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert not seen["sysfs_sees_it"]  # the situation: the host's sysfs, blind to this namespace
    assert seen["mac"] == seen["ip_says"] and seen["exists"] and not seen["gone"], seen
