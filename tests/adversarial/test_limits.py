"""Limits and quotas, from the attacker's side: a tenant who asks for nothing, or for a lot
of storage, gets exactly what the organization is counted for, and the host's memory, CPU
and disk stay out of reach.

Local driver (the one whose cgroups the host can read), on both profiles.
"""

from __future__ import annotations

import asyncio
import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hutch.api.keys import ENGINE
from hutch.core.errors import InvalidInput
from hutch.service.config import Config
from tests.api.conftest import AUTH, Api, AppFactory, make_api, profile  # noqa: F401  (fixtures)
from tests.drivers_support import require_root

pytestmark = pytest.mark.isolation

MIB = 2**20


@pytest.fixture
def driver_name() -> str:
    require_root()
    return "local"


async def run(api: Api, sid: str, script: str, timeout: str = "60s") -> tuple[dict, str, str]:
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sh", "-c", script], "timeout": timeout})
    done = await api.data("GET", f"/sandbox/execution/{ex['executionId']}?wait=90s")
    out, err = await api.stream(ex["stdoutStreamUrl"]), await api.stream(ex["stderrStreamUrl"])
    return done, out.decode(), err.decode()


def cgroup_file(controller: str, sid: str, name: str) -> str:
    """A sandbox's cgroup file as the host's administrator reads it (cgroup v1 here)."""
    found = glob.glob(f"/sys/fs/cgroup/{controller}/hutch/*/{sid}/{name}")
    assert len(found) == 1, (controller, sid, name, found)
    return Path(found[0]).read_text().strip()


async def test_a_sandbox_without_resources_is_held_to_what_it_is_counted_at(make_api: AppFactory) -> None:  # noqa: F811
    api = await make_api()
    engine = api.client.app[ENGINE]
    sid = (await api.data("POST", "/sandbox", json={"runtime": "python:3.13"}, expect=201))["sandboxId"]
    # The record says what it got, and the cgroup enforces that, not "unlimited".
    got = (await api.data("GET", f"/sandbox/{sid}"))["resources"]
    assert got["memory"] == "512Mi" and got["cpu"] == "1", got
    # /dev/shm is a memory file system inside the limit, not half the host's RAM.
    done, out, err = await run(api, sid, "df -B1 --output=size /dev/shm | tail -1")
    # The memory cgroup and the cpu limit are made before the sandbox's first command runs
    # (not at its create, where each memory cgroup and each quota write costs more the more
    # sandboxes the host holds: docs/idle.md).
    limit = int(cgroup_file("memory", sid, "memory.limit_in_bytes"))
    assert limit == 512 * MIB, limit
    assert int(out.strip()) <= limit, (out, err)
    quota_us = int(cgroup_file("cpu", sid, "cpu.cfs_quota_us"))
    period_us = int(cgroup_file("cpu", sid, "cpu.cfs_period_us"))
    assert quota_us == period_us, (quota_us, period_us)  # one core
    # The organization's usage counts exactly what the cgroup enforces.
    sb = await engine.reads.require(sid)
    used = await engine.quotas.usage(sb.spec.org_id)
    assert used["memory_bytes"] == limit and used["cpu_millis"] == quota_us * 1000 // period_us, used
    # tmpfs pages are charged to the sandbox's memory cgroup: 100 MiB in /dev/shm shows in
    # its memory.stat as shared memory.
    done, out, err = await run(api, sid, "dd if=/dev/zero of=/dev/shm/charged bs=1M count=100 2>&1; echo rc=$?")
    assert "rc=0" in out, (out, err)
    # The kernel folds its per-cpu counters into memory.stat lazily (a periodic flush, every 2 s
    # at the latest): a read right after the write may show part of it (82 of 100 MiB once).
    for _ in range(50):
        stat = dict(line.split() for line in cgroup_file("memory", sid, "memory.stat").splitlines())
        if int(stat["total_shmem"]) >= 100 * MIB:
            break
        await asyncio.sleep(0.1)
    assert int(stat["total_shmem"]) >= 100 * MIB, stat
    await run(api, sid, "rm -f /dev/shm/charged")
    # Past the limit in memory: the hog is killed, the sandbox lives on.
    done, out, err = await run(api, sid, "python3 -c 'x = b\"\\x01\" * (700 << 20); print(\"kept\", len(x))'")
    assert done["exitCode"] != 0 and "kept" not in out, (done, out, err)
    # Past it in /dev/shm: refused (no space) or killed, never kept.
    done, out, err = await run(api, sid, "dd if=/dev/zero of=/dev/shm/fill bs=1M count=700 2>&1; echo rc=$?; "
                                         "stat -c %s /dev/shm/fill")
    kept = int(out.strip().splitlines()[-1]) if out.strip().splitlines()[-1].isdigit() else 0
    assert "rc=0" not in out and kept < limit, (done, out, err)
    assert int(cgroup_file("memory", sid, "memory.max_usage_in_bytes")) <= limit
    done, out, _ = await run(api, sid, "rm -f /dev/shm/fill; echo alive")
    assert out.strip() == "alive", out


