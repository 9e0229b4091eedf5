"""Files, env, archives, copy, jobs, pause/resume through the SDK, against the wire fake."""

from __future__ import annotations

import asyncio
import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from hutch import Job, SandboxClient, SyncSandboxClient, errors
from tests.sdk.fakewire import KEY, FakeWire, Script, Step, ThreadedServer


async def test_write_read_list_mkdir_rm(client: SandboxClient, wire: FakeWire) -> None:
    sb = await client.create()
    assert await sb.write_files({"src/a.txt": "A" * 300_000, "b.bin": b"\x00\x01"}) == 2
    chunks = [c async for c in sb.read_file("src/a.txt", chunk_size=65536)]
    assert len(chunks) > 1  # streamed, not one blob
    assert b"".join(chunks) == b"A" * 300_000
    assert await sb.read_bytes("b.bin") == b"\x00\x01"
    names = {(f.path, f.is_dir) for f in await sb.list_files()}
    assert names == {("src", True), ("b.bin", False)}
    await sb.mkdir("x/y", recursive=True)
    assert wire.calls("POST", "/fs/mkdir/")[-1]["json"] == {"path": "x/y", "recursive": True}
    assert await sb.rm_file("b.bin") is True
    assert await sb.rm_file("b.bin") is False
    assert await sb.rm_dir("x", recursive=True) is True
    with pytest.raises(errors.FileNotFound) as missing:
        await sb.read_bytes("nope.txt")
    assert missing.value.status == 404
    with pytest.raises(errors.FileNotFound):
        await sb.list_files("nope")


async def test_set_env_sends_nulls_and_returns_the_whole_env(
    client: SandboxClient, wire: FakeWire
) -> None:
    sb = await client.create()
    assert await sb.set_env({"A": "1", "B": "2"}) == {"A": "1", "B": "2"}
    assert await sb.set_env({"A": None}) == {"B": "2"}
    assert wire.calls("PATCH", "/sandbox/env/")[-1]["json"] == {"env": {"A": None}}


async def test_upload_archive_streams_a_file_path(
    client: SandboxClient, wire: FakeWire, tmp_path: Path
) -> None:
    sb = await client.create()
    archive = tmp_path / "p.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        data = b"print(1)\n"
        ti = tarfile.TarInfo("app/main.py")
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))
    result = await sb.upload_archive(archive, path="/workspace/dst")
    assert (result.files, result.bytes) == (1, 9)
    call = wire.calls("POST", "/fs/upload/")[-1]
    assert call["query"] == {"path": "/workspace/dst"}
    assert call["headers"]["Content-Type"] == "application/octet-stream"
    assert call["raw_size"] == archive.stat().st_size
    assert await sb.read_bytes("/workspace/dst/app/main.py") == b"print(1)\n"


async def test_upload_archive_sources(client: SandboxClient, tmp_path: Path) -> None:
    sb = await client.create()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("z.txt", "zip")
    raw = buf.getvalue()

    async def agen():  # type: ignore[no-untyped-def]
        yield raw[:10]
        yield raw[10:]

    for source in (raw, io.BytesIO(raw), agen(), iter([raw[:5], raw[5:]])):
        result = await sb.upload_archive(source, format="zip")
        assert result.files == 1
    with pytest.raises(errors.InvalidInput) as bad:
        await sb.upload_archive(raw, format="rar")
    assert bad.value.field == "format"


async def test_download_archive_to_path_and_iterator(
    client: SandboxClient, tmp_path: Path
) -> None:
    sb = await client.create()
    await sb.write_files({"d/one.txt": "1", "d/two.txt": "22"})
    out = tmp_path / "d.zip"
    size = await sb.download_archive(out, path="d", format="zip")
    assert size == out.stat().st_size
    with zipfile.ZipFile(out) as zf:
        assert sorted(zf.namelist()) == ["one.txt", "two.txt"]
    data = b"".join([c async for c in sb.iter_archive(path="d", format="tar")])
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        assert sorted(tf.getnames()) == ["one.txt", "two.txt"]
    with pytest.raises(errors.FileNotFound):
        await sb.download_archive(tmp_path / "x.tgz", path="missing")
    assert not (tmp_path / "x.tgz").exists()  # no partial file left behind


async def test_copy_to_file_creates_parents_and_reports_them(
    client: SandboxClient, tmp_path: Path
) -> None:
    sb = await client.create()
    local = tmp_path / "settings.json"
    local.write_text('{"a": 1}')
    result = await sb.copy_to(local, "/home/agentuity/app/config/settings.json")
    assert result.directories_created == [
        "/home",
        "/home/agentuity",
        "/home/agentuity/app",
        "/home/agentuity/app/config",
    ]
    assert (result.files_transferred, result.bytes_transferred) == (1, 8)
    assert await sb.read_bytes("/home/agentuity/app/config/settings.json") == b'{"a": 1}'
    # into an existing directory: keeps its name; nothing created
    again = await sb.copy_to(local, "/home/agentuity/app/")
    assert again.directories_created == []
    assert await sb.read_bytes("/home/agentuity/app/settings.json") == b'{"a": 1}'


