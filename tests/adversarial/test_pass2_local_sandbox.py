"""Second adversarial pass, the local driver from inside a sandbox of a real ``hutch serve``:
escapes (the kernel's doors, /proc and /sys, device nodes, mounts, setuid binaries, the root
helper), the host's sockets and services over IPv4 and IPv6 with network on, an allow-list,
only a port and no network, and what one tenant's sandbox can do to another's.

Each probe is the attack as a sandbox's code would make it (Python's ctypes for raw syscalls);
each assertion is the refusal that holds today, and says what getting through would mean."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator

import pytest

from tests.adversarial.pass2 import World, start_world

pytestmark = pytest.mark.isolation


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    yield from start_world(tmp_path_factory.mktemp("pass2-sandbox"), "embedded")


@pytest.fixture(scope="module")
def kinds(world: World) -> dict[str, str]:
    """Beta's sandboxes of every network kind (python runtime)."""
    return {"off": world.sandbox("off"), "on": world.sandbox("on", network={"enabled": True, "port": 8080}),
            "allow": world.sandbox("allow", network={"enabled": True, "allow": ["93.184.216.34"]}),
            "port": world.sandbox("port", network={"port": 8081})}


SYSCALLS = r"""
import ctypes, errno, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return r if r >= 0 else -ctypes.get_errno()
def s(text):
    return ctypes.addressof(ctypes.create_string_buffer(text))
pidfd = sc(434, 1, 0)
out = {
 "keyctl": sc(250, 0, 0), "add_key": sc(248, s(b"user"), s(b"k"), s(b"v"), 1, -2),
 "request_key": sc(249, s(b"user"), s(b"k"), 0, 0),
 "io_uring_setup": sc(425, 8, s(b"\0" * 120)), "io_uring_enter": sc(426, 0, 0, 0, 0, 0),
 "io_uring_register": sc(427, 0, 0, 0, 0), "clone3": sc(435, 0, 0),
 "unshare_user": sc(272, 0x10000000), "unshare_mount": sc(272, 0x00020000), "unshare_net": sc(272, 0x40000000),
 "unshare_cgroup": sc(272, 0x02000000), "unshare_time": sc(272, 0x80), "unshare_ipc": sc(272, 0x08000000),
 "unshare_pid": sc(272, 0x20000000), "clone_newuser": sc(56, 0x10000000 | 17, 0, 0, 0, 0),
 "mount_tmpfs": sc(165, s(b"none"), s(b"/tmp"), s(b"tmpfs"), 0, 0), "umount_proc": sc(166, s(b"/proc"), 2),
 "bpf": sc(321, 0, s(b"\0" * 64), 64), "perf_event_open": sc(298, s(b"\0" * 128), 0, -1, -1, 0),
 "userfaultfd": sc(323, 0), "ptrace_attach_pid1": sc(101, 16, 1, 0, 0), "setns_pid1": sc(308, pidfd, 0),
 "open_by_handle_at": sc(304, -100, s(b"\0" * 64), 0), "name_to_handle_at": sc(303, -100, s(b"/"), s(b"\0" * 64),
                                                                                s(b"\0" * 8), 0),
 "kexec_load": sc(246, 0, 0, 0, 0), "init_module": sc(175, 0, 0, s(b"")), "finit_module": sc(313, 0, s(b""), 0),
 "delete_module": sc(176, s(b"ext4"), 0), "pivot_root": sc(155, s(b"/tmp"), s(b"/tmp")), "chroot": sc(161, s(b"/tmp")),
 "mknod_mem": sc(133, s(b"/tmp/mem"), 0o20666, (1 << 8) | 1), "mknod_sda": sc(133, s(b"/tmp/sda"), 0o60666, (8 << 8)),
 "setuid_0": sc(105, 0), "setgid_0": sc(106, 0), "setresuid_0": sc(117, 0, 0, 0), "setgroups": sc(116, 0, 0),
 "fsopen": sc(430, s(b"tmpfs"), 0), "fsmount": sc(432, 0, 0, 0), "open_tree": sc(428, -100, s(b"/"), 1),
 "move_mount": sc(429, -100, s(b"/tmp"), -100, s(b"/mnt"), 0), "mount_setattr": sc(442, -100, s(b"/"), 0, 0, 0),
 "pidfd_getfd_pid1": sc(438, pidfd, 0, 0), "vhangup": sc(153), "syslog": sc(103, 3, s(b"\0" * 64), 64),
 "iopl": sc(172, 3), "ioperm": sc(173, 0x80, 1, 1), "quotactl": sc(179, 0, s(b"/"), 0, 0), "acct": sc(163, s(b"/tmp/a")),
 "swapon": sc(167, s(b"/tmp/swap"), 0), "reboot": sc(169, 0xfee1dead, 672274793, 0x1234567, 0),
 "sethostname": sc(170, s(b"x"), 1), "setdomainname": sc(171, s(b"x"), 1),
 "settimeofday": sc(164, s(b"\0" * 16), 0), "clock_settime": sc(227, 0, s(b"\0" * 16)),
 "adjtimex": sc(159, s(b"\x01" + b"\0" * 207)), "lookup_dcookie": sc(212, 0, 0, 0), "fanotify_init": sc(300, 0, 0),
 "setpriority_raise": sc(141, 0, 0, -10),
}
out["mknod_mem_exists"] = os.path.exists("/tmp/mem")
fams = {"vsock": 40, "packet": 17, "rds": 21, "tipc": 30, "alg": 38, "kcm": 41, "qipcrtr": 42, "xdp": 44, "ax25": 3,
        "can": 29, "bluetooth": 31, "appletalk": 5, "ipx": 4, "x25": 9, "llc": 26, "pppox": 24, "smc": 43, "mctp": 45}
for name, fam in fams.items():
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM, socket.SOCK_SEQPACKET, socket.SOCK_RAW):
        try:
            socket.socket(fam, kind, 0).close()
            out["sock_" + name] = "OPEN"
            break
        except OSError as err:
            out["sock_" + name] = err.errno
for fam, name in ((socket.AF_INET, "raw_inet"), (socket.AF_INET6, "raw_inet6")):
    try:
        socket.socket(fam, socket.SOCK_RAW, socket.IPPROTO_ICMP).close(); out[name] = "OPEN"
    except OSError as err:
        out[name] = err.errno
for proto, name in ((15, "netlink_uevent_bind"), (9, "netlink_audit"), (12, "netlink_netfilter_bind")):
    try:
        n = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, proto); n.bind((0, 1)); out[name] = "OPEN"
    except OSError as err:
        out[name] = err.errno
print(json.dumps(out))
"""


