"""The nomad driver beyond the shared contract: warm pools, failures reported through the
listener, recovery after a restart. Against the real Nomad + containerd that
``./scripts/services start nomad`` runs (a missing service fails the setup, never skips)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hutch.core.errors import RuntimeNotFound
from hutch.drivers.base import ExecRequest, ResourceLimits
from hutch.drivers.nomad.driver import NomadDriver
from tests.drivers_support import Recorder, new_id, provision, start_nomad


async def echo(driver: NomadDriver, sid: str, text: str) -> str:
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, ["echo", text]), sink)
    assert result.exit_code == 0
    return sink.stdout


async def wait_for(predicate, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.1)


async def test_create_claims_from_the_warm_pool_and_the_pool_refills(tmp_path: Path) -> None:
    driver = await start_nomad(tmp_path / "data", pool_sizes={"base:latest": 2})
    assert isinstance(driver, NomadDriver)
    try:
        pool = lambda: driver.pool_metrics()["pools"]["base:latest"]  # noqa: E731
        await wait_for(lambda: pool()["ready"] == 2)
        started = time.monotonic()
        sid = await provision(driver)
        took = time.monotonic() - started
        assert driver.pool_metrics()["claims"] == 1
        assert took < 1.0, f"a claim took {took * 1000:.0f} ms"
        assert await echo(driver, sid, "warm") == "warm\n"
        await wait_for(lambda: pool()["ready"] == 2)  # refilled in the background
        from hutch.api.routes.metrics import render

        text = render(driver.metrics()).splitlines()  # what GET /metrics shows of the pools
        assert 'hutch_nomad_pool_ready{runtime="base:latest"} 2' in text
        assert 'hutch_nomad_pool_target{runtime="base:latest"} 2' in text
        assert "hutch_nomad_pool_claims_total 1" in text and "# TYPE hutch_nomad_pool_claims_total counter" in text
        # A create with other resources cannot use the pool: it is scheduled cold.
        from hutch.drivers.base import ResourceLimits

        other = await provision(driver, resources=ResourceLimits(memory_bytes=128 * 2**20))
        assert driver.pool_metrics()["claims"] == 1 and driver.pool_metrics()["misses"] >= 1
        await driver.destroy(other)
        await driver.destroy(sid)
    finally:
        prefix = driver._job_prefix()
        await driver.close()
    # close() drains the idle allocations; nothing of this driver stays placed but what it destroyed.
    jobs = await asyncio.to_thread(_jobs, prefix)
    assert not [j for j in jobs if "-pool-" in j["ID"] and j["Status"] != "dead"]


def _jobs(prefix: str) -> list[dict]:  # type: ignore[type-arg]
    import nomad

    from tests.drivers_support import NOMAD_ADDR, NOMAD_TOKEN

    return nomad.Nomad(address=NOMAD_ADDR, token=NOMAD_TOKEN).jobs.get_jobs(prefix=prefix)


async def test_a_sandbox_killed_outside_hutch_is_reported(tmp_path: Path) -> None:
    driver = await start_nomad(tmp_path / "data")
    ended: list[tuple[str, str, bool]] = []

    async def listener(sid: str, reason: str, failed: bool) -> None:
        ended.append((sid, reason, failed))

    driver.set_listener(listener)
    try:
        sid = await provision(driver)
        assert isinstance(driver, NomadDriver)
        alloc = driver._sandboxes[sid].alloc_id
        # The task dies under Nomad's feet (as on an OOM kill or a crashed node).
        await asyncio.to_thread(
            subprocess.run, ["ctr", "--address", "/run/hutch-containerd/containerd.sock", "-n", "nomad",
                             "tasks", "kill", "-a", "-s", "KILL", f"sandbox-{alloc}"], check=True)
        await wait_for(lambda: bool(ended), 30)
        assert ended[0][0] == sid and ended[0][2] is True
        assert "allocation" in ended[0][1]
        assert sid not in await driver.alive()
    finally:
        for s in await driver.alive():
            await driver.destroy(s)
        await driver.close()


async def test_a_restarted_driver_adopts_its_sandboxes(tmp_path: Path) -> None:
    first = await start_nomad(tmp_path / "data")
    sid = await provision(first, env={"KEPT": "yes"})
    await first.close()  # sandboxes keep running
    second = await start_nomad(tmp_path / "data")
    try:
        assert sid in await second.alive()
        sink = Recorder()
        result = await second.exec(ExecRequest(new_id("ex"), sid, ["printenv", "KEPT"]), sink)
        assert (result.exit_code, sink.stdout) == (0, "yes\n")
    finally:
        await second.destroy(sid)
        await second.close()


async def test_a_take_over_whose_state_file_cannot_be_written_says_so(tmp_path: Path) -> None:
    """Another replica's sandbox taken over while this replica's disk is full (its state file's
    temp file is /dev/full: ENOSPC). adopt() raised the bare OSError after it had taken the
    sandbox's allow list (and a paused one's hold), and the take-over logged it and went on:
    the sandbox stayed claimed, driven by no one, its job running. Now the error names the
    state file and the full disk, nothing of the sandbox is kept, and its job is stopped and
    purged (nothing runs that no replica records): EndedUnadopted, the one failure the take-over
    records as the sandbox's end (any other ended nothing)."""
    from hutch.core.errors import EndedUnadopted
    from hutch.core.models import NetworkSpec, SandboxSpec, SandboxState, SandboxStatus

    placer = await start_nomad(tmp_path / "a")
    taker = await start_nomad(tmp_path / "b")
    assert isinstance(placer, NomadDriver) and isinstance(taker, NomadDriver)
    try:
        sid = await provision(placer)
        handle = placer.handle(sid)
        assert handle is not None
        (taker.state_dir / f"{sid}.tmp").symlink_to("/dev/full")
        spec = SandboxSpec(runtime="base:latest", runtime_id="base:latest",
                           network=NetworkSpec(enabled=True, allow=("192.0.2.1",)))
        state = SandboxState(sandbox_id=sid, spec=spec, status=SandboxStatus.PAUSED, created_at="", updated_at="")
        with pytest.raises(EndedUnadopted) as err:
            await taker.adopt(state, handle)
        assert "state file" in err.value.message and "No space left on device" in err.value.message, err.value
        assert str(taker.state_dir) not in err.value.message and handle["job_id"] not in err.value.message, err.value
        assert sid not in await taker.alive() and sid not in taker._allow._lists and sid not in taker._paused
        assert not await taker._alloc_running(handle["job_id"], handle["alloc_id"])
    finally:
        for d in (placer, taker):
            for s in await d.alive():
                with contextlib.suppress(Exception):
                    await d.destroy(s)
            await d.close()


