"""The nomad driver's sandboxes from the attacker's side, held to the local driver's floor:
every way out that a network namespace alone does not close (vsock and the other socket
families, host devices, the host's abstract unix sockets and namespaces, IPC, the keyring,
io_uring), probed by the same script (tests/isolation/channel_probe.py), against the real
Nomad + containerd + runc of ``./scripts/services start nomad``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from drivers.base import ExecRequest, ProvisionRequest
from drivers.nomad.driver import NomadDriver
from tests.drivers_support import Recorder, new_id, start_nomad
from tests.isolation import channel_probe


@pytest.fixture
async def driver(tmp_path: Path) -> AsyncIterator[NomadDriver]:
    d = await start_nomad(tmp_path / "data")
    assert isinstance(d, NomadDriver)
    yield d
    for sid in list(d._sandboxes):
        await d.destroy(sid)
    await d.close()


@pytest.mark.parametrize("network", [False, True], ids=["network-off", "network-on"])
async def test_no_channel_around_the_network_namespace(driver: NomadDriver, network: bool) -> None:
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="python:3.13", network_enabled=network))
    sink = Recorder()
    with channel_probe.host_bait() as bait:
        result = await driver.exec(ExecRequest(new_id("ex"), sid, ["python3", "-c", channel_probe.SCRIPT,
                                                                    json.dumps(bait)]), sink)
    assert result.exit_code == 0, sink.stderr
    channel_probe.assert_sealed(json.loads(sink.stdout))


async def test_the_seccomp_profile_is_the_sandboxs(driver: NomadDriver) -> None:
    """The container's own view: a filter in force, no capabilities, no new privileges, and the
    calls hutch adds to containerd's profile refused as on the local driver."""
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="python:3.13"))
    sink = Recorder()
    code = ("import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print(open('/proc/self/status').read())\n"
            "for name, nr in [('io_uring_setup', 425), ('keyctl', 250), ('bpf', 321), ('unshare', 272)]:\n"
            "    rc = libc.syscall(ctypes.c_long(nr), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))\n"
            "    print(name, 'allowed' if rc >= 0 else errno.errorcode[ctypes.get_errno()])\n")
    result = await driver.exec(ExecRequest(new_id("ex"), sid, ["python3", "-c", code]), sink)
    assert result.exit_code == 0, sink.stderr
    status = dict(line.split(":", 1) for line in sink.stdout.splitlines() if ":" in line)
    assert status["Seccomp"].strip() == "2" and status["NoNewPrivs"].strip() == "1"
    assert status["CapEff"].strip() == status["CapBnd"].strip() == "0000000000000000"
    verdicts = dict(line.split() for line in sink.stdout.splitlines() if line.split()[:1] and line.split()[0] in
                    ("io_uring_setup", "keyctl", "bpf", "unshare"))
    assert verdicts == {"io_uring_setup": "ENOSYS", "keyctl": "EPERM", "bpf": "EPERM", "unshare": "EPERM"}, verdicts
