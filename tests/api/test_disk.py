"""resources.disk: a sandbox that writes past its limit gets ENOSPC inside while the host's
disk is untouched, and stays usable (delete and continue); the file API answers 413;
HUTCH_DEFAULT_DISK applies when a create gives none (the fake driver only records the limit:
the enforcement checks need a real one)."""

from __future__ import annotations

import base64

import pytest

from hutch.core.errors import InvalidInput
from hutch.service.config import Config
from tests.api.conftest import REAL, WIRE, Api, AppFactory


async def run(api: Api, sid: str, script: str) -> tuple[dict, str, str]:
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sh", "-c", script], "timeout": "60s"})
    done = await api.wait_execution(ex["executionId"])
    out, err = await api.stream(ex["stdoutStreamUrl"]), await api.stream(ex["stderrStreamUrl"])
    return done, out.decode(), err.decode()


@pytest.mark.runs_on(*WIRE, *REAL)  # the real drivers enforce it; the fake records it
async def test_writing_past_the_limit_is_enospc_and_the_sandbox_stays_usable(api: Api, driver_name: str) -> None:
    sid = (await api.data("POST", "/sandbox", expect=201,
                          json={"runtime": "base:latest", "resources": {"disk": "64Mi"}}))["sandboxId"]
    got = await api.data("GET", f"/sandbox/{sid}")
    assert got["resources"]["disk"] == "64Mi", got
    if driver_name == "fake":
        return
    # The workspace and the rest of the container's writable files share the one limit.
    done, out, err = await run(api, sid, "dd if=/dev/zero of=big bs=1M count=100 2>&1; echo rc=$?; "
                                         "dd if=/dev/zero of=/tmp/more bs=1M count=10 2>&1; echo rc=$?")
    assert "No space left on device" in out and "rc=1" in out, (out, err)
    # The file API meets the same wall, and says which path.
    blob = base64.b64encode(b"x" * (2 * 2**20)).decode()
    full = await api.call("POST", f"/fs/{sid}", json={"files": [{"path": "more.bin", "content": blob}]}, expect=413)
    assert "more.bin" in full["message"], full
    # Delete and continue: the room comes back.
    done, out, err = await run(api, sid, "rm -f big /tmp/more more.bin; dd if=/dev/zero of=again bs=1M count=40 2>&1 "
                                         "&& echo ok; df -k . | tail -1")
    assert done["exitCode"] == 0 and "ok" in out, (out, err)
    size_kib = int(out.strip().splitlines()[-1].split()[1])
    assert 40 * 1024 < size_kib <= 64 * 1024, out  # df shows the limit (less the file system's own metadata)


@pytest.mark.runs_on(*REAL)  # real disks only
async def test_a_limited_sandbox_checkpoints_and_restores(api: Api) -> None:
    sid = (await api.data("POST", "/sandbox", expect=201,
                          json={"runtime": "base:latest", "resources": {"disk": "48Mi"}}))["sandboxId"]
    await run(api, sid, "dd if=/dev/zero of=a bs=1M count=30 && echo first > f")
    await api.data("POST", f"/sandbox/{sid}/checkpoint", json={"name": "c1"}, expect=201)
    await run(api, sid, "echo second > f")
    # The restore needs no more room than the checkpoint (30 MiB of 48 twice would not fit).
    await api.call("POST", f"/sandbox/{sid}/checkpoint/c1/restore")
    _, out, _ = await run(api, sid, "cat f; stat -c %s a")
    assert out.split() == ["first", str(30 * 2**20)], out


@pytest.mark.runs_on(*WIRE, *REAL)  # recorded, and enforced by the real drivers
async def test_the_server_default_applies_when_a_create_gives_none(make_api: AppFactory, driver_name: str) -> None:
    api = await make_api(default_disk="32Mi")
    sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
    assert (await api.data("GET", f"/sandbox/{sid}"))["resources"]["disk"] == "32Mi"
    given = (await api.data("POST", "/sandbox", expect=201,
                            json={"runtime": "base:latest", "resources": {"disk": "80Mi"}}))["sandboxId"]
    assert (await api.data("GET", f"/sandbox/{given}"))["resources"]["disk"] == "80Mi"
    if driver_name != "fake":
        _, out, _ = await run(api, sid, "df -k . | tail -1")
        assert int(out.split()[1]) <= 32 * 1024, out


@pytest.mark.runs_on(*WIRE)  # refused while parsing
async def test_bad_disk_sizes_are_refused_by_name(api: Api) -> None:
    for bad in ("1Ki", "lots", -5):
        err = await api.call("POST", "/sandbox", json={"runtime": "base:latest", "resources": {"disk": bad}}, expect=400)
        assert err["field"] == "resources.disk", err
    with pytest.raises(InvalidInput, match="HUTCH_DEFAULT_DISK"):
        Config(default_disk="lots")
