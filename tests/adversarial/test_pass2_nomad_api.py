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
import shlex
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from hutch.api.app import create_app
from hutch.api.keys import ENGINE
from hutch.service.config import Config

pytestmark = pytest.mark.asyncio(loop_scope="module")

BOOT = {"Authorization": "Bearer pass2-bootstrap"}
NOMAD_TOKEN = os.environ.get("HUTCH_NOMAD_TOKEN")
MiB = 2**20
CHECKPOINT_LIMIT = 16 * MiB  # HUTCH_MAX_CHECKPOINT_BYTES of the module's server
ARCHIVE_LIMIT = 32 * MiB  # max_upload_bytes of the module's server: what a snapshot may unpack to


class Server:
    """The module's hutch server, its organizations' keys and a way to call it."""

    def __init__(self, client: TestClient, data_dir: Path) -> None:
        self.client, self.data_dir = client, data_dir
        self.keys: dict[str, dict[str, str]] = {}
        self.created: dict[str, Any] = {}  # the last create's answer

    async def call(self, method: str, path: str, key: dict[str, str] | None = None, **kw: Any) -> tuple[int, Any]:
        resp = await self.client.request(method, path, headers=key if key is not None else BOOT, **kw)
        raw = await resp.read()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, raw.decode(errors="replace")

    async def ok(self, method: str, path: str, key: dict[str, str] | None = None, expect: int = 200,
                 **kw: Any) -> Any:
        status, body = await self.call(method, path, key, **kw)
        assert status == expect, (method, path, status, body)
        return body.get("data") if isinstance(body, dict) else body

    async def sandbox(self, key: dict[str, str], **spec: Any) -> str:
        self.created = await self.ok("POST", "/sandbox", key, expect=201, json={"runtime": "python:3.13", **spec})
        sid = str(self.created["sandboxId"])
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
                    nomad_token=NOMAD_TOKEN, max_checkpoint_bytes=f"{CHECKPOINT_LIMIT // MiB}Mi",
                    max_upload_bytes=ARCHIVE_LIMIT)
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
        for sid in await engine.parts.driver.alive():
            await engine.parts.driver.destroy(sid)
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



async def test_a_snapshot_stops_reading_the_sandbox_at_the_archive_limit(server: Server) -> None:
    """A snapshot (and a fork, which takes one) is the sandbox's export, gzipped into a spool
    on the server, then checked against the archive limits (max_upload_bytes unpacked). A
    sparse file costs the sandbox nothing and the export its full size, so the check came
    after the server had read and compressed all of it: 4 GiB of sparse file for a 32 MiB
    limit kept the server streaming for minutes (the client gave up at 5); a 1 TiB one for
    hours, one request per sandbox at a time. The spool now stops at the limit: 413 naming
    the archive within seconds, and no snapshot is made."""
    member = server.keys["alpha-member"]
    sid = await server.sandbox(member)
    try:
        assert (await server.sh(member, sid, "truncate -s 4G big"))[0] == 0
        started = asyncio.get_running_loop().time()
        status, body = await server.call("POST", f"/sandbox/{sid}/snapshot", member, json={})
        took = asyncio.get_running_loop().time() - started
        assert (status, body.get("code"), body.get("field")) == (413, "PAYLOAD_TOO_LARGE", "archive"), (status, body)
        assert took < 60, f"the server read the sandbox for {took:.0f} s"
        snapshots = await server.ok("GET", "/sandbox/snapshots", member)
        assert snapshots["snapshots"] == [], snapshots
    finally:
        await server.ok("DELETE", f"/sandbox/{sid}", member)

LISTING_CAP = 32 * MiB  # drivers/nomad/files.py: what one file operation may print


async def test_a_listing_is_bounded_in_the_servers_memory(server: Server) -> None:
    """A file listing is what the sandbox prints (`find`), held by the server whole, then parsed
    into objects: about 1.6 KB of the server's memory per entry, so a directory of a million files
    was ~1.6 GB per request. Before: 170,000 files of 200-character names (36 MB listed) were
    answered (200) and grew the server's peak by 268 MiB. Now what one file operation prints
    is bounded: past 32 MiB (here 125,000 names of 250 characters, 35 MB) the command is
    stopped and the request refused (413 naming the path)."""
    member = server.keys["alpha-member"]
    sid = await server.sandbox(member)
    try:
        made = await server.sh(member, sid, "mkdir many && cd many && python3 -c '"
                                            "import os\nfor i in range(125000): os.close(os.open(str(i).zfill(250), 65))'")
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


