"""The official Agentuity CLI (``@agentuity/cli@2.0.21``, on bun from npm's
``@oven/bun-linux-x64``) against a live ``hutch serve``, with nothing changed but its
environment: ``AGENTUITY_API_URL`` / ``AGENTUITY_TRANSPORT_URL`` pointing at hutch and
``AGENTUITY_API_KEY`` a hutch key (an admin of an organization other than the server's first).

Setup: ``tests/compat/setup.sh`` (``npm ci`` installs the CLI and bun beside the client)."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.compat.test_agentuity_client import _free_port, _hutch_command, _stop, _wait_ready
from tests.compat.test_agentuity_client import profile_flags as profile_flags  # both profiles
from tests.drivers_support import NODE_SECRET, NodeAgents, built_runtimes  # noqa: F401  (fixture)

# One test walks the whole CLI (about 25 commands, each a bun start) through one live server;
# at a load average of 16-27 it took 126 s, past pytest's default 120 s (each command has its own
# 180 s bound below).
# One walk, on the node driver (two `hutch node serve` agents of this host, each wrapping the local
# driver) and the production profile: the CLI's commands are the wire calls test_agentuity_client.py
# and tests/api prove on every driver and profile; each walk takes about a minute, so the CLI walks
# once, on the deepest stack (the agents' signed wire, Kafka and PostgreSQL under the API).
pytestmark = [pytest.mark.compat, pytest.mark.timeout(400),
              pytest.mark.parametrize(("server", "profile_flags"), [("node", "production")],
                                      indirect=True, ids=["node-production"])]
COMPAT_DIR = Path(__file__).resolve().parent
BUN_DIR = COMPAT_DIR / "node_modules" / "@oven" / "bun-linux-x64" / "bin"
AGENTUITY = COMPAT_DIR / "node_modules" / ".bin" / "agentuity"


def http(url: str, method: str, path: str, key: str, body: Any = None) -> tuple[int, Any]:
    req = urllib.request.Request(url + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


class Cli:
    def __init__(self, url: str, key: str, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTUITY_")}
        self.env.update(
            PATH=f"{BUN_DIR}:{os.environ['PATH']}", HOME=str(home), AGENTUITY_CONFIG_DIR=str(home / "config"),
            AGENTUITY_API_URL=url, AGENTUITY_TRANSPORT_URL=url, AGENTUITY_STREAM_URL=f"{url}/streams",
            AGENTUITY_API_KEY=key,
            # No update check (it would go to the internet), no coding-agent probe, no colour query.
            AGENTUITY_SKIP_VERSION_CHECK="1", AGENTUITY_AGENT_MODE="none", COLOR_SCHEME="dark")

    def run(self, *argv: str, expect: int | None = 0, stdin: str = "") -> subprocess.CompletedProcess[str]:
        """``expect=None``: any non-zero exit (a refusal), with no stack trace."""
        done = subprocess.run([str(AGENTUITY), *argv], env=self.env, capture_output=True, text=True,
                              input=stdin, timeout=180, check=False)
        if expect is None:
            assert done.returncode != 0 and "    at " not in done.stderr, (argv, done.stdout, done.stderr)
        else:
            assert done.returncode == expect, (argv, done.returncode, done.stdout[-2000:], done.stderr[-2000:])
        return done

    def json(self, *argv: str) -> Any:
        """``--json`` goes before a ``--`` (after it, it would be the command's own argument)."""
        cut = argv.index("--") if "--" in argv else len(argv)
        out = self.run(*argv[:cut], "--json", *argv[cut:]).stdout
        return json.JSONDecoder().raw_decode(out.lstrip())[0]  # `auth whoami --json` prints it twice


@pytest.fixture(params=["node"])
def server(request: pytest.FixtureRequest, tmp_path: Path, profile_flags: list[str],
           built_runtimes: Path) -> Iterator[tuple[str, str]]:  # noqa: F811  (fixture)
    if not AGENTUITY.exists() or not (BUN_DIR / "bun").exists():
        pytest.fail(f"{AGENTUITY} or bun is missing: run tests/compat/setup.sh (npm ci) first")
    agents = NodeAgents(tmp_path / "nodes") if request.param == "node" else None
    node_env = {"HUTCH_NODE_AGENTS": agents.spec, "HUTCH_NODE_SECRET": NODE_SECRET} if agents else {}
    key, port = "hk_boot_" + os.urandom(8).hex(), _free_port()
    url, log = f"http://127.0.0.1:{port}", tmp_path / "server.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen([*_hutch_command(), "serve", "--host", "127.0.0.1", "--port", str(port),
                                 "--data-dir", str(tmp_path / "data"), "--driver", request.param, "--ssh-port", "0",
                                 *profile_flags],
                                env={**os.environ, **node_env, "HUTCH_API_KEY": key}, stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        _wait_ready(proc, url, key, log)
        yield url, key
    finally:
        _stop(proc, url, key)
        if agents is not None:
            agents.stop()


