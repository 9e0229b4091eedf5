"""The second adversarial pass of issue 32 on the nomad driver, from inside its sandboxes:
code running in a nomad sandbox tries to get out of its container (mounts, /proc, /sys,
devices, system calls, namespaces, ptrace, the runtimes' own ways in), at its neighbours
(the kernel's per-uid counts, a warm pool's previous tenant, a fork bomb) and at the hutch
server itself through what the server reads from the sandbox (the exec agent's frames).
Each test asserts the safe behaviour and says what it would show if the protection went.

One driver per module (tests/adversarial/nomad_pass2.py); each test makes the sandboxes it
attacks. The network (both families, every kind of sandbox, the cluster) is
tests/adversarial/test_pass2_nomad_network.py; the API's side (tokens, tenancy, file
listings, checkpoints and snapshots, Nomad's ACLs, the Terraform templates) is
tests/adversarial/test_pass2_nomad_api.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from hutch.drivers.base import ExecRequest
from hutch.drivers.nomad.driver import NomadDriver
from tests.adversarial.nomad_pass2 import PY, driver, launch_daemon, make, python, rss_mib, run
from tests.drivers_support import Recorder, new_id, start_nomad

__all__ = ["driver"]  # the module's fixture

pytestmark = pytest.mark.asyncio(loop_scope="module")

MiB = 2**20


# ------------------------------------------------------------------------ the exec agent's pipes

# A daemon of the sandbox (its own session, its environment without the command's tag, so no
# cancel reaches it) that kills the sandbox's exec agent (same uid), watches for the restart's
# start script (`sh -c 'f=$(mktemp …); head -c … >"$f"; …; exec "$f"'`: an ordinary, dumpable
# shell holding the agent's stdin, stdout and stderr pipes) and opens them through /proc. What
# it then writes on the agent's stdout reaches the hutch server as the agent's frames, and on its
# stderr as the agent's complaints. argv: what to do with them ("frame" MiB, "stderr" lines,
# "heartbeat" levels of nesting).
HIJACK = r'''
import json, os, signal, struct, sys, time
what, amount = sys.argv[1], int(sys.argv[2])
report = "/tmp/hijack.json"

def procs():
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != os.getpid():
            try:
                yield int(p), open(f"/proc/{p}/cmdline", "rb").read(), open(f"/proc/{p}/status").read()
            except OSError:
                pass

def ppid(status):
    return int(status.split("PPid:")[1].split()[0])

got, tries = {}, 0
while not got and tries < 5:
    tries += 1
    time.sleep(0.5)
    for pid, cmd, _ in procs():
        if b"hutch-exec-agent" in cmd:
            os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 20
    while time.time() < deadline and not got:
        for pid, cmd, status in procs():
            # the start script itself (its parent is outside the sandbox's pid namespace), not
            # the $(mktemp) subshell nor head, whose stdout is not the agent's
            if cmd.startswith(b"sh\0-c\0f=$(mktemp") and ppid(status) == 0:
                try:
                    fds = {n: os.open(f"/proc/{pid}/fd/{n}", os.O_RDONLY if n == 0 else os.O_WRONLY) for n in (0, 1, 2)}
                except OSError:
                    continue
                got = fds
                break
json.dump({"hijacked": bool(got), "tries": tries, "done": False}, open(report, "w"))
if got and what == "frame":
    # one frame claiming 4 GiB of stdout for command 0, then that many MiB of it
    os.write(got[1], struct.pack(">cII", b"1", 0, 0xFFFFFFFF))
    block = b"\xa5" * (1 << 20)
    for _ in range(amount):
        os.write(got[1], block)
elif got and what == "stderr":
    for i in range(amount):
        os.write(got[2], b"E" * 200 + b"\n")
elif got and what == "heartbeat":
    # heartbeats nested that many levels deep, each one write (under PIPE_BUF: whole, between
    # the new agent's own frames), every 50 ms from now on
    frame = struct.pack(">cII", b"H", 0, amount) + b"[" * amount
    os.write(got[1], frame)
    json.dump({"hijacked": True, "tries": tries, "done": True}, open(report, "w"))
    while True:
        time.sleep(0.05)
        os.write(got[1], frame)
json.dump({"hijacked": bool(got), "tries": tries, "done": True}, open(report, "w"))
time.sleep(300)
'''


async def hijack_report(driver: NomadDriver, sid: str, caplog: pytest.LogCaptureFixture,
                        timeout: float = 60) -> dict[str, Any]:
    """The daemon's report once it is done, or once the server said it ended the session for
    what came on the agent's pipes (the daemon's writes then block: nobody reads them)."""
    deadline = time.monotonic() + timeout
    seen: dict[str, Any] = {}
    while time.monotonic() < deadline:
        code, out, _ = await run(driver, sid, ["cat", "/tmp/hijack.json"])
        if code == 0 and out.strip():
            seen = json.loads(out)
            refused = any("exec agent's stdout" in r.getMessage() for r in caplog.records)
            if seen.get("done") or refused:
                return seen
        await asyncio.sleep(0.5)
    return seen


async def test_the_exec_agents_pipes_carry_nothing_the_server_buffers_or_logs_unbounded(
    driver: NomadDriver, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent's start script is a plain shell: a process of the sandbox opens its pipes
    through /proc (it did, at the first try) and speaks on the agent's stdout and stderr for
    as long as it likes. The server must take that as a tenant's words: a frame past the
    agent's own size, or output past its window, ends the session, and the agent's stderr is
    logged a few lines per session. Without that, one frame header claiming 4 GiB made the
    server buffer all that followed: 96 MiB written grew it by ~100 MiB (300 MiB by 300 in a
    longer run, for as long as the sandbox kept writing), and 5,000 lines on stderr were 5,000
    warnings in the server's log."""
    caplog.set_level(logging.WARNING, logger="hutch.drivers.nomad")
    sid = await make(driver)
    try:
        await launch_daemon(driver, sid, HIJACK, "frame", "96")
        before = rss_mib()
        report = await hijack_report(driver, sid, caplog)
        assert report.get("hijacked"), f"the attack did not get the agent's pipes: {report}"
        await asyncio.sleep(1)
        grown = rss_mib() - before
        assert grown < 32, f"the server holds {grown:.0f} MiB more after 96 MiB of forged frames"
    finally:
        await driver.destroy(sid)

    caplog.clear()
    sid = await make(driver)
    try:
        await launch_daemon(driver, sid, HIJACK, "stderr", "5000")
        report = await hijack_report(driver, sid, caplog)
        assert report.get("hijacked"), f"the attack did not get the agent's pipes: {report}"
        await asyncio.sleep(2)  # what Nomad still carries
        lines = [r for r in caplog.records if r.name == "hutch.drivers.nomad.agent"]
        assert len(lines) < 50, f"{len(lines)} log lines from 5,000 lines on the agent's stderr"
        # The sandbox still runs commands (a new agent, or alloc execs).
        assert (await run(driver, sid, ["echo", "still here"]))[:2] == (0, "still here\n")
    finally:
        await driver.destroy(sid)


