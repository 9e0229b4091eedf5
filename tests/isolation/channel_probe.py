"""The ways out of a sandbox that a network namespace does not close, from the attacker's side.

``host_bait()`` (run on the host, as the test) sets out what an escaping sandbox would find:
a listener on an abstract unix socket, System V shared memory, a message queue and a
semaphore set under a known key, a POSIX shared-memory file and message queue, and a
process whose command line carries a marker, all open to every uid so only the
sandbox's namespaces stand in the way. ``SCRIPT`` runs inside a sandbox (python3, no
root, under the sandbox's seccomp filter) with the bait's description as its argument
and reports, as JSON, what it could reach; ``assert_sealed`` holds that report to the
security floor. Shared by the local driver (root and rootless) and the nomad driver.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

# Families a sandbox may open (README, "Security floor"); every other one is refused.
ALLOWED_FAMILIES = {socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK}
# Values the kernel truncates to a family (an int) but the filter sees as 64 bits: each must
# be refused even when the family it truncates to is allowed.
WIDE_FAMILIES = [(1 << 32) | socket.AF_UNIX, (1 << 32) | socket.AF_INET, (1 << 32) | 40, -1, 2**31 - 1]
HOST_DEVICES = ["/dev/vsock", "/dev/vhost-vsock", "/dev/vhost-net", "/dev/kvm", "/dev/mem", "/dev/kmem",
                "/dev/port", "/dev/kmsg", "/dev/net/tun", "/dev/fuse", "/dev/uinput", "/dev/vda", "/dev/sda",
                "/dev/nvme0", "/dev/dri", "/dev/hwrng", "/dev/cpu/0/msr", "/dev/tpm0", "/dev/console"]

SCRIPT = r"""
import ctypes, errno, json, os, socket, sys
bait = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    rc = libc.syscall(ctypes.c_long(nr), *[a if isinstance(a, ctypes._SimpleCData) or isinstance(a, ctypes.Array)
                                           else ctypes.c_long(a) for a in args])
    if rc >= 0:
        return rc, "allowed"
    return rc, errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
out = {"socket": {}, "socketpair": {}}
# x86_64: socket 41, socketpair 53, setns 308, keyctl 250, add_key 248, request_key 249, io_uring_setup 425
for family in [*range(0, 70), 255, 1000, *bait["wide"]]:
    kind = socket.SOCK_STREAM if family in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, 40) else socket.SOCK_DGRAM
    rc, verdict = call(41, family, kind, 0)
    if rc >= 0:
        os.close(rc)
    out["socket"][str(family)] = verdict
    pair = (ctypes.c_int * 2)()
    rc, verdict = call(53, family, socket.SOCK_STREAM, 0, pair)
    if rc >= 0:
        os.close(pair[0]); os.close(pair[1])
    out["socketpair"][str(family)] = verdict
out["raw"] = call(41, socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)[1]
def try_open(path):
    try:
        os.close(os.open(path, os.O_RDWR))
        return "opened"
    except OSError as err:
        return errno.errorcode.get(err.errno, str(err.errno))
out["devices"] = {p: try_open(p) for p in bait["devices"]}
try:
    os.mknod("/tmp/.vsock", 0o020666, os.makedev(10, 241))
    out["mknod"] = try_open("/tmp/.vsock")
except OSError as err:
    out["mknod"] = errno.errorcode.get(err.errno, str(err.errno))
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect("\0" + bait["abstract"])
    out["abstract"] = "connected " + s.recv(16).decode(errors="replace")
except OSError as err:
    out["abstract"] = errno.errorcode.get(err.errno, str(err.errno))
seen, ns_links = [], set()
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():  # our own argv carries the marker
        continue
    try:
        if bait["marker"].encode() in open(f"/proc/{pid}/cmdline", "rb").read():
            seen.append(pid)
    except OSError:
        pass
    for ns in ("net", "pid", "ipc", "mnt", "uts", "user", "cgroup"):
        try:
            ns_links.add(os.readlink(f"/proc/{pid}/ns/{ns}"))
        except OSError:
            pass
out["marker_processes"] = seen
out["host_namespaces_seen"] = sorted(ns_links & set(bait["host_ns"]))
fd = os.open("/proc/self/ns/net", os.O_RDONLY)
out["setns"] = call(308, fd, 0)[1]
out["shmget"] = call(29, bait["ipc_key"], 0, 0)[1]
out["msgget"] = call(68, bait["ipc_key"], 0)[1]
out["semget"] = call(64, bait["ipc_key"], 0, 0)[1]
out["dev_shm"] = os.path.exists("/dev/shm/" + bait["shm_file"])
libc.mq_open.restype = ctypes.c_int
mq = libc.mq_open(bait["mqueue"].encode(), os.O_RDONLY)
out["mq_open"] = "opened" if mq >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
out["keyctl"] = call(250, 0, -4, 0)[1]  # KEYCTL_GET_KEYRING_ID of the user keyring
out["add_key"] = call(248, ctypes.c_char_p(b"user"), ctypes.c_char_p(b"x"), ctypes.c_char_p(b"y"), 1, -4)[1]
out["request_key"] = call(249, ctypes.c_char_p(b"user"), ctypes.c_char_p(b"x"), 0, 0)[1]
out["io_uring_setup"] = call(425, 1, ctypes.create_string_buffer(120))[1]
print(json.dumps(out))
"""


def answer(listener: socket.socket, reply: bytes) -> None:
    """A host service: each connection gets ``reply`` (until the listener closes)."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.sendall(reply)


