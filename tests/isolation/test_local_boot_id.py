"""A sandbox's boot id is its own: /proc/sys/kernel/random/boot_id never tells it the host's.

Before, every sandbox on a host read the host's boot id there: the same value in all of them,
naming the host's boot (a tenant could tell two sandboxes share a machine, and when it last
rebooted). Now each boot of a sandbox (its create, each filesystem-only resume) has a random
one bound read-only over the file (hutch-nsexec's mask_boot_id); these tests try to get the
host's back from inside, every way a process there could, and hold the mask to naming
nothing of the host's.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hutch.drivers.base import ExecRequest, ExecResult
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


def host_boot_id() -> str:
    return Path(BOOT_ID).read_text().strip()


async def python(driver: LocalDriver, sid: str, code: str) -> tuple[ExecResult, Recorder]:
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, ("python3", "-c", textwrap.dedent(code))), sink)
    return result, sink


async def read_boot_id(driver: LocalDriver, sid: str) -> str:
    result, out = await python(driver, sid, f"print(open({BOOT_ID!r}).read().strip())")
    assert result.exit_code == 0, out.text("stderr")
    return out.text().strip()


async def test_a_sandbox_reads_a_boot_id_of_its_own_not_the_hosts(driver: LocalDriver) -> None:
    first, second = await provision(driver, PY), await provision(driver, PY)
    try:
        ids = [await read_boot_id(driver, sid) for sid in (first, second)]
    finally:
        for sid in (first, second):
            await driver.destroy(sid)
    host = host_boot_id()
    assert host not in ids
    assert ids[0] != ids[1]  # not one id for every sandbox either
    for found in ids:
        assert len(found) == 36 and found.count("-") == 4, found  # a uuid, as the kernel's is


# Every way the sandbox user could try to take the mask off, or read around it; each line
# printed is "name<TAB>what it read or the error". Any read that returns the host's id fails.
ESCAPE = r"""
import ctypes, os, errno
libc = ctypes.CDLL(None, use_errno=True)
P = b"/proc/sys/kernel/random/boot_id"
def err(): return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
def read(path):
    try:
        with open(path) as f: return f.read().strip()
    except OSError as e: return "error " + (errno.errorcode.get(e.errno) or str(e.errno))
print("umount\t" + ("done" if libc.umount2(P, 2) == 0 else err()))  # MNT_DETACH
print("remount-rw\t" + ("done" if libc.mount(None, P, None, 0x1000 | 0x20, None) == 0 else err()))  # BIND|REMOUNT
try:
    with open(P, "w") as f: f.write("00000000-0000-0000-0000-000000000000\n")
    print("write\tdone")
except OSError as e: print("write\t" + errno.errorcode.get(e.errno, str(e.errno)))
print("chmod\t" + ("done" if libc.chmod(P, 0o666) == 0 else err()))
print("new-proc\t" + ("done" if libc.mount(b"proc", b"/tmp", b"proc", 0, None) == 0 else err()))
for path in ("/proc/sys/kernel/random/boot_id", "/proc/self/root/proc/sys/kernel/random/boot_id",
             "/proc/1/root/proc/sys/kernel/random/boot_id", "/proc/../proc/sys/kernel/random/boot_id"):
    print("read " + path + "\t" + read(path))
dfd = os.open("/proc/sys/kernel/random", os.O_RDONLY | os.O_DIRECTORY)
try:
    fd = os.open("boot_id", os.O_RDONLY, dir_fd=dfd)
    print("openat\t" + os.read(fd, 100).decode().strip())
except OSError as e: print("openat\terror " + str(e.errno))
# A user namespace of its own (where it would hold CAP_SYS_ADMIN), then the same tries.
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0:
    print("userns umount\t" + ("done" if libc.umount2(P, 2) == 0 else err()))
    print("userns read\t" + read(P))
else:
    print("userns\t" + err())
"""


async def test_the_sandbox_cannot_unmask_its_boot_id(driver: LocalDriver, sandbox: str) -> None:
    result, out = await python(driver, sandbox, ESCAPE)
    assert result.exit_code == 0, out.text("stderr")
    lines = dict(line.split("\t", 1) for line in out.text().splitlines())
    host = host_boot_id()
    assert host not in out.text(), out.text()
    for attempt in ("umount", "remount-rw", "write", "chmod", "new-proc"):
        assert lines[attempt] != "done", out.text()
    own = lines["read /proc/sys/kernel/random/boot_id"]
    assert len(own) == 36, out.text()
    for name, value in lines.items():
        if name.startswith("read ") or name == "openat":  # /proc/1/root: refused (pid 1 is not dumpable)
            assert value == own or value.startswith("error "), out.text()
    assert await read_boot_id(driver, sandbox) == own  # nothing changed it


async def test_the_mask_names_no_host_path_or_file_system(driver: LocalDriver, sandbox: str) -> None:
    """A bind mount's source shows in /proc/self/mountinfo: the file bound is the sandbox's own
    (made in its /dev tmpfs and unlinked), root's, read-only, so nothing of the host's shows."""
    result, out = await python(driver, sandbox, f"""
        for line in open("/proc/self/mountinfo"):
            f = line.split()
            if f[4] == {BOOT_ID!r}:
                print(f[3], f[5], f[f.index("-") + 1])
        import os
        st = os.stat({BOOT_ID!r})
        print(st.st_uid, oct(st.st_mode & 0o777))
    """)
    assert result.exit_code == 0, out.text("stderr")
    (root, options, fstype), owner = (line.split() for line in out.text().splitlines())
    assert fstype == "tmpfs" and "ro" in options.split(","), out.text()
    assert root == "/.boot_id//deleted", out.text()  # its /dev's, gone from there
    assert owner == ["0", "0o444"], out.text()
    assert str(driver.data_dir) not in out.text()


async def test_a_memory_pause_keeps_the_boot_id(driver: LocalDriver, sandbox: str) -> None:
    before = await read_boot_id(driver, sandbox)
    await driver.pause(sandbox)
    await driver.resume(sandbox)
    assert await read_boot_id(driver, sandbox) == before