def test_agentuity_cli_sandbox_commands_against_hutch(server: tuple[str, str], tmp_path: Path) -> None:
    url, boot = server
    assert http(url, "POST", "/orgs", boot, {"name": "clitest"})[0] == 201
    status, made = http(url, "POST", "/keys?orgId=org_clitest", boot, {"role": "admin", "name": "cli"})
    assert status == 201
    cli = Cli(url, made["data"]["secret"], tmp_path / "home")

    assert cli.json("cloud", "sandbox", "list") == {"sandboxes": [], "total": 0}
    sid = cli.json("cloud", "sandbox", "create")["sandboxId"]  # picks org_clitest and region "local" itself
    done = cli.run("cloud", "sandbox", "exec", sid, "--", "sh", "-c", "echo hi; exit 3", expect=3)
    assert done.stdout == "hi\n"
    got = cli.json("cloud", "sandbox", "get", sid)
    assert got["sandboxId"] == sid and got["status"] == "idle"
    listed = cli.json("cloud", "sandbox", "list")
    assert [(s["id"], s["orgId"], s["region"]) for s in listed["sandboxes"]] == [(sid, "org_clitest", "local")]
    assert cli.json("cloud", "sandbox", "env", sid, "FOO=bar")["env"]["FOO"] == "bar"
    cli.json("cloud", "sandbox", "pause", sid)
    cli.json("cloud", "sandbox", "resume", sid)
    assert "create" in [e["type"] for e in cli.json("cloud", "sandbox", "events", sid)["events"]]

    local = tmp_path / "up.txt"
    local.write_text("hello\n")
    assert cli.json("cloud", "sandbox", "fs", "cp", str(local), f"{sid}:/home/agentuity/up.txt")["filesTransferred"] == 1
    cli.json("cloud", "sandbox", "fs", "cp", f"{sid}:/home/agentuity/up.txt", str(tmp_path / "down.txt"))
    assert (tmp_path / "down.txt").read_text() == "hello\n"
    cli.json("cloud", "sandbox", "fs", "mkdir", sid, "/home/agentuity/d")
    names = [f.get("name") or f.get("path") for f in cli.json("cloud", "sandbox", "fs", "ls", sid, "/home/agentuity")["files"]]
    assert any("up.txt" in str(n) for n in names), names

    cp = cli.json("cloud", "sandbox", "checkpoint", "create", sid, "cp1")
    assert cp["name"] == "cp1"
    assert [c["name"] for c in cli.json("cloud", "sandbox", "checkpoint", "list", sid)["checkpoints"]] == ["cp1"]
    job = cli.json("cloud", "sandbox", "job", "create", sid, "--", "sleep", "30")
    assert [j["jobId"] for j in cli.json("cloud", "sandbox", "job", "list", sid)["jobs"]] == [job["jobId"]]
    assert cli.json("cloud", "sandbox", "job", "get", sid, job["jobId"])["status"] == "running"
    cli.json("cloud", "sandbox", "job", "stop", sid, job["jobId"])
    executions = cli.json("cloud", "sandbox", "execution", "list", sid)["executions"]
    assert executions[0]["exitCode"] == 3
    assert cli.json("cloud", "sandbox", "execution", "get", executions[0]["executionId"])["exitCode"] == 3
    cli.json("cloud", "sandbox", "checkpoint", "restore", sid, "cp1")
    cli.json("cloud", "sandbox", "checkpoint", "delete", sid, "cp1", "--confirm")
    cli.json("cloud", "sandbox", "fs", "download", sid, str(tmp_path / "all.tar.gz"))
    assert (tmp_path / "all.tar.gz").read_bytes()[:2] == b"\x1f\x8b"

    snap = cli.json("cloud", "sandbox", "snapshot", "create", sid, "--name", "clisnap")
    assert snap["fileCount"] == 1
    snaps = cli.json("cloud", "sandbox", "snapshot", "list")["snapshots"]
    assert [s["fullName"] for s in snaps] == ["@clitest/clisnap:latest"]
    assert cli.json("cloud", "sandbox", "snapshot", "tag", snap["snapshotId"], "v2")["tag"] == "v2"
    assert cli.json("cloud", "sandbox", "snapshot", "get", snap["snapshotId"])["tag"] == "v2"
    assert "runtime:" in cli.json("cloud", "sandbox", "snapshot", "generate")["content"]
    build = tmp_path / "build"
    build.mkdir()
    (build / "app.py").write_text("print(1)\n")
    (build / "agentuity-snapshot.yaml").write_text(
        "version: 1\nruntime: base:latest\nname: built\nfiles:\n  - \"*.py\"\nenv:\n  STAGE: one\n")
    built = cli.json("cloud", "sandbox", "snapshot", "build", str(build))  # asks encrypt; uploads plain
    assert built["fileCount"] == 1 and built["name"] == "built"
    cli.json("cloud", "sandbox", "snapshot", "delete", built["snapshotId"], "--confirm")
    ran = cli.json("cloud", "sandbox", "run", "--", "echo", "ran")
    assert ran["exitCode"] == 0 and ran["output"] == "ran\n"
    # A piped stdin goes through the stream service (POST /streams, PUT /streams/{id}).
    piped = cli.run("cloud", "sandbox", "run", "--json", "--", "sh", "-c", "tr a-z A-Z", stdin="piped in\n")
    assert json.loads(piped.stdout)["output"] == "PIPED IN\n"
    assert any(r["name"] == "base:latest" for r in cli.json("cloud", "sandbox", "runtime", "list")["runtimes"])
    assert cli.json("cloud", "sandbox", "stats")["services"]["sandbox"]["totalActive"] >= 1

    # Keys: `agentuity cloud apikey …` manages hutch keys of the organization.
    created = cli.json("cloud", "apikey", "create", "--name", "ci", "--expires-at", "2099-01-01T00:00:00Z",
                       "--confirm")
    assert created["value"].startswith("hk_")
    keys = cli.json("cloud", "apikey", "list")
    assert {k["name"] for k in keys} == {"cli", "ci"} and all(k["orgId"] == "org_clitest" for k in keys)
    other = Cli(url, created["value"], tmp_path / "home2")
    seen = other.json("cloud", "sandbox", "list")  # the new key works, in its organization
    assert seen["total"] == cli.json("cloud", "sandbox", "list")["total"] >= 3
    assert {s["orgId"] for s in seen["sandboxes"]} == {"org_clitest"}
    cli.json("cloud", "apikey", "delete", created["id"])
    refused = other.run("cloud", "sandbox", "list", "--json", expect=None)
    assert "revoked" in refused.stdout + refused.stderr
    # Who am I, and which organizations: the key's own only.
    me = cli.json("auth", "whoami")
    assert [o["id"] for o in me["organizations"]] == ["org_clitest"]
    assert cli.json("auth", "org", "select", "org_clitest")["orgId"] == "org_clitest"
    # A bad key, and another organization's sandbox: the CLI's own clear errors.
    bad = Cli(url, "hk_not_a_key", tmp_path / "home3").run("cloud", "sandbox", "list", "--json", expect=None)
    assert "invalid API key" in bad.stdout + bad.stderr
    status, theirs = http(url, "POST", "/sandbox", boot, {})  # org_local's
    assert status == 201
    gone = cli.run("cloud", "sandbox", "get", theirs["data"]["sandboxId"], "--json", expect=None)
    assert "not found" in (gone.stdout + gone.stderr).lower()

    assert cli.json("cloud", "sandbox", "delete", sid, "--confirm")["success"] is True
    # What hutch does not have answers 501 by name: never a crash, never a pretend success.
    status, body = http(url, "GET", "/cli/agent?projectId=proj_x", made["data"]["secret"])
    assert status == 501 and "hutch" in body["message"] and "/cli/agent" in body["message"]


