"""``tofu apply`` of infra/terraform/modules/hutch-on-nomad onto the cluster of
``./scripts/services start cluster``, sandboxes through the API it deployed, then
``tofu destroy``.

What it shows: the module's registry, PostgreSQL, Kafka and hutch API jobs come up on real
Nomad clients (exec driver) and pass their health checks; the API server, installed from a
wheelhouse built here and served to the clients as an artifact (with Kafka's jars, from the
cache ``scripts/services start kafka`` fills), runs with the module's default driver, ``node``:
it finds the module's own node agents in Nomad's catalog with its job's workload identity
(not hutch's token, which cannot read there), signs with the secret from its own Nomad
variable, and runs sandboxes on the agents, never as a Nomad job: a sandbox with egress off
runs a command and has a file written and read back, in a node agent's data dir, with no job
of it in ``default``; then the real SandboxClient does the same (tests/compat/compat.mjs).
The ``nomad`` driver is checked by plan only (the job it renders, the variable without the
node secret): one apply is all this test may cost. ``tofu destroy`` leaves none of the jobs,
Nomad variables, ACL policy and dynamic host volumes it made.

The node agents (issue 35): the module's hutch-node system job (raw_exec) in a namespace of its
own, the only one whose capabilities allow raw_exec, with ``default`` denying it; the agents'
secret in that namespace's Nomad variable; a short secret refused by the module before
anything is made. Here the job goes to a namespace and port of the test's own, beside the
agents ``services start cluster`` runs in hutch-system. Where a client offers raw_exec (the
cluster's template turns it on), the job is placed there, every placed agent answers its check
and is in the service catalog as the API's directory reads it; a client without raw_exec is
named by Nomad's placement failure.

The node agents build the sandboxes' runtimes in their HUTCH_RUNTIME_CACHE (on this one-box
cluster the host's, built already). The module's ``image_registry`` is the cluster's own registry
(HUTCH_TEST_CLUSTER_REGISTRY), what the nomad driver's plan names: the clients' hutch-containerd
trusts only that one over plain HTTP, so the registry job comes up and answers but holds no
images here.

The cluster runs with ACLs on, as the nomad-node template has it: OpenTofu deploys with its
management token (HUTCH_TEST_CLUSTER_OPERATOR_TOKEN); hutch's own token of the hutch-driver
policy (HUTCH_TEST_CLUSTER_TOKEN) is the module's api_nomad_token, which the node driver leaves
unused: the API job holds no token but its workload identity.

Needs: the cluster (HUTCH_TEST_CLUSTER_ADDR / REGISTRY / TOKEN / OPERATOR_TOKEN), Kafka's jar cache,
``npm ci`` in tests/compat, and scripts/tofu's build. Nothing skips. Takes 1.5-2 minutes here
(most of it Nomad hard-linking /usr into each exec task's chroot).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import http.server
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TOFU = REPO / "scripts" / "tofu"
TERRAFORM = REPO / "infra" / "terraform"
COMPAT = REPO / "tests" / "compat"
JOBS = ("hutch-registry", "hutch-postgres", "hutch-kafka", "hutch-api")
VARIABLES = ("nomad/jobs/hutch-postgres", "nomad/jobs/hutch-api")
API_POLICY = "hutch-api-nodes"  # the API job's own ACL policy (node driver): reading nodes
# The node agents of this test: beside (not instead of) those of the cluster in hutch-system.
NODE_NAMESPACE, NODE_PORT, NODE_VARIABLE = "hutch-tftest", 4751, "nomad/jobs/hutch-node"
UP_TIMEOUT = 240.0  # every job running and healthy, from the end of `tofu apply`

pytestmark = pytest.mark.timeout(600)


def _setting(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: start the cluster with ./scripts/services start cluster "
                    "(scripts/test does, and exports its settings)", pytrace=False)
    return value


class Nomad:
    """The few reads of Nomad's HTTP API this test makes."""

    def __init__(self, addr: str, token: str) -> None:
        self.addr, self.token = addr.rstrip("/"), token

    def get(self, path: str, *, raw: bool = False) -> Any:
        """The JSON (or text) at ``path``; None on a 404."""
        try:
            request = urllib.request.Request(self.addr + path, headers={"X-Nomad-Token": self.token})
            with urllib.request.urlopen(request, timeout=10) as resp:
                body = resp.read().decode(errors="replace")
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return None
            raise
        return body if raw else json.loads(body)

    def service(self, name: str) -> list[dict[str, Any]]:
        return self.get(f"/v1/service/{name}") or []

    def live_allocs(self, job: str) -> list[dict[str, Any]]:
        return [a for a in self.get(f"/v1/job/{job}/allocations") or []
                if a["ClientStatus"] in ("pending", "running")]

    def healthy(self, job: str) -> bool:
        """An allocation of the job runs and every one of its checks passes."""
        for alloc in self.live_allocs(job):
            if alloc["ClientStatus"] != "running":
                continue
            checks = self.get(f"/v1/client/allocation/{alloc['ID']}/checks") or {}
            if checks and all(c.get("Status") == "success" for c in checks.values()):
                return True
        return False

    def explain(self, job: str) -> str:
        """Why a job is not up: its allocations' task events and the tail of their stderr."""
        allocs = self.get(f"/v1/job/{job}/allocations")
        if allocs is None:
            return f"{job}: no such job"
        if not allocs:
            evals = self.get(f"/v1/job/{job}/evaluations") or []
            failed = [e.get("FailedTGAllocs") for e in evals if e.get("FailedTGAllocs")]
            return f"{job}: no allocation placed; {json.dumps(failed)[:1500]}"
        lines = []
        for alloc in sorted(allocs, key=lambda a: a["CreateIndex"])[-2:]:
            lines.append(f"{job}: allocation {alloc['ID'][:8]} on {alloc['NodeName']}: {alloc['ClientStatus']}")
            for task, state in (alloc.get("TaskStates") or {}).items():
                events = [f"{e['Type']}: {e.get('DisplayMessage', '')}" for e in state.get("Events") or []]
                lines.append(f"  task {task} {state['State']}; events: {' | '.join(events[-6:])}")
                query = urllib.parse.urlencode({"task": task, "type": "stderr", "plain": "true",
                                                "origin": "end", "offset": 3000})
                try:
                    tail = self.get(f"/v1/client/fs/logs/{alloc['ID']}?{query}", raw=True)
                except (OSError, ValueError) as err:
                    tail = f"<no log: {err}>"
                lines.append("  stderr: " + (tail or "").strip().replace("\n", "\n    "))
            if checks := self.get(f"/v1/client/allocation/{alloc['ID']}/checks"):
                lines.append("  checks: " + ", ".join(f"{c['Check']}={c['Status']}" for c in checks.values()))
        return "\n".join(lines)