async def test_a_forged_heartbeat_is_read_as_no_load(driver: NomadDriver, caplog: pytest.LogCaptureFixture) -> None:
    """The agent's heartbeat carries its load (JSON), kept raw and read only when asked
    (ExecAgent.load): a process of the sandbox that speaks on the agent's stdout sends its own.
    Bounded (one frame of at most MAX_FRAME, the last one kept), and it must read as what it
    is, no load: a heartbeat nested 3,000 levels deep (3 KiB) made the read raise
    RecursionError, which is no ValueError, to whatever asked."""
    caplog.set_level(logging.WARNING, logger="hutch.drivers.nomad")
    sid = await make(driver)
    try:
        await launch_daemon(driver, sid, HIJACK, "heartbeat", "3000")
        report = await hijack_report(driver, sid, caplog)
        assert report.get("hijacked"), f"the attack did not get the agent's pipes: {report}"
        agent = driver._agents.live(sid)
        assert agent is not None, "the forged heartbeats ended the agent's session"
        forged_seen = False
        for _ in range(40):  # 4 s: the forged ones every 50 ms, the agent's own every 2 s
            forged_seen = forged_seen or agent._heartbeat.startswith(b"[[[")
            load = agent.load()
            assert set(load) <= {"commands", "goroutines"} and all(type(v) is int for v in load.values()), load
            await asyncio.sleep(0.1)
        assert forged_seen, "no forged heartbeat reached the server"
        # The sandbox still runs commands.
        assert (await run(driver, sid, ["echo", "still here"]))[:2] == (0, "still here\n")
    finally:
        await driver.destroy(sid)


# ------------------------------------------------------------------------ one uid for every sandbox