def test_the_kernels_doors_stay_shut(world: World, kinds: dict[str, str]) -> None:
    """From a sandbox with network on, as its code would: keyrings (shared per uid, the
    kernel's), io_uring, user/mount/net/... namespaces, mount and the new mount API, bpf,
    perf, userfaultfd, ptrace and setns on pid 1, handles by inode, kexec and modules,
    pivot_root/chroot, device nodes, becoming root, the clock, the hostname, swap, reboot, and
    every socket family the kernel would autoload a module for (vsock reaches the hypervisor,
    packet and raw sockets go past the namespace's filtering). Each answers EPERM, ENOSYS,
    EAFNOSUPPORT or EACCES; an "OPEN" or 0 here would be a way into the kernel or out."""
    got = world.python("beta_member", kinds["on"], SYSCALLS)
    opened = {k: v for k, v in got.items() if k.startswith(("sock_", "raw_", "netlink_")) and v == "OPEN"}
    assert not opened, opened
    allowed = {k: v for k, v in got.items() if not k.startswith(("sock_", "raw_", "netlink_"))
               and type(v) is int and v >= 0}
    assert not allowed, f"allowed from inside the sandbox: {allowed}"
    assert got["mknod_mem_exists"] is False
    assert got["keyctl"] == -1 and got["add_key"] == -1, got  # EPERM: no keyring shared with the host's uid
    assert got["io_uring_setup"] == -38 and got["clone3"] == -38, got  # ENOSYS: callers fall back
    # The x32 ABI (syscall numbers with bit 30 set) is another entry to every syscall: killed.
    _, out, err = world.run("beta_member", kinds["on"],
                            "python3 -c 'import ctypes; ctypes.CDLL(None).syscall(0x40000000 | 250, 0, 0)'; "
                               "echo exit=$?")
    assert "exit=159" in out, (out, err)  # 128 + SIGSYS


