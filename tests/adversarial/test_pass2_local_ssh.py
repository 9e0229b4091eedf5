"""Second adversarial pass, the SSH gateway (api/ssh_gateway.py, api/sftp.py) of a real
``hutch serve`` on the local driver, attacked with asyncssh's client (which can send every
request OpenSSH can, malformed ones included) and OpenSSH's own ``ssh``.

The gateway runs on the host, as the server: a forwarding request it honoured would open the
host's own services (Nomad's API, PostgreSQL, Kafka, the API itself) to a tenant, and an
SFTP request it served carelessly would spend the server's memory or disk."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import pytest

from tests.adversarial.pass2 import World, start_world

pytestmark = pytest.mark.isolation


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    yield from start_world(tmp_path_factory.mktemp("pass2-ssh"), "embedded")


@pytest.fixture(scope="module")
def keys(world: World) -> dict[str, Path]:
    """SSH keys: beta's member's, a key of alpha's web-limited member, and one never registered."""
    made = {name: world.keygen(f"id_{name}") for name in ("beta", "web", "stranger")}
    for name, owner in (("beta", "beta_member"), ("web", "web_member")):
        world.data(owner, "POST", "/ssh-keys", {"publicKey": made[name].with_suffix(".pub").read_text()})
    return made


def connect(world: World, user: str, key: Path | None = None, **kw: object) -> asyncssh.SSHClientConnection:
    return asyncssh.connect("127.0.0.1", world.ssh_port, username=user, known_hosts=None,  # type: ignore[return-value]
                            client_keys=[str(key)] if key else [], agent_path=None, **kw)


def openssh(world: World, key: Path, user: str, command: str, *args: str, timeout: float = 60,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-p", str(world.ssh_port), *args,
         f"{user}@127.0.0.1", command], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})})


# The host's own services, as the gateway (on the host) would reach them.
HOST_TARGETS = [("127.0.0.1", 4646), ("127.0.0.1", 15432), ("127.0.0.1", 19092), ("10.77.0.1", 4656),
                ("127.0.0.1", 5000), ("::1", 4646), ("localhost", 22)]


async def test_no_forwarding_of_any_kind_is_honoured(world: World, keys: dict[str, Path]) -> None:
    """``-L``, ``-D`` and ``-W`` (direct-tcpip: the gateway would connect from the host to the
    host's Nomad API, PostgreSQL, Kafka, its own API), ``-R`` (tcpip-forward: a listener on
    the host), unix-socket forwarding both ways (the host's docker.sock, containerd's), agent
    forwarding (``-A``), X11 (``-X``), TUN/TAP (``-w``) and subsystems other than sftp: each
    refused. Before any of these were refused, the channel would open (a connection to the
    host's service) or the listener would bind on the host."""
    sid = world.sandbox("ssh", runtime="base:latest")
    world.data("beta_member", "GET", f"/sandbox/{sid}")
    async with connect(world, sid, keys["beta"]) as conn:
        for host, port in [*HOST_TARGETS, (world.url.split("//")[1].split(":")[0], int(world.url.rsplit(":", 1)[1]))]:
            with pytest.raises(asyncssh.ChannelOpenError):
                await conn.create_connection(asyncssh.SSHTCPSession, host, port)
        for path in ("/var/run/docker.sock", "/run/containerd/containerd.sock", "/run/nomad.sock"):
            with pytest.raises(asyncssh.ChannelOpenError):
                await conn.create_unix_connection(asyncssh.SSHUNIXSession, path)
        with pytest.raises(asyncssh.ChannelListenError):
            await conn.forward_remote_port("127.0.0.1", 0, "127.0.0.1", 9)
        with pytest.raises(asyncssh.ChannelListenError):
            await conn.forward_remote_path(str(world.home / "fwd.sock"), "/tmp/x")
        assert not (world.home / "fwd.sock").exists()
        for tun in (conn.forward_tun, conn.forward_tap):
            with pytest.raises((asyncssh.ChannelOpenError, OSError)):
                await tun()  # type: ignore[operator]
        # A subsystem that is not sftp runs nothing (no command by that name, nothing of the host's).
        for subsystem in ("netconf", "sftp-server", "/usr/lib/openssh/sftp-server"):
            with contextlib.suppress(asyncssh.ChannelOpenError):
                ran = await conn.run(subsystem=subsystem, check=False)
                assert (ran.exit_status, ran.stdout) == (255, ""), (subsystem, ran)
    # Agent forwarding, as OpenSSH's -A asks for it: no SSH_AUTH_SOCK in the sandbox.
    done = openssh(world, keys["beta"], sid, "echo ${SSH_AUTH_SOCK:-none}", "-A", "-o", "ForwardAgent=yes")
    assert (done.returncode, done.stdout) == (0, "none\n"), done
    # X11 (-X, -Y), as OpenSSH asks for it: no DISPLAY in the sandbox.
    for flag in ("-X", "-Y"):
        done = openssh(world, keys["beta"], sid, "echo ${DISPLAY:-none}", flag, env={"DISPLAY": ":99"})
        assert (done.returncode, done.stdout) == (0, "none\n"), done
    # -R through OpenSSH, with ExitOnForwardFailure: the client is told no, nothing listens.
    done = openssh(world, keys["beta"], sid, "echo reached", "-o", "ExitOnForwardFailure=yes",
                   "-R", "127.0.0.1:0:127.0.0.1:22")
    assert done.returncode == 255 and "reached" not in done.stdout, done


