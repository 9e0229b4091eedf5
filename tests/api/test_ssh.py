"""The SSH gateway (api/ssh_gateway.py, api/sftp.py) with OpenSSH's own clients: ssh, scp, sftp."""

from __future__ import annotations

import asyncio
import inspect
import os
import stat
import time
from pathlib import Path

import asyncssh
import pytest

from hutch.api.keys import SSH_GATEWAY
from hutch.api.sftp import SandboxSftp
from hutch.api.ssh_relay import PASS_SECONDS, RELAY_USER, RelayPasses
from hutch.core.tenancy import Principal, Role
from tests.api.conftest import NODE, REAL, Api, AppFactory


class Gateway:
    def __init__(self, api: Api, port: int, home: Path) -> None:
        self.api, self.port, self.home = api, port, home

    def keygen(self, name: str) -> Path:
        path = self.home / name
        os.system(f"ssh-keygen -q -t ed25519 -N '' -C {name}@test -f {path}")
        return path

    def opts(self, key: Path) -> list[str]:
        return ["-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                "-o", f"UserKnownHostsFile={self.home / 'known_hosts'}", "-o", "LogLevel=ERROR",
                "-o", "ConnectTimeout=20"]

    async def run(self, *argv: str, stdin: bytes = b"", timeout: float = 90) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
        assert proc.returncode is not None
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")

    async def ssh(self, key: Path, sandbox_id: str, *command: str, tty: bool = False, stdin: bytes = b"") -> tuple[int, str, str]:
        return await self.run("ssh", *self.opts(key), *(["-tt"] if tty else ["-T"]), "-p", str(self.port),
                              f"{sandbox_id}@127.0.0.1", *command, stdin=stdin)


@pytest.fixture
async def gateway(make_api: AppFactory, tmp_path: Path) -> Gateway:
    api = await make_api(ssh_port=0)
    port = api.client.server.app[SSH_GATEWAY].port  # type: ignore[attr-defined]
    return Gateway(api, port, tmp_path)


async def _sandbox(api: Api) -> str:
    return (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]


async def _register(gw: Gateway, key: Path, headers: dict[str, str] | None = None) -> dict:
    return await gw.api.data("POST", "/ssh-keys", json={"publicKey": key.with_suffix(".pub").read_text()},
                             expect=201, headers=headers or {})


@pytest.mark.runs_on(*REAL, *NODE)  # real commands and terminals through each driver (node: the agent's websocket)
async def test_commands_shells_exit_codes_and_stdin(gateway: Gateway) -> None:
    gw, key = gateway, gateway.keygen("id_a")
    record = await _register(gw, key)
    assert record["fingerprint"].startswith("SHA256:") and record["name"] == "id_a@test"
    sid = await _sandbox(gw.api)
    code, out, err = await gw.ssh(key, sid, "echo out; echo err >&2; id -u; exit 7")
    assert code == 7, err
    assert out.splitlines()[0] == "out" and int(out.splitlines()[1]) != 0 and err == "err\n"
    code, out, _ = await gw.ssh(key, sid, "cat; echo", stdin=b"piped in")
    assert (code, out) == (0, "piped in\n")
    # A login shell on a terminal (ssh -tt): typed lines, the terminal's answer, the exit code.
    code, out, _ = await gw.ssh(key, sid, tty=True, stdin=b"echo sum-$((2+3)); tty\nexit 4\n")
    assert code == 4, out
    assert "sum-5" in out and "/dev/pts/" in out
    # ssh sbx 'cmd' -t: the command on a terminal.
    code, out, _ = await gw.ssh(key, sid, "stty size; exit 2", tty=True)
    assert code == 2 and out.split()[:2] != [], out