def run(*args: str | Path, cwd: Path, timeout: float, env: dict[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"{' '.join(map(str, args))} did not finish in {timeout:.0f} s\n"
                    f"--- stdout\n{err.stdout!r}\n--- stderr\n{err.stderr!r}")
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, args))} (in {cwd}) exited {proc.returncode}\n"
                    f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    return proc


# ------------------------------------------------------------------------------- artifacts

def versions() -> tuple[str, str]:
    """hutch's version (pyproject.toml) and Kafka's (the services scripts' pom.xml)."""
    hutch_version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    pom = (REPO / "scripts" / "services.d" / "kafka" / "pom.xml").read_text()
    match = re.search(r"<kafka\.version>(.+?)</kafka\.version>", pom)
    assert match, "no <kafka.version> in scripts/services.d/kafka/pom.xml"
    return hutch_version, match.group(1)


def build_artifacts(out: Path, hutch_version: str, kafka_version: str) -> None:
    """hutch's wheelhouse and Kafka's jars, named as the module fetches them."""
    libs = Path(os.environ.get("HUTCH_CACHE_DIR") or "/var/cache/hutch") / "kafka" / kafka_version / "libs"
    if not (libs / ".complete").exists():
        raise RuntimeError(f"no Kafka {kafka_version} jars in {libs}: ./scripts/services start kafka fetches them")
    # The wheels of hutch and of everything it needs, for the clients' python3 (no index there).
    wheels = out.parent / "wheels"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "-w",
                           str(wheels), f"{REPO}[server]"], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"pip wheel exited {proc.returncode}: {proc.stderr[-3000:]}")
    for name, files in ((f"hutch-wheels-{hutch_version}.tar.gz", wheels.glob("*.whl")),
                        (f"kafka-libs-{kafka_version}.tgz", libs.glob("*.jar"))):
        with tarfile.open(out / f".{name}", "w:gz", compresslevel=1) as tar:
            for path in sorted(files):
                tar.add(path, arcname=path.name)
        (out / f".{name}").rename(out / name)