BAD_SETTINGS = [("HUTCH_DEFAULT_MEMORY", "lots"), ("HUTCH_DEFAULT_MEMORY", "1Mi"), ("HUTCH_DEFAULT_CPU", "fast"),
                ("HUTCH_DEFAULT_CPU", "-1"), ("HUTCH_DEFAULT_PIDS", "many"), ("HUTCH_SANDBOX_EGRESS_PERMIT", "8.8.8.0/24"),
                ("HUTCH_MAX_CHECKPOINTS", "0"), ("HUTCH_MAX_CHECKPOINT_BYTES", "lots")]


def test_a_bad_default_fails_the_server_start_naming_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each setting as `hutch serve` reads it (in process: a server start costs seconds) ...
    for setting, value in BAD_SETTINGS:
        with monkeypatch.context() as m:
            m.setenv(setting, value)
            with pytest.raises(InvalidInput) as caught:
                Config.from_env(data_dir=tmp_path)
            assert caught.value.message.startswith(setting), (setting, caught.value.message)
    # ... and one through the real command: it stops before serving, saying which.
    env = {**os.environ, "HUTCH_DEFAULT_MEMORY": "lots", "HUTCH_DATA_DIR": str(tmp_path), "HUTCH_DRIVER": "fake",
           "HUTCH_PORT": "0"}
    try:
        proc = subprocess.run([sys.executable, "-m", "hutch", "serve"], env=env, capture_output=True, text=True,
                              timeout=30)
    except subprocess.TimeoutExpired as err:
        raise AssertionError("the server started with HUTCH_DEFAULT_MEMORY='lots'") from err
    assert proc.returncode != 0 and "HUTCH_DEFAULT_MEMORY" in proc.stderr, (proc.returncode, proc.stderr[-2000:])


# Another user of the host, looking for secrets where `ps` and /proc show them: every
# process's command line, and the environment of every process it may read.
SCANNER = r"""
import os, select, sys, time
secret = sys.stdin.buffer.readline().strip()  # not on our own command line
hits = set()
while not select.select([sys.stdin], [], [], 0)[0]:  # until the test closes our stdin
    for pid in filter(str.isdigit, os.listdir("/proc")):
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as fh:
                    if secret in fh.read():
                        hits.add(f"{part} of pid {pid}")
            except OSError:
                pass
    time.sleep(0.005)
print("\n".join(sorted(hits)) or "none", flush=True)
"""