async def _left_as_a_kill_leaves_it(driver: NomadDriver) -> None:
    """Closed without draining its warm pool: what a killed (or restarted) server leaves placed."""
    async def drain_nothing() -> None:
        pass

    driver._drain_pools = drain_nothing  # type: ignore[method-assign]
    await driver.close()


async def _live_pool_jobs(prefix: str) -> list[str]:
    return [j["ID"] for j in await asyncio.to_thread(_jobs, prefix) if "-pool-" in j["ID"] and j["Status"] != "dead"]


async def _restart_without_pools(data_dir: Path) -> tuple[list[str], list[str]]:
    """A driver started on ``data_dir`` with pools off, then closed: the pool jobs it adopted
    at start, and those of its job prefix still live after 60 s (none of either: what the last
    run left is not wanted)."""
    driver = await start_nomad(data_dir)
    assert isinstance(driver, NomadDriver)
    try:
        adopted = [e.job_id for pool in driver._pool.values() for e in pool] + \
            ["(starting)"] * sum(driver._pool_starting.values())
        prefix, deadline = driver._job_prefix(), time.monotonic() + 60
        for _ in range(120):  # stopped in the background
            left = await _live_pool_jobs(prefix)
            if not left or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        return adopted, left
    finally:
        for s in list(driver._sandboxes):
            await driver.destroy(s)
        await driver.close()


