"""The local driver run by a process that is not root (rootless mode).

The driver runs in tests/isolation/rootless_probe.py, which drops to an unprivileged
uid (no groups, no capabilities) before it makes anything; the probe reports what it
saw and these tests hold it to the security floor: a user namespace mapping the
sandbox user to that uid and nothing else, no network, the runtime read-only, host
files invisible, rlimits standing in for cgroups, timeouts that kill a whole
execution, and clear refusals for what needs root.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.drivers_support import built_runtimes  # noqa: F401  (fixture)
from tests.isolation import channel_probe, terminal_probe
from tests.isolation.test_local_network import fake_internet_running

pytestmark = pytest.mark.isolation

PROBE = Path(__file__).with_name("rootless_probe.py")
UID = 64123  # an unprivileged uid with no account: nothing on the host belongs to it


@pytest.fixture(scope="module")
def report(built_runtimes: Path) -> Iterator[dict]:  # noqa: F811
    assert os.geteuid() == 0, "the probe starts as root and drops to an unprivileged uid"
    work = Path(tempfile.mkdtemp(prefix="hutch-rootless-", dir="/tmp"))
    marker = f"hutch-rootless-marker-{secrets.token_hex(4)}"
    host_file = Path("/tmp") / marker
    host_file.write_text("host secret\n")
    host_file.chmod(0o644)  # readable by the probe's uid: only the sandbox must not see it
    # A host service on every address: no sandbox may reach it (from the host it answers).
    listener = socket.create_server(("0.0.0.0", 0))
    host_port = listener.getsockname()[1]
    threading.Thread(target=channel_probe.answer, args=(listener, b"HTTP/1.0 200 host service\r\n\r\n"),
                     daemon=True).start()
    try:
        with fake_internet_running() as (inet_host, inet_port), channel_probe.host_bait() as bait:
            proc = subprocess.run([sys.executable, str(PROBE), str(work), str(built_runtimes), str(UID), marker,
                                   f"{inet_host}:{inet_port}", str(host_port)],
                                  env={**os.environ, "HUTCH_PROBE_BAIT": json.dumps(bait)},
                                  capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr[-4000:]
        data = json.loads(proc.stdout.strip().splitlines()[-1])
        assert "error" not in data, data.get("error")
        yield data
    finally:
        listener.close()
        host_file.unlink(missing_ok=True)
        subprocess.run(["pkill", "-KILL", "-u", str(UID)], check=False)
        shutil.rmtree(work, ignore_errors=True)




def test_the_server_really_is_unprivileged(report: dict) -> None:
    server = report["server"]
    assert server["euid"] == UID and server["capeff"] == "0000000000000000" and server["rootless"]
    assert report["init_host_uid"] == UID  # the sandbox's pid 1, seen from the host


def test_the_sandbox_user_maps_to_the_server_uid_only(report: dict) -> None:
    out = report["identity"]
    assert out["code"] == 0, out
    lines = out["stdout"].splitlines()
    assert lines[:2] == ["1000", "agentuity"]
    assert lines[2].split() == ["1000", str(UID), "1"]  # one uid mapped: nothing else exists inside
    assert lines[3] == "sandbox"
    assert lines[4:] == ["CapEff:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"]


def test_a_terminal_is_as_confined_as_an_execution(report: dict) -> None:
    executed, (code, screen) = report["terminal"]["exec"], report["terminal"]["tty"]
    assert executed["code"] == 0 and code == 0, (executed, screen)
    terminal_probe.assert_same_sandbox(terminal_probe.parse(executed["stdout"]), terminal_probe.parse(screen))


def test_pid_1_is_out_of_reach_and_tells_no_host_path(report: dict) -> None:
    cmdline, exe = report["pid1"]["stdout"].splitlines()[:2]
    assert cmdline.split()[0] == "hutch-init" and "/" not in cmdline, cmdline
    assert exe == "unreadable"  # non-dumpable: the sandbox user cannot look into or ptrace it


def test_the_sandbox_reads_a_boot_id_of_its_own(report: dict) -> None:
    """As with root (test_local_boot_id.py): not the host's, and not its to unmount."""
    seen = report["boot_id"]["sandbox"]["stdout"].strip()
    assert len(seen) == 36 and seen != Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert report["boot_id"]["umount"]["stdout"].strip() == "EPERM"


