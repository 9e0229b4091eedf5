"""The node agents' way in, from the attacker's side (issue 35): on the cluster the clients run
``raw_exec`` for the hutch-node system job (root, host namespaces: what the agent needs), and
only the namespace ``hutch-system`` may use it. Whoever holds the hutch API's Nomad token (the
hutch-driver policy: a compromised API server, a leaked token) tries to get that root:

- a raw_exec job in ``default``, where the token may submit, is refused at registration by the
  namespace's capabilities (Nomad's servers check them: ``taskValidateDriver``) and is not
  registered;
- a job of any driver in ``hutch-system`` is refused (no submit right there), as are the
  agents' secret (the Nomad variable ``nomad/jobs/hutch-node``) and a new namespace or a change
  of ``default``'s capabilities;
- so is an ACL policy attached to a job of its own (what infra/terraform gives the API job's
  workload identity with the node driver: a job it submits would carry whatever rules it wrote);
- what it may do there is read the ``hutch-node`` service registrations (the catalog).

Against the cluster of ``./scripts/services start cluster`` (its ACL set-up: cluster.sh
``acl_setup``, the same rules as infra/terraform's hutch-on-nomad module); nothing skips.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest

SYSTEM = "hutch-system"


def _setting(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: start the cluster with ./scripts/services start cluster", pytrace=False)
    return value


def call(method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(_setting("HUTCH_TEST_CLUSTER_ADDR") + path, data=data, method=method,
                                     headers={"X-Nomad-Token": token})
    try:
        with urllib.request.urlopen(request, timeout=20) as resp:
            text = resp.read().decode()
            return resp.status, json.loads(text) if text.strip() else None
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace").strip()


def job(job_id: str, namespace: str, driver: str) -> dict[str, Any]:
    config = {"command": "/bin/sh", "args": ["-c", "id > /tmp/owned"]} if driver != "mock_driver" else {}
    return {"Job": {"ID": job_id, "Name": job_id, "Namespace": namespace, "Type": "batch", "Datacenters": ["*"],
                    "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": driver, "Config": config}]}]}}


def test_the_hutch_api_token_gets_no_raw_exec_and_nothing_of_hutch_system() -> None:
    token = _setting("HUTCH_TEST_CLUSTER_TOKEN")
    operator = _setting("HUTCH_TEST_CLUSTER_OPERATOR_TOKEN")
    found: dict[str, Any] = {}
    attempts = {
        "raw_exec in default": ("default", "raw_exec"),
        "raw_exec in hutch-system": (SYSTEM, "raw_exec"),
        "hutch-containerd in hutch-system": (SYSTEM, "hutch-containerd"),
    }
    for what, (namespace, driver) in attempts.items():
        job_id = f"hutch-attacker-{uuid.uuid4().hex[:8]}"
        status, answer = call("PUT", f"/v1/jobs?namespace={namespace}", token, job(job_id, namespace, driver))
        registered, _ = call("GET", f"/v1/job/{job_id}?namespace={namespace}", operator)
        if registered == 200:  # the attack worked: take its job away again
            call("DELETE", f"/v1/job/{job_id}?purge=true&namespace={namespace}", operator)
        found[what] = {"status": status, "registered": registered == 200,
                       "answer": answer if isinstance(answer, str) else "accepted"}
    found["the agents' secret"] = call("GET", f"/v1/var/nomad/jobs/hutch-node?namespace={SYSTEM}", token)[0]
    found["a new namespace"] = call("PUT", "/v1/namespace/hutch-attacker", token,
                                    {"Name": "hutch-attacker"})[0]
    found["default's capabilities"] = call("PUT", "/v1/namespace/default", token,
                                           {"Name": "default", "Capabilities": None})[0]
    found["a policy for its own job"] = call("POST", "/v1/acl/policy/hutch-attacker", token, {
        "Name": "hutch-attacker", "Rules": 'namespace "*" { policy = "write" }\nnode { policy = "write" }',
        "JobACL": {"Namespace": "default", "JobID": "hutch-attacker"}})[0]
    if call("GET", "/v1/acl/policy/hutch-attacker", operator)[0] == 200:  # the attack worked: undo it
        call("DELETE", "/v1/acl/policy/hutch-attacker", operator)
    found["the catalog"] = call("GET", f"/v1/service/hutch-node?namespace={SYSTEM}", token)[0]

    default_refusal = 'used task driver "raw_exec" is not allowed in namespace "default"'
    assert found == {
        "raw_exec in default": {"status": 500, "registered": False,
                                "answer": found["raw_exec in default"]["answer"]},
        "raw_exec in hutch-system": {"status": 403, "registered": False, "answer": "Permission denied"},
        # Nomad checks the namespace's drivers before the token's rights: refused either way.
        "hutch-containerd in hutch-system": {
            "status": 500, "registered": False,
            "answer": '1 error occurred:\n\t* used task driver "hutch-containerd" is not allowed in namespace '
                      '"hutch-system"'},
        "the agents' secret": 403,
        "a new namespace": 403,
        "default's capabilities": 403,
        "a policy for its own job": 403,
        "the catalog": 200,
    }, json.dumps(found, indent=1)
    assert default_refusal in found["raw_exec in default"]["answer"], found["raw_exec in default"]


def test_the_namespaces_allow_raw_exec_only_in_hutch_system() -> None:
    """What the refusals above stand on, as the servers hold it; and that the operator (a
    management token, what deploys the system job) may use raw_exec in hutch-system and in no
    other namespace (a plan runs the same checks as a registration and places nothing)."""
    operator = _setting("HUTCH_TEST_CLUSTER_OPERATOR_TOKEN")
    capabilities = {}
    for name in ("default", SYSTEM):
        status, ns = call("GET", f"/v1/namespace/{name}", operator)
        assert status == 200, f"namespace {name}: {status} {ns}"
        capabilities[name] = ns["Capabilities"]
    assert capabilities[SYSTEM]["EnabledTaskDrivers"] == ["raw_exec"], capabilities
    assert "raw_exec" in capabilities["default"]["DisabledTaskDrivers"], capabilities
    planned = {}
    for namespace, driver in (("default", "raw_exec"), (SYSTEM, "raw_exec"), (SYSTEM, "exec")):
        status, answer = call("PUT", f"/v1/job/plan-probe/plan?namespace={namespace}", operator,
                              job("plan-probe", namespace, driver))
        planned[f"{driver} in {namespace}"] = status if status == 200 else (status, answer)
    assert planned == {
        "raw_exec in default": (500, '1 error occurred:\n\t* used task driver "raw_exec" is not allowed in '
                                     'namespace "default"'),
        f"raw_exec in {SYSTEM}": 200,
        f"exec in {SYSTEM}": (500, f'1 error occurred:\n\t* used task driver "exec" is not allowed in '
                                   f'namespace "{SYSTEM}"'),
    }, json.dumps(planned, indent=1)