async def test_a_restarted_driver_adopts_its_warm_pool_and_stops_a_pool_no_longer_wanted(tmp_path: Path) -> None:
    """A server restarted with its warm pool placed finds the idle allocations still running: the
    new driver takes them back into its pool, and a create claims one. It used to read the
    runtime from Nomad's job list, whose stubs carry no job meta unless asked, so it stopped
    every one and placed the pool again. A pool job of a runtime no longer wanted is stopped."""
    checked = False
    try:
        first = await start_nomad(tmp_path / "data", pool_sizes={"base:latest": 1})
        assert isinstance(first, NomadDriver)
        prefix = first._job_prefix()
        try:
            await wait_for(lambda: first.pool_metrics()["pools"]["base:latest"] == {"target": 1, "ready": 1,
                                                                                     "starting": 0})
            entry = first._pool["base:latest"][0]
            # The list says each job's meta when asked: recovery reads no job one by one.
            assert [j.get("Meta") for j in await first._client.jobs(prefix, meta=True)] == [{"hutch.pool": "base:latest"}]
        finally:
            await _left_as_a_kill_leaves_it(first)
        second = await start_nomad(tmp_path / "data", pool_sizes={"base:latest": 1})
        assert isinstance(second, NomadDriver)
        try:
            await wait_for(lambda: second.pool_metrics()["pools"]["base:latest"]["starting"] == 0)
            assert [(e.job_id, e.alloc_id) for e in second._pool.get("base:latest", ())] == \
                [(entry.job_id, entry.alloc_id)], "the surviving pool job was not adopted"
            # Its agent ended with the killed server's session: one is started before a create
            # can claim it, as for an allocation placed now, and the claimer takes it over.
            agent = second._agents.live(entry.job_id)
            assert agent is not None, "the adopted pool allocation has no agent"
            sid = await provision(second)
            assert second.pool_metrics()["claims"] == 1 and second._sandboxes[sid].alloc_id == entry.alloc_id
            assert second._agents.live(sid) is agent
            assert await echo(second, sid, "adopted") == "adopted\n"
            await second.destroy(sid)
            await wait_for(lambda: second.pool_metrics()["pools"]["base:latest"]["ready"] == 1)  # refilled
            assert await _live_pool_jobs(prefix) == [second._pool["base:latest"][0].job_id]
        finally:
            await _left_as_a_kill_leaves_it(second)
        checked = True
        assert await _restart_without_pools(tmp_path / "data") == ([], []), "a pool no longer wanted was kept"
    finally:
        if not checked:  # nothing of a failed run stays placed
            await _restart_without_pools(tmp_path / "data")


@pytest.mark.parametrize("limit_mb", [64])
async def test_memory_limit_holds_and_the_sandbox_survives(tmp_path: Path, limit_mb: int) -> None:
    from hutch.drivers.base import ResourceLimits

    driver = await start_nomad(tmp_path / "data")
    try:
        sid = await provision(driver, resources=ResourceLimits(memory_bytes=limit_mb * 2**20))
        sink = Recorder()
        # tail keeps everything after the last newline: /dev/zero has none.
        hog = f"head -c {4 * limit_mb}M /dev/zero | tail > /dev/null"
        result = await driver.exec(ExecRequest(new_id("ex"), sid, ["sh", "-c", hog]), sink)
        assert result.exit_code == 137, (result, sink.stderr)
        assert await echo(driver, sid, "alive") == "alive\n"
        await driver.destroy(sid)
    finally:
        await driver.close()