PROC = r"""
import json, os
out = {}
for p in ["/proc/1/mem", "/proc/1/environ", "/proc/1/maps", "/proc/1/syscall", "/proc/1/stack", "/proc/kmsg",
          "/proc/kcore", "/proc/sysrq-trigger", "/dev/mem", "/dev/kmsg", "/dev/port",
          "/sys/kernel/notes", "/sys/fs/cgroup/cgroup.procs", "/sys/firmware/dmi/tables/DMI"]:
    try:
        with open(p, "rb") as f:
            out[p] = "READ:" + f.read(16).hex()
    except OSError as e:
        out[p] = e.errno
for p in ["/proc/1/root", "/proc/1/cwd", "/proc/1/fd", "/proc/1/map_files"]:
    try:
        out[p] = "LISTED:" + ",".join(os.listdir(p)[:5])
    except OSError as e:
        out[p] = e.errno
for p, v in [("/proc/sys/kernel/core_pattern", "|/tmp/x"), ("/proc/sys/kernel/modprobe", "/tmp/x"),
             ("/proc/sys/vm/drop_caches", "3"), ("/proc/sys/net/ipv4/ip_forward", "1"),
             ("/proc/sys/kernel/hostname", "x"), ("/proc/self/oom_score_adj", "-1000"),
             ("/proc/1/oom_score_adj", "1000"), ("/proc/sysrq-trigger", "b"), ("/proc/self/setgroups", "allow"),
             ("/proc/self/uid_map", "0 0 1"), ("/etc/passwd", "x"), ("/usr/bin/python3", "x"), ("/", "x"),
             ("/root/x", "x"), ("/etc/ld.so.preload", "/tmp/x.so")]:
    try:
        with open(p, "w") as f:
            f.write(v)
        out["w:" + p] = "WROTE"
    except OSError as e:
        out["w:" + p] = e.errno
out["sys"] = sorted(os.listdir("/sys"))
out["mounts"] = sorted(line.split()[1] for line in open("/proc/mounts"))
out["dev"] = sorted(os.listdir("/dev"))
out["status"] = {l.split(":")[0]: l.split(":")[1].strip() for l in open("/proc/self/status")
                 if l.startswith(("Cap", "NoNewPrivs", "Seccomp"))}
out["sockets_in_fs"] = []
for root, dirs, files in os.walk("/", onerror=lambda e: None):
    if root.startswith(("/proc", "/sys")):
        dirs[:] = []
        continue
    for name in files:
        path = os.path.join(root, name)
        try:
            if os.path.stat.S_ISSOCK(os.lstat(path).st_mode):
                out["sockets_in_fs"].append(path)
        except OSError:
            pass
out["unix"] = open("/proc/net/unix").read().splitlines()[1:]
print(json.dumps(out))
"""