async def test_copy_to_strict_and_directory_rules(client: SandboxClient, tmp_path: Path) -> None:
    sb = await client.create()
    local = tmp_path / "f.txt"
    local.write_text("x")
    with pytest.raises(errors.FileNotFound) as strict:
        await sb.copy_to(local, "/must-exist/f.txt", strict=True)
    assert strict.value.field == "strict"
    tree = tmp_path / "src"
    (tree / "lib").mkdir(parents=True)
    (tree / "lib" / "m.py").write_text("m")
    (tree / "main.py").write_text("main")
    with pytest.raises(errors.InvalidInput) as needs_r:
        await sb.copy_to(tree, "/workspace/src")
    assert needs_r.value.field == "recursive"
    result = await sb.copy_to(tree, "/workspace/src", recursive=True)
    assert (result.files_transferred, result.bytes_transferred) == (2, 5)
    assert await sb.read_bytes("/workspace/src/lib/m.py") == b"m"
    with pytest.raises(errors.InvalidInput):
        await sb.copy_to(tmp_path / "absent", "/workspace/x")


async def test_copy_from_file_and_tree(client: SandboxClient, tmp_path: Path) -> None:
    sb = await client.create()
    await sb.write_files({"out/r.csv": "a,b\n", "out/sub/deep.txt": "deep"})
    result = await sb.copy_from("out/r.csv", tmp_path / "new" / "r.csv")
    assert (tmp_path / "new" / "r.csv").read_text() == "a,b\n"
    assert result.directories_created == [str(tmp_path / "new")]
    with pytest.raises(errors.InvalidInput):
        await sb.copy_from("out", tmp_path / "tree")
    tree = await sb.copy_from("out", tmp_path / "tree", recursive=True)
    assert tree.files_transferred == 2
    assert (tmp_path / "tree" / "sub" / "deep.txt").read_text() == "deep"
    with pytest.raises(errors.FileNotFound):
        await sb.copy_from("nothing.txt", tmp_path / "n.txt")
    with pytest.raises(errors.InvalidInput) as strict:
        await sb.copy_from("out/r.csv", tmp_path / "no" / "dir" / "r.csv", strict=True)
    assert strict.value.field == "strict"


async def test_jobs_create_get_list_output_wait_stop(client: SandboxClient, wire: FakeWire) -> None:
    sb = await client.create()
    wire.script = lambda argv: (
        Script([Step("stdout", b"built\n"), Step("stderr", b"warn\n")], exit_code=0)
        if argv[0] == "build"
        else Script([], delay=30)
    )
    job = await sb.create_job(["build", "all"])
    assert wire.calls("POST", "/sandbox/sandboxes/")[-1]["json"] == {"command": ["build", "all"]}
    assert job.id.startswith("job_")
    chunks = [c async for c in job.output()]
    assert sorted((c.stream, c.data) for c in chunks) == [("stderr", b"warn\n"), ("stdout", b"built\n")]
    final = await job.wait()
    assert (final.status, final.exit_code) == ("completed", 0)
    assert isinstance(await client.get_job(sb.id, job.id), Job)

    long = await sb.create_job(["serve"])
    jobs = await sb.list_jobs(limit=10)
    assert [j.job_id for j in jobs] == [job.id, long.id]
    assert wire.calls("GET", f"/sandbox/sandboxes/{sb.id}/jobs")[-1]["query"] == {"limit": "10"}
    stopped = await long.stop(force=True)
    assert stopped.status == "cancelled"
    assert wire.calls("DELETE", "/sandbox/sandboxes/")[-1]["query"] == {"force": "true"}
    with pytest.raises(errors.ExecutionNotFound):
        await sb.get_job("job_missing")
    with pytest.raises(errors.InvalidInput):
        await sb.create_job("echo hi")  # type: ignore[arg-type]


async def test_pause_resume_and_auto_resumed(client: SandboxClient, wire: FakeWire) -> None:
    sb = await client.create()
    paused = await sb.pause()
    assert paused.terminates_at == "2025-01-02T00:00:00Z"
    ex = await sb.execute(["echo", "hi"])
    assert ex.auto_resumed is True
    assert (await sb.execute(["echo", "again"])).auto_resumed is False
    await sb.pause()
    await sb.resume()
    assert wire.calls("POST", f"/sandbox/{sb.id}/resume")


def test_sync_client_files_and_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HUTCH_URL", "HUTCH_API_KEY", "HUTCH_DATA_DIR"):
        monkeypatch.delenv(var, raising=False)
    with ThreadedServer() as server, SyncSandboxClient(server.url, KEY) as client:
        sb = client.create()
        sb.write_files({"a.txt": "hello"})
        assert b"".join(sb.read_file("a.txt")) == b"hello"
        assert b"".join(client.read_file(sb.id, "a.txt")) == b"hello"
        assert client.set_env(sb.id, {"K": "v"}) == {"K": "v"}
        local = tmp_path / "up.txt"
        local.write_text("up")
        assert sb.copy_to(local, "/workspace/n/up.txt").directories_created == ["/workspace/n"]
        sb.copy_from("/workspace/n/up.txt", tmp_path / "down.txt")
        assert (tmp_path / "down.txt").read_text() == "up"
        assert sb.download_archive(tmp_path / "w.tgz") > 0
        assert sb.upload_archive(tmp_path / "w.tgz", path="copy").files >= 2
        job = sb.create_job(["echo", "job"])
        assert [c.data for c in job.output()] == [b"job\n"]
        assert job.wait().status == "completed"
        assert [j.job_id for j in sb.list_jobs()] == [job.id]
        with pytest.raises(errors.FileNotFound):
            list(sb.read_file("missing"))


async def test_read_file_can_stop_early(client: SandboxClient) -> None:
    sb = await client.create()
    await sb.write_files({"big": b"x" * 600_000})
    agen = sb.read_file("big", chunk_size=1024)
    first = await agen.__anext__()
    assert len(first) <= 1024
    await agen.aclose()
    assert await asyncio.wait_for(sb.read_bytes("big"), 5) == b"x" * 600_000