async def test_env_secrets_are_in_no_command_line_or_readable_environment(make_api: AppFactory) -> None:  # noqa: F811
    api = await make_api()
    secret = "s3cr3t-" + os.urandom(8).hex()
    scanner = await asyncio.create_subprocess_exec(
        "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-I", "-c", SCANNER,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert scanner.stdin is not None
    scanner.stdin.write(secret.encode() + b"\n")
    await scanner.stdin.drain()
    try:
        sid = (await api.data("POST", "/sandbox", expect=201,
                              json={"runtime": "base:latest", "env": {"SECRET": secret}}))["sandboxId"]
        await api.data("PATCH", f"/sandbox/env/{sid}", json={"env": {"OTHER": secret + "-2"}})
        for _ in range(5):
            _, out, _ = await run(api, sid, 'sleep 0.3; test "$SECRET" = "${OTHER%-2}" && echo same')
            assert out.strip() == "same", out  # the command got the secret
    finally:
        scanner.stdin.close()
        found, _ = await asyncio.wait_for(scanner.communicate(), 30)
    assert scanner.returncode == 0 and found.decode().strip() == "none", found


async def test_checkpoints_are_bounded_per_sandbox_and_counted(make_api: AppFactory) -> None:  # noqa: F811
    api = await make_api(max_checkpoint_bytes="200Mi")
    engine = api.client.app[ENGINE]
    sid = (await api.data("POST", "/sandbox", expect=201,
                          json={"runtime": "base:latest", "resources": {"disk": "64Mi"}}))["sandboxId"]
    _done, out, err = await run(api, sid, "dd if=/dev/urandom of=blob bs=1M count=50 2>&1; echo rc=$?")
    assert "rc=0" in out, (out, err)
    # 20 checkpoints of 50 MiB: 1,000 MB of the host's disk outside the sandbox's 64Mi.
    taken, refused = 0, None
    for i in range(20):
        resp = await api.client.post(f"/sandbox/{sid}/checkpoint", json={"name": f"c{i}"}, headers=AUTH)
        if resp.status != 201:
            refused = (resp.status, await resp.json())
            break
        taken += 1
    assert refused is not None and refused[0] == 403, (taken, refused)
    assert refused[1]["code"] == "QUOTA_EXCEEDED" and refused[1]["quota"] == "checkpoint_bytes", refused
    on_disk = sum(f.stat().st_blocks * 512 for f in (engine.parts.driver.data_dir / "sandboxes" / sid / "checkpoints").rglob("*")
                  if f.is_file() and not f.is_symlink())
    assert taken >= 3 and on_disk <= 200 * MIB, (taken, on_disk)
    listed = await api.data("GET", f"/sandbox/checkpoints/{sid}")
    assert len(listed["checkpoints"]) == taken, listed
    used = await engine.quotas.usage((await engine.reads.require(sid)).spec.org_id)
    assert used["checkpoint_bytes"] >= taken * 50 * MIB and used["storage_bytes"] >= used["checkpoint_bytes"], used
    # And by count: small ones stop at HUTCH_MAX_CHECKPOINTS (10 by default).
    small = (await api.data("POST", "/sandbox", expect=201, json={"runtime": "base:latest"}))["sandboxId"]
    statuses = []
    for i in range(11):
        resp = await api.client.post(f"/sandbox/{small}/checkpoint", json={"name": f"s{i}"}, headers=AUTH)
        statuses.append((resp.status, (await resp.json()).get("quota")))
    assert statuses[:10] == [(201, None)] * 10 and statuses[10] == (403, "checkpoints"), statuses


async def test_an_upload_over_the_storage_quota_is_refused_before_its_bytes_land(make_api: AppFactory) -> None:  # noqa: F811
    api = await make_api()
    engine = api.client.app[ENGINE]
    org = (await api.data("POST", "/orgs", json={"name": "uploaders"}, expect=201))["id"]
    await api.data("PATCH", f"/orgs/{org}/quota", json={"snapshotBytes": 1 * MIB})

    async def build() -> tuple[str, str]:
        made = await api.data("POST", "/sandbox/snapshots/build", expect=201,
                              json={"runtime": "base:latest", "orgId": org, "force": True})
        return made["snapshotId"], made["uploadUrl"].split("://", 1)[1].split("/", 1)[1]

    async def stored(snapshot_id: str) -> bool:
        return await engine.snapshots.archives.exists(snapshot_id)

    async def upload(path: str, body: object) -> tuple[int, dict]:
        resp = await api.client.put("/" + path, data=body)  # the presigned URL: no key
        return resp.status, await resp.json()

    # Within the quota: stored, and counted before it is finalized.
    first, path = await build()
    assert (await upload(path, b"\0" * (600 * 1024)))[0] == 200
    assert (await api.data("GET", f"/orgs/{org}"))["usage"]["uploadBytes"] == 600 * 1024
    # Past what is left (Content-Length says so): refused before a byte is stored.
    second, path = await build()
    status, body = await upload(path, b"\0" * (600 * 1024))
    assert status == 403 and body["code"] == "QUOTA_EXCEEDED" and not await stored(second), (status, body)

    # Without a Content-Length: refused the moment it passes what is left, nothing kept.
    async def chunks():
        for _ in range(8):
            yield b"\0" * (128 * 1024)

    status, body = await upload(path, chunks())
    assert status == 403 and body["code"] == "QUOTA_EXCEEDED" and not await stored(second), (status, body)
    # An organization over its quota (lowered by the operator) stores not one more byte.
    await api.data("PATCH", f"/orgs/{org}/quota", json={"snapshotBytes": 100 * 1024})
    status, body = await upload(path, b"x")
    assert status == 403 and body["code"] == "QUOTA_EXCEEDED" and not await stored(second), (status, body)
    # Never finalized: expired with its upload, and no longer counted.
    assert first in await engine.snapshots.expire_builds(older_than=0)
    assert not await stored(first) and (await api.data("GET", f"/orgs/{org}"))["usage"]["uploadBytes"] == 0
