"""Drive the local driver from a process that is not root, and report what happened.

Run by tests/isolation/test_local_rootless.py as root:

    python tests/isolation/rootless_probe.py DATA_DIR RUNTIME_CACHE UID MARKER [INTERNET HOST_PORT]

INTERNET (``ip:port``) is a server "on the internet" and HOST_PORT a port the host
listens on at every address: with them, a networked sandbox is probed too. With
HUTCH_PROBE_BAIT set (the JSON of tests/isolation/channel_probe.host_bait), a sandbox
looks for every channel around its network namespace.

It imports everything it needs, then drops to ``UID`` for good (no groups, no
capabilities: setresuid from root to a non-zero uid clears them all) before the driver
exists, so every sandbox below is made by an unprivileged process, as a server started
by an ordinary user would make it. The interpreter itself may live where that user
cannot read (here: under /root), hence the imports first. Prints one JSON object.
"""

from __future__ import annotations

import asyncio
import concurrent.futures.thread  # noqa: F401  (to_thread's pool, imported lazily otherwise)
import contextlib
import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp
import attrs
from aiohttp import web

import hutch.eventlog.sqlite
import hutch.projections.memory  # noqa: F401
from hutch.api.app import create_app
from hutch.core.errors import HutchError, NotSupported
from hutch.drivers.base import ExecRequest, FileWrite, ProvisionRequest, ResourceLimits
from hutch.drivers.local import fsops, layers, native, network, rootfs, slirp, spares  # noqa: F401
from hutch.drivers.local.driver import LocalDriver
from hutch.service.config import Config
from tests.isolation import channel_probe, connect_probe, terminal_probe

PY = "python:3.13"


class Sink:
    def __init__(self) -> None:
        self.out = {"stdout": bytearray(), "stderr": bytearray()}

    def write(self, stream: str, data: bytes) -> None:
        self.out[stream] += data


def capeff() -> str:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return line.split()[1]
    return "?"


def running_pid(pid: int) -> bool:
    """Whether ``pid`` runs (not gone, nor a zombie left for whoever reaps the host's orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def host_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return -1


async def main(data_dir: Path, cache: Path, marker: str, internet: str | None, host_port: int | None) -> dict:
    report: dict = {}
    d = LocalDriver(data_dir, cache)
    report["server"] = {"euid": os.geteuid(), "capeff": capeff(), "rootless": d.rootless,
                        "capabilities": attrs.asdict(d.capabilities)}
    await d.start()
    n = 0

    async def run(sid: str, *argv: str, timeout: float | None = None) -> dict:
        nonlocal n
        n += 1
        sink = Sink()
        res = await d.exec(ExecRequest(f"exec_p{n}", sid, argv, timeout=timeout), sink)
        return {"code": res.exit_code, "timed_out": res.timed_out, "stdout": sink.out["stdout"].decode(errors="replace"),
                "stderr": sink.out["stderr"].decode(errors="replace")[-2000:]}

    sid, bomb = "sbx_rootless1", "sbx_rootless3"
    await d.provision(ProvisionRequest(sid, PY, resources=ResourceLimits(pids=64)))
    await d.provision(ProvisionRequest(bomb, PY, resources=ResourceLimits(memory_bytes=256 * 2**20, pids=64)))
    sb = d._registry.running(sid)
    report["init_host_uid"] = host_uid(sb.init_pid)
    report["identity"] = await run(sid, "sh", "-c", "id -u; id -un; cat /proc/self/uid_map; hostname; "
                                   "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status")
    report["terminal"] = {"exec": await run(sid, "python3", "-c", terminal_probe.PROBE),
                          "tty": await terminal_probe.on_terminal(d, sid, "python3", "-c", terminal_probe.PROBE)}
    report["boot_id"] = {"sandbox": await run(sid, "cat", "/proc/sys/kernel/random/boot_id"),
                         "umount": await run(sid, "python3", "-c", "import ctypes, errno; libc = ctypes.CDLL(None, "
                                             "use_errno=True); r = libc.umount2(b'/proc/sys/kernel/random/boot_id', 2); "
                                             "print('done' if r == 0 else errno.errorcode[ctypes.get_errno()])")}
    report["pid1"] = await run(sid, "sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline; echo; readlink /proc/1/exe || echo unreadable")
    report["interfaces"] = await run(sid, "python3", "-c", "print(sorted(l.split(':')[0].strip() for l in "
                                     "open('/proc/net/dev').readlines()[2:]))")
    report["host_file"] = await run(sid, "sh", "-c", f"ls /tmp/{marker} 2>&1; find / -name '{marker}*' 2>/dev/null | head -3")
    report["writes"] = await run(sid, "sh", "-c", "echo a > ~/a && echo b > /tmp/b && echo w > /workspace/w && "
                                 "cat ~/a /tmp/b /workspace/w; touch /usr/bin/x 2>/dev/null && echo WROTE-USR; "
                                 "touch /etc/x 2>/dev/null; true")
    report["nested_userns"] = await run(sid, "python3", "-c", "import os\ntry:\n os.unshare(os.CLONE_NEWUSER)\n"
                                        " print('unshared')\nexcept OSError as e:\n print(e.errno)")
    report["fork_bomb"] = await run(bomb, "python3", "-c", """
