# ruff: noqa: ASYNC240  (tests inspect host files directly; blocking is fine here)
"""The zygote (drivers/local/zygote.py, native/zygote.h) under attack: a sandbox's pid 1
forks its commands, so what a command can do to pid 1 and to its socket is what it could
do to the fast path. Each test also checks the command really came through the zygote.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import socket
import textwrap
from pathlib import Path

import pytest

from hutch.drivers.base import ExecRequest, ExecResult, ResourceLimits
from hutch.drivers.local.driver import LocalDriver
from hutch.drivers.local.helper import start_time
from tests.drivers_support import (
    Recorder,
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    new_id,
    provision,
)

pytestmark = pytest.mark.isolation

PY = "python:3.13"


async def python(driver: LocalDriver, sid: str, code: str) -> tuple[ExecResult, Recorder]:
    sink = Recorder()
    before = driver._nsexec.zygote_runs
    result = await driver.exec(ExecRequest(new_id("ex"), sid, ("python3", "-c", textwrap.dedent(code))), sink)
    assert driver._nsexec.zygote_runs == before + 1, "the command did not come through the zygote"
    return result, sink


def socket_path(driver: LocalDriver, sid: str) -> Path:
    return driver._registry.sandbox_root / sid / "zygote.sock"


async def test_a_command_can_neither_signal_nor_ptrace_nor_read_pid_1(driver: LocalDriver) -> None:
    """pid 1 is the zygote: the kernel drops its own sandbox's signals to it (SIGKILL and
    SIGSTOP too), and non-dumpable it can be neither traced nor have its fds taken."""
    sid = await provision(driver, PY)
    try:
        result, out = await python(driver, sid, """
            import ctypes, errno, os, signal
            libc = ctypes.CDLL(None, use_errno=True)
            for sig in (signal.SIGSTOP, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD,
                        signal.SIGUSR1, signal.SIGKILL):
                os.kill(1, sig)  # delivered nowhere, refused by nobody
            for rt in range(signal.SIGRTMIN, signal.SIGRTMIN + 8):
                for _ in range(64):
                    os.kill(1, rt)  # blocked signals would queue up without end
            print("ptrace", libc.ptrace(16, 1, None, None), errno.errorcode[ctypes.get_errno()])
            pidfd = os.pidfd_open(1)
            for fd in range(3, 8):
                rc = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd
                print("getfd", fd, rc, errno.errorcode[ctypes.get_errno()] if rc < 0 else "")
            os.close(pidfd)
            for what in ("fd", "environ", "mem"):
                try:
                    print(what, os.listdir("/proc/1/fd") if what == "fd" else open(f"/proc/1/{what}", "rb").read(1))
                except PermissionError:
                    print(what, "denied")
            print("mine", sorted(os.listdir("/proc/self/fd")))
        """)
        assert result.exit_code == 0, out.text("stderr")
        lines = out.text().splitlines()
        assert lines[0] == "ptrace -1 EPERM", lines
        assert all(line.split()[2:] == ["-1", "EPERM"] for line in lines[1:6]), lines
        assert lines[6:9] == ["fd denied", "environ denied", "mem denied"], lines
        assert lines[9] == "mine ['0', '1', '2', '3']", lines  # 3: the listing's own
        init = driver._registry.running(sid).init_pid
        assert Path(f"/proc/{init}/stat").read_text().rpartition(")")[2].split()[0] not in ("T", "t")  # not stopped
        # And it still forks commands.
        result, out = await python(driver, sid, "print('still here')")
        assert (result.exit_code, out.text()) == (0, "still here\n")
    finally:
        await driver.destroy(sid)


async def test_no_sandbox_reaches_a_zygote_socket(driver: LocalDriver) -> None:
    """The sockets are host files outside every sandbox's root, in directories only root may
    enter; the command holds none of pid 1's fds, and its network namespace has no socket
    of pid 1's."""
    a = await provision(driver, PY)
    b = await provision(driver, PY)
    try:
        for sid in (a, b):
            path = socket_path(driver, sid)
            assert path.is_socket()
            assert path.stat().st_mode & 0o777 == 0o600 and path.stat().st_uid == 0
            assert path.parent.stat().st_mode & 0o077 == 0
        result, out = await python(driver, a, f"""
            import os, socket
            for path in ({str(socket_path(driver, a))!r}, {str(socket_path(driver, b))!r},
                         "/zygote.sock", "/proc/1/cwd/zygote.sock", "/proc/1/root/zygote.sock"):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                try:
                    s.connect(path)
                    print("connected", path)
                except OSError as err:
                    print("refused", type(err).__name__)
            print(sum(1 for line in open("/proc/net/unix").readlines()[1:] if line.split()[-1].endswith("zygote.sock")))
        """)
        assert result.exit_code == 0, out.text("stderr")
        lines = out.text().splitlines()
        assert not any(line.startswith("connected") for line in lines), lines
        assert lines[-1] == "0", lines
    finally:
        await driver.destroy(a)
        await driver.destroy(b)


async def test_the_zygote_dies_with_its_sandbox(driver: LocalDriver) -> None:
    sid = await provision(driver, PY)
    path = socket_path(driver, sid)
    init = driver._registry.running(sid).init_pid
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    probe.connect(str(path))  # root on the host may; pid 1 listens
    try:
        await driver.destroy(sid)
        assert start_time(init) is None  # gone, or a zombie until its host parent reaps it
        with contextlib.suppress(ConnectionResetError):  # the connection's other end died with pid 1
            assert probe.recv(16) == b""
    finally:
        probe.close()
    assert not path.exists()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as late, pytest.raises((FileNotFoundError, ConnectionRefusedError)):
        late.connect(str(path))