def _ipc_key() -> int:
    return int.from_bytes(secrets.token_bytes(3), "big") | 0x40000000


@contextlib.contextmanager
def host_bait() -> Iterator[dict]:
    """Set out the host-side bait; yields the argument for ``SCRIPT`` (as a dict)."""
    libc = ctypes.CDLL(None, use_errno=True)
    marker = f"hutch-bait-{secrets.token_hex(6)}"
    key = _ipc_key()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + marker)
    listener.listen(8)

    threading.Thread(target=answer, args=(listener, b"host service"), daemon=True).start()
    ids = {"shm": libc.shmget(key, 4096, 0o1000 | 0o666), "msg": libc.msgget(key, 0o1000 | 0o666),
           "sem": libc.semget(key, 1, 0o1000 | 0o666)}
    assert min(ids.values()) >= 0, f"host IPC objects: {ids} errno {ctypes.get_errno()}"
    shm_file = Path("/dev/shm") / marker
    shm_file.write_text("host secret\n")
    shm_file.chmod(0o666)
    mqueue = "/" + marker
    libc.mq_open.restype = ctypes.c_int
    mq = libc.mq_open(mqueue.encode(), os.O_RDWR | os.O_CREAT, 0o666, None)
    assert mq >= 0, f"mq_open on the host: errno {ctypes.get_errno()}"
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker])
    for _ in range(200):  # until it has exec'd (before that, its command line is still ours)
        if marker.encode() in Path(f"/proc/{host.pid}/cmdline").read_bytes():
            break
        time.sleep(0.01)
    host_ns = [os.readlink(f"/proc/self/ns/{ns}") for ns in ("net", "pid", "ipc", "mnt")]
    try:
        # The bait is real: from the host every piece of it answers.
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect("\0" + marker)
        assert probe.recv(16) == b"host service"
        probe.close()
        assert libc.shmget(key, 0, 0) >= 0 and marker.encode() in Path(f"/proc/{host.pid}/cmdline").read_bytes()
        yield {"abstract": marker, "ipc_key": key, "shm_file": marker, "mqueue": mqueue, "marker": marker,
               "host_ns": host_ns, "devices": HOST_DEVICES, "wide": WIDE_FAMILIES}
    finally:
        host.kill()
        host.wait()
        listener.close()
        libc.shmctl(ids["shm"], 0, None)  # IPC_RMID
        libc.msgctl(ids["msg"], 0, None)
        libc.semctl(ids["sem"], 0, 0)
        libc.mq_unlink(mqueue.encode())
        libc.mq_close(mq)  # unlinked but open, the queue lived on: ~80 KB of root's 800 KB RLIMIT_MSGQUEUE each
        shm_file.unlink(missing_ok=True)


def assert_sealed(report: dict) -> None:
    """The security floor for every channel above (README, "Security floor")."""
    name = errno.errorcode
    for call in ("socket", "socketpair"):
        for family, verdict in report[call].items():
            fam = int(family)
            if fam == socket.AF_UNIX or (call == "socket" and fam in ALLOWED_FAMILIES):
                assert verdict == "allowed", (call, family, verdict)
            elif fam in ALLOWED_FAMILIES:  # the kernel's own answer: only unix sockets come in pairs
                assert verdict in (name[errno.EOPNOTSUPP], name[errno.ESOCKTNOSUPPORT]), (call, family, verdict)
            else:
                # The filter's answer. Without it the kernel says EPERM for AF_PACKET (no
                # CAP_NET_RAW), opens AF_VSOCK, and truncates the wide values to a family.
                assert verdict == name[errno.EAFNOSUPPORT], (call, family, verdict)
    assert report["raw"] == name[errno.EPERM]
    for path, verdict in report["devices"].items():
        assert verdict == name[errno.ENOENT], (path, verdict)
    assert report["mknod"] == name[errno.EPERM], report["mknod"]
    assert report["abstract"] == name[errno.ECONNREFUSED], report["abstract"]
    assert report["marker_processes"] == [] and report["host_namespaces_seen"] == [], report
    assert report["setns"] == name[errno.EPERM]
    for call in ("shmget", "msgget", "semget"):
        assert report[call] == name[errno.ENOENT], (call, report[call])
    assert report["dev_shm"] is False
    assert report["mq_open"] == name[errno.ENOENT], report["mq_open"]
    for call in ("keyctl", "add_key", "request_key"):
        assert report[call] == name[errno.EPERM], (call, report[call])
    assert report["io_uring_setup"] in (name[errno.ENOSYS], name[errno.EPERM]), report["io_uring_setup"]