import os, time
n = 0
try:
    for _ in range(500):
        if os.fork() == 0:
            time.sleep(8)  # long enough to outlast the checks below on a loaded machine
            os._exit(0)
        n += 1
except OSError as e:
    print(n, e.errno)
else:
    print(n, 0)
""")
    # The same limit in another sandbox, while the bomb's children still hold theirs: the
    # count is per sandbox (per user namespace), not per host uid.
    report["other_sandbox_during_bomb"] = await run(sid, "sh", "-c", "for i in 1 2 3 4 5; do sleep 0 & done; wait; "
                                                    "echo forked")
    report["bomb_during_bomb"] = await run(bomb, "sh", "-c", "sleep 0 & wait; echo forked")
    for _ in range(200):  # until the bomb's children are gone and its sandbox can fork again
        if (await run(bomb, "sh", "-c", "sleep 0 & wait; echo forked"))["stdout"] == "forked\n":
            break
        await asyncio.sleep(0.1)
    report["after_fork_bomb"] = await run(bomb, "true")
    report["memory_hog"] = await run(bomb, "python3", "-c", "x = bytearray(512 * 2**20); print('allocated')")
    report["small_allocation"] = await run(bomb, "python3", "-c", "x = bytearray(64 * 2**20); print('allocated')")
    await d.destroy(bomb)
    await run(sid, "sh", "-c", "sleep 300 >/dev/null 2>&1 &")  # a background process that must outlive its exec
    report["timeout"] = await run(sid, "sh", "-c", "sleep 301 & sleep 302", timeout=0.5)
    await asyncio.sleep(0.2)
    report["sleepers"] = await run(sid, "sh", "-c", "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done "
                                   "| grep '^sleep' | sort")
    if os.environ.get("HUTCH_PROBE_BAIT"):  # the host's bait (tests/isolation/channel_probe.py)
        report["channels"] = await run(sid, "python3", "-c", channel_probe.SCRIPT, os.environ["HUTCH_PROBE_BAIT"])
    await d.write_files(sid, [FileWrite("dir/f.txt", b"written")])
    report["files"] = await run(sid, "cat", "dir/f.txt")
    # A filesystem-only pause (fspause.py): its processes (the sleep 300 above) end, its files
    # stay, and the resume is a new boot.
    boot = await run(sid, "cat", "/proc/sys/kernel/random/boot_id")
    old_init = sb.init_pid
    await d.pause(sid, memory=False)
    report["fs_pause"] = {"alive_asleep": sid in await d.alive(),
                          "old_init_left": running_pid(old_init)}
    await d.resume(sid)
    sb = d._registry.running(sid)
    report["fs_pause"].update(files=await run(sid, "cat", "dir/f.txt"), boot_before=boot,
                              boot_after=await run(sid, "cat", "/proc/sys/kernel/random/boot_id"),
                              sleepers=await run(sid, "sh", "-c", "pgrep -c sleep || true"),
                              new_init=sb.init_pid != old_init, init_host_uid=host_uid(sb.init_pid))
    if internet and host_port:
        net = "sbx_rootless4"
        await d.provision(ProvisionRequest(net, PY, network_enabled=True))
        targets = [internet, "169.254.169.254:80", f"10.0.2.2:{host_port}", f"127.0.0.1:{host_port}",
                   *(f"{a}:{host_port}" for a in slirp.host_addresses())]
        report["network"] = {"probe": await run(net, "python3", "-c", connect_probe.SCRIPT, *targets),
                             "resolv": await run(net, "cat", "/etc/resolv.conf"),
                             "interfaces": await run(net, "python3", "-c", "print(sorted(l.split(':')[0].strip() "
                                                     "for l in open('/proc/net/dev').readlines()[2:]))"),
                             "dns": await run(net, "python3", "-c", "import socket; print(socket.gethostbyname('localhost'))"),
                             "host_addresses": slirp.host_addresses()}
        # Paused filesystem-only and resumed: its slirp4netns is a new one, its rules as they were.
        slirp_before = d._registry.running(net).slirp_pid
        await d.pause(net, memory=False)
        slirp_gone = slirp_before is not None and not Path(f"/proc/{slirp_before}/stat").is_file()  # noqa: ASYNC240
        await d.resume(net)
        report["network"]["after_fs_pause"] = {"probe": await run(net, "python3", "-c", connect_probe.SCRIPT, *targets),
                                               "old_slirp_gone": slirp_gone}
        slirp_pid = d._registry.running(net).slirp_pid
        await d.destroy(net)
        report["network"]["slirp_left"] = slirp_pid is not None and Path(f"/proc/{slirp_pid}/stat").is_file()  # noqa: ASYNC240
        report["port"] = await port_only(d, run, internet)
        report["allow"] = await allow_list(d, run, internet)
    errors: dict[str, dict[str, object] | None] = {}
    for name, call in [
        ("cpu", lambda: d.provision(ProvisionRequest("sbx_rootless2", PY, resources=ResourceLimits(cpu_millis=500)))),
        ("disk", lambda: d.provision(ProvisionRequest("sbx_rootless2", PY, resources=ResourceLimits(disk_bytes=2**30)))),
        ("pause", lambda: d.pause(sid)),
        ("checkpoint", lambda: d.checkpoint(sid, "ckpt_x")),
    ]:
        try:
            await call()
            errors[name] = None
        except HutchError as err:
            errors[name] = {"type": type(err).__name__, "field": err.field, "message": err.message,
                            "not_supported": isinstance(err, NotSupported)}
    report["refused"] = errors
    ns = os.readlink(f"/proc/{sb.init_pid}/ns/pid")
    await d.destroy(sid)
    left: list[str] = []
    for _ in range(50):
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/ns/pid") == ns:
                    left.append(pid)
        if not left:
            break
        await asyncio.sleep(0.05)
    report["destroy"] = {"left": left, "dir_exists": (data_dir / "sandboxes" / sid).exists(),
                         "alive": sorted(await d.alive())}
    # A restarted server adopts the rootless sandboxes that outlived it, like any other.
    await d.provision(ProvisionRequest("sbx_rootless6", PY))
    await run("sbx_rootless6", "sh", "-c", "echo kept > ~/k; sleep 300 >/dev/null 2>&1 &")
    report["zygote"] = {"runs": d._nsexec.zygote_runs, "execs": n}
    await d.close()
    d = LocalDriver(data_dir, cache)
    await d.start()
    report["restart"] = {"alive": sorted(await d.alive()), "exec": await run("sbx_rootless6", "sh", "-c",
                                                                           "cat ~/k; pgrep -c sleep || true")}
    report["zygote"]["after_restart"] = d._nsexec.zygote_runs  # the adopted sandbox's pid 1 still forks
    await d.destroy("sbx_rootless6")
    await d.close()
    report["api"] = await through_the_api(data_dir.parent / "server", cache)
    return report


async def port_only(d: LocalDriver, run, internet: str) -> dict:  # type: ignore[no-untyped-def]
    """network.port without network.enabled: reachable through port_target (what the
    API's proxy uses), and nothing leaves the sandbox."""
    sid = "sbx_rootless5"
    await d.provision(ProvisionRequest(sid, PY, port=8080))

    async def serve_and_ask() -> tuple[str, int, str]:
        await run(sid, "sh", "-c", "python3 -m http.server 8080 --bind 0.0.0.0 >/dev/null 2>&1 &")
        host, port = await d.port_target(sid)
        answer = ""
        for _ in range(100):
            try:
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(b"GET / HTTP/1.0\r\n\r\n")
                answer = (await reader.read(12)).decode(errors="replace")
                writer.close()
                if answer:
                    break
            except OSError as err:
                answer = type(err).__name__
            await asyncio.sleep(0.05)
        return host, port, answer

    host, port, answer = await serve_and_ask()
    out = {"target": [host, port], "answer": answer,
           "outbound": await run(sid, "python3", "-c", connect_probe.SCRIPT, internet)}
    # Paused filesystem-only, resumed: the server is gone with the old boot; started again, it
    # is reached through the new slirp4netns's forward, and still nothing leaves.
    await d.pause(sid, memory=False)
    await d.resume(sid)
    host, port, answer = await serve_and_ask()
    out["after_fs_pause"] = {"target": [host, port], "answer": answer,
                             "outbound": await run(sid, "python3", "-c", connect_probe.SCRIPT, internet)}
    await d.destroy(sid)
    return out


async def allow_list(d: LocalDriver, run, internet: str) -> dict:  # type: ignore[no-untyped-def]
    """network.allow in the sandbox's own rules: one address of the fake internet allowed,
    its second refused; then swapped as a refresh of its names would (nsenter, unprivileged)."""
    sid, (ip, port) = "sbx_rootless7", internet.rsplit(":", 1)
    second = f"203.0.113.3:{port}"
    await d.provision(ProvisionRequest(sid, PY, network_enabled=True, network_allow=(f"{ip}/32",)))
    out = {"before": await run(sid, "python3", "-c", connect_probe.SCRIPT, internet, second)}
    await d._network.apply_allow(sid, {f"{ip}/32": ["203.0.113.3/32"]})  # as if its name had moved
    out["after"] = await run(sid, "python3", "-c", connect_probe.SCRIPT, internet, second)
    await d.destroy(sid)
    return out


async def through_the_api(data_dir: Path, cache: Path) -> dict:
    """The whole server, unprivileged: a one-shot run through the HTTP API."""
    key = "rootless-test-key"
    config = Config(data_dir=data_dir, api_key=key, driver="local", host="127.0.0.1", port=0, runtime_cache=cache)
    runner = web.AppRunner(create_app(config))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    url, auth = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {key}"}
    try:
        async with aiohttp.ClientSession() as s:
            body = {"runtime": PY, "command": {"exec": ["python3", "-c", "import os; print(os.getuid())"],
                                               "mode": "oneshot"}}
            async with s.post(f"{url}/sandbox", json=body, headers=auth) as r:
                created = await r.json()
            data = created["data"]
            async with s.get(data["stdoutStreamUrl"]) as r:
                stdout = (await r.read()).decode()
            async with s.get(f"{url}/sandbox/execution/{data['executionId']}?wait=30s", headers=auth) as r:
                execution = (await r.json())["data"]
            # A runtime not built here: a server without root cannot build it, and says how.
            unbuilt_name = next(r.name for r in rootfs.runtimes.CATALOG if not rootfs.is_built(cache, r))
            async with s.post(f"{url}/sandbox", json={"runtime": unbuilt_name}, headers=auth) as r:
                unbuilt_id = (await r.json())["data"]["sandboxId"]
            async with s.get(f"{url}/sandbox/{unbuilt_id}?waitForStatus=failed&waitMs=10000", headers=auth) as r:
                unbuilt = (await r.json())["data"]
            async with s.post(f"{url}/sandbox", json={"runtime": PY, "network": {"enabled": True}}, headers=auth) as r:
                network = {"status": r.status, "body": await r.json()}
            if network["status"] == 201:
                async with s.delete(f"{url}/sandbox/{network['body']['data']['sandboxId']}", headers=auth) as r:
                    network["deleted"] = r.status
        return {"stdout": stdout, "status": execution["status"], "exitCode": execution.get("exitCode"),
                "network": network, "unbuilt": {**unbuilt, "runtime_name": unbuilt_name}}
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    data, cache, uid, marker = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    internet, host_port = (sys.argv[5], int(sys.argv[6])) if len(sys.argv) > 6 else (None, None)
    os.chown(data, uid, uid)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    os.environ["HOME"] = str(data)
    try:
        result = asyncio.run(main(data / "data", cache, marker, internet, host_port))
    except Exception:
        result = {"error": traceback.format_exc()}
    print(json.dumps(result))