async def test_file_primitives_stay_inside_the_container(tmp_path: Path) -> None:
    """Paths resolve in the sandbox's own view: a planted symlink to a host path, ``..`` and
    /proc tricks reach the container's files (or nothing), never the Nomad client's."""
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host only")
    driver = await start_nomad(tmp_path / "data")
    try:
        sid = await provision(driver)
        sink = Recorder()
        await driver.exec(ExecRequest(new_id("ex"), sid, ["ln", "-s", str(secret), "planted"]), sink)
        from hutch.core.errors import FileNotFound

        for path in ("planted", str(secret), f"../../..{secret}", f"/proc/1/root{secret}"):
            with pytest.raises(FileNotFound):
                [c async for c in driver.read_file(sid, path)]
        # Writes through the planted link land inside the container, not on the host.
        async def once():  # type: ignore[no-untyped-def]
            yield b"from the sandbox"
        with pytest.raises(FileNotFound):  # the link's directory does not exist in the container
            await driver.write_file(sid, "planted", once(), parents=False)
        assert secret.read_text() == "host only"
        # What the sandbox user cannot read in its own container, the API cannot either.
        from hutch.core.errors import HutchError

        with pytest.raises(HutchError):
            [c async for c in driver.read_file(sid, "/etc/shadow")]
        # Large files stream both ways.
        size = 24 * 2**20

        async def produce():  # type: ignore[no-untyped-def]
            for _ in range(size // 2**20):
                yield b"\x5a" * 2**20
        assert await driver.write_file(sid, "big.bin", produce()) == size
        got = 0
        async for chunk in driver.read_file(sid, "big.bin"):
            assert set(chunk) == {0x5A}
            got += len(chunk)
        assert got == size
        # A reader that stops early stops the transfer; the sandbox goes on working.
        it = driver.read_file(sid, "big.bin")
        await it.__anext__()
        await it.aclose()
        assert await echo(driver, sid, "still here") == "still here\n"
        await driver.destroy(sid)
    finally:
        await driver.close()


def test_overlay_whiteouts_become_oci_whiteouts(tmp_path: Path) -> None:
    """An install layer is an overlay upper dir: its 0/0 character devices mean "deleted
    below" and must not be copied into an image as device files."""
    import os
    import stat

    from hutch.drivers.nomad import images

    tree = tmp_path / "upper"
    (tree / "usr/bin").mkdir(parents=True)
    (tree / "usr/bin/tool").write_text("new")
    os.mknod(tree / "usr/bin/gone", stat.S_IFCHR | 0o000, os.makedev(0, 0))
    os.mknod(tree / "old-dir", stat.S_IFCHR | 0o000, os.makedev(0, 0))
    assert images._copy_without_whiteouts(tree, tmp_path / "copy") == ["/old-dir", "/usr/bin/gone"]
    copied = sorted(str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*"))
    assert copied == ["usr", "usr/bin", "usr/bin/tool"]


async def test_an_archive_whose_stream_ends_after_tar_is_done_still_imports(tmp_path: Path) -> None:
    """tar exits once it has read an archive's end blocks; a source that takes its time to
    say it has nothing more (a blob store's last round trip) must not turn a
    complete import into a failed request (it did: the cut feed re-raised as a cancel)."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"imported\n"
        info = tarfile.TarInfo("seeded/file.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    archive = buf.getvalue()

    async def slow_to_end() -> AsyncIterator[bytes]:
        yield archive  # a whole archive, end blocks and all: tar has what it needs and exits
        await asyncio.sleep(1.5)  # while the source is still finding out that it is done

    driver = await start_nomad(tmp_path / "data")
    sid = await provision(driver)
    try:
        await driver.import_tar(sid, "dest", slow_to_end(), gzipped=False)  # relative: in HOME
        sink = Recorder()
        result = await driver.exec(ExecRequest(new_id("ex"), sid, ["cat", "dest/seeded/file.txt"]), sink)
        assert (result.exit_code, sink.stdout) == (0, "imported\n")
    finally:
        await driver.destroy(sid)
        await driver.close()


async def test_an_install_layer_in_the_registry_needs_no_local_runtime_tree(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any API server of a deployment can place a sandbox whose install layer another server
    pushed: the layer's image is keyed by its recipe, so a host without the runtime's tree
    (another replica, or this one after losing its disk) finds it in the registry. Before,
    it refused with RuntimeNotFound ("not built") although the image was there."""
    from hutch.drivers.base import ProvisionRequest
    from hutch.drivers.local import rootfs
    from hutch.drivers.nomad.runtime_images import RuntimeImages

    registry = os.environ["HUTCH_NOMAD_REGISTRY"]
    req = ProvisionRequest("sbx_layertest", "base:latest", dependencies=("jq",))
    builder = RuntimeImages(registry, rootfs.default_cache())
    key = await builder.layer(req)  # built here (or found) and pushed
    assert key is not None

    empty = tmp_path / "no-runtimes"
    empty.mkdir()
    monkeypatch.setenv("HUTCH_RUNTIME_CACHE", str(empty))
    elsewhere = RuntimeImages(registry, empty)
    assert await elsewhere.layer(req) == key
    assert list(empty.iterdir()) == []  # nothing was built or unpacked for it

    # A layer nobody pushed still needs the tree, and says so.
    other = ProvisionRequest("sbx_layertest", "base:latest", dependencies=("jq", "file"))
    with pytest.raises(RuntimeNotFound, match="not built"):
        await elsewhere.layer(other)


async def test_a_disk_limited_sandbox_reports_its_own_file_system(driver: NomadDriver) -> None:
    """E2B's disk metrics with a disk limit: the plugin's file system of that size holds the
    workspace and the writable layer (containerd-driver/disk.go), so both count, and its size
    is the total (tests/contracts/test_driver.py holds the case without a limit)."""
    from hutch.drivers.base import ResourceLimits

    sid = await provision(driver, resources=ResourceLimits(memory_bytes=256 * 2**20, cpu_millis=1000,
                                                           disk_bytes=64 * 2**20))
    before = await driver.usage(sid, disk=True)
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, [
        "sh", "-c", "head -c 4194304 /dev/zero > /tmp/four; head -c 4194304 /dev/zero > $HOME/four"]), sink)
    assert result.exit_code == 0, sink.stderr
    after = await driver.usage(sid, disk=True)
    assert before.disk_total_bytes is not None and 56 * 2**20 < before.disk_total_bytes <= 64 * 2**20
    assert before.disk_used_bytes is not None and after.disk_used_bytes is not None
    assert after.disk_used_bytes - before.disk_used_bytes >= 8 * 2**20  # the layer's file and the workspace's
    assert (after.memory_total_bytes, after.cpu_count) == (256 * 2**20, 1)