def test_a_filesystem_only_pause_needs_no_root(report: dict) -> None:
    """No freezer needed: its processes end (the background sleep), its files stay, it stays
    one of the server's sandboxes while asleep, and its resume is a new boot, still the
    server's uid on the host."""
    fs = report["fs_pause"]
    assert fs["alive_asleep"] and not fs["old_init_left"] and fs["new_init"], fs
    assert fs["files"]["stdout"] == "written" and fs["sleepers"]["stdout"].strip() == "0", fs
    assert fs["boot_after"]["stdout"] != fs["boot_before"]["stdout"] and len(fs["boot_after"]["stdout"].strip()) == 36
    assert fs["init_host_uid"] == UID


def test_no_network_but_loopback(report: dict) -> None:
    assert report["interfaces"]["stdout"] == "['lo']\n"


def test_network_reaches_the_internet_but_not_the_host(report: dict) -> None:
    """network.enabled, rootless: slirp4netns, and egress rules inside the sandbox."""
    net = report["network"]
    assert net["interfaces"]["stdout"] == "['lo', 'tap0']\n"
    assert net["resolv"]["stdout"] == "nameserver 10.0.2.3\n"
    seen = json.loads(net["probe"]["stdout"])
    internet = next(iter(seen))
    assert seen.pop(internet).startswith("open HTTP/1.0 200"), net  # the internet answers
    assert len(seen) >= 4, seen  # metadata, slirp's gateway, loopback, and the host's addresses
    for target, outcome in seen.items():
        assert not outcome.startswith("open"), (target, outcome)  # the host service never answers
    assert net["slirp_left"] is False  # destroy ends slirp4netns too
    # Paused filesystem-only and resumed: a new slirp4netns, and the same reach, no more.
    after = net["after_fs_pause"]
    assert after["old_slirp_gone"], after
    assert json.loads(after["probe"]["stdout"]) == {internet: json.loads(net["probe"]["stdout"])[internet],
                                                    **seen}, after


def test_no_channel_around_the_network_namespace(report: dict) -> None:
    """The attacker's view of vsock and the other socket families, host devices, abstract
    unix sockets, host namespaces, IPC, the keyring and io_uring (as for root mode)."""
    assert report["channels"]["code"] == 0, report["channels"]["stderr"]
    channel_probe.assert_sealed(json.loads(report["channels"]["stdout"]))


def test_host_files_are_invisible(report: dict) -> None:
    lines = report["host_file"]["stdout"].splitlines()
    assert len(lines) == 1 and "No such file" in lines[0], lines  # ls fails; find finds nothing


def test_writable_where_it_should_be_and_nowhere_else(report: dict) -> None:
    out = report["writes"]
    assert out["code"] == 0 and out["stdout"] == "a\nb\nw\n", out


def test_no_nested_user_namespace(report: dict) -> None:
    assert report["nested_userns"]["stdout"] == "1\n"  # EPERM from the seccomp filter


def test_pids_rlimit_contains_a_fork_bomb_per_sandbox(report: dict) -> None:
    forks, errno = map(int, report["fork_bomb"]["stdout"].split())
    assert errno == 11 and forks < 64  # EAGAIN at the sandbox's limit of 64 processes
    assert report["bomb_during_bomb"]["stdout"] != "forked\n"  # its own sandbox is full...
    assert report["other_sandbox_during_bomb"]["stdout"] == "forked\n"  # ...another is not
    assert report["after_fork_bomb"]["code"] == 0