def test_agentuity_cloud_ssh_reaches_the_ssh_gateway(server: tuple[str, str], tmp_path: Path) -> None:
    """`agentuity cloud ssh sbx_… 'cmd'` runs `ssh sbx_…@HOST cmd`, HOST from the profile's
    overrides.ion_url (a host name only: the port comes from ~/.ssh/config, as for any host)."""
    url, boot = server
    assert http(url, "POST", "/orgs", boot, {"name": "sshtest"})[0] == 201
    _, made = http(url, "POST", "/keys?orgId=org_sshtest", boot, {"role": "member", "name": "cli"})
    home = tmp_path / "home-ssh"
    cli = Cli(url, made["data"]["secret"], home)
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh_dir / "id_ed25519")], check=True)
    status, _ = http(url, "POST", "/ssh-keys", made["data"]["secret"],
                     {"publicKey": (ssh_dir / "id_ed25519.pub").read_text()})
    assert status == 201
    port = http(url, "GET", "/healthz", boot)[1]["data"]["ssh"]["port"]
    (ssh_dir / "config").write_text(f"Host 127.0.0.1\n  Port {port}\n  IdentityFile {ssh_dir / 'id_ed25519'}\n"
                                    f"  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
                                    f"  UserKnownHostsFile {ssh_dir / 'known_hosts'}\n  LogLevel ERROR\n")
    # OpenSSH reads the config of the passwd entry's home, not $HOME's: a user's own
    # ~/.ssh/config is where these lines go; here an `ssh` first on PATH points at them.
    shim = home / "bin" / "ssh"
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\nexec /usr/bin/ssh -F {ssh_dir / 'config'} \"$@\"\n")
    shim.chmod(0o755)
    cli.env["PATH"] = f"{shim.parent}:{cli.env['PATH']}"
    (home / "config").mkdir(exist_ok=True)
    (home / "config" / "production.yaml").write_text("name: production\noverrides:\n  ion_url: http://127.0.0.1\n")
    sid = cli.json("cloud", "sandbox", "create")["sandboxId"]
    shown = cli.run("cloud", "ssh", sid, "echo from-agentuity", "--show").stdout
    assert shown.strip() == f"ssh {sid}@127.0.0.1 'echo from-agentuity'"
    done = cli.run("cloud", "ssh", sid, "echo from-agentuity; exit 5", expect=5)
    assert done.stdout == "from-agentuity\n"
