"""The local driver's filesystem-only pause (E2B's ``keep_memory=False``; fspause.py):
every process ends and its memory goes, its files stay; the resume is a new boot."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from hutch.core.errors import IllegalTransition
from hutch.drivers.base import ExecRequest, ExecResult, FileWrite, ProvisionRequest, ResourceLimits
from hutch.drivers.local import layercache
from hutch.drivers.local.driver import LocalDriver
from tests.drivers_support import (
    Recorder,
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    new_id,
    provision,
)

pytestmark = pytest.mark.isolation

PY = "python:3.13"
BOOT_ID = "/proc/sys/kernel/random/boot_id"


async def run(driver: LocalDriver, sid: str, *argv: str, timeout: float | None = None) -> tuple[ExecResult, Recorder]:
    sink = Recorder()
    return await driver.exec(ExecRequest(new_id("ex"), sid, argv, timeout=timeout), sink), sink


async def out(driver: LocalDriver, sid: str, script: str) -> str:
    result, sink = await run(driver, sid, "sh", "-c", script)
    assert result.exit_code == 0, sink.text("stderr")
    return sink.text()


def alive(pid: int) -> bool:
    """Running (not gone, nor a zombie waiting for whoever reaps the host's orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


async def test_it_ends_every_process_releases_their_memory_and_keeps_the_files(driver: LocalDriver,
                                                                                sandbox: str) -> None:
    await out(driver, sandbox, "echo kept > marker.txt")
    # A background process holding 200 MiB, and a command running at the pause.
    hog = textwrap.dedent("""
        import os, time
        x = bytearray(200 * 2**20)
        for i in range(0, len(x), 4096): x[i] = 1
        open('hog.pid', 'w').write(str(os.getpid())); time.sleep(3600)
    """)
    await run(driver, sandbox, "sh", "-c", f"python3 -c \"{hog}\" >/dev/null 2>&1 &")
    for _ in range(100):
        if (driver.sandbox_root / sandbox / "upper/home/agentuity/hog.pid").exists():
            break
        await asyncio.sleep(0.05)
    assert driver._cgroups is not None
    held, cache, _ = driver._cgroups.memory_now(sandbox)
    assert held is not None and held - (cache or 0) > 150 * 2**20  # the hog's pages
    boot_before = (await out(driver, sandbox, f"cat {BOOT_ID}")).strip()
    init_before = driver._registry.running(sandbox).init_pid
    running = asyncio.ensure_future(run(driver, sandbox, "sleep", "300"))
    await asyncio.sleep(0.3)

    await driver.pause(sandbox, memory=False)

    result, _ = await asyncio.wait_for(running, 10)
    assert result.cancelled and result.exit_code == 137  # it ended, as a cancel ends one
    assert not alive(init_before)
    assert driver._cgroups.pids(sandbox) == []  # nothing of it runs, nothing frozen
    assert not driver._cgroups.is_frozen(sandbox)
    held, cache, _ = driver._cgroups.memory_now(sandbox)
    assert held is None or held - (cache or 0) < 16 * 2**20, (held, cache)
    assert (driver.sandbox_root / sandbox / "upper/home/agentuity/marker.txt").read_text() == "kept\n"
    assert sandbox in await driver.alive()  # paused, not gone: a restarted server keeps it

    await driver.resume(sandbox)

    assert driver._registry.running(sandbox).init_pid != init_before
    forked = driver._nsexec.zygote_runs
    assert await out(driver, sandbox, "cat marker.txt") == "kept\n"
    assert driver._nsexec.zygote_runs == forked + 1  # by the new pid 1 (zygote.py), not a fallback
    assert "python3" not in await out(driver, sandbox, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")  # a new boot
    boot_after = (await out(driver, sandbox, f"cat {BOOT_ID}")).strip()
    assert boot_after != boot_before and len(boot_after) == 36


async def test_nothing_runs_in_it_until_the_resume(driver: LocalDriver, sandbox: str) -> None:
    await driver.pause(sandbox, memory=False)
    await driver.pause(sandbox, memory=False)  # again: nothing more to do
    for call in (lambda: run(driver, sandbox, "true"),
                 lambda: driver.write_files(sandbox, [FileWrite("a.txt", b"a")]),
                 lambda: driver.list_files(sandbox, "/"),
                 lambda: driver.checkpoint(sandbox, "ck1")):
        with pytest.raises(IllegalTransition, match="paused"):
            await call()
    await driver.resume(sandbox)
    await driver.resume(sandbox)  # a running one: nothing to do
    assert await out(driver, sandbox, "echo up") == "up\n"


async def test_a_restarted_server_adopts_it_and_resumes_it(driver: LocalDriver, sandbox: str) -> None:
    await out(driver, sandbox, "echo before > f")
    await driver.pause(sandbox, memory=False)
    again = LocalDriver(driver.data_dir, driver.runtime_cache)
    await again.start()
    try:
        assert sandbox in await again.alive()
        await again.resume(sandbox)
        result, sink = await run(again, sandbox, "cat", "f")
        assert result.exit_code == 0 and sink.text() == "before\n"
    finally:
        await again.close()
    driver._registry.sandboxes.pop(sandbox, None)  # the other driver booted it: read it again


async def test_destroying_it_paused_leaves_nothing(driver: LocalDriver) -> None:
    sid = await provision(driver, PY)
    await driver.pause(sid, memory=False)
    await driver.destroy(sid)
    assert sid not in await driver.alive()
    assert not (driver.sandbox_root / sid).exists()
    assert driver._cgroups is not None and not driver._cgroups.paths(sid)[0].exists()


async def test_limits_disk_and_network_come_back_with_it(driver: LocalDriver) -> None:
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=PY, network_enabled=True,
                                            resources=ResourceLimits(memory_bytes=256 * 2**20, disk_bytes=2**30)))
    try:
        await out(driver, sid, "echo on-disk > /workspace/w")
        await driver.pause(sid, memory=False)
        await driver.resume(sid)
        assert await out(driver, sid, "cat /workspace/w") == "on-disk\n"
        interfaces = await out(driver, sid, "cat /proc/net/dev")
        assert "eth0:" in interfaces, interfaces  # its veth, made again for the new namespace
        # Its memory limit still holds: the cgroup it was made with, kept through the pause.
        assert driver.limits(sid).memory_bytes == 256 * 2**20
        result, _ = await run(driver, sid, "python3", "-c", "x = bytearray(400 * 2**20); x[::4096] = b'1' * len(x[::4096])")
        assert result.oom_killed
    finally:
        await driver.destroy(sid)


async def test_its_install_layer_is_held_while_it_sleeps(driver: LocalDriver) -> None:
    """Mounted nowhere while paused, its install layer is held in the cache (layercache.py)
    so that no sweep drops it (tests/unit/test_layer_cache.py); the resume mounts it again
    and lets go. (No drop is tried here: the cache is the host's, shared.)"""
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest", dependencies=("vim-tiny",)))
    try:
        layer = driver._registry.running(sid).layer
        assert layer is not None
        root = driver.runtime_cache / "layers"
        await driver.pause(sid, memory=False)
        assert layer in layercache.held_asleep(root)
        await driver.resume(sid)
        assert (root / ".asleep" / layer / sid).exists() is False
        assert await out(driver, sid, "command -v vim.tiny") == "/usr/bin/vim.tiny\n"
        await driver.pause(sid, memory=False)  # and destroyed asleep: its hold goes with it
    finally:
        await driver.destroy(sid)
    assert not (driver.runtime_cache / "layers" / ".asleep" / layer / sid).exists()