@pytest.mark.runs_on(*REAL)  # real files through each driver
async def test_scp_both_ways_and_sftp(gateway: Gateway) -> None:
    gw, key = gateway, gateway.keygen("id_b")
    await _register(gw, key)
    sid = await _sandbox(gw.api)
    payload = os.urandom(300_000)
    local = gw.home / "up.bin"
    local.write_bytes(payload)
    scp = ["scp", *gw.opts(key), "-P", str(gw.port)]
    code, _, err = await gw.run(*scp, str(local), f"{sid}@127.0.0.1:up.bin")
    assert code == 0, err
    code, out, _ = await gw.ssh(key, sid, "sha256sum /home/agentuity/up.bin | cut -c1-64")
    import hashlib
    assert out.strip() == hashlib.sha256(payload).hexdigest()
    back = gw.home / "down.bin"
    code, _, err = await gw.run(*scp, f"{sid}@127.0.0.1:/home/agentuity/up.bin", str(back))
    assert code == 0, err
    assert back.read_bytes() == payload
    batch = gw.home / "batch"
    batch.write_text("mkdir made\nls -l\nput " + str(local) + " made/again.bin\nls made\nrm made/again.bin\nrmdir made\n")
    code, out, err = await gw.run("sftp", *gw.opts(key), "-P", str(gw.port), "-b", str(batch), f"{sid}@127.0.0.1")
    assert code == 0, err
    assert "up.bin" in out and "again.bin" in out and "made" in out
    # Nothing of the host: a missing file, and a path that is the host's, not the sandbox's.
    code, _, err = await gw.run(*scp, f"{sid}@127.0.0.1:{local}", str(gw.home / "nope"))
    assert code != 0 and not (gw.home / "nope").exists()


@pytest.mark.runs_on("local-embedded", "local-production")  # the gateway's checks over both stores' keys
async def test_refusals_reveal_nothing(gateway: Gateway) -> None:
    gw = gateway
    registered, stranger = gw.keygen("id_c"), gw.keygen("id_d")
    record = await _register(gw, registered)
    sid = await _sandbox(gw.api)
    other_org = (await gw.api.data("POST", "/orgs", json={"name": "ssh-other"}, expect=201))["id"]
    other_key = (await gw.api.data("POST", f"/keys?orgId={other_org}", json={"role": "admin"}, expect=201))["secret"]
    theirs = (await gw.api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201,
                                headers={"Authorization": f"Bearer {other_key}"}))["sandboxId"]
    refusals = [
        await gw.ssh(stranger, sid, "true"),  # an unregistered key
        await gw.ssh(registered, theirs, "true"),  # another organization's sandbox
        await gw.ssh(registered, "sbx_doesnotexist00000000000000", "true"),  # no such sandbox
    ]
    for code, out, err in refusals:
        assert code == 255 and out == "" and "Permission denied (publickey)" in err, (code, out, err)
    # The same key cannot be registered twice in one organization (other organizations: test_tenancy).
    body = await gw.api.call("POST", "/ssh-keys", json={"publicKey": registered.with_suffix(".pub").read_text()},
                             expect=400)
    assert "registered already" in body["message"]
    bad = await gw.api.call("POST", "/ssh-keys", json={"publicKey": registered.read_text()}, expect=400)
    assert "private key" in bad["message"]
    assert (await gw.ssh(registered, sid, "true"))[0] == 0
    await gw.api.call("DELETE", f"/ssh-keys/{record['id']}")
    assert (await gw.ssh(registered, sid, "true"))[0] == 255  # removed: refused at once
    assert record["id"] not in [k["id"] for k in (await gw.api.data("GET", "/ssh-keys"))["sshKeys"]]


@pytest.mark.runs_on("local-embedded")  # the gateway's passes, no store
async def test_a_relay_pass_opens_only_the_sandbox_it_names_and_only_briefly(gateway: Gateway) -> None:
    """Replicas relay sessions with a signed pass (api/ssh_relay.py) instead of the user's key.
    A forged, expired or other-sandbox pass is refused; a person is never offered a password."""
    gw = gateway
    sid, other = await _sandbox(gw.api), await _sandbox(gw.api)
    ssh_gateway = gw.api.client.server.app[SSH_GATEWAY]
    passes: RelayPasses = ssh_gateway.passes  # type: ignore[attr-defined]
    me = Principal(key_id="key_relay", org_id="org_local", role=Role.MEMBER)

    async def run_as(user: str, password: str) -> int | None:
        async with asyncssh.connect("127.0.0.1", gw.port, username=user, password=password, known_hosts=None,
                                    client_keys=None, agent_path=None, preferred_auth="password") as conn:
            return (await conn.run("echo relayed", check=False)).exit_status

    assert await run_as(RELAY_USER + sid, passes.make(sid, me)) == 0  # served here: no other replica
    good = passes.make(sid, me)
    refused = [
        RELAY_USER + sid + ":" + good.rpartition(".")[0] + ".0000",  # forged signature
        RELAY_USER + other + ":" + good,  # a pass for another sandbox
        RELAY_USER + sid + ":" + passes.make(sid, me, now=time.time() - 2 * PASS_SECONDS),  # expired
        sid + ":" + good,  # a person's user name: public keys only
        RELAY_USER + sid + ":a.\u00e9",  # a signature outside ASCII: refused, not a crash
    ]
    for attempt in refused:
        user, _, password = attempt.partition(":")
        with pytest.raises(asyncssh.PermissionDenied):
            await run_as(user, password)
    mac = good.rpartition(".")[2]
    assert passes.check(sid, "e30." + mac) is None and passes.check(sid, "no-dot") is None