# ------------------------------------------------------------------------ tokens and the orchestrator, seen by a tenant

# Inside the sandbox: every string shaped like a Nomad secret (a UUID) in any process's
# environment or command line, and in every file of the usual places, hashed: the caller
# compares with the token's hash (the token itself never enters the sandbox).
TOKEN_SEARCH = r'''
import hashlib, json, os, re, sys
uuid = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
found, looked = set(), 0
def scan(data, where):
    global looked
    looked += 1
    for m in uuid.findall(data):
        found.add(hashlib.sha256(m).hexdigest())
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for part in ("environ", "cmdline"):
        try:
            scan(open(f"/proc/{pid}/{part}", "rb").read(), f"{pid}/{part}")
        except OSError:
            pass
for top in ("/etc", "/home", "/tmp", "/run", "/var", "/opt", "/root", "/srv", "/usr/local/etc"):
    for dirpath, dirnames, filenames in os.walk(top):
        for name in filenames:
            try:
                with open(os.path.join(dirpath, name), "rb") as f:
                    scan(f.read(1 << 20), os.path.join(dirpath, name))
            except OSError:
                pass
print(json.dumps({"hashes": sorted(found), "looked": looked}))
'''


async def test_the_orchestrators_secrets_and_names_reach_no_tenant(server: Server) -> None:
    """Where could a tenant read hutch's Nomad token, or learn Nomad's internals (its address,
    the registry, job and allocation ids)? Every answer an admin of alpha gets about its nomad
    sandbox (the sandbox, its list, history, events, executions and output, the audit stream,
    metrics, runtimes, its organization, the OpenAPI description, the Web App's pages and
    session), every process and file inside the sandbox, and the Nomad job hutch submitted
    (which carries neither the token nor the tenant's env: the env travels with each exec)."""
    import hashlib
    import urllib.request

    admin = server.keys["alpha-admin"]
    secret_env = "alpha-env-secret-5c1e"
    sid = await server.sandbox(admin, network={"enabled": True, "port": 8000}, env={"SECRET": secret_env})
    created = server.created
    code, _ = await server.sh(admin, sid, "echo $SECRET >/dev/null; env | wc -l")
    assert code == 0
    engine = server.client.server.app[ENGINE]
    sb = engine.parts.driver.running(sid)
    sandbox = await server.ok("GET", f"/sandbox/{sid}", admin)
    answers = [json.dumps(sandbox), json.dumps(created)]
    for path in ("/sandbox", f"/sandbox/status/{sid}", f"/sandbox/sandboxes/{sid}/history",
                 f"/sandbox/sandboxes/{sid}/events", f"/sandbox/sandboxes/{sid}/executions", "/metrics",
                 "/sandbox/runtimes", "/sandbox/stats", "/orgs/org_alpha", "/openapi.json", "/healthz", "/keys"):
        status, body = await server.call("GET", path, admin)
        assert status == 200, (path, status, body)
        answers.append(body if isinstance(body, str) else json.dumps(body))
    audit = await server.client.get("/" + created["auditStreamUrl"].split("://", 1)[1].split("/", 1)[1] + "?follow=false")
    answers.append(await audit.text())
    signed = await server.client.post("/app/session", json={"apiKey": admin["Authorization"].split()[1]})
    assert signed.status in (200, 201), await signed.text()
    for path in ("/app", "/app/session"):
        answers.append(await (await server.client.get(path)).text())
    server.client.session.cookie_jar.clear()  # signed out: later calls carry only their key
    seen = "\n".join(answers)
    leaks = {name: value for name, value in (
        ("the Nomad token", NOMAD_TOKEN), ("Nomad's address", engine.parts.driver.address.split("//", 1)[1]),
        ("the registry", engine.parts.driver.registry), ("the job id", sb.job_id), ("the allocation id", sb.alloc_id))
        if value and value in seen}
    assert not leaks, f"a tenant's answers hold {sorted(leaks)}"

    inside = json.loads((await server.sh(admin, sid, f"python3 -c {shlex.quote(TOKEN_SEARCH)}"))[1])
    assert inside["looked"] > 100, inside["looked"]
    assert NOMAD_TOKEN and hashlib.sha256(NOMAD_TOKEN.encode()).hexdigest() not in inside["hashes"]

    request = urllib.request.Request(f"{engine.parts.driver.address}/v1/job/{sb.job_id}",
                                     headers={"X-Nomad-Token": NOMAD_TOKEN or ""})
    job = await asyncio.to_thread(lambda: urllib.request.urlopen(request, timeout=10).read().decode())
    assert NOMAD_TOKEN not in job and secret_env not in job and "SECRET" not in job, job[:2000]
    await server.ok("DELETE", f"/sandbox/{sid}", admin)