async def test_a_forked_command_is_confined_as_the_helpers_was(driver: LocalDriver) -> None:
    """What the helper's setup gave a command, pid 1's fork gives it too: its own cgroup
    leaf, its own session, no capabilities, the filter, default signals and oom score."""
    sid = await provision(driver, PY)
    try:
        result, out = await python(driver, sid, """
            import os, signal
            status = dict(line.split(":", 1) for line in open("/proc/self/status"))
            print(" ".join(status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")))
            print(os.getsid(0) == os.getpid(), os.getppid(), oct(os.umask(0)), os.getcwd())
            print(open("/proc/self/oom_score_adj").read().strip())
            try:
                fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
                os.write(fd, b"-1000")
                print("lowered")
            except OSError:
                print("floor held")
            print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, signal.pthread_sigmask(signal.SIG_BLOCK, []))
            print([line.split(":")[2].strip() for line in open("/proc/self/cgroup") if ":freezer:" in line or ":memory:" in line])
        """)
        assert result.exit_code == 0, out.text("stderr")
        caps, session, oom, floor, signals, cgroups = out.text().splitlines()
        assert caps == "0000000000000000 0000000000000000 0000000000000000 0000000000000000 1 2"
        assert session == "True 1 0o22 /home/agentuity", session
        assert (oom, floor) == ("0", "floor held")
        assert signals == "True set()", signals
        leaves = ast.literal_eval(cgroups)
        assert len(leaves) == 2 and all(p.split("/")[-1].startswith("x-") and sid in p for p in leaves), leaves
    finally:
        await driver.destroy(sid)


async def test_setup_failures_and_exits_are_reported_as_before(driver: LocalDriver) -> None:
    sid = await provision(driver, PY)
    try:
        sink = Recorder()
        result = await driver.exec(ExecRequest(new_id("ex"), sid, ("sh", "-c", "kill -TERM $$")), sink)
        assert result.exit_code == 128 + 15
        result = await driver.exec(ExecRequest(new_id("ex"), sid, ("no-such-command",)), sink)
        assert result.exit_code == 127 and "command not found" in sink.text("stderr")
        with pytest.raises(Exception, match="working directory"):
            await driver.exec(ExecRequest(new_id("ex"), sid, ("true",), cwd="/nonexistent"), sink)
        result = await driver.exec(ExecRequest(new_id("ex"), sid, ("cat",), stdin=b"fed\n"), sink)
        assert result.exit_code == 0 and sink.text().endswith("fed\n")
        result = await driver.exec(ExecRequest(new_id("ex"), sid, ("sleep", "30"), timeout=0.5), sink)
        assert result.timed_out and result.exit_code == 124
        assert driver._nsexec.zygote_runs == 5
        assert os.path.exists(socket_path(driver, sid))
    finally:
        await driver.destroy(sid)


async def test_a_sandbox_at_its_pids_limit_still_executes(driver: LocalDriver) -> None:
    """pid 1 is in the instance's pids cgroup, outside the sandbox's (cgroups.py), so a
    sandbox its own processes hold at the limit still has the zygote's fork: its child joins
    the full cgroup (a join is never refused) and runs the command. (At the instance's bound
    pid 1 cannot fork, says so, and the helper runs it: test_local_pids_total.py.)"""
    sid = await provision(driver, PY, resources=ResourceLimits(pids=12))
    try:
        sink = Recorder()
        # Forks for a second, taking every slot freed meanwhile (its own shell's), then says so.
        fill = ("import os, time\nend = time.monotonic() + 1\nwhile time.monotonic() < end:\n"
                "    try:\n        pid = os.fork()\n    except OSError:\n        time.sleep(0.01)\n        continue\n"
                "    if pid == 0:\n        time.sleep(120)\n        os._exit(0)\n"
                "open('full', 'w').close()\ntime.sleep(120)\n")
        await driver.exec(ExecRequest(new_id("ex"), sid, ("sh", "-c", f'python3 -c "{fill}" >/dev/null 2>&1 &')), sink)
        full = driver._registry.sandbox_root / sid / "upper" / "home" / "agentuity" / "full"
        for _ in range(100):
            if full.exists():
                break
            await asyncio.sleep(0.1)
        assert full.exists()
        before = driver._nsexec.zygote_runs
        result = await driver.exec(ExecRequest(new_id("ex"), sid, ("echo", "in")), sink)
        assert (result.exit_code, sink.text()) == (0, "in\n"), sink.text("stderr")
        assert driver._nsexec.zygote_runs == before + 1  # the zygote's run, not the helper's
    finally:
        await driver.destroy(sid)


async def test_a_sandbox_stopping_its_own_processes_cannot_hang_an_execute(driver: LocalDriver) -> None:
    """The zygote's child is the sandbox user's before it is in its leaf: a process of the
    sandbox stopping everything it may signal can catch it there, where the leaf's kill does
    not reach. The execute's timeout still ends the execute."""
    sid = await provision(driver, PY)
    try:
        stopper = "import os, time\nwhile True:\n    try:\n        os.kill(-1, 19)\n    except OSError:\n" \
                  "        pass\n    time.sleep(0.0002)\n"
        sink = Recorder()
        await driver.exec(ExecRequest(new_id("ex"), sid, ("sh", "-c", f'python3 -c "{stopper}" >/dev/null 2>&1 &')),
                          sink)
        for _ in range(8):
            result = await asyncio.wait_for(
                driver.exec(ExecRequest(new_id("ex"), sid, ("true",), timeout=0.5), sink), 10)
            assert result.timed_out or result.exit_code == 0, result
    finally:
        await driver.destroy(sid)
