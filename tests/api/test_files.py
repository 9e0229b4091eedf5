"""Files, archives and env through the wire."""

from __future__ import annotations

import asyncio
import base64
import io
import tarfile
import zipfile

import aiohttp
import pytest

from tests.api.conftest import AUTH, NODE, REAL, STORE, WIRE, Api


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def new_sandbox(api: Api) -> str:
    return (await api.call("POST", "/sandbox", json={}, expect=201))["data"]["sandboxId"]


async def raw(api: Api, method: str, path: str, *, expect: int = 200, **kw: object) -> bytes:
    resp = await api.client.request(method, path, headers=AUTH, **kw)  # type: ignore[arg-type]
    body = await resp.read()
    assert resp.status == expect, (resp.status, body[:300])
    return body


@pytest.mark.runs_on(*WIRE, *REAL)  # the drivers' file primitives through the API
async def test_write_read_list_mkdir_rm(api: Api) -> None:
    sid = await new_sandbox(api)
    body = await api.call("POST", f"/fs/{sid}", json={"files": [
        {"path": "src/app.py", "content": b64(b"print(1)\n")},
        {"path": "/workspace/data/x.bin", "content": b64(bytes(range(256)))},
    ]})
    assert body["data"]["filesWritten"] == 2 and body["filesWritten"] == 2
    assert await raw(api, "GET", f"/fs/{sid}?path=src/app.py") == b"print(1)\n"
    assert await raw(api, "GET", f"/fs/{sid}?path=/workspace/data/x.bin") == bytes(range(256))
    listed = (await api.data("GET", f"/fs/list/{sid}?path=src"))["files"]
    assert [(f["path"], f["size"], f["isDir"]) for f in listed] == [("app.py", 9, False)]
    assert listed[0]["mode"] == "0644" and listed[0]["modTime"].endswith("Z")
    home = {f["path"]: f for f in (await api.data("GET", f"/fs/list/{sid}"))["files"]}
    assert home["src"]["isDir"] is True

    await api.call("POST", f"/fs/mkdir/{sid}", json={"path": "a/b/c", "recursive": True})
    err = await api.call("POST", f"/fs/mkdir/{sid}", json={"path": "x/y", "recursive": False}, expect=404)
    assert "does not exist" in err["message"]
    assert (await api.call("POST", f"/fs/rm/{sid}", json={"path": "src/app.py"}))["found"] is True
    assert (await api.call("POST", f"/fs/rm/{sid}", json={"path": "src/app.py"}))["found"] is False
    err = await api.call("POST", f"/fs/rmdir/{sid}", json={"path": "a", "recursive": False}, expect=400)
    assert "not empty" in err["message"]
    assert (await api.call("POST", f"/fs/rmdir/{sid}", json={"path": "a", "recursive": True}))["found"] is True
    await api.call("GET", f"/fs/{sid}?path=nope.txt", expect=404)
    await api.call("GET", f"/fs/list/{sid}?path=nope", expect=404)


@pytest.mark.runs_on(*WIRE, *REAL)  # written by the driver, read by a real process
async def test_files_given_at_create_and_execute_are_written(api: Api) -> None:
    sid = (await api.call("POST", "/sandbox", json={"files": [{"path": "cfg/a.txt", "content": b64(b"A")}]}, expect=201))["data"]["sandboxId"]
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sh", "-c", "cat cfg/a.txt; cat b.txt"],
                                                                "files": [{"path": "b.txt", "content": b64(b"B")}]})
    await api.wait_execution(ex["executionId"])
    assert await api.stream(ex["stdoutStreamUrl"]) == b"AB"