async def test_a_watch_that_falls_behind_the_kernels_queue_ends_saying_events_were_lost(driver: NomadDriver) -> None:
    """Nobody takes the events: the agent's window and the helper's pipe fill, the helper stops
    reading inotify, the kernel's queue (max_queued_events, 16384) overflows. The next take
    ends the watch naming the loss, never an incomplete history (drivers/local/watches.py)."""
    from hutch.core.driver_types import WatchEnded
    from hutch.core.errors import RateLimited

    sid = await provision(driver, "python:3.13")
    await driver.mkdir(sid, "busy", parents=False)
    watch = await driver.watch_dir(sid, "busy", recursive=False)
    # 40,000 creates of 200-character names: ~8 MB of records, past every buffer on the way.
    make = "import os\nfor i in range(40000): os.close(os.open('busy/%0200d' % i, os.O_CREAT | os.O_WRONLY))"
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, ["python3", "-c", make], timeout=120), sink)
    assert result.exit_code == 0, sink.stderr

    async def take_until_it_ends() -> None:
        async with asyncio.timeout(60):
            while True:
                await watch.flush()

    with pytest.raises(RateLimited, match=r"fell behind.*some were lost"):
        await take_until_it_ends()
    with pytest.raises(WatchEnded):
        await watch.flush()


async def test_without_exec_agents_watches_and_metadata_are_refused_naming_the_setting(tmp_path: Path) -> None:
    """HUTCH_NOMAD_EXEC=alloc: no agent, so no helper (drivers/nomad/helpers.py); the
    capabilities say so (the E2B wire's 501 / unimplemented) and the calls name the setting."""
    from hutch.core.errors import NotSupported
    from hutch.drivers.base import FileWrite

    driver = await start_nomad(tmp_path / "data", exec_mode="alloc")
    assert isinstance(driver, NomadDriver)
    try:
        assert not driver.capabilities.watches and not driver.capabilities.metadata
        sid = await provision(driver)
        await driver.write_files(sid, [FileWrite("f.txt", b"x")])
        with pytest.raises(NotSupported, match="HUTCH_NOMAD_EXEC=alloc"):
            await driver.watch_dir(sid, ".", recursive=False)
        with pytest.raises(NotSupported, match="HUTCH_NOMAD_EXEC=alloc"):
            await driver.set_metadata(sid, "f.txt", {"k": "v"})
        assert [e.metadata for e in await driver.list_files(sid, "f.txt")] == [{}]
    finally:
        for sid in await driver.alive():
            await driver.destroy(sid)
        await driver.close()


