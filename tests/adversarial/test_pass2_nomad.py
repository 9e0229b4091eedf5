"""The second adversarial pass of issue 32 on the nomad driver, from inside its sandboxes:
code running in a nomad sandbox (no network, network on, an allow-list, a port only) tries
to get out of its container, at the orchestrator (Nomad, containerd, the registry, Kafka,
PostgreSQL, hutch), at other sandboxes on its node and on other cluster clients, and at
the hutch server itself through what the server reads from the sandbox (the exec agent's
frames, file listings, checkpoints). Each test asserts the safe behaviour and says what it
would show if the protection went.

One driver and a few sandboxes per module (made once, shared); the cluster's tests add a
driver on ``./scripts/services start cluster``. The API's side (tokens, tenancy, Nomad's
ACLs, the Terraform templates) is tests/adversarial/test_pass2_nomad_api.py."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from hutch.drivers.base import ExecRequest, ProvisionRequest
from hutch.drivers.nomad.driver import NomadDriver
from tests.drivers_support import Recorder, new_id, start_nomad

pytestmark = pytest.mark.asyncio(loop_scope="module")

PY = "python:3.13"
MiB = 2**20


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def driver(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[NomadDriver]:
    d = await start_nomad(tmp_path_factory.mktemp("nomad-pass2") / "data")
    assert isinstance(d, NomadDriver)
    try:
        yield d
    finally:
        for sid in list(d._sandboxes):
            await d.destroy(sid)
        await d.close()


async def make(driver: NomadDriver, **kw: Any) -> str:
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=PY, **kw))
    return sid


async def run(driver: NomadDriver, sid: str, argv: list[str], *, timeout: float = 60,
              env: dict[str, str] | None = None) -> tuple[int, str, str]:
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, argv, env=env or {}, timeout=timeout), sink)
    return result.exit_code, sink.stdout, sink.stderr


async def python(driver: NomadDriver, sid: str, script: str, *args: str, timeout: float = 60) -> Any:
    """Run ``script`` in the sandbox; what it printed last, as JSON."""
    code, out, err = await run(driver, sid, ["python3", "-c", script, *args], timeout=timeout)
    assert code == 0, f"exit {code}: {err}\n{out}"
    return json.loads(out.strip().splitlines()[-1])


def rss_mib() -> float:
    """This process's resident memory: the driver (the hutch server's part that reads what a
    sandbox sends) runs in it."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


# ------------------------------------------------------------------------ the exec agent's pipes

# A daemon of the sandbox (its own session, its environment without the command's tag, so no
# cancel reaches it) that kills the sandbox's exec agent (same uid), watches for the restart's
# start script (`sh -c 'f=$(mktemp …); head -c … >"$f"; …; exec "$f"'`: an ordinary, dumpable
# shell holding the agent's stdin, stdout and stderr pipes) and opens them through /proc. What
# it then writes on the agent's stdout reaches the hutch server as the agent's frames, and on its
# stderr as the agent's complaints. argv: what to do with them ("frame" MiB, "stderr" lines).
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
json.dump({"hijacked": bool(got), "tries": tries, "done": True}, open(report, "w"))
time.sleep(300)
'''


async def launch_daemon(driver: NomadDriver, sid: str, script: str, *args: str) -> None:
    """Start ``script`` as a daemon of the sandbox, out of its command's process group and tag."""
    code, out, err = await run(driver, sid, ["sh", "-c", 'cat >/tmp/daemon.py <<"EOF"\n' + script + "\nEOF\n"
                                             'setsid env -i PATH="$PATH" python3 /tmp/daemon.py "$@" '
                                             '>/dev/null 2>&1 </dev/null &', "sh", *args])
    assert code == 0, (out, err)


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