@pytest.mark.runs_on(*WIRE)  # refused while parsing
async def test_bad_file_requests(api: Api) -> None:
    sid = await new_sandbox(api)
    for path, body, field in [
        (f"/fs/{sid}", {"files": "x"}, "files"),
        (f"/fs/{sid}", {"files": [{"path": "", "content": ""}]}, "files[0].path"),
        (f"/fs/mkdir/{sid}", {}, "path"),
        (f"/fs/mkdir/{sid}", {"path": "a", "recursive": "yes"}, "recursive"),
        (f"/fs/rm/{sid}", {"path": 5}, "path"),
    ]:
        err = await api.call("POST", path, json=body, expect=400)
        assert field in err["message"], err
    await api.call("GET", f"/fs/{sid}", expect=400)  # path is required
    await api.call("POST", "/fs/sbx_nope", json={"files": []}, expect=404)
    await api.call("DELETE", f"/sandbox/{sid}")
    err = await api.call("GET", f"/fs/list/{sid}", expect=404)


@pytest.mark.runs_on(*STORE)  # the service's env and its events (env reaching a process: tests/contracts)
async def test_env_patch_sets_and_deletes_for_later_commands(api: Api) -> None:
    sid = (await api.call("POST", "/sandbox", json={"env": {"KEEP": "1", "DROP": "2"}}, expect=201))["data"]["sandboxId"]
    data = await api.data("PATCH", f"/sandbox/env/{sid}", json={"env": {"NEW": "3", "DROP": None}})
    assert data["env"] == {"KEEP": "1", "NEW": "3"}
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["env"]})
    await api.wait_execution(ex["executionId"])
    out = (await api.stream(ex["stdoutStreamUrl"])).decode()
    assert "KEEP=1" in out and "NEW=3" in out and "DROP=" not in out
    events = (await api.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100"))["events"]
    env_event = next(e for e in events if e["type"] == "env")
    assert env_event["event"]["set"] == {"NEW": "***"} and env_event["event"]["unset"] == ["DROP"]
    for bad, field in [({"env": "x"}, "env"), ({"env": {"A": 1}}, "env.A"), ({"env": {"9X": "1"}}, "env.9X")]:
        err = await api.call("PATCH", f"/sandbox/env/{sid}", json=bad, expect=400)
        assert field in err["message"]


def make_tar(entries: list[tuple[str, bytes | None, dict]], gz: bool = True) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tf:
        for name, data, extra in entries:
            info = tarfile.TarInfo(name)
            for k, v in extra.items():
                setattr(info, k, v)
            if data is not None:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                tf.addfile(info)
    return buf.getvalue()


@pytest.mark.runs_on(*WIRE, *REAL, *NODE)  # archives over real file systems (links, modes); node: tar streams
async def test_upload_and_download_archives_round_trip(api: Api) -> None:
    sid = await new_sandbox(api)
    archive = make_tar([("proj/", None, {"type": tarfile.DIRTYPE}), ("proj/a.txt", b"alpha", {}),
                        ("proj/sub/b.txt", b"beta" * 1000, {}), ("proj/link", None, {"type": tarfile.SYMTYPE, "linkname": "a.txt"})])
    done = await api.data("POST", f"/fs/upload/{sid}?path=/workspace/in", data=archive)
    assert done["files"] == 2 and done["symlinks"] == 1 and done["bytes"] == 5 + 4000
    assert await raw(api, "GET", f"/fs/{sid}?path=/workspace/in/proj/sub/b.txt") == b"beta" * 1000

    tgz = await raw(api, "GET", f"/fs/download/{sid}?path=/workspace/in")
    with tarfile.open(fileobj=io.BytesIO(tgz)) as tf:
        names = {m.name.rstrip("/"): m for m in tf.getmembers()}
        assert tf.extractfile(names["proj/a.txt"]).read() == b"alpha"  # type: ignore[union-attr]
        assert names["proj/link"].issym() and names["proj/link"].linkname == "a.txt"
    zipped = await raw(api, "GET", f"/fs/download/{sid}?path=/workspace/in&format=zip")
    with zipfile.ZipFile(io.BytesIO(zipped)) as zf:
        assert zf.read("proj/sub/b.txt") == b"beta" * 1000
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("z/one.txt", "1")
    done = await api.data("POST", f"/fs/upload/{sid}?path=zipped", data=buf.getvalue())
    assert done["files"] == 1
    assert await raw(api, "GET", f"/fs/{sid}?path=zipped/z/one.txt") == b"1"


@pytest.mark.runs_on(*WIRE)  # service/archives.py checks every entry before one is written
@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([("../escape.txt", b"x", {})], "climbs out"),
        ([("ok/../../escape.txt", b"x", {})], "climbs out"),
        ([("/etc/passwd", b"x", {})], "absolute"),
        ([("evil", None, {"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"})], "outside the destination"),
        ([("evil", None, {"type": tarfile.SYMTYPE, "linkname": "../../.."})], "outside the destination"),
        # Each link inside as written, the second out through the first (up is the destination
        # itself); then a file through them: it was written to the sandbox's /tmp.
        ([("x/y/up", None, {"type": tarfile.SYMTYPE, "linkname": "../.."}),
          ("x/y/up/l", None, {"type": tarfile.SYMTYPE, "linkname": "../../../tmp"}),
          ("x/y/up/l/pwned.txt", b"x", {})], "passes through the archive's link"),
        ([("x/y/up", None, {"type": tarfile.SYMTYPE, "linkname": "../.."}),
          ("x/y/up/l", None, {"type": tarfile.SYMTYPE, "linkname": "../../../tmp"}),
          ("x/y/up/m", None, {"type": tarfile.SYMTYPE, "linkname": "sub"})], "passes through the archive's link"),
        # Each link at a name of its own: here is the destination, so x/up is its parent.
        ([("here", None, {"type": tarfile.SYMTYPE, "linkname": "."}),
          ("x/up", None, {"type": tarfile.SYMTYPE, "linkname": "../here/.."})], "by way of the archive's other links"),
        # A link named again: read as its last, l was inside; written as its first, outside.
        ([("x/up", None, {"type": tarfile.SYMTYPE, "linkname": ".."}),
          ("x/up/l", None, {"type": tarfile.SYMTYPE, "linkname": "../x2"}),
          ("x/up/l/f.txt", b"x", {}), ("x/up", None, {"type": tarfile.SYMTYPE, "linkname": "."})], "given twice"),
        ([("hard", None, {"type": tarfile.LNKTYPE, "linkname": "x"})], "hard link"),
        ([("dev", None, {"type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3})], "device"),
        ([("fifo", None, {"type": tarfile.FIFOTYPE})], "fifo"),
    ],
)
async def test_hostile_archives_are_refused_whole(api: Api, entries: list, message: str) -> None:
    sid = await new_sandbox(api)
    archive = make_tar([("good.txt", b"fine", {}), *entries])
    err = await api.call("POST", f"/fs/upload/{sid}", data=archive, expect=400)
    assert message in err["message"]
    await api.call("GET", f"/fs/{sid}?path=good.txt", expect=404)  # nothing was half-written


@pytest.mark.runs_on(*WIRE)  # checked before anything is written
async def test_zip_slip_and_limits(make_api) -> None:  # type: ignore[no-untyped-def]
    api = await make_api(max_upload_bytes=10_000)
    sid = await new_sandbox(api)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("../../zip-slip.txt", "x")
    err = await api.call("POST", f"/fs/upload/{sid}", data=buf.getvalue(), expect=400)
    assert "climbs out" in err["message"]
    big = make_tar([("big.bin", b"\0" * 50_000, {})], gz=True)  # small on the wire, big unpacked
    err = await api.call("POST", f"/fs/upload/{sid}", data=big, expect=413)
    assert "unpacks to more than" in err["message"]
    err = await api.call("POST", f"/fs/upload/{sid}", data=b"x" * 20_000, expect=413)
    assert "larger than" in err["message"]
    err = await api.call("POST", f"/fs/upload/{sid}", data=b"definitely not an archive", expect=400)
    assert "not a tar" in err["message"]
    err = await api.call("GET", f"/fs/download/{sid}?format=rar", expect=400)
    assert "format" in err["message"]


@pytest.mark.runs_on(*STORE, *REAL)  # real restores; the chain in both stores
async def test_checkpoints_restore_exact_state_with_a_parent_chain(api: Api) -> None:
    sid = await new_sandbox(api)
    await api.call("POST", f"/fs/{sid}", json={"files": [{"path": "keep.txt", "content": b64(b"v1")},
                                                        {"path": "doomed.txt", "content": b64(b"x")}]})
    first = await api.call("POST", f"/sandbox/{sid}/checkpoint", json={"name": "base"}, expect=201)
    cp1 = first["data"]
    assert cp1["id"].startswith("ckpt_") and cp1["name"] == "base" and cp1["parent"] == "" and cp1["createdAt"]
    await api.call("POST", f"/fs/{sid}", json={"files": [{"path": "keep.txt", "content": b64(b"v2")},
                                                        {"path": "later.txt", "content": b64(b"new")}]})
    await api.call("POST", f"/fs/rm/{sid}", json={"path": "doomed.txt"})
    cp2 = (await api.call("POST", f"/sandbox/{sid}/checkpoint", json={"name": "upgraded"}, expect=201))["data"]
    assert cp2["parent"] == "base"
    await api.call("POST", f"/sandbox/{sid}/checkpoint/{cp1['id']}/restore")
    assert await raw(api, "GET", f"/fs/{sid}?path=keep.txt") == b"v1"
    assert await raw(api, "GET", f"/fs/{sid}?path=doomed.txt") == b"x"  # deleted ones return
    await api.call("GET", f"/fs/{sid}?path=later.txt", expect=404)  # later ones are gone
    cp3 = (await api.call("POST", f"/sandbox/{sid}/checkpoint", json={"name": "again"}, expect=201))["data"]
    assert cp3["parent"] == "base"  # the chain follows what was restored
    listed = (await api.data("GET", f"/sandbox/checkpoints/{sid}"))["checkpoints"]
    assert [c["name"] for c in listed] == ["base", "upgraded", "again"]

    err = await api.call("POST", f"/sandbox/{sid}/checkpoint", json={"name": "base"}, expect=409)
    assert "already has a checkpoint named" in err["message"]
    await api.call("POST", f"/sandbox/{sid}/checkpoint", json={}, expect=400)
    await api.call("DELETE", f"/sandbox/{sid}/checkpoint/{cp2['id']}")
    err = await api.call("POST", f"/sandbox/{sid}/checkpoint/{cp2['id']}/restore", expect=404)
    assert "deleted" in err["message"]
    await api.call("DELETE", f"/sandbox/{sid}/checkpoint/{cp2['id']}", expect=404)
    types = [e["type"] for e in (await api.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100"))["events"]]
    assert types.count("checkpoint") == 3 and "checkpoint:restored" in types and "checkpoint:deleted" in types
    await api.call("DELETE", f"/sandbox/{sid}")
    await api.call("GET", f"/sandbox/checkpoints/{sid}", expect=404)


@pytest.mark.runs_on("local-embedded")  # a driver read that fails once its answer has begun
async def test_a_read_that_fails_half_way_cuts_its_answer(api: Api) -> None:
    """The sandbox destroyed while its 64 MiB file is being read: the transfer is cut short (the
    client sees it broken, at once), never answered with an error written into the body already
    under way, which left the client waiting for the rest (120 s on the cluster)."""
    sid = await new_sandbox(api)
    done = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sh", "-c", "head -c 67108864 /dev/zero > big"]})
    assert (await api.wait_execution(done["executionId"]))["exitCode"] == 0
    resp = await api.client.get(f"/fs/{sid}?path=big", headers=AUTH)
    assert resp.status == 200
    await resp.content.readexactly(65536)  # under way, the rest held back by this reader
    await api.call("DELETE", f"/sandbox/{sid}")

    async def rest() -> int:
        n = 0
        while chunk := await resp.content.read(1 << 20):
            n += len(chunk)
            assert b"success" not in chunk, chunk[-300:]  # no JSON answer inside the body
        return n

    with pytest.raises(aiohttp.ClientPayloadError):
        await asyncio.wait_for(rest(), 20)  # cut at once: without the cut, this waited the 20 s out