# Every nomad sandbox runs as uid 290000 of the host (no user namespace), and the kernel
# counts some things per uid: inotify instances (fs.inotify.max_user_instances, 128 by
# default) and watches (max_user_watches). A daemon of one sandbox takes 300 instances and
# 200,000 watches (100 instances x 2,000 directories) and holds them.
INOTIFY_HOG = r'''
import ctypes, json, os, time
libc = ctypes.CDLL(None, use_errno=True)
for i in range(2000):
    os.makedirs(f"/tmp/w/{i}", exist_ok=True)
fds = [fd for fd in (libc.inotify_init1(0) for _ in range(300)) if fd >= 0]
watches = 0
for fd in fds[:100]:
    for i in range(2000):
        if libc.inotify_add_watch(fd, f"/tmp/w/{i}".encode(), 0x100) >= 0:
            watches += 1
json.dump({"instances": len(fds), "watches": watches}, open("/tmp/hog.json", "w"))
time.sleep(300)
'''

# What another sandbox then gets: an inotify instance, and a watch in it.
INOTIFY_PROBE = r'''
import ctypes, errno, json
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
out = {"init": "ok" if fd >= 0 else errno.errorcode[ctypes.get_errno()]}
if fd >= 0:
    w = libc.inotify_add_watch(fd, b"/tmp", 0x100)
    out["watch"] = "ok" if w >= 0 else errno.errorcode[ctypes.get_errno()]
print(json.dumps(out))
'''


async def test_no_sandbox_takes_the_kernels_per_uid_allowances_of_the_others(driver: NomadDriver) -> None:
    """One sandbox held the uid's 128 inotify instances and every other nomad sandbox of the
    node got EMFILE from inotify_init (a file watcher, `tail -f`, a dev server's reload: gone
    for every tenant); 200,000 watches made their inotify_add_watch ENOSPC. The clients lift
    those per-uid counts (scripts/services.d/nomad.sh `sandbox_sysctls`, the Terraform
    nodes' sysctl.d): instances and watches are kernel memory charged to the sandbox's own
    memory cgroup (1,000 instances: +1 MiB of its kmem), so each sandbox pays for its own."""
    hog, other = await make(driver), await make(driver)
    try:
        await launch_daemon(driver, hog, INOTIFY_HOG)
        took: dict[str, Any] = {}
        for _ in range(100):
            code, out, _ = await run(driver, hog, ["cat", "/tmp/hog.json"])
            if code == 0 and out:
                took = json.loads(out)
                break
            await asyncio.sleep(0.2)
        seen = await python(driver, other, INOTIFY_PROBE)
    finally:
        await driver.destroy(hog)
        await driver.destroy(other)
    assert took, "the hog never reported"
    assert seen == {"init": "ok", "watch": "ok"}, f"another sandbox got {seen} while one held {took}"
    assert took == {"instances": 300, "watches": 200000}, took


# ------------------------------------------------------------------------ escapes from the container