class Artifacts:
    """An HTTP server on this host's address on the cluster network (the module's
    artifact_base_url), serving the artifacts while a thread still builds them: Nomad builds
    the tasks' chroots first, so the build costs no time; a request waits until it is done."""

    def __init__(self, directory: Path, host: str) -> None:
        self.hutch_version, self.kafka_version = versions()
        self.built = threading.Event()
        self.error: str | None = None
        self.seconds = 0.0
        artifacts = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def send_head(self) -> Any:  # GET and HEAD both
                if not artifacts.built.wait(300) or artifacts.error:
                    self.send_error(503, "artifacts not built")
                    return None
                return super().send_head()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), functools.partial(Handler, directory=str(directory)))
        self.url = f"http://{host}:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        threading.Thread(target=self._build, args=(directory,), daemon=True).start()

    def _build(self, directory: Path) -> None:
        started = time.monotonic()
        try:
            build_artifacts(directory, self.hutch_version, self.kafka_version)
        except Exception as err:  # reported by wait(), and to the clients as a 503
            self.error = f"building the artifacts failed: {err}"
        self.seconds = time.monotonic() - started
        self.built.set()

    def wait(self) -> None:
        if not self.built.wait(400) or self.error:
            pytest.fail(self.error or "the artifacts were not built in 400 s", pytrace=False)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Artifacts]:
    directory = tmp_path_factory.mktemp("artifacts") / "served"
    directory.mkdir()
    served = Artifacts(directory, urllib.parse.urlsplit(_setting("HUTCH_TEST_CLUSTER_ADDR")).hostname or "")
    try:
        yield served
    finally:
        served.server.shutdown()
        served.server.server_close()


# ------------------------------------------------------------------------------- the root module

def write_root(tmp: Path) -> Path:
    """A root module using hutch-on-nomad, in a copy of infra/terraform (no init state in the repo)."""
    tree = tmp / "terraform"
    shutil.copytree(TERRAFORM, tree, ignore=shutil.ignore_patterns(
        ".terraform", ".terraform.lock.hcl", "*.tfstate*"))
    root = tree / "system-test"
    root.mkdir()
    (root / "main.tf").write_text('''
variable "nomad_addr" { type = string }
variable "artifact_base_url" { type = string }
variable "hutch_version" { type = string }
variable "kafka_version" { type = string }
variable "image_registry" { type = string }
variable "nomad_token" {
  type      = string
  sensitive = true
}
variable "api_nomad_token" {
  type      = string
  sensitive = true
}
variable "api_key" {
  type      = string
  sensitive = true
}
variable "postgres_password" {
  type      = string
  sensitive = true
}
variable "node_secret" {
  type      = string
  sensitive = true
}
variable "node_data_dir" { type = string }
variable "driver" {
  type    = string
  default = null # the module's default
}

provider "nomad" {
  address   = var.nomad_addr
  secret_id = var.nomad_token
}

module "hutch" {
  source            = "../modules/hutch-on-nomad"
  datacenters       = ["dc1"]
  driver            = var.driver
  nomad_addr        = var.nomad_addr
  nomad_token       = var.nomad_token
  api_nomad_token   = var.api_nomad_token
  artifact_base_url = var.artifact_base_url
  hutch_version     = var.hutch_version
  kafka_version     = var.kafka_version
  image_registry    = var.image_registry
  api_replicas      = 1
  api_key           = var.api_key
  postgres_password = var.postgres_password
  node_secret       = var.node_secret
  node_namespace    = "{NODE_NAMESPACE}"
  node_port         = {NODE_PORT}
  node_data_dir     = var.node_data_dir
}

output "node_agents" {
  value = module.hutch.node_agents
}

output "jobs" {
  value = module.hutch.jobs
}

output "variables" {
  value = module.hutch.variables
}

output "volumes" {
  value = module.hutch.volumes
}
'''.replace("{NODE_NAMESPACE}", NODE_NAMESPACE).replace("{NODE_PORT}", str(NODE_PORT)))
    return root


