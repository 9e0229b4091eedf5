"""What one tenant may take of what every tenant of a server shares (its sockets, its memory,
its disk), attacked as a tenant would: through the routes and capabilities its own key and
sandboxes hand it, in process."""

from __future__ import annotations

import pytest

from hutch.api.at_once import SETTING
from hutch.api.keys import AT_ONCE, TENANTS
from tests.api.conftest import AUTH, KEY, WIRE, Api


def _path(url: str) -> str:
    return "/" + url.split("://", 1)[1].split("/", 1)[1]


@pytest.mark.runs_on(*WIRE)
async def test_an_audit_stream_is_one_of_its_organizations_requests_at_once(api: Api) -> None:
    """An audit stream URL carries no key and follows its sandbox for as long as it lives: it
    was the one capability read counted in no organization's share (HUTCH_MAX_REQUESTS_PER_ORG),
    so a tenant could hold as many followers of its own idle sandbox as the server had sockets
    (and each its backlog), past the bound that keeps the others served."""
    made = await api.data("POST", "/sandbox", json={}, expect=201)
    audit = _path(made["auditStreamUrl"])
    app = api.client.server.app
    at_once = app[AT_ONCE]
    org = app[TENANTS].authenticate(KEY).org_id
    at_once.limit = 1
    with at_once.slot(org):  # its share held by its other requests
        refused = await api.client.get(audit)  # following: before, a 200 that went on for ever
        assert refused.status == 429, (refused.status, refused.headers)
        assert SETTING in (await refused.json())["message"]
        assert refused.headers.get("Connection") == "close"
    read = await api.client.get(audit + "?follow=false")  # its share free again: read as before
    assert read.status == 200, await read.text()
    assert b"sandbox" in await read.read()
    assert at_once.held(org) == 0
    # An audit URL with a wrong token stays a 404, whoever's share is full.
    with at_once.slot(org):
        forged = await api.client.get(audit.rsplit("/", 1)[0] + "/" + "0" * 64)
        assert forged.status == 404


