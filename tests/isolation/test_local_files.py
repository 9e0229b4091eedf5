# ruff: noqa: ASYNC240  (tests inspect host files directly; blocking is fine here)
"""The attacker's view of the local driver's file primitives, checkpoints and signals.

Every path a client or a sandbox chooses must resolve inside the sandbox's own view as
the sandbox user: planted symlinks, ``..``, ``/proc`` tricks and hard links never read
or write a host file, and the shared runtime (the overlay's lower layer) never changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hutch.core import runtimes
from hutch.core.errors import FileNotFound, HutchError, InvalidInput
from hutch.drivers.base import ExecRequest
from hutch.drivers.local import rootfs
from hutch.drivers.local.checkpoints import copy_layer
from hutch.drivers.local.driver import LocalDriver
from tests.drivers_support import (
    Recorder,
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    new_id,
)
from tests.isolation.test_local_isolation import PY, python, run

pytestmark = pytest.mark.isolation


async def read(driver: LocalDriver, sid: str, path: str) -> bytes:
    return b"".join([c async for c in driver.read_file(sid, path)])


async def chunks_of(data: bytes, n: int = 1 << 20) -> AsyncIterator[bytes]:
    for i in range(0, len(data), n):
        yield data[i : i + n]


async def write(driver: LocalDriver, sid: str, path: str, data: bytes) -> int:
    return await driver.write_file(sid, path, chunks_of(data))


@pytest.fixture
def host_secret() -> Path:
    """A file only the host has, at a path a sandbox might try to reach."""
    path = Path(f"/tmp/hutch-secret-{uuid.uuid4().hex}")
    path.write_bytes(b"host secret")
    yield path
    path.unlink(missing_ok=True)


def lower_of(driver: LocalDriver, runtime: str) -> Path:
    recipe = runtimes.find(runtime)
    assert recipe is not None
    return rootfs.rootfs_path(driver.runtime_cache, recipe)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_planted_symlinks_never_reach_host_files(driver: LocalDriver, sandbox: str, host_secret: Path) -> None:
    # The sandbox plants links to the host path, through /proc/1/root, /proc/self/root
    # and /proc/self/cwd, and a link to / that a client path then walks through.
    s = str(host_secret)
    result, out = await python(driver, sandbox, f"""
        import os
        for name, target in [("abs", "{s}"), ("p1", "/proc/1/root{s}"), ("pself", "/proc/self/root{s}"),
                             ("pcwd", "/proc/self/cwd/../../..{s}"), ("up", "../../../../../..{s}"),
                             ("rootdir", "/"), ("procroot", "/proc/1/root")]:
            os.symlink(target, name)
    """)
    assert result.exit_code == 0, out.stderr
    for path in ["abs", "p1", "pself", "pcwd", "up", f"rootdir{s}", f"procroot{s}", s,
                 f"../../../../..{s}", f"/proc/self/root{s}", f"/proc/1/root{s}"]:
        with pytest.raises(HutchError) as err:
            await read(driver, sandbox, path)
        assert isinstance(err.value, FileNotFound | InvalidInput), (path, err.value)
    # Writes through the same links land in the sandbox (its own /tmp), never on the host.
    for path in ["abs", f"rootdir{s}", f"../../../..{s}", s]:
        await write(driver, sandbox, path, b"from the sandbox")
        assert host_secret.read_bytes() == b"host secret", path
    assert await read(driver, sandbox, s) == b"from the sandbox"
    listed = {e.name for e in await driver.list_files(sandbox, "/tmp")}
    assert host_secret.name in listed
    # /proc/1/root is the sandbox's own root (or refused): never the host's.
    with pytest.raises(HutchError):
        await driver.list_files(sandbox, f"/proc/1/root{s}")


async def test_host_paths_are_the_sandboxes_own(driver: LocalDriver, sandbox: str) -> None:
    # /etc/shadow is the runtime's, root-only: the sandbox user cannot read it.
    with pytest.raises(InvalidInput, match="Permission denied"):
        await read(driver, sandbox, "/etc/shadow")
    with pytest.raises(InvalidInput, match="Permission denied"):
        await write(driver, sandbox, "/etc/passwd", b"root::0:0::/:/bin/sh\n")
    hostname = await read(driver, sandbox, "/etc/hostname") if any(
        e.name == "hostname" for e in await driver.list_files(sandbox, "/etc")) else b""
    assert hostname != Path("/etc/hostname").read_bytes() or not hostname
    # The server's own process is not even visible.
    with pytest.raises(FileNotFound):
        await driver.list_files(sandbox, f"/proc/{os.getpid()}/root/etc")


async def test_hard_links_and_writes_never_change_the_runtime(driver: LocalDriver, sandbox: str) -> None:
    lower = lower_of(driver, PY)
    before = {p: digest(lower / p) for p in ("usr/bin/env", "etc/passwd", "etc/hostname") if (lower / p).is_file()}
    result, out = await python(driver, sandbox, """
        import os
        for i, src in enumerate(["/usr/bin/env", "/etc/passwd", "/etc/hostname"]):
            try:
                os.link(src, f"hard{i}")
                print("linked", src)
            except OSError as err:
                print("refused", src, err.errno)
    """)
    assert result.exit_code == 0, out.stderr
    for i in range(3):
        # A refused link leaves no file (the write makes a new one); a made link is to a
        # file the sandbox user cannot write. Either way the runtime is unchanged (below).
        with contextlib.suppress(InvalidInput):
            await write(driver, sandbox, f"hard{i}", b"overwritten")
    for path in ["/usr/bin/env", "/usr/bin/../bin/env", "../../../usr/bin/env"]:
        with pytest.raises(InvalidInput, match="Permission denied"):
            await write(driver, sandbox, path, b"#!/bin/sh\necho pwned\n")
    with pytest.raises(InvalidInput):
        await driver.remove(sandbox, "/usr/bin/env", directory=False, recursive=False)
    with pytest.raises(InvalidInput):
        await driver.remove(sandbox, "/usr", directory=True, recursive=True)
    assert {p: digest(lower / p) for p in before} == before


async def test_fifos_and_devices_never_hang_or_stream_forever(driver: LocalDriver, sandbox: str) -> None:
    result, out = await run(driver, sandbox, "mkfifo", "pipe")
    assert result.exit_code == 0, out.stderr
    for path in ["pipe", "/dev/zero", "/dev/urandom"]:
        with pytest.raises(InvalidInput, match="not a regular file"):
            await asyncio.wait_for(read(driver, sandbox, path), 5)
    with pytest.raises(InvalidInput, match="not a regular file"):
        await asyncio.wait_for(write(driver, sandbox, "pipe", b"x"), 5)


async def test_recursive_remove_never_follows_links(driver: LocalDriver, sandbox: str) -> None:
    await write(driver, sandbox, "keep/precious.txt", b"keep me")
    result, out = await run(driver, sandbox, "sh", "-c", "mkdir -p doomed/sub && ln -s ../keep doomed/sub/link && ln -s /usr doomed/usr")
    assert result.exit_code == 0, out.stderr
    assert await driver.remove(sandbox, "doomed", directory=True, recursive=True) is True
    assert await read(driver, sandbox, "keep/precious.txt") == b"keep me"
    assert any(e.name == "env" for e in await driver.list_files(sandbox, "/usr/bin"))


async def test_names_with_odd_bytes_and_listing_fields(driver: LocalDriver, sandbox: str) -> None:
    name = "odd\nname \t\u00e9"
    await write(driver, sandbox, f"d/{name}", b"12345")
    await driver.symlink(sandbox, "d/ln", "target/that/does/not/exist")
    await driver.mkdir(sandbox, "d/sub", parents=False)
    entries = {e.name: e for e in await driver.list_files(sandbox, "d")}
    assert set(entries) == {name, "ln", "sub"}
    assert entries[name].size == 5 and not entries[name].is_dir and entries[name].mode & 0o777 == 0o644
    assert entries["ln"].is_symlink and entries["ln"].link_target == "target/that/does/not/exist"
    assert entries["sub"].is_dir and abs(entries["sub"].mod_time - time.time()) < 60
    assert await read(driver, sandbox, f"d/{name}") == b"12345"


async def test_large_files_stream_with_flat_memory(driver: LocalDriver, sandbox: str) -> None:
    size = 100 * 2**20
    block = os.urandom(2**20)

    async def produce() -> AsyncIterator[bytes]:
        for _ in range(size // len(block)):
            yield block

    tracemalloc.start()
    try:
        t0 = time.monotonic()
        assert await driver.write_file(sandbox, "big.bin", produce()) == size
        t_write = time.monotonic() - t0
        _, peak_write = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        h = hashlib.sha256()
        total = 0
        t0 = time.monotonic()
        async for chunk in driver.read_file(sandbox, "big.bin"):
            h.update(chunk)
            total += len(chunk)
        t_read = time.monotonic() - t0
        _, peak_read = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total == size and h.hexdigest() == hashlib.sha256(block * (size // len(block))).hexdigest()
    # A few MiB of chunks in flight at most, never the file.
    assert peak_write < 8 * 2**20 and peak_read < 8 * 2**20, (peak_write, peak_read)
    print(f"100 MiB: write {size / t_write / 1e6:.0f} MB/s, read {size / t_read / 1e6:.0f} MB/s, "
          f"peak traced {peak_write / 2**20:.1f} / {peak_read / 2**20:.1f} MiB")


async def test_a_slow_reader_holds_the_helper_back(driver: LocalDriver, sandbox: str) -> None:
    """Backpressure: nothing is read ahead of the consumer; abandoning the read stops the helper."""
    await driver.write_file(sandbox, "big.bin", chunks_of(b"\0" * (64 * 2**20)))
    it = driver.read_file(sandbox, "big.bin")
    first = await anext(it)
    assert 0 < len(first) <= 2**20
    await asyncio.sleep(0.3)
    assert driver._cgroups is not None
    leaves = [p for p in driver._cgroups.paths(sandbox)[0].iterdir() if p.name.startswith("f-")]
    assert len(leaves) == 1 and (leaves[0] / "cgroup.procs").read_text().split()  # blocked on the pipe, alive
    await it.aclose()
    for _ in range(200):
        if not any((p / "cgroup.procs").exists() and (p / "cgroup.procs").read_text().split() for p in leaves):
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the helper outlived its abandoned read")


async def test_signal_reaches_the_whole_tree(driver: LocalDriver, sandbox: str) -> None:
    """SIGTERM goes to every process of the execution (background children too), which may
    handle it; other executions are untouched."""
    other = asyncio.ensure_future(driver.exec(ExecRequest(new_id("ex"), sandbox, ["sleep", "30"]), Recorder()))
    sink = Recorder()
    eid = new_id("ex")
    script = "trap 'echo term; exit 7' TERM; (trap 'echo child-term; exit 0' TERM; sleep 30 & wait) & sleep 30 & wait"
    job = asyncio.ensure_future(driver.exec(ExecRequest(eid, sandbox, ["bash", "-c", script]), sink))
    await asyncio.sleep(0.5)
    await driver.signal(eid, signal.SIGTERM)
    result = await asyncio.wait_for(job, 5)
    assert result.exit_code == 7 and not result.cancelled, (result, sink.stdout)
    assert "term" in sink.stdout.split()
    assert not other.done()
    await driver.signal("ex-unknown", signal.SIGTERM)  # a no-op
    await driver.destroy(sandbox)
    assert (await other).cancelled or (await other).exit_code != 0


# -- disk checkpoints ------------------------------------------------------------------


async def test_checkpoint_restores_exactly_that_state(driver: LocalDriver, sandbox: str) -> None:
    """Files changed in place, deleted runtime files (whiteouts), replaced runtime dirs (opaque)
    and hard links all come back exactly; processes keep running through a checkpoint."""
    setup = """
        set -e
        echo v1 > edited.txt; echo same > a.txt; ln a.txt a-hard.txt
        mkdir -p /tmp/x; echo lower-ish > /tmp/x/f
        sleep 300 &
    """
    result, out = await run(driver, sandbox, "sh", "-c", setup)
    assert result.exit_code == 0, out.stderr
    t0 = time.monotonic()
    await driver.checkpoint(sandbox, "ckpt_one")
    took = time.monotonic() - t0
    result, out = await run(driver, sandbox, "sh", "-c", "pgrep -x sleep >/dev/null && echo alive")
    assert out.stdout == "alive\n", "a checkpoint must not stop the sandbox's processes"
    # Change everything after the checkpoint: in place (same inode), new, deleted.
    await write(driver, sandbox, "edited.txt", b"v2\n")  # O_TRUNC: the same inode
    result, out = await run(driver, sandbox, "sh", "-c", "echo more >> a-hard.txt; echo new > later.txt; rm -rf /tmp/x")
    assert result.exit_code == 0, out.stderr
    sb = driver._registry.running(sandbox)
    old_pid = sb.init_pid
    await driver.restore(sandbox, "ckpt_one")
    assert driver._registry.running(sandbox).init_pid != old_pid
    assert await read(driver, sandbox, "edited.txt") == b"v1\n"
    assert await read(driver, sandbox, "a.txt") == b"same\n"
    assert await read(driver, sandbox, "/tmp/x/f") == b"lower-ish\n"
    with pytest.raises(FileNotFound):
        await read(driver, sandbox, "later.txt")
    result, out = await run(driver, sandbox, "sh", "-c", "stat -c %h a.txt; pgrep -x sleep || echo none")
    assert out.stdout == "2\nnone\n", out.stdout  # hard link kept; processes restarted
    # A restore is repeatable, in any order.
    result, _ = await run(driver, sandbox, "sh", "-c", "echo x > /tmp/y")
    await driver.checkpoint(sandbox, "ckpt_two")
    await driver.restore(sandbox, "ckpt_one")
    with pytest.raises(FileNotFound):
        await read(driver, sandbox, "/tmp/y")
    await driver.restore(sandbox, "ckpt_two")
    assert await read(driver, sandbox, "/tmp/y") == b"x\n"
    await driver.delete_checkpoint(sandbox, "ckpt_one")
    with pytest.raises(HutchError):
        await driver.restore(sandbox, "ckpt_one")
    for bad in ["../../etc", "a/b", ""]:
        with pytest.raises(InvalidInput):
            await driver.checkpoint(sandbox, bad)
    print(f"checkpoint of a small sandbox: {took * 1000:.1f} ms")


def test_layer_copies_keep_whiteouts_opaque_dirs_and_links(tmp_path: Path) -> None:
    """What overlayfs writes into an upper layer (whiteout devices, opaque-dir xattrs) and
    what a sandbox can plant (links out, hard links, fifos) is copied as is, never followed."""
    src = tmp_path / "upper"
    (src / "opaque").mkdir(parents=True)
    os.setxattr(src / "opaque", "trusted.overlay.opaque", b"y")
    os.mknod(src / "gone", 0o600 | 0o020000, os.makedev(0, 0))  # a whiteout
    (src / "f").write_bytes(b"data")
    os.link(src / "f", src / "f2")
    os.symlink("/etc/shadow", src / "out")
    os.mkfifo(src / "fifo")
    copy_layer(src, tmp_path / "ckpt")
    dst = tmp_path / "ckpt"
    assert os.getxattr(dst / "opaque", "trusted.overlay.opaque") == b"y"
    st = os.lstat(dst / "gone")
    assert (st.st_mode & 0o170000) == 0o020000 and st.st_rdev == os.makedev(0, 0)
    assert os.stat(dst / "f").st_ino == os.stat(dst / "f2").st_ino != os.stat(src / "f").st_ino
    assert os.readlink(dst / "out") == "/etc/shadow"
    assert (os.lstat(dst / "fifo").st_mode & 0o170000) == 0o010000
    assert not (tmp_path / "ckpt.tmp").exists()


async def test_checkpoint_cost_for_1000_files_100_mib(driver: LocalDriver, sandbox: str) -> None:
    result, out = await run(driver, sandbox, "sh", "-c",
                            "mkdir -p data && cd data && for i in $(seq 1000); do head -c 104857 /dev/urandom > f$i; done; du -sm .")
    assert result.exit_code == 0, out.stderr
    t0 = time.monotonic()
    await driver.checkpoint(sandbox, "ckpt_big")
    took_ckpt = time.monotonic() - t0
    await run(driver, sandbox, "rm", "-rf", "data")
    t0 = time.monotonic()
    await driver.restore(sandbox, "ckpt_big")
    took_restore = time.monotonic() - t0
    assert len(await driver.list_files(sandbox, "data")) == 1000
    print(f"1,000 files / 100 MiB: checkpoint {took_ckpt * 1000:.0f} ms, restore {took_restore * 1000:.0f} ms")
    assert took_ckpt < 30