# Everything a process of the sandbox tries on its way out, and what each attempt gave.
ESCAPE_PROBE = r'''
import ctypes, errno, json, os, socket
out = {}
libc = ctypes.CDLL(None, use_errno=True)
def err(e):
    return errno.errorcode.get(e, str(e))
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"):
    out["status " + k] = status[k].strip()
out["uid"] = [os.getuid(), os.geteuid(), os.getgid()]
out["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())[:1]
out["hostname"] = socket.gethostname()
out["/dev"] = sorted(os.listdir("/dev"))
out["/sys/fs/cgroup"] = sorted(os.listdir("/sys/fs/cgroup"))
mounts = [l.split(" - ")[0].split()[3:5] for l in open("/proc/self/mountinfo")]
out["mount points"] = sorted(m[1] for m in mounts)
out["host sources"] = sorted(m[0] for m in mounts if m[0] != "/" and m[1] not in ("/proc/keys", "/proc/timer_list"))
for path in ("/run/containerd", "/run/hutch-containerd", "/run/runc", "/var/run/docker.sock", "/var/lib/hutch",
             "/var/lib/nomad", "/var/lib/containerd", "/alloc", "/local", "/secrets", "/etc/nomad.d"):
    out["exists " + path] = os.path.exists(path)
def read(path, n=64):
    try:
        with open(path, "rb") as f:
            data = f.read(n)
        return "empty" if not data else "read"
    except OSError as e:
        return err(e.errno)
for path in ("/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/sysrq-trigger",
             "/proc/1/environ", "/proc/1/mem", "/proc/1/maps", "/proc/1/root/etc/hostname", "/proc/1/cwd/x",
             "/sys/firmware/efi/efivars", "/sys/kernel/debug/kprobes/list", "/sys/kernel/security/lsm"):
    out["read " + path] = read(path)
for path in ("/proc/1/exe", "/proc/1/fd/0", "/proc/1/ns/mnt"):
    try:
        os.readlink(path)
        out["readlink " + path] = "read"
    except OSError as e:
        out["readlink " + path] = err(e.errno)
def write(path, data):
    try:
        with open(path, "w") as f:
            f.write(data)
        return "WROTE"
    except OSError as e:
        return err(e.errno)
for path, data in (("/proc/sys/kernel/core_pattern", "|/tmp/x"), ("/proc/sys/vm/drop_caches", "3"),
                   ("/sys/kernel/mm/transparent_hugepage/enabled", "never"), ("/proc/self/oom_score_adj", "-1000"),
                   ("/sys/fs/cgroup/release_agent", "/tmp/x"), ("/proc/sysrq-trigger", "c"), ("/etc/passwd", "x")):
    out["write " + path] = write(path, data)
def sc(name, nr, *args):
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    out["syscall " + name] = "ok" if r >= 0 else err(ctypes.get_errno())
buf = ctypes.create_string_buffer(8)
local = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
remote = (ctypes.c_void_p * 2)(0x400000, 8)
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID = 0x10000000, 0x20000, 0x40000000, 0x20000000
sc("unshare(NEWUSER)", 272, CLONE_NEWUSER); sc("unshare(NEWNS)", 272, CLONE_NEWNS)
sc("unshare(NEWNET)", 272, CLONE_NEWNET); sc("unshare(NEWPID)", 272, CLONE_NEWPID)
sc("setns(own net)", 308, os.open("/proc/self/ns/net", os.O_RDONLY), 0)
sc("mount(tmpfs)", 165, ctypes.cast(ctypes.c_char_p(b"x"), ctypes.c_void_p).value,
   ctypes.cast(ctypes.c_char_p(b"/tmp"), ctypes.c_void_p).value, ctypes.cast(ctypes.c_char_p(b"tmpfs"), ctypes.c_void_p).value, 0, 0)
sc("umount2(/proc)", 166, ctypes.cast(ctypes.c_char_p(b"/proc"), ctypes.c_void_p).value, 2)
sc("chroot(/tmp)", 161, ctypes.cast(ctypes.c_char_p(b"/tmp"), ctypes.c_void_p).value)
sc("pivot_root", 155, 0, 0)
sc("ptrace(ATTACH, 1)", 101, 16, 1, 0, 0)
sc("process_vm_readv(1)", 310, 1, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
sc("bpf", 321, 0, 0, 0); sc("perf_event_open", 298, 0, 0, -1, -1, 0); sc("userfaultfd", 323, 0)
sc("keyctl", 250, 0, 0); sc("add_key", 248, 0, 0, 0, 0, 0); sc("request_key", 249, 0, 0, 0, 0)
sc("kexec_load", 246, 0, 0, 0, 0); sc("init_module", 175, 0, 0, 0); sc("finit_module", 313, 0, 0, 0)
sc("delete_module", 176, 0, 0); sc("open_by_handle_at", 304, 0, 0, 0); sc("iopl", 172, 3); sc("ioperm", 173, 0, 1, 1)
sc("reboot", 169, 0, 0, 0, 0); sc("syslog(READ_ALL)", 103, 3, 0, 0); sc("sethostname", 170, 0, 0)
sc("acct", 163, 0); sc("swapon", 167, 0, 0); sc("fanotify_init", 300, 0, 0); sc("kcmp", 312, 1, 1, 0, 0, 0)
sc("quotactl", 179, 0, 0, 0, 0); sc("setuid(0)", 105, 0); sc("setgid(0)", 106, 0); sc("clone3", 435, 0, 0)
sc("io_uring_setup", 425, 1, 0); sc("lookup_dcookie", 212, 0, 0, 0); sc("settimeofday", 164, 0, 0)
sc("clock_settime", 227, 0, 0); sc("vhangup", 153); sc("nfsservctl", 180, 0, 0, 0)
sc("move_mount", 429, 0, 0, 0, 0, 0); sc("fsopen", 430, 0, 0); sc("open_tree", 428, -100, 0, 0)
sc("mknod(char 1:1)", 133, ctypes.cast(ctypes.c_char_p(b"/tmp/mem"), ctypes.c_void_p).value, 0o20600, 0x0101)
sc("personality(READ_IMPLIES_EXEC)", 135, 0x0400000)
for name, args in (("AF_PACKET", (17, socket.SOCK_RAW, 0)), ("AF_VSOCK", (40, socket.SOCK_STREAM, 0)),
                   ("raw IPv4", (socket.AF_INET, socket.SOCK_RAW, 1)), ("AF_ALG", (38, socket.SOCK_SEQPACKET, 0)),
                   ("AF_KEY", (15, socket.SOCK_RAW, 2)), ("AF_BLUETOOTH", (31, socket.SOCK_RAW, 0))):
    try:
        socket.socket(*args).close()
        out["socket " + name] = "ok"
    except OSError as e:
        out["socket " + name] = err(e.errno)
print(json.dumps(out))
'''