def test_proc_sys_dev_and_mounts_give_nothing_of_the_host(world: World, kinds: dict[str, str]) -> None:
    """pid 1 (the sandbox's init, run by the root helper) is not readable; the kernel's
    memory, log and sysrq are not there; /proc/sys takes no write (core_pattern or modprobe
    would run a program as root on the host); no file outside the sandbox's own is writable
    (ld.so.preload, /etc, /usr, /root); /sys is empty; /dev holds only the harmless nodes; no
    capability, no_new_privs, seccomp on; no unix socket anywhere in the file system."""
    got = world.python("beta_member", kinds["off"], PROC)
    leaks = {k: v for k, v in got.items() if isinstance(v, str) and v.startswith(("READ", "LISTED", "WROTE"))}
    assert not leaks, leaks
    assert got["sys"] == [], got["sys"]
    assert set(got["mounts"]) <= {
        "/", "/dev", "/dev/pts", "/proc", "/dev/shm", "/workspace", "/home/agentuity",
        "/proc/sys/kernel/random/boot_id"}, got["mounts"]  # its own boot id (docs/isolation.md)
    assert set(got["dev"]) <= {"fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout",
                               "tty", "urandom", "zero"}, got["dev"]
    status = got["status"]
    assert all(int(status[c], 16) == 0 for c in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")), status
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2", status
    assert got["sockets_in_fs"] == [] and got["unix"] == [], (got["sockets_in_fs"], got["unix"])


def test_setuid_binaries_give_no_root(world: World, kinds: dict[str, str]) -> None:
    """The runtime ships su, mount, passwd, chfn, newgrp... setuid root. With no_new_privs, a
    nosuid root and no capabilities, none of them gives root: ``su`` with an empty password,
    ``mount``, ``chfn`` editing /etc/passwd, ``newgrp`` all fail, and nothing ran as uid 0."""
    _, out, _ = world.run("beta_member", kinds["off"], r"""
find / -xdev -perm -4000 -type f 2>/dev/null | sort | tr '\n' ' '; echo
echo | su -c 'id -u' root 2>&1 | tail -1
mount -t tmpfs none /mnt 2>&1 | tail -1
chfn -f pwned agentuity 2>&1 | tail -1; grep -c pwned /etc/passwd
newgrp root -c 'id -g' 2>&1 | tail -1
id -u
""")
    lines = out.splitlines()
    assert "/usr/bin/su" in lines[0], out  # there to be tried
    assert lines[1] != "0" and lines[-1] != "0", out
    assert lines[4] == "0", out  # /etc/passwd unchanged
    assert not any(line.strip() == "0" for line in lines[1:4]), out


def test_the_root_helper_cannot_be_ptraced_or_read_while_it_works(world: World, kinds: dict[str, str]) -> None:
    """A file operation enters the sandbox as a helper (``hutch-nsexec fs``): root on the host
    until it drops to the sandbox user in the sandbox's pid namespace. Held there by a download
    whose client reads nothing (the helper blocks on its full pipe to the server), it sits
    beside the sandbox's processes: they may not ptrace it, nor read its memory, environment,
    mappings or file descriptors (pipes to the server), because it is not dumpable."""
    sid = kinds["off"]
    code, _, err = world.run("beta_member", sid, "head -c 64M /dev/zero > /tmp/big")
    assert code == 0, err
    host, port = world.url.split("//")[1].split(":")
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect((host, int(port)))
    slow.sendall(f"GET /fs/{sid}?path=/tmp/big HTTP/1.1\r\nHost: {host}\r\n"
                 f"Authorization: Bearer {world.keys['beta_member']}\r\n\r\n".encode())
    try:
        got = world.python("beta_member", sid, r"""
import ctypes, json, os, time
libc = ctypes.CDLL(None, use_errno=True)
mine = {os.getpid(), os.getppid(), 1}
found = {}
for _ in range(100):
    helpers = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in mine
               and open(f"/proc/{p}/comm").read().strip() not in ("sh", "python3")]
    if helpers:
        break
    time.sleep(0.05)
for pid in helpers:
    seen = {"comm": open(f"/proc/{pid}/comm").read().strip(), "uid": os.stat(f"/proc/{pid}").st_uid}
    for what in ("mem", "environ", "maps", "syscall"):
        try:
            with open(f"/proc/{pid}/{what}", "rb") as f:
                seen[what] = "READ" if f.read(64) else "EMPTY"
        except OSError as e:
            seen[what] = e.errno
    for what in ("fd", "cwd", "root"):
        try:
            seen[what] = os.listdir(f"/proc/{pid}/{what}")
        except OSError as e:
            seen[what] = e.errno
    seen["ptrace"] = libc.ptrace(16, pid, 0, 0)
    seen["ptrace_errno"] = ctypes.get_errno()
    found[pid] = seen
print(json.dumps(found))
""")
    finally:
        slow.close()
    assert got, "no helper was seen in the sandbox while it served the file"
    for pid, seen in got.items():
        assert seen["ptrace"] == -1 and seen["ptrace_errno"] == 1, (pid, seen)  # EPERM
        for what in ("mem", "environ", "maps", "syscall", "fd", "cwd", "root"):
            assert seen[what] == 13, (pid, what, seen)  # EACCES: not dumpable


def host_unix_sockets() -> list[str]:
    out = subprocess.run(["ss", "-xlH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] not in ("*",):
            found.append(fields[4])
    # Once each: sockets bound through a path relative to the binder's fd (each sandbox's zygote
    # binds /proc/self/fd/N/zygote.sock) print the same name for every sandbox that has one.
    return sorted(set(found))


def test_the_hosts_unix_sockets_are_out_of_reach(world: World, kinds: dict[str, str]) -> None:
    """Every unix socket the host listens on (docker's, containerd's and its shims', Nomad's
    plugins and task API sockets, PostgreSQL's, abstract ones) by path and by abstract name,
    from a sandbox: none connects. The sandbox's mount namespace holds none of those paths and
    its network namespace none of the abstract names (containerd-shim's escape, CVE-2020-15257,
    was an abstract socket shared with the host's namespace)."""
    targets = host_unix_sockets()
    assert any("docker.sock" in t for t in targets) and any("PGSQL" in t for t in targets), targets
    got = world.python("beta_member", kinds["on"], r"""
import json, socket, sys
out = {}
for target in json.loads(sys.argv[1]):
    addr = "\0" + target[1:] if target.startswith("@") else target
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        s = socket.socket(socket.AF_UNIX, kind)
        try:
            s.connect(addr); out[target] = "CONNECTED"; break
        except OSError as e:
            out[target] = e.errno
        finally:
            s.close()
print(json.dumps(out))
""", json.dumps(targets))
    assert not [t for t, v in got.items() if v == "CONNECTED"], got
    assert len(got) == len(targets)


NET_PROBE = r"""
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
def probe(target):
    host, port = target
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(1)
    try:
        s.connect(socket.getaddrinfo(host, port, fam)[0][4])
        return f"{host} {port}", "CONNECTED"
    except OSError as e:
        return f"{host} {port}", type(e).__name__
    finally:
        s.close()
with ThreadPoolExecutor(128) as pool:
    out = dict(pool.map(probe, [tuple(t) for t in json.loads(sys.argv[1])]))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(1)
try:
    u.sendto(b"x", ("10.77.0.1", 4648)); u.recv(16); out["udp 10.77.0.1 4648"] = "ANSWERED"
except OSError as e:
    out["udp 10.77.0.1 4648"] = type(e).__name__
print(json.dumps(out))
"""


def host_addresses() -> list[str]:
    out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        dev, family, addr = fields[1].split("@")[0], fields[2], fields[3].split("/")[0]
        if family == "inet6" and addr.startswith("fe80"):
            addr = f"{addr}%eth0" if dev == "eth0" else ""
        if addr and dev != "lo":
            found.append(addr)
    return found


def test_the_orchestrators_services_are_unreachable_over_ipv4_and_ipv6(world: World, kinds: dict[str, str]) -> None:
    """The services that run the platform — Nomad's API (127.0.0.1:4646, the cluster at
    10.77.0.1:4656-4658), the registry (5000), Kafka (19092), PostgreSQL (15432), this server's
    API and SSH gateway — at every address of the host, IPv4 and IPv6 (global, link-local, the
    IPv4-mapped forms), from a sandbox with network on, with an allow-list, with only a port and
    with none: nothing connects (a CONNECTED here is a tenant talking to the orchestrator)."""
    api_port, ssh_port = int(world.url.rsplit(":", 1)[1]), world.ssh_port
    ports = [4646, 4647, 4648, 4656, 4657, 4658, 5000, 15432, 19092, 19093, api_port, ssh_port]
    addresses = [*host_addresses(), "127.0.0.1", "::1", "::ffff:127.0.0.1", "::ffff:10.77.0.1", "10.213.0.1",
                 "169.254.169.254", "0.0.0.0"]
    assert "10.77.0.1" in addresses and any(":" in a for a in addresses), addresses
    targets = [(a, p) for a in addresses for p in ports]
    for kind, sid in kinds.items():
        got = world.python("beta_member", sid, NET_PROBE, json.dumps(targets), timeout=300)
        reached = {k: v for k, v in got.items() if v in ("CONNECTED", "ANSWERED")}
        assert not reached, (kind, reached)
        assert len(got) == len(targets) + 1


def test_files_a_tenant_writes_outside_its_workspace_stay_its_own(world: World, kinds: dict[str, str]) -> None:
    """/tmp, /var/tmp, /dev/shm, /run/lock and the home directory are writable in a sandbox:
    each is the sandbox's own (its overlay or tmpfs), so what beta leaves there is not in
    alpha's sandbox, and nothing root-owned outside them is writable."""
    spots = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/home/agentuity", "/workspace"]
    mark = "beta-was-here-5d1"
    script = "; ".join(f"echo {mark} > {d}/mark 2>/dev/null && echo ok:{d}" for d in spots)
    _, out, _ = world.run("beta_member", kinds["off"], script)
    assert out.count("ok:") == len(spots), out
    alpha = world.sandbox("alpha-py", who="alpha_admin")
    _, out, _ = world.run("alpha_admin", alpha, f"grep -rs {mark} {' '.join(spots)} /etc /var /opt /srv; "
                                                   "for d in / /etc /usr /usr/local/bin /var /opt /root /srv /boot; do "
                                                   "touch $d/x 2>/dev/null && echo writable:$d; done; true")
    assert mark not in out and "writable:" not in out, out


def test_a_fork_bomb_and_a_disk_filler_stay_in_their_sandbox(world: World, kinds: dict[str, str]) -> None:
    """Beta runs a fork bomb (held by its pids limit) and fills a disk-limited sandbox with
    empty files (inodes) and bytes until the file system says no: alpha's command meanwhile
    answers promptly, the server's data dir keeps its free inodes and space, and beta's
    sandbox still runs commands afterwards."""
    bomb = kinds["off"]
    filler = world.sandbox("disk", resources={"disk": "64Mi"})
    data_dir = world.server.data_dir
    before = subprocess.run(["df", "--output=iavail,avail", str(data_dir)], capture_output=True, text=True).stdout
    ex = world.data("beta_member", "POST", f"/sandbox/{bomb}/execute",
                    {"command": ["sh", "-c", "b() { b | b & }; b"], "timeout": "20s"})
    fill = world.data("beta_member", "POST", f"/sandbox/{filler}/execute", {"command": ["python3", "-c", (
        "import os\nos.makedirs('/home/agentuity/d')\ni = 0\n"
        "try:\n    while True:\n        open(f'/home/agentuity/d/{i}', 'w').close(); i += 1\n"
        "except OSError as e:\n    print(f'files={i}', e)\n"
        "try:\n    with open('/tmp/big', 'wb') as f:\n        [f.write(b'0' * 2**20) for _ in range(200)]\n"
        "except OSError as e:\n    print(e)\n")], "timeout": "60s"})
    alpha = world.sandbox("alpha-py", who="alpha_admin")
    time.sleep(2)
    started = time.monotonic()
    code, out, _ = world.run("alpha_admin", alpha, "echo alive")
    assert (code, out) == (0, "alive\n") and time.monotonic() - started < 15
    done = world.data("beta_member", "GET", f"/sandbox/execution/{fill['executionId']}?wait=90s", timeout=120)
    text = world.stream(fill["stdoutStreamUrl"]).decode()
    files = int(re.search(r"files=(\d+)", text).group(1))  # type: ignore[union-attr]
    assert 1000 < files < 200_000 and "No space left" in text, text
    after = subprocess.run(["df", "--output=iavail,avail", str(data_dir)], capture_output=True, text=True).stdout
    (inodes_b, space_b), (inodes_a, space_a) = ([int(x) for x in t.split()[-2:]] for t in (before, after))
    assert inodes_b - inodes_a < 10_000 and (space_b - space_a) < 512 * 1024, (before, after)  # KiB
    world.data("beta_member", "GET", f"/sandbox/execution/{ex['executionId']}?wait=60s", timeout=90)
    code, out, _ = world.run("beta_member", bomb, "echo recovered")
    assert out == "recovered\n", out
    assert done["status"] in ("completed", "failed"), done


def test_an_output_flood_is_capped_and_costs_the_server_nothing_it_keeps(world: World, kinds: dict[str, str]) -> None:
    """``yes`` for 3 seconds on stdout and stderr (hundreds of MiB): each stream keeps at most the output cap
    (16 MiB) and says it was truncated; the server's memory stays flat while it pours in and
    readers can still read it."""
    sid = kinds["off"]
    before = world.reset_peak()
    ex = world.data("beta_member", "POST", f"/sandbox/{sid}/execute", {"command": [
        "sh", "-c", "timeout 3 yes flood & timeout 3 yes flood >&2; wait"], "timeout": "60s"})
    done = world.data("beta_member", "GET", f"/sandbox/execution/{ex['executionId']}?wait=90s", timeout=120)
    assert done["status"] == "completed", done
    with urllib.request.urlopen(world.url + "/streams/" + ex["stdoutStreamUrl"].rsplit("/", 1)[1]) as resp:
        size = len(resp.read())
    assert 15 * 2**20 <= size <= 17 * 2**20, size  # the flood reached the cap, and stopped there
    grown = world.memory("VmHWM") - before
    assert grown < 200 * 2**20, f"the server's peak grew by {grown >> 20} MiB"


def test_the_port_proxy_reaches_a_sandboxs_own_port_and_nothing_else(world: World, kinds: dict[str, str]) -> None:
    """The proxy serves a sandbox's ``network.port`` and only that: the host form naming
    another port of the same sandbox, a sandbox without a port (alpha's), another tenant's
    sandbox on the port beta's uses, a Host that merely ends like the domain, a Host with a
    user part or a port of its own, and the path form's tail trying ``..``, an absolute URL
    or a CRLF into the upstream request: each is the one 404, or reaches beta's own app at
    its own port (which says which path it was asked)."""
    from tests.adversarial.pass2 import DOMAIN

    sid = kinds["port"]
    code, _, err = world.run("beta_member", sid, r"""cat > /tmp/app.py <<'EOF'
import http.server, json, threading
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        port = self.server.server_address[1]
        body = json.dumps({"port": port, "path": self.path, "headers": dict(self.headers)}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
for port in (8081, 8082):
    threading.Thread(target=http.server.ThreadingHTTPServer(("0.0.0.0", port), H).serve_forever).start()
EOF
nohup python3 /tmp/app.py >/dev/null 2>&1 &
for i in $(seq 50); do python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8081))' 2>/dev/null && break; sleep 0.1; done""")
    assert code == 0, err
    body = sid.removeprefix("sbx_")
    alpha = world.sandbox("alpha-py", who="alpha_admin")
    host, port = world.url.split("//")[1].split(":")

    def get(path: str, host_header: str | None = None) -> tuple[int, bytes]:
        conn = socket.create_connection((host, int(port)))
        try:
            conn.sendall(f"GET {path} HTTP/1.1\r\nHost: {host_header or host + ':' + port}\r\nConnection: close\r\n\r\n"
                         .encode())
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
        finally:
            conn.close()
        return int(data.split(b" ", 2)[1]), data.split(b"\r\n\r\n", 1)[1]

    status, page = get("/hello", f"8081-{body}.{DOMAIN}")
    assert status == 200 and json.loads(page)["path"] == "/hello", page
    not_served = [
        ("/hello", f"8082-{body}.{DOMAIN}"), ("/", f"8081-{alpha.removeprefix('sbx_')}.{DOMAIN}"),
        ("/", f"8081-{body}.{DOMAIN}.evil.test"), ("/", f"evil.test.8081-{body}.{DOMAIN}x"),
        ("/", f"8081-{body.upper()}x.{DOMAIN}"), ("/", f"x@8081-{body}.{DOMAIN}"),
        (f"/proxy/{alpha}/", None), (f"/proxy/{alpha}/../{sid}/", None),
    ]
    for path, host_header in not_served:
        status, page = get(path, host_header)
        # A 404, the API's own answer to a host that is not a sandbox's (a redirect to /app),
        # or beta's own app on its own port: never port 8082, never alpha's sandbox.
        assert status in (302, 400, 404) or json.loads(page)["port"] == 8081, (path, host_header, status, page[:200])
    for tail in ("..%2F..%2Fkeys", "http://127.0.0.1:4646/v1/jobs", "x%0d%0aX-Injected:%20yes", "%2e%2e/%2e%2e/"):
        status, page = get(f"/proxy/{sid}/{tail}")
        if status == 200:
            seen = json.loads(page)
            assert seen["port"] == 8081 and "X-Injected" not in seen["headers"], seen
        else:
            assert 400 <= status < 500, (tail, status, page[:200])


def test_the_output_an_organization_keeps_is_bounded_by_its_storage_quota(world: World) -> None:
    """Medium, found open by pass 2. Each command's stdout and stderr were kept (16 MiB each at
    most) for ever, on the server's disk (embedded) or in PostgreSQL, and counted by no quota:
    an organization whose storage quota is 8 MiB ran three commands of 16 MiB of output and the
    server kept 48 MiB of it, and would have kept as much as it was asked to (a member with a
    loop fills the disk every tenant's event log and projections live on). What holds now: the
    output an organization keeps counts against its storage quota from its first byte, a
    command is cut where the room ends and refused (403 QUOTA_EXCEEDED) when none is left, and
    ended sandboxes' output is dropped after HUTCH_OUTPUT_RETENTION: here the first command
    keeps 8 MiB and the next two are refused (at most one more command's cap is allowed)."""
    org = f"o{int(time.time() * 1000) % 10**8}"
    world.data("boot", "POST", "/orgs", {"name": org})
    key = world.data("boot", "POST", f"/keys?orgId=org_{org}", {"role": "member"})["secret"]
    world.data("boot", "PATCH", f"/orgs/org_{org}/quota", {"snapshotBytes": 8 * 2**20})
    sid = world.data(key, "POST", "/sandbox", {"runtime": "base:latest"})["sandboxId"]
    kept = 0
    for _ in range(3):
        status, ex = world.call(key, "POST", f"/sandbox/{sid}/execute", {"command": ["head", "-c", "16M", "/dev/zero"]})
        if status != 200:
            continue  # refused: nothing more kept
        world.data(key, "GET", f"/sandbox/execution/{ex['data']['executionId']}?wait=60s", timeout=90)
        kept += len(world.stream(ex["data"]["stdoutStreamUrl"]))
    assert kept <= 8 * 2**20 + 16 * 2**20, f"{kept >> 20} MiB of output kept under an 8 MiB storage quota"


def test_the_event_log_an_organization_writes_is_bounded_by_its_storage_quota(world: World) -> None:
    """Medium, found open by pass 2. The event log is the source of truth, kept for ever (Kafka:
    unlimited retention) and shared by every tenant; each command's argv was in its event whole
    (up to 512 KiB since the first pass's limits): forty commands of three 131,000-byte
    arguments each, from an organization whose storage quota is 8 MiB, grew the log by 18 MiB,
    and a member with a loop grew it at its rate limit times 512 KiB, for ever. What holds now:
    an event keeps the first 4 KiB of an argv, how many bytes it left out and the SHA-256 of
    the whole (core/limits.py ``recorded_argv``; the driver still runs the whole), so what a
    command puts in the log is bounded (the same forty grow it by under 2 MiB)."""
    org = f"l{int(time.time() * 1000) % 10**8}"
    world.data("boot", "POST", "/orgs", {"name": org})
    key = world.data("boot", "POST", f"/keys?orgId=org_{org}", {"role": "member"})["secret"]
    world.data("boot", "PATCH", f"/orgs/org_{org}/quota", {"snapshotBytes": 8 * 2**20})
    sid = world.data(key, "POST", "/sandbox", {"runtime": "base:latest"})["sandboxId"]
    log = world.server.data_dir

    def size() -> int:
        return sum(p.stat().st_size for p in log.glob("events.db*"))

    before = size()
    for _ in range(40):
        world.call(key, "POST", f"/sandbox/{sid}/execute", {"command": ["true", *(["a" * 131_000] * 3)]})
    grown = size() - before
    assert grown <= 8 * 2**20 + 2 * 2**20, f"the event log grew by {grown >> 20} MiB under an 8 MiB storage quota"