async def test_another_organization_reaches_nothing_of_a_nomad_sandbox(server: Server) -> None:
    """A member of beta names alpha's nomad sandbox on every route that takes one (read it,
    run in it, its files, its terminal, checkpoints, snapshots, fork, pause, env, delete):
    404 as if it did not exist; alpha's read-only key may read but not act (403); no key is
    401. Afterwards the sandbox is as it was: same file, no execution it did not run."""
    alpha, reader, beta = server.keys["alpha-member"], server.keys["alpha-read-only"], server.keys["beta-member"]
    server.client.session.cookie_jar.clear()  # no Web App session: each call is its key alone
    sid = await server.sandbox(alpha, network={"enabled": True, "port": 8000})
    assert (await server.sh(alpha, sid, "echo mine > owned"))[0] == 0
    tries = [("GET", f"/sandbox/{sid}", None), ("GET", f"/sandbox/status/{sid}", None),
             ("POST", f"/sandbox/{sid}/execute", {"command": ["sh", "-c", "echo pwned > owned"]}),
             ("GET", f"/fs/{sid}?path=owned", None), ("GET", f"/fs/list/{sid}?path=.", None),
             ("POST", f"/fs/{sid}", {"files": [{"path": "owned", "content": "cHduZWQ="}]}),
             ("POST", f"/fs/rm/{sid}", {"path": "owned"}), ("GET", f"/fs/download/{sid}?path=.", None),
             ("GET", f"/sandbox/{sid}/terminal", None), ("POST", f"/sandbox/{sid}/checkpoint", {"name": "x"}),
             ("GET", f"/sandbox/checkpoints/{sid}", None), ("POST", f"/sandbox/{sid}/snapshot", {}),
             ("POST", f"/sandbox/{sid}/fork", {}), ("POST", f"/sandbox/{sid}/pause", None),
             ("PATCH", f"/sandbox/env/{sid}", {"env": {"X": "1"}}),
             ("GET", f"/sandbox/sandboxes/{sid}/executions", None), ("GET", f"/sandbox/sandboxes/{sid}/history", None),
             ("DELETE", f"/sandbox/{sid}", None)]
    found = {}
    for method, path, body in tries:
        kw = {"json": body} if body is not None else {}
        found[f"beta {method} {path}"] = (await server.call(method, path, beta, **kw))[0]
        if method != "GET":
            found[f"reader {method} {path}"] = (await server.call(method, path, reader, **kw))[0]
        found[f"nobody {method} {path}"] = (await server.call(method, path, {}, **kw))[0]
    expected = {}
    for method, path, _ in tries:
        expected[f"beta {method} {path}"] = 404
        if method != "GET":
            expected[f"reader {method} {path}"] = 403
        expected[f"nobody {method} {path}"] = 401
    assert found == expected, json.dumps({k: v for k, v in found.items() if expected[k] != v}, indent=1)
    assert (await server.sh(alpha, sid, "cat owned"))[1] == "mine\n"
    executions = await server.ok("GET", f"/sandbox/sandboxes/{sid}/executions", alpha)
    assert len(executions["executions"]) == 2, executions
    await server.ok("DELETE", f"/sandbox/{sid}", alpha)


# ------------------------------------------------------------------------ Nomad's own ACLs, every node