@pytest.mark.runs_on("local-embedded")  # the gateway's start, no driver or store
async def test_the_host_key_is_made_once_and_kept(gateway: Gateway, make_api: AppFactory, data_dir: Path) -> None:
    path = data_dir / "ssh_host_ed25519_key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert asyncssh.read_private_key(str(path)).get_fingerprint()


def test_the_sftp_server_serves_nothing_of_the_host() -> None:
    """asyncssh's SFTPServer serves the host's files method by method: every public one must
    be ours (a method a new asyncssh adds fails here until it is mapped or refused)."""
    theirs = {n for n, f in inspect.getmembers(asyncssh.SFTPServer, inspect.isfunction) if not n.startswith("_")}
    inherited = {n for n in theirs if getattr(SandboxSftp, n) is getattr(asyncssh.SFTPServer, n)}
    assert inherited <= {"convert_attrs", "format_longname"}, inherited  # pure formatting, no file access


@pytest.mark.runs_on("local-embedded")  # the gateway's count, shared with the API's
async def test_a_signed_in_connection_is_one_of_its_organizations_requests_at_once(gateway: Gateway) -> None:
    """An SSH connection holds a server socket for as long as it is open, as a long-poll does;
    only HTTP requests were counted in an organization's share (HUTCH_MAX_REQUESTS_PER_ORG), so
    a tenant could take the server's file descriptors through the gateway past its bound. A
    connection signed in now holds one of them; past the share it is refused, saying why."""
    from hutch.api.at_once import SETTING
    from hutch.api.keys import AT_ONCE, TENANTS
    from tests.api.conftest import KEY

    gw, key = gateway, gateway.keygen("id_share")
    await _register(gw, key)
    sid = await _sandbox(gw.api)
    app = gw.api.client.server.app
    org = app[TENANTS].authenticate(KEY).org_id
    at_once = app[AT_ONCE]
    at_once.limit = 1
    shown = [o if o != "LogLevel=ERROR" else "LogLevel=INFO" for o in gw.opts(key)]  # ssh's default: banners shown
    with at_once.slot(org):  # its share held elsewhere (a long-poll)
        code, out, err = await gw.run("ssh", *shown, "-T", "-p", str(gw.port), f"{sid}@127.0.0.1", "echo in")
        assert code == 255 and out == "" and SETTING in err, (code, out, err)  # served before, uncounted
    assert at_once.held(org) == 0
    code, out, _ = await gw.ssh(key, sid, "echo in")
    assert (code, out) == (0, "in\n")
    assert at_once.held(org) == 0  # the connection's slot went with it


@pytest.mark.runs_on("local-embedded")  # the gateway's relay of a resize is the driver's whatever it is
async def test_a_terminal_resized_past_its_bounds_keeps_taking_input(gateway: Gateway) -> None:
    """A window-change to an impossible size (a careless client; SSH sizes are 32-bit) is
    refused and said on stderr; the terminal goes on, typed lines still reach it. Before,
    the refusal ended the gateway's copy of what is typed: the session hung, taking no input."""
    gw, key = gateway, gateway.keygen("id_resize")
    await _register(gw, key)
    sid = await _sandbox(gw.api)
    async with asyncssh.connect("127.0.0.1", gw.port, username=sid, known_hosts=None, client_keys=[str(key)],
                                agent_path=None) as conn:
        proc = await conn.create_process(term_type="xterm", term_size=(80, 24))
        for width, height in ((100_000, 24), (80, 2**32 - 1)):
            proc.change_terminal_size(width, height)
        proc.stdin.write("echo after-$((20+22)); exit 3\n")
        out, err = "", ""
        while "after-42" not in out:
            chunk = await asyncio.wait_for(proc.stdout.read(4096), 20)
            assert chunk, (out, err)
            out += chunk
        result = await asyncio.wait_for(proc.wait(), 20)
        assert result.exit_status == 3
        err = (result.stderr or "") if isinstance(result.stderr, str) else ""
        assert "cols: 100000 is not a terminal size" in err and "rows: 4294967295" in err, err
