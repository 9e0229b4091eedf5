# ruff: noqa: ASYNC240  (tests inspect host files directly; blocking is fine here)
"""The security floor (ARCHITECTURE.md), checked against the local driver on this host.

Needs root and the python:3.13 runtime (built by the session fixture). A missing
prerequisite fails loudly; nothing here skips.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import json
import os
import signal
import socket
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from hutch.core.errors import InvalidInput
from hutch.drivers.base import ExecRequest, ExecResult, FileWrite, ResourceLimits
from hutch.drivers.local.driver import LocalDriver
from hutch.drivers.local.native import seccomp_program
from tests.drivers_support import (
    Recorder,
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    new_id,
    provision,
)
from tests.isolation import channel_probe, terminal_probe

pytestmark = pytest.mark.isolation

PY = "python:3.13"


async def run(driver: LocalDriver, sid: str, *argv: str, **kw: object) -> tuple[ExecResult, Recorder]:
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, argv, **kw), sink)  # type: ignore[arg-type]
    return result, sink


async def python(driver: LocalDriver, sid: str, code: str, **kw: object) -> tuple[ExecResult, Recorder]:
    return await run(driver, sid, "python3", "-c", textwrap.dedent(code), **kw)


def status_of(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def sandbox_processes(driver: LocalDriver, sid: str) -> list[int]:
    """Host pids of the processes inside the sandbox's pid namespace."""
    sb = driver._registry.running(sid)
    ns = os.readlink(f"/proc/{sb.init_pid}/ns/pid")
    assert driver._cgroups is not None
    found = []
    for pid in driver._cgroups.pids(sid):
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") == ns:
                found.append(pid)
        except FileNotFoundError:
            pass
    return found


# -- network -----------------------------------------------------------------------


async def test_only_loopback_and_no_route_to_host_services(driver: LocalDriver, sandbox: str) -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        result, out = await python(driver, sandbox, f"""
            import socket
            print(sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]))
            for addr in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("{socket.gethostname()}", 22)]:
                try:
                    socket.create_connection(addr, timeout=2)
                    print("connected", addr)
                except OSError as err:
                    print("refused", type(err).__name__)
        """)
    finally:
        server.close()
        await server.wait_closed()
    assert result.exit_code == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "['lo']"
    assert not any(line.startswith("connected") for line in lines), out.stdout


async def test_no_raw_or_packet_sockets(driver: LocalDriver, sandbox: str) -> None:
    result, out = await python(driver, sandbox, """
        import socket
        for args in [(socket.AF_PACKET, socket.SOCK_RAW, 0), (socket.AF_PACKET, socket.SOCK_DGRAM, 0),
                     (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
                     (socket.AF_INET, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.IPPROTO_ICMP)]:
            try:
                socket.socket(*args)
                print("allowed")
            except OSError as err:
                print(errno.errorcode[err.errno])
    """.replace("import socket", "import errno, socket"))
    # Raw sockets are refused as raw (EPERM); AF_PACKET of any type is outside the family
    # allow-list (EAFNOSUPPORT; the kernel alone would say EPERM, for want of CAP_NET_RAW).
    assert (result.exit_code, out.stdout) == (0, "EPERM\nEAFNOSUPPORT\nEPERM\nEPERM\n"), out.stderr


async def test_no_channel_around_the_network_namespace(driver: LocalDriver, sandbox: str) -> None:
    """vsock and the other socket families, host devices, the host's abstract unix sockets,
    its processes' namespaces, its System V and POSIX IPC, the keyring and io_uring: the
    attacker's view of every way out that a network namespace alone does not close."""
    with channel_probe.host_bait() as bait:
        result, out = await run(driver, sandbox, "python3", "-c", channel_probe.SCRIPT, json.dumps(bait))
    assert result.exit_code == 0, out.stderr
    channel_probe.assert_sealed(json.loads(out.stdout))


# -- limits --------------------------------------------------------------------------