def nomad(addr: str, path: str, token: str | None, method: str = "GET", body: bytes | None = None) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    headers = {"X-Nomad-Token": token} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(addr + path, data=body, method=method, headers=headers),
                                    timeout=10) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def cluster_token() -> str:
    token = os.environ.get("HUTCH_TEST_CLUSTER_TOKEN")
    if not token or not os.environ.get("HUTCH_TEST_CLUSTER_ADDR"):
        pytest.fail("HUTCH_TEST_CLUSTER_ADDR/_TOKEN must be set: ./scripts/services start cluster", pytrace=False)
    return token


async def test_nomad_answers_no_one_without_a_token_and_hutchs_token_only_what_hutch_needs(server: Server) -> None:
    """Nomad's HTTP API on the dev agent, the cluster's server and each of its clients (every
    node answers for the whole cluster): anonymous reads of jobs, nodes, allocations, the
    agent, ACL tokens, raft, the event stream, services, a running sandbox's files, logs and
    stats are 403, and the list routes that answer everyone (policies, variables, namespaces,
    volumes) are empty; the ACLs cannot be bootstrapped again. hutch's own token (what a
    compromised API server holds) reads no ACL tokens, variables, agent, raft or event stream,
    reads no allocation's files or logs, writes no policy, and a raw_exec job it submits is
    never placed (no node offers raw_exec)."""
    member = server.keys["alpha-member"]
    sid = await server.sandbox(member)
    alloc = server.client.server.app[ENGINE].parts.driver.running(sid).alloc_id
    nodes = [("dev agent", "http://127.0.0.1:4646", NOMAD_TOKEN, alloc)]
    token = cluster_token()
    cluster = os.environ["HUTCH_TEST_CLUSTER_ADDR"]
    nodes += [("cluster server", cluster, token, None)]
    nodes += [(f"client {n}", f"http://10.77.0.{n}:4656", token, None) for n in (11, 12, 13)]
    denied = ["/v1/jobs", "/v1/nodes", "/v1/allocations", "/v1/agent/self", "/v1/agent/members", "/v1/agent/host",
              "/v1/acl/tokens", "/v1/operator/raft/configuration", "/v1/event/stream", "/v1/services"]
    empty = ["/v1/acl/policies", "/v1/vars", "/v1/namespaces", "/v1/volumes"]
    hutch_denied = ["/v1/agent/self", "/v1/agent/host", "/v1/acl/tokens", "/v1/operator/raft/configuration",
                    "/v1/event/stream", "/v1/acl/token/" + "0" * 8 + "-0000-0000-0000-" + "0" * 12]
    found, expected = {}, {}
    try:
        for name, addr, tok, alloc_id in nodes:
            for path in denied:
                found[f"{name} anonymous {path}"] = (await asyncio.to_thread(nomad, addr, path, None))[0]
                expected[f"{name} anonymous {path}"] = 403
            for path in empty:
                found[f"{name} anonymous {path}"] = await asyncio.to_thread(nomad, addr, path, None)
                expected[f"{name} anonymous {path}"] = (200, "[]")
            for path in hutch_denied:
                found[f"{name} hutch {path}"] = (await asyncio.to_thread(nomad, addr, path, tok))[0]
                expected[f"{name} hutch {path}"] = 403
            found[f"{name} hutch /v1/vars"] = await asyncio.to_thread(nomad, addr, "/v1/vars", tok)
            expected[f"{name} hutch /v1/vars"] = (200, "[]")
            found[f"{name} bootstrap"] = (await asyncio.to_thread(nomad, addr, "/v1/acl/bootstrap", None, "POST", b""))[0]
            expected[f"{name} bootstrap"] = 400
            policy = json.dumps({"Name": "pass2", "Rules": 'namespace "default" { policy = "write" }'}).encode()
            found[f"{name} hutch writes a policy"] = (await asyncio.to_thread(
                nomad, addr, "/v1/acl/policy/pass2", tok, "POST", policy))[0]
            expected[f"{name} hutch writes a policy"] = 403
            if alloc_id:
                # Nomad's streaming routes answer 200 or 500 with the refusal as their body.
                for who, key in (("anonymous", None), ("hutch", tok)):
                    for path in (f"/v1/client/fs/ls/{alloc_id}?path=/", f"/v1/client/fs/stat/{alloc_id}?path=/",
                                 f"/v1/client/fs/cat/{alloc_id}?path=sandbox/resolv.conf",
                                 f"/v1/client/fs/readat/{alloc_id}?path=sandbox/resolv.conf&offset=0&limit=64",
                                 f"/v1/client/fs/logs/{alloc_id}?task=sandbox&type=stdout&plain=true"):
                        code, text = await asyncio.to_thread(nomad, addr, path, key)
                        found[f"{name} {who} {path}"] = "denied" if code == 403 or "Permission denied" in text \
                            else (code, text[:100])
                        expected[f"{name} {who} {path}"] = "denied"
                path = f"/v1/client/allocation/{alloc_id}/stats"
                found[f"{name} anonymous {path}"] = (await asyncio.to_thread(nomad, addr, path, None))[0]
                expected[f"{name} anonymous {path}"] = 403
        job_id = f"pass2-raw-{os.getpid()}"
        job = json.dumps({"Job": {"ID": job_id, "Type": "batch", "Datacenters": ["*"], "TaskGroups": [{
            "Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}}]}]}})
        for name, addr, tok, _ in (nodes[0], nodes[1]):
            status, _ = await asyncio.to_thread(nomad, addr, "/v1/jobs", tok, "PUT", job.encode())
            await asyncio.sleep(2)
            allocs = json.loads((await asyncio.to_thread(nomad, addr, f"/v1/job/{job_id}/allocations", tok))[1] or "[]") \
                if status == 200 else []
            found[f"{name} raw_exec job placed"] = [a.get("ClientStatus") for a in allocs]
            expected[f"{name} raw_exec job placed"] = []
            await asyncio.to_thread(nomad, addr, f"/v1/job/{job_id}?purge=true", tok, "DELETE")
    finally:
        await server.ok("DELETE", f"/sandbox/{sid}", member)
    assert found == expected, json.dumps({k: v for k, v in found.items() if expected.get(k) != v}, indent=1)


async def test_the_files_api_stays_inside_the_container(server: Server) -> None:
    """The nomad driver's file primitives run as the sandbox user inside its container, so a
    path means what it means to the sandbox: `..` out of the workspace, absolute paths, and
    links planted by the sandbox (to /proc/1/root, init's view) reach the container's files
    or nothing, never the client's (whose /etc/hostname says `vm`). Before the first pass a
    path like these could have reached the host through a driver that resolved it there."""
    member = server.keys["alpha-member"]
    sid = await server.sandbox(member)
    try:
        assert (await server.sh(member, sid, "ln -s /proc/1/root initroot && ln -s /proc/1/environ initenv && "
                                             "ln -s / root"))[0] == 0
        found = {}
        for path in ("../../../../etc/hostname", "/etc/hostname", "root/etc/hostname", "initroot/etc/hostname",
                     "initenv", "/proc/1/environ", "/etc/shadow", "/proc/self/root/etc/hostname"):
            status, body = await server.call("GET", f"/fs/{sid}?path={path}", member)
            found[f"read {path}"] = (status, "Permission denied" in body.get("message", "")) if isinstance(body, dict) \
                else body.strip()
        for path in ("/etc/passwd", "../../../../etc/cron.d/x", "/proc/1/root/tmp/x", "initroot/tmp/x"):
            status, _ = await server.call("POST", f"/fs/{sid}", member,
                                          json={"files": [{"path": path, "content": "eA=="}]})
            found[f"write {path}"] = status
    finally:
        await server.ok("DELETE", f"/sandbox/{sid}", member)
    host_name = (await asyncio.to_thread(Path("/etc/hostname").read_text)).strip()
    assert not any(v == host_name for v in found.values()), found
    assert {k: v for k, v in found.items() if k.startswith("read")} == {
        "read ../../../../etc/hostname": "sandbox", "read /etc/hostname": "sandbox", "read root/etc/hostname": "sandbox",
        "read initroot/etc/hostname": (404, False), "read initenv": (400, True), "read /proc/1/environ": (400, True),
        "read /etc/shadow": (400, True), "read /proc/self/root/etc/hostname": "sandbox"}, found
    writes = {k: v for k, v in found.items() if k.startswith("write")}
    assert writes == {k: 400 for k in writes}, writes  # "Permission denied" or "No such file or directory"
