"""The attacker's view through a terminal: the same probe run as an execution and on a
terminal must see the same sandbox (shared by the local and nomad isolation tests).

The probe prints one JSON line; what may differ is only what a terminal is: stdin is a
tty of the sandbox's own devpts (never a host pty), and the cgroup leaf has another name.
"""

from __future__ import annotations

import asyncio
import json
import re
import textwrap

from hutch.drivers.base import Driver, TerminalRequest

PROBE = textwrap.dedent("""
    import ctypes, errno, json, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    def call(nr, *args):
        rc = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
        return "allowed" if rc >= 0 else errno.errorcode[ctypes.get_errno()]
    status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
    report = {
        "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
        "status": {k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb",
                                                   "NoNewPrivs", "Seccomp")},
        "syscalls": {"mount": call(165, 0, 0, 0, 0, 0), "unshare(NEWUSER)": call(272, 0x10000000),
                     "bpf": call(321, 0, 0, 0), "setns": call(308, 0, 0), "ptrace(pid1)": call(101, 16, 1, 0, 0)},
        "interfaces": sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]),
        "pid1": open("/proc/1/cmdline", "rb").read().split(b"\\0")[0].decode(),
        "hostname": os.uname().nodename,
        "cgroup": [l.rsplit("/", 1)[0] for l in open("/proc/self/cgroup").read().splitlines()],
        "root": sorted(os.listdir("/")),
        "tty": os.ttyname(0) if os.isatty(0) else None,
        "pts": sorted(os.listdir("/dev/pts")),
        "rlimits": [__import__("resource").getrlimit(r) for r in (6, 7, 9)],
    }
    print("PROBE" + json.dumps(report))
""")


def parse(output: str) -> dict:
    m = re.search(r"PROBE(\{.*\})", output.replace("\r\n", "\n"))
    assert m is not None, output[-2000:]
    return json.loads(m[1])


def assert_same_sandbox(executed: dict, on_terminal: dict) -> None:
    """Everything equal but the tty, and the tty one of the sandbox's own devpts."""
    assert executed["uid"] != 0 and executed["status"]["NoNewPrivs"] == "1", executed
    assert executed["status"]["Seccomp"] == "2" and set(executed["syscalls"].values()) == {"EPERM"}, executed
    tty = on_terminal.pop("tty")
    pts = on_terminal.pop("pts")
    assert executed.pop("tty") is None
    executed.pop("pts")
    assert on_terminal == executed
    assert tty is not None and re.fullmatch(r"/dev/pts/\d+", tty), tty
    # The sandbox's devpts instance holds its own terminals only: a handful, never the host's.
    assert tty.rsplit("/", 1)[1] in pts and len(pts) < 8, pts


async def on_terminal(driver: Driver, sid: str, *argv: str) -> tuple[int, str]:
    """Run ``argv`` on a terminal of the sandbox: (exit code, the screen)."""
    term = await driver.open_terminal(TerminalRequest(sid, argv))
    screen = b""
    try:
        while chunk := await asyncio.wait_for(term.read(), 60):
            screen += chunk
        code = await term.wait()
    finally:
        await term.close()
    return code, screen.decode(errors="replace")
