"""Snapshots that cannot be recorded are refused up front: a list of files past what one
snapshot's record holds (the production log appends it in one record batch) is a 400 naming
it, at the entry that passes it, on both profiles alike, with nothing left behind."""

from __future__ import annotations

import io
import posixpath
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hutch.api.keys import ENGINE
from hutch.drivers.fake.driver import HOME, FakeDriver
from tests.api.conftest import STORE, Api

FILES_RECORD_MAX = 6 * 2**20  # core.snapshots: what one snapshot's list of files may take
# Paths of ~1,000 bytes: 8,000 files' list takes ~9 MB, past the record's 6 MiB at ~5,500.
DEEP = "/".join(c * 199 for c in "abcd")
COUNT = 8_000


def long_names(count: int = COUNT) -> list[str]:
    return [f"{DEEP}/{i:05d}-{'e' * 190}.txt" for i in range(count)]


def many_files(names: list[str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tf:
        for name in names:
            tf.addfile(tarfile.TarInfo(name), io.BytesIO(b""))
    return buf.getvalue()


def engine(api: Api) -> Any:
    return api.client.server.app[ENGINE]


def spooled(api: Api) -> list[Path]:
    spool = engine(api).snapshots.archives.spool_dir
    return list(spool.iterdir()) if spool.exists() else []


def refused_for_files(body: dict[str, Any]) -> None:
    assert body["code"] == "INVALID_INPUT" and body.get("field") == "archive", body
    assert "too many files" in body["message"] and str(FILES_RECORD_MAX) in body["message"], body


@pytest.mark.runs_on(*STORE)  # the same limit over the embedded log and Kafka
async def test_a_build_listing_more_than_its_record_holds_is_refused_at_its_upload(api: Api) -> None:
    made = await api.data("POST", "/sandbox/snapshots/build", json={"runtime": "base:latest"}, expect=201)
    snapshot_id = made["snapshotId"]
    archive = many_files(long_names())
    assert len(archive) < 2**20  # small to send: its list is what is large
    refused_for_files(await api.call("PUT", f"/sandbox/snapshots/{snapshot_id}/upload", data=archive, expect=400))
    assert not await engine(api).snapshots.archives.exists(snapshot_id) and not spooled(api)
    # Nothing was stored to finalize: the build says so, not the log.
    gone = await api.call("POST", f"/sandbox/snapshots/{snapshot_id}/finalize", json={}, expect=400)
    assert "no archive was uploaded" in gone["message"], gone
    # One that fits is taken, on both profiles.
    fits = many_files(long_names(2_000))
    await api.call("PUT", f"/sandbox/snapshots/{snapshot_id}/upload", data=fits)
    done = await api.data("POST", f"/sandbox/snapshots/{snapshot_id}/finalize", json={})
    assert done["fileCount"] == 2_000


@pytest.mark.runs_on(*STORE)
async def test_a_take_listing_more_than_its_record_holds_stops_its_export(api: Api) -> None:
    sid = (await api.call("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["data"]["sandboxId"]
    driver: FakeDriver = engine(api).parts.driver
    box = driver.sandboxes[sid]
    for name in long_names():
        path = posixpath.join(HOME, name)
        box.files[path] = b""
        parent = posixpath.dirname(path)
        while parent not in box.dirs:
            box.dirs.add(parent)
            parent = posixpath.dirname(parent)
    reads = 0
    read_file = driver.read_file

    def counted(sandbox_id: str, path: str) -> Any:
        nonlocal reads
        reads += 1
        return read_file(sandbox_id, path)

    driver.read_file = counted  # type: ignore[method-assign]
    refused_for_files(await api.call("POST", f"/sandbox/{sid}/snapshot", json={"name": "many"}, expect=400))
    assert 5_000 < reads < 6_000, reads  # stopped at the file past the limit, not after all 8,000
    listed = await api.data("GET", "/sandbox/snapshots")
    assert listed["snapshots"] == [], listed
    assert not spooled(api)


# ---------------------------------------------------------------- the storage quota, as they are read

MiB = 2**20


async def small_org(api: Api, name: str) -> dict[str, str]:
    """An organization that may store 10 MiB, and its admin key's headers."""
    await api.data("POST", "/orgs", json={"name": name}, expect=201)
    key = (await api.data("POST", f"/keys?orgId=org_{name}", json={"role": "admin"}, expect=201))["secret"]
    await api.data("PATCH", f"/orgs/org_{name}/quota", json={"snapshotBytes": 10 * MiB})
    return {"Authorization": f"Bearer {key}"}


def over_quota(body: dict[str, Any]) -> None:
    assert body["code"] == "QUOTA_EXCEEDED" and body["quota"] == "snapshot_bytes", body


class ReadBytes:
    """What the driver's ``read_file`` hands out from here on (a snapshot's export reads every
    file through it), counted in ``bytes``: how far an export read before it stopped."""

    def __init__(self, driver: Any) -> None:
        self.bytes = 0
        read_file = driver.read_file

        async def counted(sandbox_id: str, path: str) -> AsyncIterator[bytes]:
            async for chunk in read_file(sandbox_id, path):
                self.bytes += len(chunk)
                yield chunk

        driver.read_file = counted


@pytest.mark.runs_on(*STORE)
async def test_a_take_or_fork_past_the_room_left_stops_its_export_there(api: Api) -> None:
    """50 files of 4 MiB (200 MiB) against 10 MiB of room: the export was read, compressed and
    spooled whole before the quota was checked; now it stops at the file that passes the room."""
    auth = await small_org(api, "roomy")
    sid = (await api.call("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201,
                          headers=auth))["data"]["sandboxId"]
    driver: FakeDriver = engine(api).parts.driver
    box = driver.sandboxes[sid]
    block = bytes(4 * MiB)
    for i in range(50):
        box.files[posixpath.join(HOME, f"big-{i:02d}.bin")] = block
    reads = ReadBytes(driver)
    over_quota(await api.call("POST", f"/sandbox/{sid}/snapshot", json={"name": "big"}, expect=403, headers=auth))
    assert reads.bytes <= 12 * MiB, reads.bytes  # two files fit the room; the third's header passes it
    reads.bytes = 0
    over_quota(await api.call("POST", f"/sandbox/{sid}/fork", json={"count": 1}, expect=403, headers=auth))
    assert reads.bytes <= 12 * MiB, reads.bytes
    assert (await api.data("GET", "/sandbox/snapshots", headers=auth))["snapshots"] == [] and not spooled(api)


@pytest.mark.runs_on(*STORE)
async def test_a_build_upload_that_unpacks_past_the_room_left_is_refused_as_it_arrives(api: Api) -> None:
    """A 100 KiB upload of a 100 MiB file was stored, and finalize read and hashed all of it
    before the quota was checked; now the upload is refused at the header past the room."""
    auth = await small_org(api, "tight")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("zeros.bin")
        info.size = 100 * MiB
        tf.addfile(info, io.BytesIO(bytes(info.size)))
    archive = buf.getvalue()
    assert len(archive) < MiB
    made = await api.data("POST", "/sandbox/snapshots/build", json={"runtime": "base:latest"}, expect=201,
                          headers=auth)
    snapshot_id = made["snapshotId"]
    over_quota(await api.call("PUT", f"/sandbox/snapshots/{snapshot_id}/upload", data=archive, expect=403,
                              headers=auth))
    assert not await engine(api).snapshots.archives.exists(snapshot_id) and not spooled(api)


async def run(api: Api, sid: str, script: str, auth: dict[str, str] | None = None) -> None:
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["bash", "-c", script]},
                        headers=auth or {})
    done = await api.data("GET", f"/sandbox/execution/{ex['executionId']}?wait=60s", headers=auth or {})
    assert done["exitCode"] == 0, done


@pytest.mark.runs_on("local-embedded", "local-production")  # a real workspace, both profiles
async def test_a_real_workspace_past_either_limit_is_refused_as_it_is_read(api: Api) -> None:
    auth = await small_org(api, "real")
    sid = (await api.call("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201,
                          headers=auth))["data"]["sandboxId"]
    driver = engine(api).parts.driver
    reads = ReadBytes(driver)
    # A sparse file costs the sandbox nothing and was read whole (3 GiB of zeros) before the check.
    await run(api, sid, "head -c 1048576 /dev/zero > a-small && truncate -s 3G b-sparse", auth)
    over_quota(await api.call("POST", f"/sandbox/{sid}/snapshot", json={"name": "sparse"}, expect=403, headers=auth))
    assert reads.bytes <= 2 * MiB, reads.bytes
    # Many files of long paths: refused at the one past the record's limit, on both profiles.
    # Paths of ~4,000 bytes (PATH_MAX is 4,096): the record passes its limit at ~1,550 files.
    deeper = "/".join(c * 249 for c in "abcdefghijklmno")
    await run(api, sid, f"rm b-sparse && mkdir -p {deeper} && cd {deeper} && "
                        f"for i in $(seq -w 1 2000); do : > $i-{'e' * 190}.txt; done", auth)
    await api.data("PATCH", "/orgs/org_real/quota", json={"snapshotBytes": None})
    refused_for_files(await api.call("POST", f"/sandbox/{sid}/snapshot", json={"name": "many"}, expect=400,
                                     headers=auth))
    assert (await api.data("GET", "/sandbox/snapshots", headers=auth))["snapshots"] == [] and not spooled(api)