def tofu(*args: str, root: Path, timeout: float, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(TOFU, *args, cwd=root, timeout=timeout, check=check)


def wait_up(nomad: Nomad, applied: float, deadline: float) -> None:
    """Every job of the module runs with its checks passing, or a failure naming those that don't."""
    waiting = list(JOBS)
    while waiting:
        for job in [job for job in waiting if nomad.healthy(job)]:
            print(f"{job}: healthy {time.monotonic() - applied:.1f} s after tofu apply")
            waiting.remove(job)
        if waiting and time.monotonic() > deadline:
            pytest.fail(f"not up {UP_TIMEOUT:.0f} s after tofu apply: {', '.join(waiting)}\n"
                        + "\n".join(nomad.explain(job) for job in waiting), pytrace=False)
        time.sleep(1)


def api_url(nomad: Nomad, key: str, deadline: float) -> str:
    """The API server's address from its Nomad service, once it answers an authorized call."""
    last = "no hutch-api service registered"
    while time.monotonic() < deadline:
        for reg in nomad.service("hutch-api"):
            url = f"http://{reg['Address']}:{reg['Port']}"
            request = urllib.request.Request(url + "/sandbox/runtimes", headers={"Authorization": f"Bearer {key}"})
            try:
                with urllib.request.urlopen(request, timeout=5) as resp:
                    if json.loads(resp.read()).get("success") is True:
                        return url
            except (OSError, ValueError) as err:
                last = f"{url}: {err}"
        time.sleep(1)
    pytest.fail(f"the hutch API does not answer: {last}\n{nomad.explain('hutch-api')}", pytrace=False)


def leftovers(nomad: Nomad) -> list[str]:
    """What of the module's is still in Nomad."""
    left = [f"job {job}" for job in JOBS if nomad.get(f"/v1/job/{job}") is not None]
    left += [f"variable {path}" for path in VARIABLES if nomad.get(f"/v1/var/{path}") is not None]
    if nomad.get(f"/v1/acl/policy/{API_POLICY}") is not None:
        left.append(f"ACL policy {API_POLICY}")
    if nomad.get(f"/v1/namespace/{NODE_NAMESPACE}") is not None:
        left.append(f"namespace {NODE_NAMESPACE}")
        if nomad.get(f"/v1/job/hutch-node?namespace={NODE_NAMESPACE}") is not None:
            left.append(f"job hutch-node in {NODE_NAMESPACE}")
        if nomad.get(f"/v1/var/{NODE_VARIABLE}?namespace={NODE_NAMESPACE}") is not None:
            left.append(f"variable {NODE_VARIABLE} in {NODE_NAMESPACE}")
    volumes = nomad.get("/v1/volumes?type=host") or []
    left += [f"volume {v['Name']} ({v['ID']})" for v in volumes if v["Name"] in JOBS]
    return left


def node_pieces_made(nomad: Nomad, secret: str) -> None:
    """The node agents' namespaces, job and variable as the module made them."""
    namespace = nomad.get(f"/v1/namespace/{NODE_NAMESPACE}")
    assert namespace and namespace["Capabilities"]["EnabledTaskDrivers"] == ["raw_exec"], namespace
    default = nomad.get("/v1/namespace/default")
    assert "raw_exec" in ((default["Capabilities"] or {}).get("DisabledTaskDrivers") or []), default
    job = nomad.get(f"/v1/job/hutch-node?namespace={NODE_NAMESPACE}")
    assert job is not None, f"no job hutch-node in namespace {NODE_NAMESPACE}"
    group = job["TaskGroups"][0]
    task = group["Tasks"][0]
    assert (job["Type"], job["Priority"], task["Driver"]) == ("system", 90, "raw_exec"), job
    assert [(p["Label"], p["Value"]) for p in group["Networks"][0]["ReservedPorts"]] == [("agent", NODE_PORT)]
    service = group["Services"][0]
    assert (service["Name"], service["Provider"], service["PortLabel"]) == ("hutch-node", "nomad", "agent")
    assert [(c["Type"], c["Protocol"], c["TLSSkipVerify"], c["Path"]) for c in service["Checks"]] == \
        [("http", "https", True, "/healthz")], service["Checks"]
    template = task["Templates"][0]
    assert (template["DestPath"], template["Perms"]) == ("secrets/node.secret", "0400"), template
    assert f'nomadVar "{NODE_VARIABLE}"' in template["EmbeddedTmpl"], template
    assert task["Env"]["HUTCH_NODE_SECRET_FILE"] == "${NOMAD_SECRETS_DIR}/node.secret", task["Env"]
    assert secret not in json.dumps(job), "the node secret is in the job's text"
    variable = nomad.get(f"/v1/var/{NODE_VARIABLE}?namespace={NODE_NAMESPACE}")
    assert variable and variable["Items"] == {"secret": secret}, "the agents' variable does not hold the secret"


def node_agents_up(nomad: Nomad, deadline: float) -> dict[str, str]:
    """Every client runs an agent of the job: placed on each (the clients offer raw_exec for it),
    healthy and in the catalog the API reads."""
    from hutch.drivers.node.catalog import NomadAgentDirectory

    nodes = {n["Name"]: n for n in nomad.get("/v1/nodes") if n["Status"] == "ready"}
    without = sorted(name for name, n in nodes.items()
                     if not (n.get("Drivers") or {}).get("raw_exec", {}).get("Healthy"))
    assert not without, (f"clients without raw_exec: {without}; the cluster's template turns it on for the node "
                         "agents: ./scripts/services restart cluster with this checkout's scripts")
    query = f"?namespace={NODE_NAMESPACE}"

    def stderr(alloc: dict[str, Any]) -> str:
        return nomad.get(f"/v1/client/fs/logs/{alloc['ID']}{query}&task=agent&type=stderr&plain=true",
                         raw=True) or ""

    while True:
        allocs = [a for a in nomad.get(f"/v1/job/hutch-node/allocations{query}") or [] if a["DesiredStatus"] == "run"]
        placed = {a["NodeName"] for a in allocs}
        healthy = {a["NodeName"] for a in allocs if a["ClientStatus"] == "running"
                   and (checks := nomad.get(f"/v1/client/allocation/{a['ID']}/checks{query}") or {})
                   and all(c.get("Status") == "success" for c in checks.values())}
        if healthy == set(nodes):
            break
        if time.monotonic() > deadline:
            states = [f"{a['NodeName']}: {a['ClientStatus']}: {stderr(a)[-300:]}" for a in allocs]
            pytest.fail(f"node agents placed on {sorted(placed)} of {sorted(nodes)}, not up in time\n"
                        + "\n".join(states), pytrace=False)
        time.sleep(1)

    async def catalog() -> dict[str, str]:
        async with NomadAgentDirectory(nomad.addr, nomad.token, namespace=NODE_NAMESPACE) as directory:
            return await directory.agents()

    agents = asyncio.run(catalog())
    assert agents == {name: f"{n['Address']}:{NODE_PORT}" for name, n in nodes.items()}, agents
    return agents


def api_pieces_made(nomad: Nomad, secret: str) -> None:
    """The API job as the node driver has it: HUTCH_DRIVER=node, the agents' secret from its own
    variable rendered 0400 for its user, its workload identity as its only Nomad token; and
    hutch's own token no closer to the secret or the agents than before."""
    job = nomad.get("/v1/job/hutch-api")
    task = job["TaskGroups"][0]["Tasks"][0]
    env = next(t for t in task["Templates"] if t["DestPath"] == "secrets/hutch.env")["EmbeddedTmpl"]
    assert "HUTCH_DRIVER=node\n" in env and f"HUTCH_NODE_NAMESPACE={NODE_NAMESPACE}\n" in env, env
    assert "nomad_token" not in env, "the node driver's API job is given a token besides its identity"
    template = next(t for t in task["Templates"] if t["DestPath"] == "secrets/node.secret")
    assert (template["Perms"], template["Uid"], template["Gid"]) == ("0400", 65534, 65534), template
    assert 'nomadVar "nomad/jobs/hutch-api"' in template["EmbeddedTmpl"], template
    assert task["Env"]["HUTCH_NODE_SECRET_FILE"] == "${NOMAD_SECRETS_DIR}/node.secret", task["Env"]
    assert task["Identity"]["Env"] is True, task["Identity"]
    assert secret not in json.dumps(job), "the node secret is in the API job's text"
    variable = nomad.get("/v1/var/nomad/jobs/hutch-api")
    assert variable["Items"].get("node_secret") == secret, "the API's variable does not hold the node secret"
    assert "nomad_token" not in variable["Items"], "the node driver's API variable holds a Nomad token"
    policy = nomad.get(f"/v1/acl/policy/{API_POLICY}")
    assert policy and policy["JobACL"]["Namespace"] == "default" and policy["JobACL"]["JobID"] == "hutch-api", policy
    hutch = Nomad(nomad.addr, _setting("HUTCH_TEST_CLUSTER_TOKEN"))
    refused = {}
    for what, path in (("the API's variable", "/v1/var/nomad/jobs/hutch-api"),
                       ("the agents' variable", f"/v1/var/{NODE_VARIABLE}?namespace={NODE_NAMESPACE}"),
                       ("the agents' catalog", f"/v1/service/hutch-node?namespace={NODE_NAMESPACE}")):
        try:
            hutch.get(path)
            refused[what] = 200
        except urllib.error.HTTPError as err:
            refused[what] = err.code
    assert refused == {"the API's variable": 403, "the agents' variable": 403, "the agents' catalog": 403}, refused


def plan_nomad_driver(root: Path) -> None:
    """driver = "nomad", planned only (the one apply runs the default): the API job as before
    the node driver (hutch's token, the registry, warm pools), no node secret, no policy."""
    tofu("plan", "-input=false", "-no-color", "-var", "driver=nomad", "-out", "nomad.plan", root=root, timeout=120)
    shown = json.loads(tofu("show", "-json", "nomad.plan", root=root, timeout=60).stdout)
    (root / "nomad.plan").unlink()
    after = {rc["address"]: rc["change"]["after"] for rc in shown["resource_changes"]}
    spec = after["module.hutch.nomad_job.hutch"]["jobspec"]
    for line in ("HUTCH_DRIVER=nomad\n", "HUTCH_NOMAD_POOL=off\n", "HUTCH_NOMAD_TOKEN={{ .nomad_token }}\n",
                 f"HUTCH_NOMAD_REGISTRY={_setting('HUTCH_TEST_CLUSTER_REGISTRY')}\n"):
        assert line in spec, f"{line!r} not in the nomad driver's API job:\n{spec}"
    assert "node.secret" not in spec and "identity" not in spec, spec
    assert sorted(after["module.hutch.nomad_variable.api"]["items"]) == ["api_key", "nomad_token", "postgres_password"]
    assert not [a for a in after if "api_nodes" in a], sorted(after)


def api_call(url: str, key: str, method: str, path: str, body: Any = None, timeout: float = 60) -> bytes:
    request = urllib.request.Request(url + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.read()
    except urllib.error.HTTPError as err:
        pytest.fail(f"{method} {path} through the module's API: {err.code} {err.read()[:2000]!r}", pytrace=False)


def sandbox_through_module_api(nomad: Nomad, url: str, key: str, agents_dir: Path) -> str:
    """A sandbox with egress off through the module's API (the node driver): a file written, a
    command that reads it and lists the network interfaces, the file read back. It runs on a
    node agent (its directory is in that agent's data dir), and no Nomad job is made for it."""
    sid = json.loads(api_call(url, key, "POST", "/sandbox", {"runtime": "base:latest", "network": {"enabled": False}},
                              timeout=120))["data"]["sandboxId"]
    try:
        on = [d.name for d in agents_dir.iterdir() if (d / "sandboxes" / sid).is_dir()]
        assert len(on) == 1, f"sandbox {sid} is in the data dirs of agents {on} (of {sorted(agents_dir.iterdir())})"
        note = b"from the terraform-deployed API\n"
        api_call(url, key, "POST", f"/fs/{sid}", {"files": [{"path": "/workspace/note.txt",
                                                             "content": base64.b64encode(note).decode()}]})
        ex = json.loads(api_call(url, key, "POST", f"/sandbox/{sid}/execute",
                                 {"command": ["sh", "-c", "cat /workspace/note.txt; cat /proc/net/dev"]}))["data"]
        with urllib.request.urlopen(ex["stdoutStreamUrl"], timeout=60) as resp:
            out = resp.read().decode()
        done = json.loads(api_call(url, key, "GET", f"/sandbox/execution/{ex['executionId']}?wait=30s"))["data"]
        assert done["exitCode"] == 0 and out.startswith(note.decode()), (done, out)
        interfaces = sorted(line.split(":")[0].strip() for line in out.splitlines()[3:] if ":" in line)
        assert interfaces == ["lo"], f"egress off, yet the sandbox has {interfaces}:\n{out}"
        assert api_call(url, key, "GET", f"/fs/{sid}?path=/workspace/note.txt") == note
        # The nomad driver names a sandbox's job after it (warm pools are off in this root).
        jobs = [j["ID"] for j in nomad.get("/v1/jobs?namespace=default") or []]
        assert not [j for j in jobs if sid in j], f"a Nomad job was made for sandbox {sid}: {jobs}"
    except BaseException:
        with contextlib.suppress(OSError):  # what failed first is the report
            urllib.request.urlopen(urllib.request.Request(f"{url}/sandbox/{sid}", method="DELETE", headers={
                "Authorization": f"Bearer {key}"}), timeout=30).close()
        raise
    api_call(url, key, "DELETE", f"/sandbox/{sid}")
    deadline = time.monotonic() + 30
    while (agents_dir / on[0] / "sandboxes" / sid).exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not (agents_dir / on[0] / "sandboxes" / sid).exists(), f"agent {on[0]} kept a deleted sandbox"
    return on[0]


def compat_run(url: str, key: str) -> str:
    """The real @agentuity/core SandboxClient runs a command with files through the API."""
    if not (COMPAT / "node_modules" / "@agentuity" / "core").is_dir():
        pytest.fail(f"no node_modules in {COMPAT}: run `npm ci` there (tests/compat/setup.sh)", pytrace=False)
    env = {**os.environ, "HUTCH_URL": url, "HUTCH_API_KEY": key,
           "HUTCH_COMPAT_ONLY": "run: files + env", "HUTCH_COMPAT_CHECK_TIMEOUT_MS": "150000"}
    proc = run("node", "compat.mjs", cwd=COMPAT, timeout=200, env=env, check=False)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("1 passed, 0 failed"), (
        f"compat.mjs through the Terraform-deployed API:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


# ------------------------------------------------------------------------------- the test

def test_apply_run_a_sandbox_destroy(
    artifacts: Artifacts, tmp_path: Path
) -> None:
    started = time.monotonic()
    nomad = Nomad(_setting("HUTCH_TEST_CLUSTER_ADDR"), _setting("HUTCH_TEST_CLUSTER_OPERATOR_TOKEN"))
    if stale := leftovers(nomad):
        pytest.fail(f"the cluster already has {', '.join(stale)}: another run of this test, or one that "
                    "could not clean up; remove them with nomad job stop -purge, nomad volume delete -type "
                    "host, nomad var purge", pytrace=False)
    root = write_root(tmp_path)
    key, password = "hutch_" + secrets.token_urlsafe(24), secrets.token_hex(16)
    variables = {"nomad_addr": nomad.addr, "artifact_base_url": artifacts.url,
                 "hutch_version": artifacts.hutch_version, "kafka_version": artifacts.kafka_version,
                 "image_registry": _setting("HUTCH_TEST_CLUSTER_REGISTRY"),
                 "nomad_token": nomad.token, "api_nomad_token": _setting("HUTCH_TEST_CLUSTER_TOKEN"),
                 "api_key": key, "postgres_password": password,
                 "node_secret": secrets.token_hex(32), "node_data_dir": str(tmp_path / "agents")}
    (root / "test.auto.tfvars.json").write_text(json.dumps(variables))
    timings: dict[str, float] = {}
    tofu("init", "-backend=false", "-input=false", "-no-color", root=root, timeout=120)
    # A short node secret: refused by the module's validation, naming it, before anything is made.
    short = tofu("plan", "-input=false", "-no-color", "-var", "node_secret=too-short", root=root, timeout=120,
                 check=False)
    assert short.returncode != 0 and "node_secret: at least 32 characters" in short.stderr, short.stderr
    bogus = tofu("plan", "-input=false", "-no-color", "-var", "driver=containerd", root=root, timeout=120, check=False)
    assert bogus.returncode != 0 and 'driver: "node" (sandboxes on the node agents) or "nomad"' in bogus.stderr, (
        bogus.stderr)
    plan_nomad_driver(root)
    try:
        mark = time.monotonic()
        tofu("apply", "-auto-approve", "-input=false", "-no-color", root=root, timeout=180)
        timings["apply"] = time.monotonic() - mark
        outputs = json.loads(tofu("output", "-json", root=root, timeout=60).stdout)
        assert outputs["jobs"]["value"] == list(JOBS), outputs["jobs"]
        assert outputs["variables"]["value"] == list(VARIABLES), outputs["variables"]
        assert set(outputs["volumes"]["value"]) == set(JOBS), outputs["volumes"]
        assert outputs["node_agents"]["value"] == {
            "namespace": NODE_NAMESPACE, "job": "hutch-node", "service": "hutch-node",
            "variable": NODE_VARIABLE, "port": NODE_PORT}, outputs["node_agents"]
        node_pieces_made(nomad, variables["node_secret"])
        api_pieces_made(nomad, variables["node_secret"])

        mark = time.monotonic()
        artifacts.wait()
        timings["artifacts (overlapped)"] = artifacts.seconds
        wait_up(nomad, mark, mark + UP_TIMEOUT)
        url = api_url(nomad, key, mark + UP_TIMEOUT)
        timings["up"] = time.monotonic() - mark
        agents = node_agents_up(nomad, mark + UP_TIMEOUT)
        timings["node agents up"] = time.monotonic() - mark
        print(f"node agents: {agents}")
        mark = time.monotonic()
        ran_on = sandbox_through_module_api(nomad, url, key, tmp_path / "agents")
        timings["sandbox through the module's API"] = time.monotonic() - mark
        print(f"a sandbox ran through the module's API on the agent of {ran_on}")
        # The registry job answers the OCI distribution API on its service address.
        reg = nomad.service("hutch-registry")[0]
        with urllib.request.urlopen(f"http://{reg['Address']}:{reg['Port']}/v2/", timeout=5) as resp:
            assert resp.status == 200

        mark = time.monotonic()
        compat_run(url, key)
        timings["compat"] = time.monotonic() - mark
    finally:
        mark = time.monotonic()
        destroyed = tofu("destroy", "-auto-approve", "-input=false", "-no-color", root=root, timeout=300,
                         check=False)
        timings["destroy"] = time.monotonic() - mark
        if destroyed.returncode != 0:  # shown with whatever failed first
            print(f"tofu destroy exited {destroyed.returncode}:\n{destroyed.stdout[-4000:]}\n{destroyed.stderr}")
        print(f"timings (s): {json.dumps({k: round(v, 1) for k, v in timings.items()})}, "
              f"total {time.monotonic() - started:.0f}")
    assert destroyed.returncode == 0, f"tofu destroy failed:\n{destroyed.stdout[-4000:]}\n{destroyed.stderr}"
    state = tofu("state", "list", root=root, timeout=60).stdout.split()
    assert state == [], f"tofu destroy left these in its state: {state}"
    left = leftovers(nomad)
    assert not left, f"tofu destroy left behind: {', '.join(left)}"