async def test_commands_start_with_default_signal_dispositions(driver: LocalDriver, sandbox: str) -> None:
    """A server started in the background by a non-interactive shell (nohup, CI, systemd
    units) ignores SIGINT and SIGQUIT; ignored dispositions and the signal mask survive
    exec. A sandbox's command must not inherit them: ^C in a terminal would do nothing, and
    a command could not be interrupted the way its author expects."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        result, out = await run(driver, sandbox, "sh", "-c", "grep -E '^Sig(Ign|Blk)' /proc/self/status")
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert result.exit_code == 0, out.stderr
    seen = dict(line.split(":\t") for line in out.stdout.splitlines())
    assert seen == {"SigBlk": "0000000000000000", "SigIgn": "0000000000000000"}, seen


async def test_memory_hog_is_oom_killed_and_sandbox_survives(driver: LocalDriver) -> None:
    sid = await provision(driver, PY, resources=ResourceLimits(memory_bytes=128 * 2**20))
    try:
        result, _ = await python(driver, sid, """
            hog = []
            while True:
                hog.append(bytearray(16 * 2**20))
        """, timeout=60)
        assert result.oom_killed
        assert result.exit_code == 137
        assert not result.timed_out
        result, out = await run(driver, sid, "echo", "survived")
        assert (result.exit_code, out.stdout) == (0, "survived\n")
    finally:
        await driver.destroy(sid)


async def test_fork_bomb_is_contained(driver: LocalDriver) -> None:
    sid = await provision(driver, PY, resources=ResourceLimits(pids=64))
    other = await provision(driver, PY)
    try:
        assert driver._cgroups is not None
        peak = 0

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, len(driver._cgroups.pids(sid)))  # type: ignore[union-attr]
                await asyncio.sleep(0.05)

        sampler = asyncio.create_task(sample())
        started = time.monotonic()
        result, _ = await run(driver, sid, "bash", "-c", ":(){ :|:& };: ; sleep 30", timeout=3)
        sampler.cancel()
        assert result.timed_out
        assert time.monotonic() - started < 20
        assert 10 < peak <= 64
        result, out = await run(driver, sid, "sh", "-c", "ps -e --no-headers | wc -l")
        assert result.exit_code == 0
        assert int(out.stdout) <= 4  # init, sh, ps, wc: the bomb is gone
        # Neither the host nor another sandbox noticed.
        proc = await asyncio.create_subprocess_exec("true")
        assert await proc.wait() == 0
        result, _ = await run(driver, other, "true")
        assert result.exit_code == 0
    finally:
        await driver.destroy(sid)
        await driver.destroy(other)


async def test_a_fork_bomb_left_behind_by_an_ended_command_is_ended(driver: LocalDriver) -> None:
    # Its command ends at once (timeouts and cancel never reach it); the bomb would hold the
    # sandbox at its pids limit for ever: the pids guard ends its leaf (pidsguard.py).
    sid = await provision(driver, PY, resources=ResourceLimits(pids=64))
    try:
        result, _ = await run(driver, sid, "sh", "-c", "b(){ b | b & }; b; exit 0", timeout=10)
        assert not result.timed_out
        started = time.monotonic()
        while time.monotonic() - started < 15:
            result, out = await run(driver, sid, "sh", "-c", "echo usable; ps -e --no-headers | wc -l", timeout=5)
            words = out.stdout.split()
            if result.exit_code == 0 and len(words) == 2 and int(words[1]) <= 5:
                break
            await asyncio.sleep(0.2)
        assert result.exit_code == 0 and int(out.stdout.split()[1]) <= 5, out.stdout  # init, sh, ps, wc
        assert time.monotonic() - started < 10  # two guard periods and the kill, with room for a loaded CI
    finally:
        await driver.destroy(sid)


async def test_background_fork_bomb_dies_with_the_sandbox(driver: LocalDriver) -> None:
    sid = await provision(driver, PY, resources=ResourceLimits(pids=64))
    assert driver._cgroups is not None
    # The bomb goes to the background from a subshell, the command's one fork: run from the
    # command's own shell, that shell forked each element of the pipeline itself, and a fork
    # refused at the full limit made bash retry it, sleeping 1, 2, 4, 8 s (past the 10 s
    # timeout on a loaded machine, which then killed the bomb: nothing left for the destroy).
    result, _ = await run(driver, sid, "bash", "-c", "(:(){ :|:& };:) >/dev/null 2>&1 & exit 0", timeout=10)
    assert (result.exit_code, result.timed_out) == (0, False)
    for _ in range(100):  # the bomb fills the limit, and stays within it
        if len(driver._cgroups.pids(sid)) >= 32:
            break
        await asyncio.sleep(0.05)
    assert 32 <= len(driver._cgroups.pids(sid)) <= 64
    started = time.monotonic()
    await driver.destroy(sid)
    assert time.monotonic() - started < 10
    assert not any(p.exists() for p in driver._cgroups.paths(sid))


async def test_pids_limit_holds(driver: LocalDriver) -> None:
    sid = await provision(driver, PY, resources=ResourceLimits(pids=20))
    try:
        result, out = await python(driver, sid, """
            import os, time
            n = 0
            try:
                for _ in range(100):
                    if os.fork() == 0:
                        time.sleep(30)
                        os._exit(0)
                    n += 1
            except BlockingIOError:
                pass
            print(n)
        """, timeout=20)
        assert result.exit_code == 0, out.stderr
        assert int(out.stdout) < 20
    finally:
        await driver.destroy(sid)


async def test_cpu_limit_is_applied(driver: LocalDriver) -> None:
    sid = await provision(driver, PY, resources=ResourceLimits(cpu_millis=250))
    try:
        result, out = await python(driver, sid, """
            import os, time
            end = time.monotonic() + 2
            while time.monotonic() < end:
                pass
            t = os.times()
            print(t.user + t.system)
        """)
        assert result.exit_code == 0, out.stderr
        assert float(out.stdout) < 1.0  # ~0.5 s of CPU in 2 s at 250m; unlimited would be 2 s
    finally:
        await driver.destroy(sid)


async def test_timeout_kills_background_children(driver: LocalDriver, sandbox: str) -> None:
    result, _ = await run(driver, sandbox, "sh", "-c", "sleep 1000 & sleep 1001 & (sleep 1002 &) ; sleep 1003",
                          timeout=1)
    assert result.timed_out
    _, out = await run(driver, sandbox, "ps", "-eo", "args", "--no-headers")
    assert "sleep" not in out.stdout


# -- filesystem ----------------------------------------------------------------------


async def test_host_files_are_invisible(driver: LocalDriver, sandbox: str) -> None:
    marker = f"hutch-marker-{uuid.uuid4().hex}"
    host_files = [Path("/root") / marker, Path("/tmp") / marker, Path(__file__).parent / marker]
    for f in host_files:
        f.write_text("host secret")
    try:
        result, out = await run(driver, sandbox, "sh", "-c", f"find / -name '{marker}*' 2>/dev/null; "
                                f"cat /root/{marker} /tmp/{marker}; ls /work")
        assert marker not in out.stdout
        assert "host secret" not in out.stdout
        assert result.exit_code != 0
    finally:
        for f in host_files:
            f.unlink()


async def test_runtime_root_is_read_only_and_unchanged(driver: LocalDriver, sandbox: str) -> None:
    from hutch.drivers.local import rootfs

    lower = rootfs.rootfs_path(driver.runtime_cache, rootfs.lookup(PY))
    before = (lower / "etc/passwd").read_bytes()
    result, _ = await run(driver, sandbox, "sh", "-c",
                          "touch /usr/hutch-x || echo denied; echo evil >> /etc/passwd || echo denied")
    assert result.exit_code == 0
    with pytest.raises(InvalidInput):
        await driver.write_files(sandbox, [FileWrite("/usr/bin/hutch-x", b"x")])
    assert not (lower / "usr/hutch-x").exists()
    assert not (lower / "usr/bin/hutch-x").exists()
    assert (lower / "etc/passwd").read_bytes() == before
    # The sandbox's own writes land in its own layer, not the shared runtime.
    await run(driver, sandbox, "sh", "-c", "echo mine > /home/agentuity/mine.txt")
    assert not (lower / "home/agentuity/mine.txt").exists()
    assert (driver.sandbox_root / sandbox / "upper/home/agentuity/mine.txt").read_text() == "mine\n"


async def test_write_files_never_leave_the_sandbox(driver: LocalDriver, sandbox: str, tmp_path: Path) -> None:
    host_dir = tmp_path / "host-target"
    host_dir.mkdir()
    host_dir.chmod(0o777)
    result, _ = await run(driver, sandbox, "ln", "-s", str(host_dir), "link")
    assert result.exit_code == 0
    with pytest.raises(InvalidInput):  # the link's target does not exist in the sandbox
        await driver.write_files(sandbox, [FileWrite("link/pwned", b"x")])
    name = f"dotdot-{uuid.uuid4().hex}"
    await driver.write_files(sandbox, [FileWrite(f"../../../../../../tmp/{name}", b"inside")])
    assert list(host_dir.iterdir()) == []
    assert not (Path("/tmp") / name).exists()
    _, out = await run(driver, sandbox, "cat", f"/tmp/{name}")
    assert out.stdout == "inside"
    # Files are written as the sandbox user, not root.
    _, out = await run(driver, sandbox, "stat", "-c", "%U %a", f"/tmp/{name}")
    assert out.stdout == "agentuity 644\n"


async def test_the_mount_table_is_the_sandboxs_own(driver: LocalDriver, sandbox: str) -> None:
    """The launcher pivots into the overlay and detaches the host's tree: inside, only
    the sandbox's own root, /proc and minimal /dev are mounted, with the flags that keep
    them harmless, and /dev holds nothing but the harmless devices and links."""
    result, out = await python(driver, sandbox, """
        import json, os
        mounts = []
        for line in open("/proc/self/mountinfo"):
            f = line.split()
            sep = f.index("-")
            mounts.append([f[4], f[sep + 1], sorted(f[5].split(","))])
        print(json.dumps({"mounts": mounts, "dev": sorted(os.listdir("/dev")),
                          "links": {n: os.readlink("/dev/" + n) for n in os.listdir("/dev")
                                    if os.path.islink("/dev/" + n)}}))
    """)
    assert result.exit_code == 0, out.stderr
    seen = json.loads(out.stdout)
    mounts = {point: (fstype, opts) for point, fstype, opts in seen["mounts"]}
    boot_id = "/proc/sys/kernel/random/boot_id"  # its own (test_local_boot_id.py)
    assert set(mounts) == {"/", "/proc", "/dev", "/dev/pts", boot_id}, seen["mounts"]  # devices are nodes (mknod)
    assert mounts[boot_id][0] == "tmpfs" and {"ro", "nosuid", "nodev", "noexec"} <= set(mounts[boot_id][1])
    assert mounts["/"][0] == "overlay" and {"nosuid", "nodev"} <= set(mounts["/"][1])
    assert mounts["/proc"][0] == "proc" and {"nosuid", "nodev", "noexec"} <= set(mounts["/proc"][1])
    assert mounts["/dev"][0] == "tmpfs" and {"nosuid", "noexec"} <= set(mounts["/dev"][1])
    assert mounts["/dev/pts"][0] == "devpts" and {"nosuid", "noexec"} <= set(mounts["/dev/pts"][1])
    assert seen["dev"] == sorted(["null", "zero", "full", "random", "urandom", "tty", "shm", "pts",
                                  "ptmx", "fd", "stdin", "stdout", "stderr"])
    assert seen["links"] == {"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
                             "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"}
    # Usable, not just present.
    result, out = await run(driver, sandbox, "sh", "-c",
                            "echo hi > /dev/null && head -c 4 /dev/urandom | wc -c && echo x > /dev/shm/f && "
                            "cat /dev/shm/f && hostname")
    assert (result.exit_code, out.stdout) == (0, "4\nx\nsandbox\n"), out.stderr


async def test_pid_1_tells_no_host_path(driver: LocalDriver, sandbox: str) -> None:
    """pid 1 is the launcher, forked, not exec'd: its command line (readable by every
    process in the sandbox) would name the data dir and the runtime cache. Scrubbed."""
    result, out = await run(driver, sandbox, "sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline; echo; "
                            "readlink /proc/1/exe || echo unreadable")
    assert result.exit_code == 0, out.stderr
    cmdline, exe = out.stdout.splitlines()[:2]
    assert cmdline.strip() == "hutch-init", cmdline
    assert str(driver.data_dir) not in out.stdout and str(driver.runtime_cache) not in out.stdout
    assert exe == "unreadable"


async def test_no_block_devices(driver: LocalDriver, sandbox: str) -> None:
    result, out = await python(driver, sandbox, """
        import os, stat
        print([n for n in os.listdir("/dev") if stat.S_ISBLK(os.lstat("/dev/" + n).st_mode)])
    """)
    assert (result.exit_code, out.stdout) == (0, "[]\n"), out.stderr


# -- privileges ----------------------------------------------------------------------


async def test_processes_are_unprivileged_on_the_host(driver: LocalDriver, sandbox: str) -> None:
    await run(driver, sandbox, "sh", "-c", "sleep 300 >/dev/null 2>&1 &")
    pids = sandbox_processes(driver, sandbox)
    assert len(pids) >= 2  # init and the sleep
    uid = driver._registry.running(sandbox).uid
    assert uid >= 200_000
    for pid in pids:
        st = status_of(pid)
        assert st["Uid"].split() == [str(uid)] * 4, st
        assert st["Gid"].split() == [str(uid)] * 4, st
        assert st["Groups"] == ""
        assert st["CapEff"] == st["CapPrm"] == st["CapBnd"] == st["CapInh"] == st["CapAmb"] == "0000000000000000"
        assert st["NoNewPrivs"] == "1"
        assert st["Seccomp"] == "2"
        # No user namespace mapping trickery: the uid the kernel sees is the uid above.
        assert Path(f"/proc/{pid}/uid_map").read_text().split() == ["0", "0", "4294967295"]


async def test_whoami_and_home(driver: LocalDriver, sandbox: str) -> None:
    result, out = await run(driver, sandbox, "sh", "-c", 'whoami; echo "$HOME"; id -u')
    assert result.exit_code == 0
    name, home, uid = out.stdout.split()
    assert (name, home) == ("agentuity", "/home/agentuity")
    assert int(uid) >= 200_000


async def test_seccomp_filter(driver: LocalDriver, sandbox: str) -> None:
    result, out = await python(driver, sandbox, """
        import ctypes, errno
        libc = ctypes.CDLL(None, use_errno=True)
        calls = {"bpf": (321, 0, 0, 0), "perf_event_open": (298, 0, 0, -1, -1, 0), "keyctl": (250, 0),
                 "add_key": (248, 0, 0, 0, 0, 0), "kexec_load": (246, 0, 0, 0, 0),
                 "init_module": (175, 0, 0, 0), "finit_module": (313, -1, 0, 0), "delete_module": (176, 0, 0),
                 "mount": (165, 0, 0, 0, 0, 0), "umount2": (166, 0, 0), "pivot_root": (155, 0, 0),
                 "io_uring_setup": (425, 1, 0), "unshare(NEWUSER)": (272, 0x10000000),
                 "clone(NEWUSER)": (56, 0x10000000 | 17, 0, 0, 0, 0)}
        for name, (nr, *args) in calls.items():
            rc = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
            print(name, "allowed" if rc >= 0 else errno.errorcode[ctypes.get_errno()])
    """)
    assert result.exit_code == 0, out.stderr
    verdicts = dict(line.split() for line in out.stdout.splitlines())
    assert verdicts.pop("io_uring_setup") == "ENOSYS"
    assert set(verdicts.values()) == {"EPERM"}, verdicts


PTRACE_SECCOMP_GET_FILTER = 0x420C
WALL = 0x40000000


def loaded_seccomp_programs(pid: int) -> list[bytes]:
    """The seccomp programs the kernel runs for ``pid`` (newest first), read with ptrace
    as root: what was really loaded, whoever compiled it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    if libc.ptrace(16, pid, None, None) < 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), f"ptrace attach {pid}")
    try:
        os.waitpid(pid, WALL)
        programs = []
        for index in range(8):
            n = libc.ptrace(PTRACE_SECCOMP_GET_FILTER, pid, index, None)
            if n < 0:
                assert ctypes.get_errno() == errno.ENOENT, os.strerror(ctypes.get_errno())
                return programs
            buf = ctypes.create_string_buffer(n * 8)
            assert libc.ptrace(PTRACE_SECCOMP_GET_FILTER, pid, index, buf) == n
            programs.append(buf.raw)
        return programs
    finally:
        libc.ptrace(17, pid, None, None)  # PTRACE_DETACH