MASKED = ("ENOENT", "empty", "EACCES", "EPERM")  # absent, bound over by /dev/null, or refused
REFUSED = ("EPERM", "EACCES", "ENOSYS")


async def test_nothing_inside_leads_out_of_the_container(driver: NomadDriver) -> None:
    """Credentials, capabilities, seccomp, the mounts and devices it has, the host's and
    init's /proc entries, kernel interfaces that change the host, namespaces, mounts,
    ptrace and process_vm_readv of init, modules, keyrings, BPF, perf, io_uring, raw and
    exotic sockets: each would be a way out if it answered (a capability, a host path in the
    mounts, a namespace made, a write to core_pattern or release_agent)."""
    sid = await make(driver, network_enabled=True)
    try:
        seen = await python(driver, sid, ESCAPE_PROBE)
    finally:
        await driver.destroy(sid)
    problems = {}

    def expect(key: str, ok: Any) -> None:
        value = seen.pop(key)
        if not (ok(value) if callable(ok) else value == ok):
            problems[key] = value

    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        expect(f"status {cap}", "0000000000000000")
    expect("status NoNewPrivs", "1")
    expect("status Seccomp", "2")
    expect("uid", [290000, 290000, 290000])
    expect("pids", [1])
    expect("hostname", "sandbox")
    expect("/dev", ["fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout",
                    "tty", "urandom", "zero"])
    expect("/sys/fs/cgroup", [])
    expect("mount points", lambda v: set(v) <= {
        "/", "/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys", "/run", "/home/agentuity",
        "/etc/resolv.conf", "/etc/hosts", "/etc/hostname", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
        "/proc/acpi", "/proc/keys", "/proc/timer_list", "/sys/firmware", "/proc/kcore", "/proc/sysrq-trigger",
        "/proc/sched_debug", "/proc/scsi", "/proc/latency_stats", "/proc/timer_stats", "/proc/asound",
        "/sys/devices/virtual/powercap"})
    # The only host paths bound in: the workspace and the sandbox's own resolv.conf/hosts files.
    expect("host sources", lambda v: all(s.startswith(("/var/lib/hutch/nomad-workspaces/", "/bus", "/fs", "/irq",
                                                       "/sys", "/null")) or "resolv" in s or "hosts" in s
                                         or "hostname" in s for s in v))
    for key in [k for k in seen if k.startswith("exists ")]:
        expect(key, False)
    for key in [k for k in seen if k.startswith("read ")]:
        expect(key, lambda v: v in MASKED)
    for key in [k for k in seen if k.startswith("readlink ")]:
        expect(key, "EACCES")
    for key in [k for k in seen if k.startswith("write ")]:
        expect(key, lambda v: v in ("EROFS", "EACCES", "EPERM", "ENOENT"))
    for key in [k for k in seen if k.startswith("syscall ")]:
        expect(key, lambda v: v in REFUSED)
    for key in [k for k in seen if k.startswith("socket ")]:
        expect(key, lambda v: v in ("EAFNOSUPPORT", "EPERM"))
    assert not seen, f"unchecked: {seen}"
    assert not problems, json.dumps(problems, indent=1)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def alloc_driver(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[NomadDriver]:
    """The same Nomad, every command its own alloc exec (runc exec): HUTCH_NOMAD_EXEC=alloc."""
    d = await start_nomad(tmp_path_factory.mktemp("nomad-pass2-alloc") / "data", exec_mode="alloc")
    assert isinstance(d, NomadDriver)
    try:
        yield d
    finally:
        for sid in list(d._sandboxes):
            await d.destroy(sid)
        await d.close()


# Connect to each abstract unix socket of the host's network namespace (containerd's shims
# once listened there: CVE-2020-15257), by name; what each gave.
ABSTRACT_PROBE = r'''
import errno, json, socket, sys
out = {}
for name in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect("\0" + name)
        out[name] = "connected"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))
    finally:
        s.close()
print(json.dumps(out))
'''


async def test_the_runtimes_own_ways_in_are_closed(driver: NomadDriver, alloc_driver: NomadDriver) -> None:
    """What hutch, runc and containerd themselves hand a sandbox:
    - a command or terminal whose argv starts like the plugin's envelope (`hutch-exec:v1`
      and a verb: freeze the sandbox, widen its allow-list) is a command like any other
      (not found), on both exec paths: the driver's envelope always comes first;
    - a working directory of /proc/self/fd/N (runc's leaked host fds, CVE-2024-21626) is
      refused on runc's path (terminals, alloc execs) and on the agent's: the command never
      runs there (a terminal's is sometimes refused just after its start: no output, 137);
    - the exec agent's binary is gone from /tmp once it runs, and its /proc entries are
      closed to the sandbox (not dumpable);
    - the host's abstract unix sockets are not reachable (another network namespace)."""
    from hutch.core.errors import InvalidInput
    from hutch.drivers.base import TerminalRequest
    from hutch.drivers.nomad.execs import ENVELOPE
    from tests.nomad.test_exec_agent import until_agent

    sid = await make(driver, network_enabled=True, network_allow=("198.51.100.7/32",))
    plain = await make(alloc_driver)
    found: dict[str, Any] = {}
    try:
        agent = await until_agent(driver, sid)
        for name, d, target in (("agent", driver, sid), ("alloc", alloc_driver, plain)):
            for verb in ({"freeze": True}, {"allow": ["0.0.0.0/0"]}, {"kill": "x"}, {"usage": True}):
                found[f"{name} {verb}"] = (await run(d, target, [ENVELOPE, json.dumps(verb)]))[0]
            found[f"{name} still runs"] = (await run(d, target, ["echo", "ok"]))[:2]
            for n in (3, 5, 7):
                try:
                    r = await d.exec(ExecRequest(new_id("ex"), target, ["sh", "-c", "ls -a ../../.."],
                                                 cwd=f"/proc/self/fd/{n}"), Recorder())
                    found[f"{name} cwd fd {n}"] = f"ran, exit {r.exit_code}"
                except InvalidInput:  # "working directory ... does not exist"
                    found[f"{name} cwd fd {n}"] = "refused"
        for n in (3, 5, 7):
            # runc refuses the directory, either before the start (InvalidInput) or just after
            # it (the stream ends without an exit: 137); the command never runs either way.
            try:
                term = await alloc_driver.open_terminal(TerminalRequest(plain, ["sh", "-c", "echo RAN; pwd; ls -a ../../.."],
                                                                        cwd=f"/proc/self/fd/{n}"))
            except InvalidInput:
                found[f"terminal cwd fd {n}"] = "refused"
                continue
            screen = b""
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    while chunk := await term.read():
                        screen += chunk
            await term.close()
            found[f"terminal cwd fd {n}"] = f"ran: {screen[:300]!r}" if b"RAN" in screen else "refused"
        try:
            term = await alloc_driver.open_terminal(TerminalRequest(plain, [ENVELOPE, json.dumps({"freeze": True})]))
            found["terminal envelope"] = await asyncio.wait_for(term.wait(), 30)
            await term.close()
        except Exception as err:
            found["terminal envelope"] = type(err).__name__
        found["still reaches nothing but its list"] = await python(driver, sid, (
            "import json, socket\ns = socket.socket(); s.settimeout(2)\n"
            "try:\n    s.connect(('1.1.1.1', 80)); r = 'open'\nexcept OSError as e:\n    r = type(e).__name__\n"
            "print(json.dumps(r))"))
        found["agent"] = await python(driver, sid, (
            "import glob, json, os, sys\npid = int(sys.argv[1])\nout = {'tmp': glob.glob('/tmp/.hutch-exec-agent*')}\n"
            "for p in ('exe', 'cwd', 'root', 'fd/0'):\n    try:\n        os.readlink(f'/proc/{pid}/{p}'); out[p] = 'read'\n"
            "    except OSError as e:\n        out[p] = e.strerror\nprint(json.dumps(out))"), str(agent.pid))
        unix = await asyncio.to_thread(Path("/proc/net/unix").read_text)
        abstract = sorted({line.split()[-1][1:] for line in unix.splitlines()[1:] if line.split()[-1].startswith("@")})
        found["host abstract sockets"] = await python(driver, sid, ABSTRACT_PROBE, *abstract) if abstract else {}
    finally:
        await driver.destroy(sid)
        await alloc_driver.destroy(plain)
    expected: dict[str, Any] = {}
    for name in ("agent", "alloc"):
        expected.update({f"{name} {v}": 127 for v in ({"freeze": True}, {"allow": ["0.0.0.0/0"]}, {"kill": "x"},
                                                      {"usage": True})})
        expected[f"{name} still runs"] = (0, "ok\n")
        expected.update({f"{name} cwd fd {n}": "refused" for n in (3, 5, 7)})
    expected.update({f"terminal cwd fd {n}": "refused" for n in (3, 5, 7)})
    expected["terminal envelope"] = 127
    expected["still reaches nothing but its list"] = "ConnectionRefusedError"
    expected["agent"] = {"tmp": [], "exe": "Permission denied", "cwd": "Permission denied", "root": "Permission denied",
                         "fd/0": "Permission denied"}
    expected["host abstract sockets"] = {n: "ECONNREFUSED" for n in found["host abstract sockets"]}
    assert found == expected, json.dumps(found, indent=1)


# ------------------------------------------------------------------------ limits a sandbox meets

# Fork until the kernel refuses, children sleeping; the most that were alive at once.
FORK_BOMB = r'''
import errno, json, os, time
alive = 0
why = None
while alive < 100000:
    try:
        pid = os.fork()
    except OSError as e:
        why = errno.errorcode.get(e.errno)
        break
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    alive += 1
json.dump({"alive": alive, "why": why}, open("/tmp/bomb.json", "w"))
time.sleep(600)
'''

# Empty files until the file system says no: how many, and why it stopped.
INODES = r'''
import errno, json, os
os.makedirs("many", exist_ok=True)
n, why = 0, None
while n < 2000000:
    try:
        os.close(os.open(f"many/{n}", os.O_CREAT | os.O_WRONLY, 0o600))
    except OSError as e:
        why = errno.errorcode.get(e.errno)
        break
    n += 1
print(json.dumps({"files": n, "why": why}))
'''

# 20 MiB into the task's stderr, through the fd 2 of init's children (init is not dumpable).
STDERR_FLOOD = r'''
import os
pids = [p for p in os.listdir("/proc") if p.isdigit() and p != "1"
        and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == "1"]
for pid in pids:
    try:
        fd = os.open(f"/proc/{pid}/fd/2", os.O_WRONLY)
        break
    except OSError:
        continue
else:
    raise SystemExit(f"no way into the task's stderr through {pids}")
for _ in range(20):
    os.write(fd, b"y" * (1 << 20))
print("wrote 20 MiB through", pid)
'''


async def test_a_sandboxs_limits_keep_its_node_and_neighbours_whole(driver: NomadDriver) -> None:
    """A fork bomb stops at the sandbox's pids limit (64 here) and its neighbour keeps running
    commands meanwhile; the bomb's command times out and its tree goes, the sandbox stays
    usable. With a disk limit, files are made until that file system is full of inodes (an
    ext4 image of the limit's size), never the client's own inodes. The task's stderr, as its
    stdout, goes nowhere on the client's disk."""
    from hutch.drivers.base import ResourceLimits
    from tests.adversarial.test_nomad_attacker import alloc_files

    bombed = await make(driver, resources=ResourceLimits(pids=64))
    neighbour = await make(driver)
    disked = await make(driver, resources=ResourceLimits(disk_bytes=64 * MiB))
    try:
        # The bomb runs 20 s: long enough that a neighbour slowed by whatever else the machine
        # runs still answers while the bomb is alive, which is the point (not a time bound).
        bomb = asyncio.ensure_future(run(driver, bombed, ["python3", "-c", FORK_BOMB], timeout=20))
        await asyncio.sleep(3)
        started = time.monotonic()
        beside = await run(driver, neighbour, ["echo", "beside"])
        beside_took = time.monotonic() - started
        bomb_alive_meanwhile = not bomb.done()
        code, _, _ = await bomb
        report = json.loads((await run(driver, bombed, ["cat", "/tmp/bomb.json"]))[1] or "{}")
        after = (await run(driver, bombed, ["echo", "after"]))[:2]
        host = os.statvfs("/var/lib/hutch/nomad-workspaces")
        made = await python(driver, disked, INODES, timeout=120)
        host_after = os.statvfs("/var/lib/hutch/nomad-workspaces")
        alloc = driver.running(neighbour).alloc_id
        flood = await run(driver, neighbour, ["python3", "-c", STDERR_FLOOD])
        await asyncio.sleep(1)
        sizes = await asyncio.to_thread(alloc_files, alloc)
    finally:
        for sid in (bombed, neighbour, disked):
            await driver.destroy(sid)
    assert beside[:2] == (0, "beside\n") and bomb_alive_meanwhile, (beside, beside_took)
    assert code == 124 and after == (0, "after\n"), (code, after)
    assert report.get("why") == "EAGAIN" and report.get("alive", 0) < 64, report
    assert made["why"] == "ENOSPC" and made["files"] < 70000, made
    # Files made on the client's own file system would take about as many of its inodes as the
    # sandbox made; other processes on the machine may take a few thousand meanwhile.
    assert host.f_ffree - host_after.f_ffree < made["files"] // 2, ("the client's own inodes were taken",
                                                                   host.f_ffree - host_after.f_ffree, made)
    assert flood[0] == 0, flood
    assert sum(sizes.values()) < 4 * MiB, sizes