async def test_user_names_open_only_the_keys_own_sandboxes(world: World, keys: dict[str, Path]) -> None:
    """The user name is the sandbox. Alpha's sandbox (and one of alpha's ``ml`` project for a
    key limited to ``web``), an unknown id, names that only look like an id (case, spaces, a
    NUL, a path), a relay user with a forged pass: each the same ``Permission denied``."""
    alpha_sbx = world.sandbox("alpha-ssh", who="alpha_admin", runtime="base:latest")
    ml_sbx = world.sandbox("alpha-ml", who="alpha_admin", runtime="base:latest", projectId="ml")
    web_sbx = world.sandbox("alpha-web", who="web_member", runtime="base:latest")
    mine = world.sandbox("ssh", runtime="base:latest")
    refused = [
        ("beta", alpha_sbx), ("beta", "sbx_" + "0" * 26), ("beta", mine.upper()), ("beta", f" {mine}"),
        ("beta", f"{mine}/../{alpha_sbx}"), ("beta", "x" * 4000), ("beta", ""),
        ("web", ml_sbx), ("web", mine), ("stranger", mine), ("stranger", alpha_sbx),
    ]
    for who, user in refused:
        with pytest.raises((asyncssh.PermissionDenied, asyncssh.DisconnectError)):
            async with connect(world, user, keys[who]) as conn:
                await conn.run("echo IN", check=False)
    for user in (f"replica-relay.{alpha_sbx}", "replica-relay." + mine):
        for password in ("x", "e30.0000", "eyJzIjoiIn0." + "a" * 64, "é.é"):
            with pytest.raises(asyncssh.PermissionDenied):
                async with connect(world, user, password=password) as conn:
                    await conn.run("echo IN", check=False)
    # The controls: each key opens its own organization's (and project's) sandbox.
    async with connect(world, mine, keys["beta"]) as conn:
        assert (await conn.run("echo IN", check=False)).stdout == "IN\n"
    async with connect(world, web_sbx, keys["web"]) as conn:
        assert (await conn.run("echo IN", check=False)).stdout == "IN\n"


async def test_sftp_serves_the_sandbox_never_the_host(world: World, keys: dict[str, Path]) -> None:
    """SFTP paths that would leave the sandbox: ``..`` past its root, the server's data dir
    and the host's sockets by absolute path, a symlink the sandbox made to ``/proc/1/root``
    and to ``/etc/shadow``, ``/proc/self/environ`` of whoever reads it. Each resolves in the
    sandbox, as the sandbox user: its own files or nothing, never the host's."""
    sid = world.sandbox("ssh", runtime="base:latest")
    code, _, err = world.run("beta_member", sid, "ln -sf /proc/1/root /home/agentuity/pid1root && "
                                                 "ln -sf /etc/shadow /home/agentuity/shadow && "
                                                 "echo sandbox-only > /tmp/marker")
    assert code == 0, err
    data_dir = str(world.server.data_dir)
    async with connect(world, sid, keys["beta"]) as conn, conn.start_sftp_client() as sftp:
        assert await sftp.realpath("../../../../..") == "/"
        assert sorted(await sftp.listdir("/")) == sorted(await sftp.listdir("/../../.."))
        assert "workspace" in await sftp.listdir("/") and "data" not in await sftp.listdir("/tmp")
        assert (await (await sftp.open("/tmp/marker")).read()) == "sandbox-only\n"
        for path in (data_dir, data_dir + "/events.db", data_dir + "/api-key", "/var/run/docker.sock",
                     "/run/containerd/containerd.sock", "/var/cache/hutch/runtimes", "/root/.ssh"):
            with pytest.raises(asyncssh.SFTPError):
                await (await sftp.open(path)).read()
        for path in ("pid1root/etc/hostname", "shadow", "/proc/1/environ", "/proc/1/mem"):
            with pytest.raises(asyncssh.SFTPError):
                await (await sftp.open(path)).read()
        # Whatever /proc/self is, it is a process of the sandbox's: no server environment.
        with contextlib.suppress(asyncssh.SFTPError):
            environ = await (await sftp.open("/proc/self/environ")).read()
            assert "HUTCH_" not in environ and "PYTHONPATH" not in environ, environ[:300]