@pytest.mark.runs_on("local-embedded")
async def test_a_directory_listing_is_bounded_and_leaves_the_server_answering(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory's listing was read, parsed and answered whole, on the event loop: 200,000
    empty files with 200-character names (90 MB of the sandbox's disk, made in 18 s) made one
    ``GET /fs/list`` take 16 s and 380 MB of the server, every other tenant's request waiting
    meanwhile, and an organization may hold hundreds of them at once. Now a listing holds at most
    ``limits.LIST_ENTRIES`` entries (a 413 naming the path past it), is parsed and rendered off
    the event loop, and an organization's listings run two at a time. The bound is lowered here to keep
    the test fast; what is checked is that it is enforced where the entries are read."""
    from hutch.core import limits

    monkeypatch.setattr(limits, "LIST_ENTRIES", 3000, raising=False)
    sid = (await api.data("POST", "/sandbox", json={}, expect=201))["sandboxId"]
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": [
        "sh", "-c", "mkdir big small && cd big && seq -f '%0200.0f' 1 3001 | xargs touch && "
                    "cd ../small && seq 1 3000 | xargs touch"]})
    assert (await api.wait_execution(ex["executionId"]))["exitCode"] == 0
    refused = await api.call("GET", f"/fs/list/{sid}?path=big", expect=413)
    assert refused["field"] == "path" and "3000" in refused["message"] and "big" in refused["message"], refused
    listed = await api.data("GET", f"/fs/list/{sid}?path=small")
    assert len(listed["files"]) == 3000


async def test_a_download_holds_one_directory_s_listing_at_a_time() -> None:
    """A tar or zip download walks the tree through the driver's listings: it listed every
    subdirectory of a directory as it met them, so a wide tree (a directory of directories of
    files) was held whole in the server while it was downloaded. Now a directory is listed
    when its turn comes: at most one listing is held, in the same order as before."""
    from hutch.core.driver_types import FileInfo
    from hutch.drivers import trees

    def entry(name: str, is_dir: bool) -> FileInfo:
        return FileInfo(name=name, size=0, is_dir=is_dir, mode=0o40755 if is_dir else 0o100644, mod_time=0.0)

    tree = {"/r": [entry(f"d{i}", True) for i in range(50)],
            **{f"/r/d{i}": [entry(f"f{j}", False) for j in range(3)] for i in range(50)}}
    listed: list[str] = []

    class Files:
        async def list_files(self, sandbox_id: str, path: str) -> list[FileInfo]:
            listed.append(path)
            return tree[path]

    walked, held_at = [], []
    async for e in trees.walk(Files(), "sbx", "/r"):  # type: ignore[arg-type]
        walked.append(e.rel)
        held_at.append(len(listed))
    names = sorted(f"d{i}" for i in range(50))
    assert walked[:53] == [*names, f"{names[-1]}/f0", f"{names[-1]}/f1", f"{names[-1]}/f2"]  # the order kept
    assert held_at[49] == 1, held_at[49]  # its 50 directories met, none listed yet (before: all 50)
    assert len(listed) == 51 and len(walked) == 200


@pytest.mark.runs_on(*WIRE)
async def test_an_organization_s_listings_run_two_at_a_time(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each listing is held whole in the server until answered: an organization holding
    hundreds of requests at once held hundreds of them. Now its listings beyond two wait in its
    own queue, and another organization's listing does not wait behind them."""
    import asyncio

    from hutch.api.keys import ENGINE
    from tests.api.test_tenancy import bearer, new_key, new_org

    keys = {}
    for name in ("attacker", "victim"):
        org = await new_org(api, name)
        keys[name] = bearer((await new_key(api, org, "member"))["secret"])
    sids = {name: (await api.data("POST", "/sandbox", json={}, expect=201, headers=key))["sandboxId"]
            for name, key in keys.items()}
    driver = api.client.server.app[ENGINE].parts.driver
    real, inside, release = driver.list_files, [], asyncio.Event()

    async def slow(sandbox_id: str, path: str):  # type: ignore[no-untyped-def]
        inside.append(sandbox_id)
        await release.wait()
        return await real(sandbox_id, path)

    monkeypatch.setattr(driver, "list_files", slow)
    lists = [asyncio.create_task(api.data("GET", f"/fs/list/{sids['attacker']}", headers=keys["attacker"]))
             for _ in range(6)]
    await asyncio.sleep(0.3)
    assert inside.count(sids["attacker"]) == 2, inside  # before: all 6
    victim = asyncio.create_task(api.data("GET", f"/fs/list/{sids['victim']}", headers=keys["victim"]))
    await asyncio.sleep(0.3)
    assert sids["victim"] in inside, inside  # not behind the attacker's
    release.set()
    await asyncio.gather(*lists, victim)
    assert inside.count(sids["attacker"]) == 6


SPOOL = 1_000_000  # the server's max_upload_bytes here: what an organization may spool at once


def _tar(name: str, size: int) -> bytes:
    import io
    import os
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo(name)
        info.size = size
        tf.addfile(info, io.BytesIO(os.urandom(size)))  # incompressible: a spool of its size
    return buf.getvalue()


@pytest.mark.runs_on(*WIRE)
async def test_an_organization_s_uploads_spool_its_room_at_most(make_api) -> None:  # type: ignore[no-untyped-def]
    """An archive upload is spooled whole in the server's temporary files before it is
    checked, up to max_upload_bytes (4 GiB) each, outside every sandbox's disk limit and every
    quota: a tenant's hundreds of uploads at once (its share of requests) wrote the server's
    disk full for everyone. Now an organization's spooled uploads and SFTP files are at most
    max_upload_bytes together: past it, 429 naming the bound, until some end."""
    import asyncio

    from hutch.api.keys import ENGINE

    api = await make_api(max_upload_bytes=SPOOL)
    sid = (await api.data("POST", "/sandbox", json={}, expect=201))["sandboxId"]
    held_tar, second_tar = _tar("held.bin", 600_000), _tar("second.bin", 600_000)
    go_on = asyncio.Event()

    async def trickled():  # type: ignore[no-untyped-def]
        yield held_tar[:590_000]  # most of it sent, the rest held back
        await go_on.wait()
        yield held_tar[590_000:]

    held = asyncio.create_task(api.client.post(f"/fs/upload/{sid}?format=tar", data=trickled(), headers=AUTH))
    await asyncio.sleep(0.5)
    resp = await api.client.post(f"/fs/upload/{sid}?format=tar", data=second_tar, headers=AUTH)
    body = await resp.json()
    assert resp.status == 429, (resp.status, body)  # before: 200, 1.2 MB spooled at once
    assert "max_upload_bytes" in body["message"] and body["code"] == "RATE_LIMITED", body
    go_on.set()
    first = await held
    assert first.status == 200, await first.text()
    org = api.client.server.app[TENANTS].authenticate(KEY).org_id
    assert api.client.server.app[ENGINE].files._spools.held(org) == 0  # all given back
    again = await api.client.post(f"/fs/upload/{sid}?format=tar", data=second_tar, headers=AUTH)
    assert again.status == 200, await again.text()


@pytest.mark.runs_on(*WIRE)
async def test_an_organization_s_sftp_files_spool_its_room_at_most(make_api, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An SFTP file is fetched whole into the server's temporary files when opened (and
    collected whole until closed), up to max_upload_bytes each, and one session opened as
    many as it liked: a sandbox's sparse 4 GiB file (free to make) opened a hundred times had
    the server write 400 GiB. Now the opened files count in the organization's room."""
    import asyncio
    import base64
    import os

    import asyncssh

    from hutch.api.keys import SSH_GATEWAY
    from tests.api.test_ssh import Gateway

    api = await make_api(max_upload_bytes=SPOOL, ssh_port=0)
    port = api.client.server.app[SSH_GATEWAY].port
    key = Gateway(api, port, tmp_path).keygen("id_spool")
    await api.data("POST", "/ssh-keys", json={"publicKey": key.with_suffix(".pub").read_text()}, expect=201)
    sid = (await api.data("POST", "/sandbox", json={}, expect=201))["sandboxId"]
    content = base64.b64encode(os.urandom(600_000)).decode()
    await api.data("POST", f"/fs/{sid}", json={"files": [{"path": "/home/agentuity/big.bin", "content": content}]})
    async with asyncssh.connect("127.0.0.1", port, username=sid, known_hosts=None, client_keys=[str(key)],
                                agent_path=None) as conn, conn.start_sftp_client() as sftp:
        first = await sftp.open("big.bin", "rb")
        with pytest.raises(asyncssh.SFTPFailure, match="max_upload_bytes"):
            await sftp.open("big.bin", "rb")  # before: opened, 1.2 MB spooled
        writing = await sftp.open("new.bin", "wb")
        with pytest.raises(asyncssh.SFTPFailure, match="max_upload_bytes"):
            await writing.write(b"x" * 500_000)
        await first.close()
        await writing.write(b"x" * 500_000)  # room again once the first is closed
        await writing.close()
        assert len(await (await sftp.open("big.bin", "rb")).read()) == 600_000
    await asyncio.sleep(0.2)