async def test_the_loaded_seccomp_filter_is_the_one_libseccomp_compiles(driver: LocalDriver, sandbox: str) -> None:
    """Byte for byte, the one program on a command and on pid 1 is what libseccomp makes of
    the helper's rules (``hutch-nsexec seccomp-bpf``, the path every exec took before the
    build embedded the program): the filter is compiled once, never changed."""
    await run(driver, sandbox, "sh", "-c", "exec sleep 300 >/dev/null 2>&1 &")
    helper = driver._nsexec.path
    assert helper is not None
    compiled = seccomp_program(helper)
    assert len(compiled) > 400 and len(compiled) % 8 == 0
    init = driver._registry.running(sandbox).init_pid
    pids = sandbox_processes(driver, sandbox)
    assert init in pids and len(pids) >= 2
    for pid in pids:
        assert loaded_seccomp_programs(pid) == [compiled], pid


async def test_server_environment_does_not_leak(driver: LocalDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUTCH_TEST_DATABASE_URL", "postgresql://secret@db/prod")
    sid = await provision(driver, PY)
    try:
        _, out = await run(driver, sid, "sh", "-c", "env; cat /proc/self/environ; ps -eo args")
        assert "secret@db" not in out.stdout
        assert "HUTCH_TEST_DATABASE_URL" not in out.stdout
    finally:
        await driver.destroy(sid)


# -- lifecycle -----------------------------------------------------------------------


def _mounted_anywhere(needle: str) -> bool:
    for mi in Path("/proc").glob("[0-9]*/mountinfo"):
        try:
            if needle in mi.read_text():
                return True
        except OSError:  # exited meanwhile, or a kernel thread
            pass
    return False


async def test_destroy_leaves_no_process_mount_cgroup_or_file(driver: LocalDriver) -> None:
    sid = await provision(driver, PY, resources=ResourceLimits(memory_bytes=256 * 2**20, pids=100))
    await run(driver, sid, "sh", "-c", "sleep 300 >/dev/null 2>&1 & echo x > f")
    sb = driver._registry.running(sid)
    assert driver._cgroups is not None
    cgroups = driver._cgroups.paths(sid)
    pids = driver._cgroups.pids(sid)
    sandbox_dir = driver.sandbox_root / sid
    assert _mounted_anywhere(str(sandbox_dir))
    await driver.destroy(sid)
    # Dead processes are reparented to the host's init, which reaps them in its own time:
    # a zombie is a dead process, anything else is a survivor.
    for _ in range(100):
        left = {pid: status_of(pid)["State"] for pid in [sb.init_pid, *pids] if Path(f"/proc/{pid}").exists()}
        if not left:
            break
        await asyncio.sleep(0.05)
    assert all(state.startswith("Z") for state in left.values()), left
    assert not any(p.exists() for p in cgroups)
    assert not sandbox_dir.exists()
    assert not _mounted_anywhere(str(sandbox_dir))
    assert sid not in await driver.alive()


def _own_mounts() -> str:
    with open("/proc/self/mountinfo") as fh:
        return fh.read()


async def test_a_create_makes_only_its_layer_on_the_data_dir(driver: LocalDriver) -> None:
    """Every inode a create allocates on the data dir's file system is a scan past recently
    freed ones on a journal-less ext4 (docs/idle.md): the sandbox's dir holds its upper and
    work layers, its record and its zygote socket, no uid file nor mount point of its own.
    The overlay is mounted on the data dir's one shared mount point in the sandbox's own
    mount namespace only: on the host that directory stays empty and is no mount point."""
    sid = await provision(driver, PY)
    d = driver.sandbox_root / sid
    assert sorted(os.listdir(d)) == ["meta.json", "upper", "work", "zygote.sock"]
    mount_point = driver.sandbox_root / ".mnt"
    assert os.listdir(mount_point) == []
    assert not os.path.ismount(mount_point)
    assert str(d) not in _own_mounts()
    sid2 = await provision(driver, PY)  # a second over the same mount point: each its own root
    r1, out1 = await run(driver, sid, "sh", "-c", "echo one > /workspace/f; cat /workspace/f")
    r2, out2 = await run(driver, sid2, "sh", "-c", "ls -A /workspace")
    assert (r1.exit_code, out1.stdout, r2.exit_code, out2.stdout) == (0, "one\n", 0, ""), (out1.stderr, out2.stderr)
    for s in (sid, sid2):
        await driver.destroy(s)


def _spares(driver: LocalDriver) -> int:
    return sum(map(len, driver._spares._by_key.values()))


async def _no_pool(driver: LocalDriver) -> None:
    """Counting spares needs no warm pool refilling (and taking them) meanwhile."""
    driver._pool.size = 0
    await driver._background.drain()


async def test_a_recycled_skeleton_carries_nothing_of_its_last_sandbox(driver: LocalDriver) -> None:
    """A destroyed sandbox's directory is kept for the next one only when nothing the
    sandbox made is in it (drivers/local/spares.py); the next one sees its own user."""
    await _no_pool(driver)
    before = _spares(driver)
    first = await provision(driver, PY)
    first_uid = driver._registry.running(first).uid
    result, _ = await run(driver, first, "true")
    assert result.exit_code == 0
    await driver.destroy(first)
    assert _spares(driver) == before + 1
    second = await provision(driver, PY)
    assert _spares(driver) == before
    uid = driver._registry.running(second).uid
    assert uid != first_uid
    result, out = await run(driver, second, "sh", "-c",
                            "id -u; stat -c '%u %a' . /workspace; ls -A . /workspace; "
                            f"grep -c ':{first_uid}:' /etc/passwd /etc/group; grep -c agentuity /etc/passwd")
    assert result.exit_code == 0, out.stderr
    assert out.stdout.split("\n") == [str(uid), f"{uid} 755", f"{uid} 755", ".:", "", "/workspace:",
                                      "/etc/passwd:0", "/etc/group:0", "1", ""]
    await driver.destroy(second)


@pytest.mark.parametrize("leftover", [
    "echo x > f",                             # a file in the home
    "mkdir -p .cache",                        # an empty directory
    "setfattr -n user.note -v x . 2>/dev/null || python3 -c \"import os; os.setxattr('.', 'user.note', b'x')\"",
    "chmod 700 /workspace && rm -rf /workspace/* && touch /tmp/t",  # a file outside home
])
async def test_a_sandbox_that_left_anything_is_not_recycled(driver: LocalDriver, leftover: str) -> None:
    await _no_pool(driver)
    sid = await provision(driver, PY)
    before = _spares(driver)
    result, out = await run(driver, sid, "sh", "-c", leftover)
    assert result.exit_code == 0, out.stderr
    await driver.destroy(sid)
    assert _spares(driver) == before
    assert not (driver.sandbox_root / sid).exists()


async def test_restart_recovers_live_sandboxes_and_reaps_dead_ones(driver: LocalDriver) -> None:
    live = await provision(driver, PY)
    dead = await provision(driver, PY)
    dead_init = driver._registry.running(dead).init_pid
    assert driver._cgroups is not None
    dead_cgroups = driver._cgroups.paths(dead)  # its pids one under its organization's (cgroups.py)
    assert all(p.exists() for p in dead_cgroups if "memory" not in p.parts and "cpu" not in p.parts)
    assert dead_cgroups[-1].parent.name == "_org-org_local"
    os.kill(dead_init, 9)
    for _ in range(100):
        if not Path(f"/proc/{dead_init}").exists():
            break
        await asyncio.sleep(0.02)
    # A new server process over the same data dir.
    fresh = LocalDriver(driver.data_dir, driver.runtime_cache)
    await fresh.start()
    assert live in await fresh.alive()
    assert dead not in await fresh.alive()
    assert not (fresh.sandbox_root / dead).exists()
    assert fresh._cgroups is not None
    assert not any(p.exists() for p in dead_cgroups)
    assert fresh._cgroups.paths(live) == driver._cgroups.paths(live)  # found under its organization's
    result, out = await run(fresh, live, "echo", "still here")
    assert (result.exit_code, out.stdout) == (0, "still here\n")
    await fresh.destroy(live)
    assert not dead_cgroups[-1].parent.exists()  # the organization's went with its last sandbox


async def test_runtime_promises_hold(driver: LocalDriver) -> None:
    from hutch.core import runtimes
    from hutch.drivers.local import rootfs

    # Every runtime built on this host (tests/runtimes checks the same in a fresh driver).
    for recipe in [r for r in runtimes.CATALOG if rootfs.is_built(driver.runtime_cache, r)]:
        sid = await provision(driver, recipe.name)
        try:
            result, out = await run(driver, sid, *recipe.version_command)
            assert result.exit_code == 0, out.stderr
            assert recipe.version_expect in out.stdout + out.stderr
        finally:
            await driver.destroy(sid)


async def test_meta_is_not_readable_by_sandbox_users(driver: LocalDriver, sandbox: str) -> None:
    meta = json.loads((driver.sandbox_root / sandbox / "meta.json").read_text())
    assert meta["uid"] >= 200_000
    assert (driver.sandbox_root.stat().st_mode & 0o077) == 0


async def test_pause_freezes_background_processes(driver: LocalDriver, sandbox: str) -> None:
    await run(driver, sandbox, "sh", "-c", "while true; do echo t >> ticks; sleep 0.02; done >/dev/null 2>&1 &")
    ticks = driver.sandbox_root / sandbox / "upper/home/agentuity/ticks"
    await asyncio.sleep(0.3)
    await driver.pause(sandbox)
    await asyncio.sleep(0.1)
    frozen_at = ticks.read_text().count("t")
    await asyncio.sleep(0.5)
    assert ticks.read_text().count("t") == frozen_at
    await driver.resume(sandbox)
    await asyncio.sleep(0.3)
    assert ticks.read_text().count("t") > frozen_at


async def test_a_terminal_is_as_confined_as_an_execution(driver: LocalDriver, sandbox: str) -> None:
    result, out = await python(driver, sandbox, terminal_probe.PROBE)
    assert result.exit_code == 0, out.stderr
    code, screen = await terminal_probe.on_terminal(driver, sandbox, "python3", "-c", terminal_probe.PROBE)
    assert code == 0, screen
    terminal_probe.assert_same_sandbox(terminal_probe.parse(out.stdout), terminal_probe.parse(screen))