async def test_sftp_sizes_spend_neither_server_memory_nor_server_disk(world: World, keys: dict[str, Path]) -> None:
    """An SFTP write of one byte at offset 1 GiB grew the server's resident memory by 1 GiB
    (the file was spooled in a ``BytesIO``, which fills the gap with zeros): a member with an
    SSH key could run the host out of memory with a few requests, every tenant's server with
    it. And a sparse file of a terabyte in the sandbox (a few KiB on its disk) would be
    fetched whole into the server's temporary directory by an SFTP open. Now an SFTP file
    is bounded (past it: refused by name) and a write far past its end spends no memory."""
    sid = world.sandbox("ssh", runtime="base:latest")
    code, _, err = world.run("beta_member", sid, "truncate -s 1T /home/agentuity/sparse")
    assert code == 0, err
    async with connect(world, sid, keys["beta"]) as conn, conn.start_sftp_client() as sftp:
        handle = await sftp.open("far.bin", "wb")
        before = world.reset_peak()
        try:
            await handle.write(b"x", 256 * 2**20)  # inside the bound: taken, without spending memory
            grown = world.memory("VmHWM") - before
            assert grown < 128 * 2**20, f"a write at 256 MiB grew the server by {grown >> 20} MiB"
            with pytest.raises(asyncssh.SFTPError, match="too large"):
                await handle.write(b"x", 2**40)
        finally:
            with contextlib.suppress(asyncssh.SFTPError):
                await handle.close()
        with pytest.raises(asyncssh.SFTPError, match="too large"):
            await sftp.open("sparse")  # a terabyte of zeros: not copied to the server's disk
        with pytest.raises(asyncssh.SFTPError, match="too large"):
            await sftp.open("sparse", "r+b")
    grown = world.memory("VmHWM") - before
    assert grown < 128 * 2**20, f"the server grew by {grown >> 20} MiB"


async def test_a_read_only_key_registers_no_ssh_key_and_nobody_else_s_keys_change(world: World) -> None:
    """A read-only key adding an SSH key (which would open a shell, more than it may do) is
    403; beta cannot remove or see alpha's SSH keys by id."""
    pub = world.keygen("id_ro").with_suffix(".pub").read_text()
    status, answer = world.call("alpha_read-only", "POST", "/ssh-keys", {"publicKey": pub})
    assert status == 403 and answer["code"] == "FORBIDDEN", answer
    alpha_key = world.data("alpha_admin", "POST", "/ssh-keys", {"publicKey": world.keygen("id_alpha").with_suffix(
        ".pub").read_text()})
    status, answer = world.call("beta_admin", "DELETE", f"/ssh-keys/{alpha_key['id']}")
    missing_status, missing = world.call("beta_admin", "DELETE", "/ssh-keys/ssk_" + "0" * 26)
    assert (status, answer["code"]) == (missing_status, missing["code"]) == (404, missing["code"]), answer
    assert alpha_key["id"] not in str(world.data("beta_admin", "GET", "/ssh-keys"))
    assert alpha_key["id"] in str(world.data("alpha_admin", "GET", "/ssh-keys"))


async def test_many_ssh_sessions_leave_the_gateway_serving(world: World, keys: dict[str, Path]) -> None:
    """Connections that authenticate and then sit, and half-open connections that never say a
    word, do not stop another tenant from getting in."""
    sid = world.sandbox("ssh", runtime="base:latest")
    idle: list[asyncio.StreamWriter] = []
    try:
        for _ in range(50):
            _, writer = await asyncio.open_connection("127.0.0.1", world.ssh_port)
            idle.append(writer)
        async with connect(world, sid, keys["beta"]) as conn:
            result = await asyncio.wait_for(conn.run("echo still", check=False), 60)
            assert result.stdout == "still\n"
    finally:
        for writer in idle:
            writer.close()


async def test_the_gateway_counts_against_the_keys_rate_limit(world: World) -> None:
    """A key limited to 1 request a second (burst 2) is refused its third quick HTTP request,
    but the SSH key it registered ran every command asked of it, one execution each, and every
    SFTP operation: the gateway took no notice of the rate. Sessions and SFTP operations now
    count against the registering key's rate like its HTTP requests, and a refusal says so."""
    slow = world.data("beta_admin", "POST", "/keys", {"role": "member", "rate": 1, "burst": 2})
    key = world.keygen("id_slow")
    world.data(slow["secret"], "POST", "/ssh-keys", {"publicKey": key.with_suffix(".pub").read_text()})
    sid = world.sandbox("ssh", runtime="base:latest")
    statuses = [world.call(slow["secret"], "GET", f"/sandbox/{sid}")[0] for _ in range(4)]
    assert 429 in statuses, statuses  # the HTTP control
    await asyncio.sleep(2.1)
    ran, refused = 0, []
    async with connect(world, sid, key) as conn:
        for _ in range(6):
            result = await conn.run("echo ran", check=False)
            if result.stdout == "ran\n":
                ran += 1
            else:
                refused.append(result.stderr)
    assert ran <= 4 and refused and all("rate limit" in r for r in refused), (ran, refused)
    await asyncio.sleep(2.1)
    async with connect(world, sid, key) as conn, conn.start_sftp_client() as sftp:
        failures = []
        for _ in range(6):
            try:
                await sftp.listdir("/tmp")
            except asyncssh.SFTPError as err:
                failures.append(str(err))
    assert failures and all("rate limit" in f for f in failures), failures
