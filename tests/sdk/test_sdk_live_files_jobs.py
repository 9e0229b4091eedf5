"""Files, env, jobs and pause/resume through the SDK against the real hutch application
(fake driver), plus a 100 MiB round trip against a separate server process that checks the
client streams instead of holding the file in memory."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import socket
import subprocess
import sys
import tarfile
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from hutch import SandboxClient, errors
from hutch.api.app import create_app
from hutch.service.config import Config


@pytest.fixture
async def live(aiohttp_server, tmp_path: Path) -> AsyncIterator[SandboxClient]:  # type: ignore[no-untyped-def]
    server = await aiohttp_server(create_app(Config(driver="fake", data_dir=tmp_path / "data", api_key="k")))
    async with SandboxClient(str(server.make_url("")), api_key="k") as client:
        yield client


async def test_files_round_trip(live: SandboxClient, tmp_path: Path) -> None:
    async with await live.create() as sb:
        assert await sb.write_files({"src/index.ts": "export {}\n"}) == 1
        assert b"".join([c async for c in sb.read_file("src/index.ts")]) == b"export {}\n"
        listed = await sb.list_files("src")
        assert [(f.path, f.size, f.is_dir, f.mode) for f in listed] == [("index.ts", 10, False, "0644")]
        await sb.mkdir("a/b", recursive=True)
        with pytest.raises(errors.NotFound):
            await sb.mkdir("x/y")
        assert await sb.rm_file("src/index.ts") is True
        assert await sb.rm_file("src/index.ts") is False
        with pytest.raises(errors.InvalidInput):
            await sb.rm_dir("a")  # not empty
        assert await sb.rm_dir("a", recursive=True) is True
        with pytest.raises(errors.FileNotFound):
            await sb.read_bytes("src/index.ts")

        tree = tmp_path / "proj"
        (tree / "lib").mkdir(parents=True)
        (tree / "lib" / "util.py").write_text("def f(): ...\n")
        (tree / "main.py").write_text("print('hi')\n")
        up = await sb.copy_to(tree, "/workspace/deep/er/proj", recursive=True)
        assert up.files_transferred == 2
        assert up.directories_created == ["/workspace/deep", "/workspace/deep/er"]
        assert await sb.read_bytes("/workspace/deep/er/proj/lib/util.py") == b"def f(): ...\n"
        with pytest.raises(errors.FileNotFound):
            await sb.copy_to(tree / "main.py", "/nowhere/main.py", strict=True)

        down = await sb.copy_from("/workspace/deep/er/proj", tmp_path / "back", recursive=True)
        assert down.files_transferred == 2
        assert (tmp_path / "back" / "main.py").read_text() == "print('hi')\n"

        for fmt in ("tar.gz", "zip", "tar"):
            buf = io.BytesIO()
            size = await sb.download_archive(buf, path="/workspace/deep", format=fmt)
            assert size == len(buf.getvalue()) > 0
            buf.seek(0)
            result = await sb.upload_archive(buf, path=f"/workspace/again-{fmt}")
            assert result.files == 2
            assert await sb.read_bytes(f"/workspace/again-{fmt}/er/proj/main.py") == b"print('hi')\n"

        evil = io.BytesIO()
        with tarfile.open(fileobj=evil, mode="w") as tf:
            info = tarfile.TarInfo("../escape.txt")
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
        with pytest.raises(errors.InvalidInput) as refused:
            await sb.upload_archive(evil.getvalue(), format="tar")
        assert ".." in refused.value.message


async def test_env_is_seen_by_later_executions_and_jobs(live: SandboxClient) -> None:
    async with await live.create(env={"KEEP": "1", "DROP": "2"}) as sb:
        env = await sb.set_env({"NEW": "3", "DROP": None})
        assert env == {"KEEP": "1", "NEW": "3"}
        ex = await sb.execute(["env"])
        assert "NEW=3" in (ex.stdout or "") and "DROP=" not in (ex.stdout or "")
        job = await sb.create_job(["env"])
        out = b"".join([c.data async for c in job.output()])
        assert b"NEW=3" in out


async def test_jobs_live(live: SandboxClient) -> None:
    async with await live.create() as sb:
        quick = await sb.create_job(["sh", "-c", "echo built; echo warn >&2; exit 3"])
        chunks = [c async for c in quick.output()]
        assert {(c.stream, c.data) for c in chunks} == {("stdout", b"built\n"), ("stderr", b"warn\n")}
        final = await asyncio.wait_for(quick.wait(), 10)
        assert (final.status, final.exit_code) == ("failed", 3)
        assert final.started_at and final.completed_at

        long = await sb.create_job(["sleep", "60"])
        # jobs run beside executions
        assert (await sb.execute(["echo", "beside"])).stdout == "beside\n"
        assert (await long.get()).status in ("pending", "running")
        jobs = await sb.list_jobs(limit=10)
        assert {j.job_id for j in jobs} == {quick.id, long.id}
        stopped = await long.stop(force=True)
        assert stopped.status == "cancelled"
        with pytest.raises(errors.ExecutionNotFound):
            await sb.get_job("job_nope")


async def test_pause_resume_auto_resumed_live(live: SandboxClient) -> None:
    async with await live.create() as sb:
        await sb.write_files({"keep.txt": "kept"})
        paused = await sb.pause()
        assert paused.status == "paused"
        assert (await sb.get()).status == "paused"
        ex = await sb.execute(["echo", "back"])
        assert ex.auto_resumed is True and ex.stdout == "back\n"
        assert (await sb.execute(["echo", "again"])).auto_resumed is False
        await sb.pause()
        await sb.resume()
        assert (await sb.get()).status in ("idle", "running")
        assert await sb.read_bytes("keep.txt") == b"kept"


async def test_a_filesystem_only_pause_through_the_sdk(aiohttp_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``pause(memory=False)`` on the local driver (real processes): the answer says so, the
    files stay, the resume is a new boot; the fake driver (``live``) cannot, and says so."""
    from tests.drivers_support import require_root

    require_root()
    server = await aiohttp_server(create_app(Config(driver="local", data_dir=tmp_path / "local", api_key="k")))
    async with SandboxClient(str(server.make_url("")), api_key="k") as client, \
            await client.create(runtime="base:latest") as sb:
        await sb.write_files({"keep.txt": "kept"})
        boot = (await sb.execute(["cat", "/proc/sys/kernel/random/boot_id"])).stdout
        paused = await sb.pause(memory=False)
        assert (paused.status, paused.memory) == ("paused", False)
        ex = await sb.execute(["cat", "keep.txt"])
        assert ex.auto_resumed is True and ex.stdout == "kept"
        assert (await sb.execute(["cat", "/proc/sys/kernel/random/boot_id"])).stdout != boot
        assert (await sb.pause()).memory is None  # a memory pause says nothing of it


