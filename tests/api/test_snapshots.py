"""Snapshots through the wire: take, seed new sandboxes, tags, lineage, builds, deletes,
and every way in that must be refused (tar slips, both snapshot and runtime, unknown refs)."""

from __future__ import annotations

import base64
import io
import tarfile

import pytest

from tests.api.conftest import AUTH, REAL, STORE, Api


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def sandbox(api: Api, **body: object) -> str:
    return (await api.call("POST", "/sandbox", json=body, expect=201))["data"]["sandboxId"]


async def read(api: Api, sid: str, path: str, expect: int = 200) -> bytes:
    resp = await api.client.get(f"/fs/{sid}?path={path}", headers=AUTH)
    assert resp.status == expect, (resp.status, await resp.text())
    return await resp.read()


async def write(api: Api, sid: str, files: dict[str, bytes]) -> None:
    await api.call("POST", f"/fs/{sid}", json={"files": [{"path": p, "content": b64(c)} for p, c in files.items()]})


async def printenv(api: Api, sid: str, name: str) -> bytes:
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["printenv", name]})
    await api.wait_execution(ex["executionId"])
    return await api.stream(ex["stdoutStreamUrl"])


def tar_gz(entries: dict[str, bytes], *, links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o640
            tf.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tf.addfile(info)
    return buf.getvalue()


@pytest.mark.runs_on(*STORE, *REAL)  # real files in and out; archives in both blob stores
async def test_take_and_create_from_snapshot(api: Api) -> None:
    sid = await sandbox(api, runtime="base:latest", name="seed", env={"STAGE": "one", "KEEP": "yes"})
    await write(api, sid, {"app/main.py": b"print('hi')\n", "data.txt": b"x" * 1000})
    snap = await api.data("POST", f"/sandbox/{sid}/snapshot", json={"name": "myapp", "tag": "v1",
                                                                      "description": "first"}, expect=201)
    assert snap["snapshotId"].startswith("snp_") and snap["name"] == "myapp" and snap["tag"] == "v1"
    assert snap["fullName"] == "@local/myapp:v1" and snap["public"] is False and snap["user"]["id"]
    assert snap["fileCount"] == 2 and snap["sizeBytes"] == 1012 and snap["description"] == "first"
    assert snap["runtimeId"].startswith("srt_") and "parentSnapshotId" not in snap
    files = {f["path"]: f for f in snap["files"]}
    assert files["app/main.py"]["size"] == 12 and len(files["app/main.py"]["sha256"]) == 64
    assert files["app/main.py"]["contentType"] == "text/x-python"

    # The source sandbox changes afterwards; the snapshot does not.
    await write(api, sid, {"data.txt": b"changed"})
    for ref in (snap["snapshotId"], "myapp:v1", "@local/myapp:v1", "v1"):
        child = await sandbox(api, snapshot=ref, env={"STAGE": "two"})
        assert await read(api, child, "app/main.py") == b"print('hi')\n"
        assert await read(api, child, "data.txt") == b"x" * 1000
        info = await api.data("GET", f"/sandbox/{child}")
        assert info["snapshot"]["id"] == snap["snapshotId"] and info["runtime"]["name"] == "base:latest"
    assert await printenv(api, child, "STAGE") == b"two\n"  # the create's env on top of the snapshot's
    assert await printenv(api, child, "KEEP") == b"yes\n"

    made = await api.data("GET", f"/sandbox?snapshotId={snap['snapshotId']}")
    assert made["total"] == 4 and all(s["snapshot"]["id"] == snap["snapshotId"] for s in made["sandboxes"])

    # A snapshot of a sandbox made from a snapshot has it as parent: lineage walks back.
    await write(api, child, {"more.txt": b"more"})
    second = await api.data("POST", f"/sandbox/{child}/snapshot", json={"name": "myapp", "tag": "v2"}, expect=201)
    assert second["parentSnapshotId"] == snap["snapshotId"] and second["fileCount"] == 3
    lineage = await api.data("GET", "/sandbox/snapshots/lineage?name=myapp")
    assert [e["snapshotId"] for e in lineage["lineage"]] == [second["snapshotId"], snap["snapshotId"]]
    assert lineage["total"] == 2 and not any(e["deleted"] for e in lineage["lineage"])
    assert (await api.data("GET", "/sandbox/snapshots/lineage?name=myapp&tag=v1"))["total"] == 1
    # name= is a name, never a tag: "v2" tags a snapshot but names none.
    err = await api.call("GET", "/sandbox/snapshots/lineage?name=v2", expect=404)
    assert err["field"] == "name" and "v2" in err["message"]
    one = await api.data("GET", f"/sandbox/snapshots/lineage?snapshot={second['snapshotId']}&limit=1")
    assert [e["snapshotId"] for e in one["lineage"]] == [second["snapshotId"]]

    listed = await api.data("GET", f"/sandbox/snapshots?sandboxId={sid}")
    assert [s["snapshotId"] for s in listed["snapshots"]] == [snap["snapshotId"]] and listed["total"] == 1
    everything = await api.data("GET", "/sandbox/snapshots?sort=name&direction=asc&limit=1")
    assert everything["total"] == 2 and len(everything["snapshots"]) == 1

    # Deleting the parent: the child still works and lineage marks the parent deleted.
    await api.call("DELETE", f"/sandbox/snapshots/{snap['snapshotId']}")
    await api.call("GET", f"/sandbox/snapshots/{snap['snapshotId']}", expect=404)
    await api.call("DELETE", f"/sandbox/snapshots/{snap['snapshotId']}", expect=404)
    lineage = await api.data("GET", f"/sandbox/snapshots/lineage?snapshot={second['snapshotId']}")
    assert [e["deleted"] for e in lineage["lineage"]] == [False, True]
    err = await api.call("POST", "/sandbox", json={"snapshot": snap["snapshotId"]}, expect=404)
    assert err["code"] == "SNAPSHOT_NOT_FOUND"
    grandchild = await sandbox(api, snapshot=second["snapshotId"])
    assert await read(api, grandchild, "more.txt") == b"more"


@pytest.mark.runs_on(*STORE)  # the service's tags over the store
async def test_tags_move_and_clear(api: Api) -> None:
    sid = await sandbox(api)
    await write(api, sid, {"a": b"1"})
    first = await api.data("POST", f"/sandbox/{sid}/snapshot", json={"name": "tagged"}, expect=201)
    assert first["tag"] == "latest"
    second = await api.data("POST", f"/sandbox/{sid}/snapshot", json={"name": "tagged"}, expect=201)
    # "latest" moved to the newer one: a name:tag names one snapshot.
    assert (await api.data("GET", f"/sandbox/snapshots/{first['snapshotId']}")).get("tag") is None
    assert (await api.data("GET", "/sandbox/snapshots/tagged:latest"))["snapshotId"] == second["snapshotId"]
    back = await api.data("PATCH", f"/sandbox/snapshots/{first['snapshotId']}", json={"tag": "latest"})
    assert back["tag"] == "latest"
    assert (await api.data("GET", f"/sandbox/snapshots/{second['snapshotId']}")).get("tag") is None
    cleared = await api.data("PATCH", f"/sandbox/snapshots/{first['snapshotId']}", json={"tag": None})
    assert "tag" not in cleared
    await api.call("GET", "/sandbox/snapshots/tagged:latest", expect=404)
    # Bad tags and names name what was wrong.
    for body, field in (({"tag": "bad tag"}, "tag"), ({"tag": 5}, "tag"), ({}, "tag")):
        err = await api.call("PATCH", f"/sandbox/snapshots/{first['snapshotId']}", json=body, expect=400)
        assert err["field"] == field, err
    err = await api.call("POST", f"/sandbox/{sid}/snapshot", json={"name": "no/slash"}, expect=400)
    assert err["field"] == "name" and "no/slash" in err["message"]
    await api.call("PATCH", "/sandbox/snapshots/snp_missing", json={"tag": "x"}, expect=404)


@pytest.mark.runs_on(*STORE)  # the service's refusals over the store
async def test_create_refusals(api: Api) -> None:
    sid = await sandbox(api)
    snap = await api.data("POST", f"/sandbox/{sid}/snapshot", json={}, expect=201)
    err = await api.call("POST", "/sandbox", json={"snapshot": snap["snapshotId"], "runtime": "base:latest"}, expect=400)
    assert err["field"] == "snapshot" and "not both" in err["message"]
    err = await api.call("POST", "/sandbox", json={"snapshot": "nothing:here"}, expect=404)
    assert err["code"] == "SNAPSHOT_NOT_FOUND" and "nothing:here" in err["message"]
    err = await api.call("POST", "/sandbox", json={"snapshot": 7}, expect=400)
    assert err["field"] == "snapshot"
    await api.call("POST", "/sandbox/sbx_missing/snapshot", json={}, expect=404)
    # A sandbox that has ended (a finished oneshot: terminated) cannot be snapshotted: 409.
    ended = (await api.call("POST", "/sandbox", json={"command": {"exec": ["echo", "x"], "mode": "oneshot"}},
                            expect=201))["data"]
    await api.data("GET", f"/sandbox/status/{ended['sandboxId']}?waitForStatus=terminated&waitMs=10000")
    err = await api.call("POST", f"/sandbox/{ended['sandboxId']}/snapshot", json={}, expect=409)
    assert "terminated" in err["message"] and "only a live sandbox" in err["message"]
    await api.call("DELETE", f"/sandbox/{sid}")
    await api.call("POST", f"/sandbox/{sid}/snapshot", json={}, expect=404)
    # Snapshots outlive the sandbox they came from.
    assert (await api.data("GET", f"/sandbox/snapshots/{snap['snapshotId']}"))["sourceSandboxId"] == sid
    child = await sandbox(api, snapshot=snap["snapshotId"])
    assert (await api.data("GET", f"/sandbox/{child}"))["status"] == "idle"


@pytest.mark.runs_on(*STORE, *REAL)  # both blob stores; a real sandbox made from the build
async def test_build_upload_finalize(api: Api) -> None:
    init = await api.data("POST", "/sandbox/snapshots/build", json={
        "runtime": "base:latest", "name": "built", "tag": "v1", "message": "first build", "contentHash": "abc123",
    }, expect=201)
    snapshot_id, url = init["snapshotId"], init["uploadUrl"]
    assert "token=" in url
    # Not visible, not usable, until finalized.
    await api.call("GET", f"/sandbox/snapshots/{snapshot_id}", expect=404)
    await api.call("POST", "/sandbox", json={"snapshot": "built:v1"}, expect=404)
    archive = tar_gz({"bin/tool.sh": b"echo built\n", "conf/app.ini": b"[a]\n"})
    # The presigned URL works without a key, and only for its own snapshot.
    path = "/" + url.split("://", 1)[1].split("/", 1)[1]
    bad = await api.client.put(path.replace(snapshot_id, "snp_other"), data=archive)
    assert bad.status == 401
    forged = await api.client.put(path.split("?")[0] + "?token=" + "0" * 64, data=archive)
    assert forged.status == 401
    resp = await api.client.put(path, data=archive, headers={"Content-Type": "application/gzip"})
    assert resp.status == 200 and (await resp.json())["data"]["success"] is True
    done = await api.data("POST", f"/sandbox/snapshots/{snapshot_id}/finalize", json={
        "sizeBytes": 1, "fileCount": 1, "files": [], "env": {"BUILT": "1"}, "metadata": {"owner": "me"},
    })
    # The server counts what it stored, not what the client claimed.
    assert done["fileCount"] == 2 and done["sizeBytes"] == 15 and done["userMetadata"] == {"owner": "me"}
    assert done["message"] == "first build" and done["tag"] == "v1"
    await api.call("POST", f"/sandbox/snapshots/{snapshot_id}/finalize", json={}, expect=409)
    await api.call("PUT", f"/sandbox/snapshots/{snapshot_id}/upload", data=archive, expect=409)

    child = await sandbox(api, snapshot="built:v1")
    assert await read(api, child, "bin/tool.sh") == b"echo built\n"
    assert await printenv(api, child, "BUILT") == b"1\n"
    resp = await api.client.get(f"/sandbox/snapshots/{snapshot_id}/download", headers=AUTH)
    assert resp.status == 200 and await resp.read() == archive
    assert resp.headers["Content-Length"] == str(len(archive))  # from either blob store

    # Same content hash: unchanged, nothing new; force builds anyway.
    again = await api.data("POST", "/sandbox/snapshots/build", json={
        "runtime": "base:latest", "name": "built", "contentHash": "abc123"})
    assert again == {"unchanged": True, "existingId": snapshot_id, "existingName": "built", "existingTag": "v1"}
    forced = await api.data("POST", "/sandbox/snapshots/build", json={
        "runtime": "base:latest", "name": "built", "contentHash": "abc123", "force": True}, expect=201)
    assert forced["snapshotId"] != snapshot_id


@pytest.mark.runs_on(*STORE)  # checked at finalize, read back from either blob store
@pytest.mark.parametrize(("entries", "links", "needle"), [
    ({"../escape.txt": b"x"}, None, "climbs out"),
    ({"/etc/passwd": b"x"}, None, "absolute"),
    ({"ok.txt": b"x"}, {"link": "/etc"}, "outside"),
    ({"ok.txt": b"x"}, {"a/link": "../../.."}, "outside"),
    ({"ok.txt": b"x"}, {"x/y/up": "../..", "x/y/up/l": "../../../tmp"}, "passes through the archive's link"),
    ({"ok.txt": b"x"}, {"here": ".", "x/up": "../here/.."}, "by way of the archive's other links"),
])
async def test_build_refuses_archives_that_climb_out(api: Api, entries: dict[str, bytes], links: dict[str, str] | None,
                                                      needle: str) -> None:
    init = await api.data("POST", "/sandbox/snapshots/build", json={"runtime": "base:latest", "name": "evil"},
                          expect=201)
    await api.call("PUT", f"/sandbox/snapshots/{init['snapshotId']}/upload", data=tar_gz(entries, links=links))
    err = await api.call("POST", f"/sandbox/snapshots/{init['snapshotId']}/finalize", json={}, expect=400)
    assert err["field"] == "archive" and needle in err["message"], err
    await api.call("GET", f"/sandbox/snapshots/{init['snapshotId']}", expect=404)


@pytest.mark.runs_on(*STORE)  # refusals, an upload in either blob store
async def test_build_errors_name_the_field(api: Api) -> None:
    for body, field, status in (({}, "runtime", 400), ({"runtime": "cobol:85"}, "runtime", 404),
                                ({"runtime": "base:latest", "name": "a b"}, "name", 400),
                                ({"runtime": "base:latest", "encrypt": "yes"}, "encrypt", 400),
                                ({"runtime": "base:latest", "force": "yes"}, "force", 400)):
        err = await api.call("POST", "/sandbox/snapshots/build", json=body, expect=status)
        assert err["field"] == field, (body, err)
    # encrypt: hutch offers no encryption key, so the client uploads the plain archive
    asked = await api.data("POST", "/sandbox/snapshots/build", json={"runtime": "base:latest", "encrypt": True},
                           expect=201)
    assert "publicKey" not in asked and asked["encrypted"] is False and asked["uploadUrl"]
    init = await api.data("POST", "/sandbox/snapshots/build", json={"runtime": "base:latest"}, expect=201)
    err = await api.call("POST", f"/sandbox/snapshots/{init['snapshotId']}/finalize", json={}, expect=400)
    assert "no archive was uploaded" in err["message"]
    err = await api.call("POST", f"/sandbox/snapshots/{init['snapshotId']}/finalize",
                         json={"env": {"A": "1"}, "dependencies": ["-o", "Dpkg::Options=x"]}, expect=400)
    assert err["field"] == "dependencies" and "'-o'" in err["message"]
    err = await api.call("POST", f"/sandbox/snapshots/{init['snapshotId']}/finalize",
                         json={"env": {"A": "1"}, "packages": ["x; rm -rf /"]}, expect=400)
    assert err["field"] == "packages"
    await api.call("PUT", f"/sandbox/snapshots/{init['snapshotId']}/upload", data=b"not an archive at all")
    err = await api.call("POST", f"/sandbox/snapshots/{init['snapshotId']}/finalize", json={}, expect=400)
    assert err["field"] == "archive" and "not a readable" in err["message"]
    # An env-only build is a snapshot too.
    env_only = await api.data("POST", "/sandbox/snapshots/build", json={"runtime": "base:latest", "name": "envonly"},
                              expect=201)
    done = await api.data("POST", f"/sandbox/snapshots/{env_only['snapshotId']}/finalize", json={"env": {"X": "y"}})
    assert done["fileCount"] == 0
    await sandbox(api, snapshot="envonly")


@pytest.mark.runs_on(*STORE)  # routing and the store's public list
async def test_public_snapshots_need_no_key(api: Api) -> None:
    sid = await sandbox(api)
    await write(api, sid, {"pub.txt": b"p"})
    private = await api.data("POST", f"/sandbox/{sid}/snapshot", json={"name": "secret"}, expect=201)
    public = await api.data("POST", f"/sandbox/{sid}/snapshot", json={"name": "shared", "public": True}, expect=201)
    assert public["public"] is True and public["orgSlug"] == "local" and public["fullName"] == "@local/shared:latest"
    resp = await api.client.get("/sandbox/snapshots/public")
    listed = (await resp.json())["data"]
    assert resp.status == 200 and [s["snapshotId"] for s in listed["snapshots"]] == [public["snapshotId"]]
    for ref in (public["snapshotId"], "@local/shared:latest", "shared:latest"):
        resp = await api.client.get(f"/sandbox/snapshots/public/{ref}")
        assert resp.status == 200 and (await resp.json())["data"]["snapshotId"] == public["snapshotId"]
    resp = await api.client.get(f"/sandbox/snapshots/public/{private['snapshotId']}")
    assert resp.status == 404
    # Everything else about snapshots still needs the key.
    for path in ("/sandbox/snapshots", f"/sandbox/snapshots/{public['snapshotId']}",
                 f"/sandbox/snapshots/{public['snapshotId']}/download"):
        assert (await api.client.get(path)).status == 401


@pytest.mark.runs_on(*STORE)  # both profiles' durability; real files: take_and_create
async def test_snapshots_survive_a_restart(make_api) -> None:  # type: ignore[no-untyped-def]
    api = await make_api()
    sid = await sandbox(api)
    await write(api, sid, {"kept.txt": b"kept"})
    snap = await api.data("POST", f"/sandbox/{sid}/snapshot", json={"name": "durable", "tag": "v1"}, expect=201)
    await api.client.close()
    again = await make_api()
    assert (await again.data("GET", "/sandbox/snapshots/durable:v1"))["snapshotId"] == snap["snapshotId"]
    child = await sandbox(again, snapshot="durable:v1")
    assert await read(again, child, "kept.txt") == b"kept"


@pytest.mark.runs_on(*STORE)  # the service over either blob store
async def test_abandoned_builds_are_cleared(api: Api) -> None:
    from hutch.api.keys import ENGINE

    init = await api.data("POST", "/sandbox/snapshots/build", json={"runtime": "base:latest", "name": "gone"},
                          expect=201)
    await api.call("PUT", f"/sandbox/snapshots/{init['snapshotId']}/upload", data=tar_gz({"a": b"1"}))
    snapshots = api.client.server.app[ENGINE].snapshots
    assert await snapshots.archives.exists(init["snapshotId"])  # in the blob store: files or PostgreSQL
    assert await snapshots.expire_builds(older_than=3600) == []  # young builds stay
    assert await snapshots.expire_builds(older_than=0) == [init["snapshotId"]]
    assert not await snapshots.archives.exists(init["snapshotId"])
    await api.call("POST", f"/sandbox/snapshots/{init['snapshotId']}/finalize", json={}, expect=404)
    gone = await api.client.server.app[ENGINE].parts.store.get_snapshot(init["snapshotId"])
    assert gone is not None and gone.status.value == "deleted"  # through an event, in the log


@pytest.mark.runs_on("fake-embedded")
async def test_a_presigned_upload_is_one_of_its_organizations_requests_at_once(api: Api) -> None:
    """A presigned upload (no key) holds its socket for as long as its sender likes; only keyed
    requests counted toward the organization's share (HUTCH_MAX_REQUESTS_PER_ORG), so a tenant
    could hold uploads past its bound. Now each counts, in the snapshot's organization."""
    from hutch.api.at_once import SETTING
    from hutch.api.keys import AT_ONCE, TENANTS
    from tests.api.conftest import KEY

    init = await api.data("POST", "/sandbox/snapshots/build", json={
        "runtime": "base:latest", "name": "held", "tag": "v1", "contentHash": "held1"}, expect=201)
    path = "/" + init["uploadUrl"].split("://", 1)[1].split("/", 1)[1]
    app = api.client.server.app
    at_once = app[AT_ONCE]
    org = app[TENANTS].authenticate(KEY).org_id
    at_once.limit = 1
    with at_once.slot(org):  # its share held elsewhere
        refused = await api.client.put(path, data=tar_gz({"a": b"x"}))
        assert refused.status == 429, await refused.text()  # stored before, uncounted
        assert SETTING in (await refused.json())["message"]
    stored = await api.client.put(path, data=tar_gz({"a": b"x"}))
    assert stored.status == 200, await stored.text()
    assert at_once.held(org) == 0


@pytest.mark.runs_on(*STORE)  # the quota over either store
async def test_a_snapshot_of_many_empty_files_counts_its_record(api: Api) -> None:
    """Its storage is its files' bytes and its record's (its files' list, kept by the log and
    the server): 10,000 empty files, a 60 KiB upload, made a 1.7 MB record counted as nothing,
    as often as the organization liked (100,000: 17 MB each, in the server's memory)."""
    await api.data("POST", "/orgs", json={"name": "lists"}, expect=201)
    key = (await api.data("POST", "/keys?orgId=org_lists", json={"role": "admin"}, expect=201))["secret"]
    auth = {"Authorization": f"Bearer {key}"}
    await api.data("PATCH", "/orgs/org_lists/quota", json={"snapshotBytes": 2**20})
    names = {f"d{i // 1000}/empty-{i:05d}.txt": b"" for i in range(10_000)}
    made = await api.data("POST", "/sandbox/snapshots/build", json={"runtime": "base:latest"}, expect=201,
                          headers=auth)
    # Refused as its headers arrive (tests/api/test_snapshot_limits.py), not stored to finalize.
    refused = await api.call("PUT", f"/sandbox/snapshots/{made['snapshotId']}/upload", data=tar_gz(names),
                             expect=403, headers=auth)
    assert refused["code"] == "QUOTA_EXCEEDED" and refused["quota"] == "snapshot_bytes", refused
    # A few files fit, and count their record.
    small = await api.data("POST", "/sandbox/snapshots/build", json={"runtime": "base:latest", "force": True},
                           expect=201, headers=auth)
    await api.call("PUT", f"/sandbox/snapshots/{small['snapshotId']}/upload", headers=auth,
                   data=tar_gz({"a.txt": b"", "b.txt": b""}))
    await api.data("POST", f"/sandbox/snapshots/{small['snapshotId']}/finalize", json={}, headers=auth)
    assert (await api.data("GET", "/orgs/org_lists", headers=auth))["usage"]["snapshotBytes"] > 0