async def test_a_plugin_that_reads_the_page_cache_is_taken_at_its_word(driver: NomadDriver,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The dev agent's plugin may predate cgroupUsage's memory now and page cache (the
    contract test then sees neither): its answer is faked here, Nomad's stats left unasked."""
    import json

    from hutch.drivers.nomad import usage as nomad_usage

    sid = await provision(driver)
    said = {"cpuSeconds": 1.5, "memoryPeakBytes": 9000, "memoryBytes": 8192, "memoryCacheBytes": 2048}

    async def verb(*_args: object) -> tuple[int, bytes]:
        return 0, json.dumps(said).encode()

    async def not_asked(*_args: object) -> int:
        raise AssertionError("Nomad's allocation stats were asked although the plugin said the memory held")

    monkeypatch.setattr(nomad_usage, "plugin_verb", verb)
    monkeypatch.setattr(driver._readings, "memory_now", not_asked)
    used = await driver.usage(sid, disk=True)
    assert (used.cpu_seconds, used.memory_peak_bytes, used.memory_bytes, used.memory_cache_bytes) == (1.5, 9000, 8192,
                                                                                                     2048)
    assert used.disk_used_bytes is not None and used.memory_total_bytes == 512 * 2**20


async def test_a_command_cannot_name_itself_one_of_the_agents_helpers(driver: NomadDriver) -> None:
    """Only the API's start request makes a helper (exec-agent/helper.go): a command that
    names the helper's argv[0] is a program looked up on PATH, and not found."""
    sid = await provision(driver)
    assert await driver._agents.ready(driver.running(sid)) is not None  # the command goes through it
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, ["hutch-exec-agent-helper", "watch", ".", "0"]), sink)
    assert (result.exit_code, sink.stdout) == (127, "")


async def test_without_an_agent_binary_the_capabilities_say_no_helpers(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Agent mode, but the binary cannot be built (no Go on the server): commands run as alloc
    execs, and watches and metadata are not claimed (the E2B wire then answers 501 itself)."""
    from hutch.core.errors import DriverFailure
    from hutch.drivers.nomad import agents

    def no_go(*_args: object) -> Path:
        raise DriverFailure("Go is not installed: cannot build the nomad exec agent")

    monkeypatch.setattr(agents, "build", no_go)
    driver = await start_nomad(tmp_path / "data")
    assert isinstance(driver, NomadDriver)
    try:
        assert not driver.capabilities.watches and not driver.capabilities.metadata
        sid = await provision(driver)
        assert await echo(driver, sid, "still runs") == "still runs\n"
        from hutch.core.errors import NotSupported

        with pytest.raises(NotSupported, match="exec agent, which this server could not build"):
            await driver.watch_dir(sid, ".", recursive=False)  # the E2B wire asks the driver itself
    finally:
        for sid in await driver.alive():
            await driver.destroy(sid)
        await driver.close()


@pytest.mark.parametrize("pooled", [False, True], ids=["named", "pool-entry"])
async def test_a_job_a_lost_replica_placed_and_never_recorded_is_stopped_and_purged(tmp_path: Path,
                                                                                    pooled: bool) -> None:
    """Another replica placed a sandbox and was lost before recording it (issue 35): the
    survivor's take-over finds its job (by the name hutch gives it, whichever replica placed
    it; one taken from a warm pool through the owner row's handle), stops it and purges it.
    The lost replica's other sandbox, recorded, is left alone."""
    from hutch.drivers.nomad.client import NomadNotFound

    lost = await start_nomad(tmp_path / "a", **({"pool_sizes": {"base:latest": 1}} if pooled else {}))
    survivor: NomadDriver | None = None
    assert isinstance(lost, NomadDriver)
    try:
        if pooled:
            await wait_for(lambda: lost.pool_metrics()["pools"]["base:latest"]["ready"] == 1)
        sid = await provision(lost)
        assert (lost.pool_metrics()["claims"] == 1) is pooled
        job_id, alloc_id = lost._sandboxes[sid].job_id, lost._sandboxes[sid].alloc_id
        assert (sid in job_id) is not pooled
        handle = lost.handle(sid) if pooled else {}
        assert handle is not None
        other = await provision(lost, resources=ResourceLimits(memory_bytes=128 * 2**20))  # never pooled
        kept = lost._sandboxes[other]
        await lost.close()  # the replica is gone; its jobs run on
        started = await start_nomad(tmp_path / "b")
        assert isinstance(started, NomadDriver)
        survivor = started
        await survivor.discard_unrecorded(sid, handle)
        assert not [j for j in await asyncio.to_thread(_jobs, job_id) if j["ID"] == job_id], "the job was not purged"
        with pytest.raises(NomadNotFound):  # stopped, then collected: its task is gone
            await survivor._client.allocation(alloc_id)
        assert await survivor._alloc_running(kept.job_id, kept.alloc_id)
        await survivor.discard_unrecorded(sid, handle)  # a second claim finds nothing: no error
    finally:
        if survivor is not None:
            await survivor.close()
        again = await start_nomad(tmp_path / "a")  # adopts what it left, and it goes
        for s in list(again._sandboxes):  # type: ignore[attr-defined]
            await again.destroy(s)
        await again.close()