def test_memory_rlimit_refuses_a_hog_and_the_sandbox_survives(report: dict) -> None:
    hog = report["memory_hog"]
    assert hog["code"] == 1 and "MemoryError" in hog["stderr"], hog
    assert report["small_allocation"]["stdout"] == "allocated\n"


def test_timeout_kills_the_execution_but_not_earlier_background_processes(report: dict) -> None:
    assert report["timeout"]["timed_out"] and report["timeout"]["code"] == 124
    # sleep 301/302 belonged to the timed-out execution; sleep 300 to an earlier one.
    assert report["sleepers"]["stdout"].split("\n") == ["sleep 300 ", ""]


def test_files_are_written_as_the_sandbox_user(report: dict) -> None:
    assert report["files"]["stdout"] == "written"


def test_a_port_is_reachable_from_the_host_and_nothing_leaves(report: dict) -> None:
    port = report["port"]
    assert port["target"][0] == "127.0.0.1" and port["answer"].startswith("HTTP/1.0 200"), port
    seen = json.loads(port["outbound"]["stdout"])
    assert not next(iter(seen.values())).startswith("open"), seen  # a port alone gives no outbound network
    after = port["after_fs_pause"]  # paused filesystem-only and resumed: its port forwarded again
    assert after["target"][0] == "127.0.0.1" and after["answer"].startswith("HTTP/1.0 200"), after
    assert not next(iter(json.loads(after["outbound"]["stdout"]).values())).startswith("open"), after


def test_an_allow_list_limits_the_network_and_is_updated_in_place(report: dict) -> None:
    allow = report["allow"]
    before, after = json.loads(allow["before"]["stdout"]), json.loads(allow["after"]["stdout"])
    first, second = list(before)
    assert before[first].startswith("open HTTP") and before[second] == "ConnectionRefusedError", allow
    assert after[first] == "ConnectionRefusedError" and after[second].startswith("open HTTP"), allow


def test_what_needs_root_is_refused_by_name(report: dict) -> None:
    refused = report["refused"]
    assert refused["cpu"]["not_supported"] and refused["cpu"]["field"] == "resources.cpu"
    assert refused["disk"]["not_supported"] and refused["disk"]["field"] == "resources.disk"
    assert "HUTCH_DEFAULT_DISK" in refused["disk"]["message"]
    assert "rootless" in refused["pause"]["message"] and refused["pause"]["not_supported"]
    assert "rootless" in refused["checkpoint"]["message"] and refused["checkpoint"]["not_supported"]


def test_a_restarted_server_adopts_live_sandboxes(report: dict) -> None:
    assert report["restart"]["alive"] == ["sbx_rootless6"]
    assert report["restart"]["exec"]["stdout"].split() == ["kept", "1"], report["restart"]


def test_destroy_leaves_nothing(report: dict) -> None:
    assert report["destroy"] == {"left": [], "dir_exists": False, "alive": []}


def test_the_whole_server_runs_rootless(report: dict) -> None:
    """The API server itself in the unprivileged process: a one-shot run end to end, and a
    sandbox with network."""
    api = report["api"]
    assert (api["stdout"], api["status"], api["exitCode"]) == ("1000\n", "completed", 0), api
    assert api["network"]["status"] == 201, api["network"]  # slirp4netns: no root needed


def test_a_runtime_not_built_here_fails_saying_how_to_build_it(report: dict) -> None:
    unbuilt = report["api"]["unbuilt"]
    assert unbuilt["status"] == "failed", unbuilt
    assert "cannot build runtimes" in unbuilt["reason"], unbuilt
    assert f"sudo hutch runtime build {unbuilt['runtime_name']}" in unbuilt["reason"], unbuilt


def test_commands_come_through_the_zygote(report: dict) -> None:
    """Rootless too, pid 1 forks the commands (the re-exec'd pid 1 keeps its socket), and a
    sandbox adopted by a restarted server still does."""
    zygote = report["zygote"]
    assert zygote["runs"] == zygote["execs"] > 10, zygote
    assert zygote["after_restart"] == 1, zygote