# ------------------------------------------------------------------------ warm pools: one tenant after another

LEAVE_BEHIND = r'''
import os, socket, subprocess
open("/tmp/left-by-a", "w").write("a's secret")
open("/home/agentuity/left-by-a", "w").write("a's secret")
subprocess.Popen(["left-by-a", "1000"], executable="/bin/sleep", start_new_session=True, env={},
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
if os.fork() == 0:
    os.setsid()
    s = socket.socket(socket.AF_UNIX)
    s.bind("\0left-by-a")
    s.listen(1)
    import time
    time.sleep(1000)
print("{}")
'''

FIND_LEFTOVERS = r'''
import errno, json, os, socket
out = {"files": [p for p in ("/tmp/left-by-a", "/home/agentuity/left-by-a") if os.path.exists(p)], "procs": []}
for p in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
    try:
        if b"left-by-a" in open(f"/proc/{p}/cmdline", "rb").read():
            out["procs"].append(p)
    except OSError:
        pass
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("\0left-by-a")
    out["socket"] = "connected"
except OSError as e:
    out["socket"] = errno.errorcode[e.errno]
print(json.dumps(out))
'''


async def test_a_warm_pool_hands_no_tenant_what_another_left(tmp_path_factory: pytest.TempPathFactory) -> None:
    """With warm pools a create claims an allocation placed ahead of time (with an exec agent
    already running in it). A tenant that claimed one leaves files in /tmp and its workspace,
    a daemon and an abstract socket, then destroys its sandbox; the next create claims a
    pool entry too, and must find none of it (an entry serves one sandbox, then goes)."""
    d = await start_nomad(tmp_path_factory.mktemp("nomad-pass2-pool") / "data", pool_sizes={PY: 1})
    assert isinstance(d, NomadDriver)

    async def pooled() -> str:
        for _ in range(300):
            if d._pool.get(PY):
                claims = d.pool_metrics()["claims"]
                sid = await make(d)
                assert d.pool_metrics()["claims"] == claims + 1, "the create did not claim a pool entry"
                return sid
            await asyncio.sleep(0.1)
        raise AssertionError("the warm pool never filled")

    try:
        first = await pooled()
        first_alloc = d.running(first).alloc_id
        await python(d, first, LEAVE_BEHIND)
        left = await python(d, first, FIND_LEFTOVERS)
        assert len(left["files"]) == 2 and left["procs"] and left["socket"] == "connected", left  # the probe sees them
        await d.destroy(first)
        second = await pooled()
        assert d.running(second).alloc_id != first_alloc
        seen = await python(d, second, FIND_LEFTOVERS)
        await d.destroy(second)
    finally:
        for sid in list(d._sandboxes):
            await d.destroy(sid)
        await d.close()
    assert seen == {"files": [], "procs": [], "socket": "ECONNREFUSED"}, seen
