"""The second adversarial pass of issue 32 on the nomad driver, from the API's side: a hutch
server driving the dev agent's Nomad, with two organizations (alpha, beta) and keys of every
role. What a tenant sees of the orchestrator (tokens, Nomad's addresses, jobs), what a tenant
can do to another's nomad sandbox, what a sandbox can make the server store, Nomad's own
ACLs on the dev agent and on every node of the cluster, and what the Terraform templates
would expose. One server (and its sandboxes) for the module.

tests/adversarial/test_pass2_nomad.py is the view from inside the sandboxes."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from hutch.api.app import create_app
from hutch.api.config import Config
from hutch.api.keys import ENGINE

pytestmark = pytest.mark.asyncio(loop_scope="module")

BOOT = {"Authorization": "Bearer pass2-bootstrap"}
NOMAD_TOKEN = os.environ.get("HUTCH_NOMAD_TOKEN")
MiB = 2**20
CHECKPOINT_LIMIT = 16 * MiB  # HUTCH_MAX_CHECKPOINT_BYTES of the module's server


class Server:
    """The module's hutch server, its organizations' keys and a way to call it."""

    def __init__(self, client: TestClient, data_dir: Path) -> None:
        self.client, self.data_dir = client, data_dir
        self.keys: dict[str, dict[str, str]] = {}

    async def call(self, method: str, path: str, key: dict[str, str] | None = None, **kw: Any) -> tuple[int, Any]:
        resp = await self.client.request(method, path, headers=key if key is not None else BOOT, **kw)
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text

    async def ok(self, method: str, path: str, key: dict[str, str] | None = None, expect: int = 200,
                 **kw: Any) -> Any:
        status, body = await self.call(method, path, key, **kw)
        assert status == expect, (method, path, status, body)
        return body.get("data") if isinstance(body, dict) else body

    async def sandbox(self, key: dict[str, str], **spec: Any) -> str:
        sid = str((await self.ok("POST", "/sandbox", key, expect=201, json={"runtime": "python:3.13", **spec}))
                  ["sandboxId"])
        for _ in range(200):
            status = (await self.ok("GET", f"/sandbox/{sid}", key))["status"]
            if status != "creating":
                assert status == "idle", status
                return sid
            await asyncio.sleep(0.1)
        raise AssertionError(f"sandbox {sid} never came up")

    async def sh(self, key: dict[str, str], sid: str, script: str) -> tuple[int, str]:
        ex = await self.ok("POST", f"/sandbox/{sid}/execute", key, json={"command": ["sh", "-c", script]})
        done = await self.ok("GET", f"/sandbox/execution/{ex['executionId']}?wait=60s", key)
        out = await self.client.get("/" + done["stdoutStreamUrl"].split("://", 1)[1].split("/", 1)[1])
        return int(done["exitCode"]), await out.text()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Server]:
    data_dir = tmp_path_factory.mktemp("nomad-pass2-api")
    config = Config(data_dir=data_dir, api_key=BOOT["Authorization"].split()[1], driver="nomad", nomad_pool="off",
                    nomad_token=NOMAD_TOKEN, max_checkpoint_bytes=f"{CHECKPOINT_LIMIT // MiB}Mi")
    client = TestClient(TestServer(create_app(config)))
    await client.start_server()
    srv = Server(client, data_dir)
    try:
        for org in ("alpha", "beta"):
            await srv.ok("POST", "/orgs", expect=201, json={"name": org})
            for role in ("admin", "member", "read-only"):
                secret = (await srv.ok("POST", f"/keys?orgId=org_{org}", expect=201, json={"role": role}))["secret"]
                srv.keys[f"{org}-{role}"] = {"Authorization": f"Bearer {secret}"}
        yield srv
    finally:
        engine = client.server.app[ENGINE]
        for sid in await engine.driver.alive():
            await engine.driver.destroy(sid)
        await client.close()


def disk_used(path: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


# ------------------------------------------------------------------------ what a sandbox makes the server store

async def test_a_checkpoint_takes_no_more_of_the_servers_disk_than_the_limit(server: Server) -> None:
    """A nomad checkpoint is a tar of the workspace, spooled to the API server's disk and
    stored in its blob store; HUTCH_MAX_CHECKPOINT_BYTES and the organization's storage quota
    only see what the driver reports. A 2 GiB sparse file takes nothing in the sandbox and
    2 GiB in a tar: before, the nomad driver reported no size and spooled without a bound,
    so the checkpoint of a 16 MiB limit was taken whole (2 GiB on the server's disk per
    checkpoint, ten per sandbox, whatever the sandbox's disk limit). Now the spool stops at
    what is left of the limit, the checkpoint is refused (403 QUOTA_EXCEEDED) and nothing
    stays; a small one is counted in the organization's usage."""
    member = server.keys["alpha-member"]
    sid = await server.sandbox(member)
    assert (await server.sh(member, sid, "truncate -s 2G big && echo small > note"))[0] == 0
    before = disk_used(server.data_dir)
    status, body = await server.call("POST", f"/sandbox/{sid}/checkpoint", member, json={"name": "big"})
    grown = disk_used(server.data_dir) - before
    assert (status, body.get("code"), body.get("quota")) == (403, "QUOTA_EXCEEDED", "checkpoint_bytes"), (status, body)
    assert grown < 2 * CHECKPOINT_LIMIT, f"the server's disk took {grown // MiB} MiB for a refused checkpoint"
    assert (await server.ok("GET", f"/sandbox/checkpoints/{sid}", member))["checkpoints"] == []
    # Without the sparse file: taken, and counted.
    assert (await server.sh(member, sid, "rm big"))[0] == 0
    await server.ok("POST", f"/sandbox/{sid}/checkpoint", member, expect=201, json={"name": "small"})
    usage = (await server.ok("GET", "/orgs/org_alpha", member))["usage"]
    assert 0 < usage["checkpointBytes"] < CHECKPOINT_LIMIT, usage
    await server.ok("DELETE", f"/sandbox/{sid}", member)


def peak_rss_reset() -> None:
    """Start a new peak (VmHWM) for this process, where the server runs."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


LISTING_CAP = 32 * MiB  # drivers/nomad/files.py: what one file operation may print


async def test_a_listing_is_bounded_in_the_servers_memory(server: Server) -> None:
    """A file listing is what the sandbox prints (`find`), held by the server whole, then parsed
    into objects: about 1 KB of the server's memory per entry, so a directory of a million files
    was ~1 GB per request. Before: 170,000 files of 200-character names (36 MB listed) were
    answered (200), the server's peak growing by the amount measured below. Now what one file
    operation prints is bounded: past 32 MiB the command is stopped and the request refused
    (413 naming the path)."""
    member = server.keys["alpha-member"]
    sid = await server.sandbox(member)
    try:
        made = await server.sh(member, sid, "mkdir many && cd many && python3 -c '"
                                            "import os\nfor i in range(170000): os.close(os.open(str(i).zfill(200), 65))'")
        assert made[0] == 0, made
        before = peak_rss_mib()
        peak_rss_reset()
        status, body = await server.call("GET", f"/fs/list/{sid}?path=many", member)
        grown = peak_rss_mib() - before
        answer = (status, body.get("code"), body.get("field")) if isinstance(body, dict) else (status, body[:200])
        assert answer == (413, "PAYLOAD_TOO_LARGE", "path"), (answer, f"peak grew by {grown:.0f} MiB")
        assert grown < 3 * LISTING_CAP / MiB, f"the server's peak grew by {grown:.0f} MiB for a refused listing"
        # A directory of ordinary size still lists.
        assert len((await server.ok("GET", f"/fs/list/{sid}?path=.", member))["files"]) == 1
    finally:
        await server.ok("DELETE", f"/sandbox/{sid}", member)


# ------------------------------------------------------------------------ the Terraform templates

TERRAFORM = Path(__file__).resolve().parents[2] / "infra" / "terraform"
SERVICES = Path(__file__).resolve().parents[2] / "scripts" / "services.d"


def template(path: str) -> str:
    return (TERRAFORM / path).read_text()


async def test_the_terraform_registry_listens_on_the_cluster_address_only() -> None:
    """The hutch-registry job serves the runtime images every sandbox starts from, and takes
    pushes from whoever reaches it (no authentication: containerd on the clients pulls
    anonymously). It listened on 0.0.0.0:5000: on a client with a public address, anyone on
    the internet could push a `python:3.13` of their own (every tenant's next sandboxes would
    run it), and a sandbox could too, through another client's public address (only private
    ranges and the cluster's CIDRs are denied to sandboxes). It listens on the allocation's
    own address now, the cluster network's, as Kafka and PostgreSQL do."""
    registry = template("modules/hutch-on-nomad/jobs/registry.nomad.hcl.tftpl")
    addr = next(line.split(":", 1)[1].strip() for line in registry.splitlines() if line.strip().startswith("addr:"))
    assert addr == '{{ env "NOMAD_ADDR_http" }}', f"the registry listens on {addr}"
    kafka = template("modules/hutch-on-nomad/jobs/kafka.nomad.hcl.tftpl")
    assert 'listeners=PLAINTEXT://{{ env "NOMAD_ADDR_broker" }}' in kafka and "0.0.0.0" not in kafka
    postgres = template("modules/hutch-on-nomad/jobs/postgres.nomad.hcl.tftpl")
    assert "scram-sha-256" in postgres and " trust" not in postgres  # a password, from a Nomad variable


async def test_the_terraform_nodes_run_nomad_as_production_must() -> None:
    """What a deployment from the templates exposes of Nomad: ACLs on unless turned off by
    name, raw_exec off and denied on clients (a job of it runs as root on the host), the
    clients' per-uid inotify counts lifted as the one-box services lift them, the API's Nomad
    token only in a Nomad variable rendered into the task's secrets (never in a job's text or
    environment block), and the driver policy the README prints without ACL, variable,
    operator or node-write rights."""
    agent = template("modules/nomad-node/agent.hcl.tftpl")
    variables = template("modules/nomad-node/variables.tf")
    assert "acl {\n  enabled = ${acl_enabled}\n}" in agent
    acl_default = variables.split('variable "acl_enabled"', 1)[1].split("}", 1)[0]
    assert "default = true" in acl_default, acl_default
    assert 'plugin "raw_exec" {\n  config {\n    enabled = false' in agent
    denylist = next(line for line in agent.splitlines() if '"driver.denylist"' in line)
    assert "raw_exec" in denylist, denylist
    assert "sandbox_firewall = true" in agent and "denied_cidrs" in agent
    cloud_init = template("modules/nomad-node/cloud-init.yaml.tftpl")
    sysctls = {"fs.inotify.max_user_instances": "2147483647", "fs.inotify.max_user_watches": "2147483647"}
    for name, value in sysctls.items():
        assert f"{name} = {value}" in cloud_init, name
        assert f"{name}={value}" in (SERVICES / "nomad.sh").read_text(), name
    hutch_job = template("modules/hutch-on-nomad/jobs/hutch.nomad.hcl.tftpl")
    token_lines = [line.strip() for line in hutch_job.splitlines() if "nomad_token" in line]
    assert token_lines == ["HUTCH_NOMAD_TOKEN={{ .nomad_token }}"], token_lines
    assert 'destination = "secrets/hutch.env"' in hutch_job and "env         = true" in hutch_job
    readme = (TERRAFORM / "README.md").read_text()
    policy = readme.split('namespace "default" {', 1)[1].split("```", 1)[0]
    assert '"submit-job", "read-job", "list-jobs", "alloc-exec", "alloc-lifecycle"' in policy
    assert "policy = \"read\"" in policy and "write" not in policy and "acl" not in policy
    assert "variables" not in policy and "operator" not in policy