async def test_a_filesystem_only_pause_the_driver_cannot_do_is_an_error_naming_it(live: SandboxClient) -> None:
    async with await live.create() as sb:
        with pytest.raises(errors.NotSupported, match="fake driver cannot pause a sandbox filesystem-only"):
            await sb.pause(memory=False)
        assert (await sb.get()).status == "idle"


# ---------------------------------------------------------------- 100 MiB, server in its own process

SIZE = 100 * 2**20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    env = {
        **os.environ,
        "HUTCH_DATA_DIR": str(tmp_path / "srv"),
        "HUTCH_DRIVER": "fake",
        "HUTCH_API_KEY": "k",
        "HUTCH_LOG_LEVEL": "WARNING",
    }
    env.pop("HUTCH_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hutch.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _big_file(path: Path) -> str:
    digest = hashlib.sha256()
    block = os.urandom(2**20)
    with path.open("wb") as fh:
        for i in range(SIZE // len(block)):
            piece = bytes([i % 256]) + block[1:]
            fh.write(piece)
            digest.update(piece)
    return digest.hexdigest()


def _sha(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(2**20):
            digest.update(chunk)
    return digest.hexdigest()


async def test_100mib_upload_and_download_stream_through_the_client(
    served: str, tmp_path: Path
) -> None:
    big = tmp_path / "big.bin"
    expected = _big_file(big)
    async with SandboxClient(served, api_key="k", request_timeout=120) as client:
        sb = await client.create()
        tracemalloc.start()
        try:
            up = await sb.copy_to(big, "/workspace/data/big.bin")
            assert (up.bytes_transferred, up.files_transferred) == (SIZE, 1)
            down = await sb.copy_from("/workspace/data/big.bin", tmp_path / "back.bin")
            assert down.bytes_transferred == SIZE
            archive = tmp_path / "data.tar"
            size = await sb.download_archive(archive, path="/workspace/data", format="tar")
            assert size > SIZE
            result = await sb.upload_archive(archive, path="/workspace/copy")
            assert result.bytes == SIZE
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        await sb.destroy()
    assert _sha(tmp_path / "back.bin") == expected
    print(f"client tracemalloc peak: {peak / 2**20:.2f} MiB")
    # The client never held the file: its peak is a few chunks, not 100 MiB.
    assert peak < 16 * 2**20, f"client peak {peak / 2**20:.1f} MiB"
