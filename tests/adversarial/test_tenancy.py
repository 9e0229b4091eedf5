"""Attacks on tenancy, keys, SSH keys and input limits (issue 32), each as an attacker would
make it: a server with two organizations (alpha, beta) and keys of every role, on both
profiles. The API layer decides all of these, so the fake driver carries most of them;
those that need a real process (a command to cancel, an ``ssh`` login, an env as big as
the kernel takes) run on the local driver."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import gc
import io
import json
import tracemalloc
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import pytest
from aiohttp import web

from hutch.api.keys import ENGINE, SSH_GATEWAY, TENANTS
from tests.api.conftest import AUTH, Api, AppFactory
from tests.api.test_ssh import Gateway
from tests.api.test_tenancy import (
    PUBLIC_ROUTES,
    bearer,
    canonical,
    fill,
    new_key,
    new_org,
    params_of,
    routes_of,
)


@pytest.fixture
def driver_name() -> str:
    return "fake"


MISSING = {"name": "cobol:1", "ssh_key_id": "ssk_" + "0" * 26, "sandbox_id": "sbx_" + "0" * 26,
           "execution_id": "exec_" + "0" * 26, "job_id": "job_" + "0" * 26, "checkpoint_id": "ckpt_" + "0" * 26,
           "snapshot_id": "snp_" + "0" * 26, "key_id": "key_" + "0" * 26, "org_id": "org_alpha",
           "stream_id": "stin_" + "0" * 32, "project_id": "proj_" + "0" * 26, "tail": "agents", "node": "n_nobody"}


def deep(levels: int) -> bytes:
    """A body whose ``env`` is ``levels`` lists deep; ``orgId`` first, as the auth looks for it."""
    return b'{"orgId": "org_alpha", "env": ' + b"[" * levels + b"]" * levels + b"}"


async def test_deeply_nested_json_is_a_400_naming_the_body_on_every_route(api: Api) -> None:
    """100,000 nested lists were a 500 (RecursionError in the decoder); 100 are past any
    body hutch takes. Every route that reads JSON answers 400 naming the body; none a 500."""
    await new_org(api, "alpha")
    admin = bearer((await new_key(api, "org_alpha", "admin"))["secret"])
    sid = (await api.data("POST", "/sandbox", headers=admin, json={}, expect=201))["sandboxId"]
    for levels in (100_000, 100):
        for path in ("/sandbox", f"/sandbox/{sid}/execute", f"/sandbox/env/{sid}", "/keys", "/ssh-keys",
                     "/projects", "/orgs/org_alpha/quota"):
            method = "PATCH" if path.startswith(("/sandbox/env", "/orgs")) else "POST"
            resp = await api.client.request(method, path, data=deep(levels), headers={
                **admin, "Content-Type": "application/json"})
            body = await resp.json()
            if resp.status == 403:  # refused before the body is read (the quota is the operator's)
                continue
            assert (resp.status, body.get("field")) == (400, "body"), (levels, method, path, resp.status, body)
            assert "nested" in body["message"], body
    # Every other route that takes a body: never a 500, whatever it does with it.
    swept = 0
    for route in routes_of(api):
        if route.method not in ("POST", "PUT", "PATCH", "*") or canonical(route) in PUBLIC_ROUTES:
            continue
        resp = await api.client.request("POST" if route.method == "*" else route.method, fill(route, MISSING),
                                        data=deep(100_000), headers={**admin, "Content-Type": "application/json"})
        text = await resp.text()
        assert resp.status != 500, (route.method, route.resource.canonical, resp.status, text[:300])
        if resp.status == 400 and resp.content_type == "application/json":
            assert json.loads(text).get("field") in ("body", None) or "nested" not in text, text[:300]
        swept += 1
    assert swept >= 30


async def test_a_tenant_admin_reads_its_quota_but_only_the_operator_sets_it(api: Api) -> None:
    """An admin of alpha set ``sandboxes: 100000`` and lifted the operator's memory cap. The
    quota is the operator's (the bootstrap key): the tenant reads it, and a change is 403."""
    await new_org(api, "alpha")
    await api.data("PATCH", "/orgs/org_alpha/quota", json={"sandboxes": 2, "memoryBytes": 2**30})  # the operator
    admin = bearer((await new_key(api, "org_alpha", "admin"))["secret"])
    for attempt in ({"sandboxes": 100_000}, {"memoryBytes": None}, {"sandboxes": 100_000, "orgId": "org_alpha"}):
        refused = await api.call("PATCH", "/orgs/org_alpha/quota", headers=admin, json=attempt, expect=403)
        assert refused["code"] == "FORBIDDEN" and "administrator" in refused["message"], refused
    seen = await api.data("GET", "/orgs/org_alpha", headers=admin)
    assert seen["quota"]["sandboxes"] == 2 and seen["quota"]["memoryBytes"] == 2**30
    assert seen["usage"]["sandboxes"] == 0
    changed = await api.data("PATCH", "/orgs/org_alpha/quota", json={"sandboxes": 3})
    assert changed["quota"] == {**seen["quota"], "sandboxes": 3}


GRACE = 0.6  # the "every waiter went away" grace, shortened (api/watchers.py)


async def leave_early(api: Api, path: str, headers: dict[str, str], after: float = 0.4) -> None:
    """A client that starts waiting, then drops its connection (an aborted fetch)."""
    async with aiohttp.ClientSession() as session:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(after), session.get(api.client.make_url(path), headers=headers) as resp:
                await resp.read()


async def status_of(api: Api, execution_id: str, headers: dict[str, str]) -> str:
    """Without ``wait``: a long-poll would itself be a waiter."""
    return str((await api.data("GET", f"/sandbox/execution/{execution_id}", headers=headers))["status"])


@pytest.mark.parametrize("driver_name", ["fake", "local"])
async def test_readers_that_may_not_write_cannot_cancel_a_command(api: Api) -> None:
    """A read-only key's long-poll and a keyless reader of the stream URL (a read capability)
    that disconnect were taken as "every waiter went away" and cancelled the command. Only a
    waiter that may act on the sandbox counts: readers leaving, alone or together, and a
    reader sending a read-only key, leave it running; a member's long-poll leaving ends it."""
    await new_org(api, "alpha")
    member = bearer((await new_key(api, "org_alpha", "member"))["secret"])
    reader = bearer((await new_key(api, "org_alpha", "read-only"))["secret"])
    api.client.app[ENGINE].watchers.grace = GRACE
    sid = (await api.data("POST", "/sandbox", headers=member, json={"runtime": "base:latest"}, expect=201))["sandboxId"]
    ex = await api.data("POST", f"/sandbox/{sid}/execute", headers=member, json={"command": ["sleep", "60"]})
    exec_id = ex["executionId"]
    for _ in range(100):
        if await status_of(api, exec_id, member) == "running":
            break
        await asyncio.sleep(0.05)
    stream = "/" + ex["stdoutStreamUrl"].split("://", 1)[1].split("/", 1)[1]
    poll = f"/sandbox/execution/{exec_id}?wait=30s"
    await asyncio.gather(leave_early(api, poll, reader), leave_early(api, stream, {}))
    await leave_early(api, stream, reader)  # a read-only key on a stream read is a reader too
    await asyncio.sleep(GRACE * 3)
    assert await status_of(api, exec_id, member) == "running"
    # The control: the member's own long-poll leaving is what "stop it" means.
    await leave_early(api, poll, member)
    for _ in range(100):
        if await status_of(api, exec_id, member) != "running":
            break
        await asyncio.sleep(0.1)
    done = await api.data("GET", f"/sandbox/execution/{exec_id}", headers=member)
    assert done["status"] == "cancelled" and "went away" in done["error"], done


@pytest.fixture
async def gateway(make_api: AppFactory, tmp_path: Path) -> Gateway:
    """A server with its SSH gateway, driven with OpenSSH's own client (tests/api/test_ssh.py)."""
    api = await make_api(ssh_port=0)
    return Gateway(api, api.client.server.app[SSH_GATEWAY].port, tmp_path)  # type: ignore[attr-defined]


def in_seconds(seconds: float) -> str:
    return (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


async def sandbox_of(api: Api, headers: dict[str, str]) -> str:
    return str((await api.data("POST", "/sandbox", headers=headers, json={"runtime": "base:latest"},
                               expect=201))["sandboxId"])


@pytest.mark.parametrize("driver_name", ["local"])
async def test_revoking_an_api_key_ends_the_ssh_keys_it_registered(gateway: Gateway) -> None:
    """Off-boarding: ``ssh … 'echo STILL-IN'`` still worked after the API key that registered
    the SSH key was revoked. An SSH key dies with the API key that added it (revoked, or
    expired), and leaves the organization's list; the others' keys go on working."""
    gw, api = gateway, gateway.api
    await new_org(api, "alpha")
    admin = bearer((await new_key(api, "org_alpha", "admin"))["secret"])
    leaver = await api.data("POST", "/keys", headers=admin, json={"role": "member"}, expect=201)
    temp = await api.data("POST", "/keys", headers=admin, json={"role": "member", "expires": in_seconds(4)},
                          expect=201)
    stays = gw.keygen("id_stays")
    keys = {name: gw.keygen(name) for name in ("id_leaver", "id_temp")}
    for name, owner in (("id_leaver", leaver), ("id_temp", temp)):
        await api.data("POST", "/ssh-keys", headers=bearer(owner["secret"]), expect=201,
                       json={"publicKey": keys[name].with_suffix(".pub").read_text()})
    await api.data("POST", "/ssh-keys", headers=admin, json={"publicKey": stays.with_suffix(".pub").read_text()},
                   expect=201)
    sid = await sandbox_of(api, admin)
    code, out, err = await gw.ssh(keys["id_leaver"], sid, "echo STILL-IN")
    assert (code, out) == (0, "STILL-IN\n"), err
    await api.data("DELETE", f"/keys/{leaver['id']}", headers=admin)
    expires = dt.datetime.fromisoformat(temp["expiresAt"].replace("Z", "+00:00"))
    await asyncio.sleep(max(0.0, (expires - dt.datetime.now(dt.UTC)).total_seconds()) + 1)
    for gone in ("id_leaver", "id_temp"):
        code, out, err = await gw.ssh(keys[gone], sid, "echo STILL-IN")
        assert code == 255 and out == "" and "Permission denied (publickey)" in err, (gone, code, out, err)
    listed = (await api.data("GET", "/ssh-keys", headers=admin))["sshKeys"]
    assert [k["name"] for k in listed] == ["id_stays@test"], listed
    assert (await gw.ssh(stays, sid, "echo IN"))[:2] == (0, "IN\n")


@pytest.mark.parametrize("driver_name", ["local"])
async def test_a_public_key_squatted_by_another_organization_locks_nobody_out(gateway: Gateway) -> None:
    """Beta registered alice's public key first, so alice's own registration in alpha failed
    ("registered already (in another organization)"): a lock-out, and an oracle telling
    anyone whether a public key is in use. Now both registrations stand, each opening its
    own organization's sandboxes only, and registering says nothing of other organizations."""
    gw, api = gateway, gateway.api
    await new_org(api, "alpha")
    await new_org(api, "beta")
    alpha = bearer((await new_key(api, "org_alpha", "member"))["secret"])
    beta = bearer((await new_key(api, "org_beta", "member"))["secret"])
    alice, fresh = gw.keygen("id_alice"), gw.keygen("id_fresh")
    squat = await api.data("POST", "/ssh-keys", headers=beta, expect=201,
                           json={"publicKey": alice.with_suffix(".pub").read_text()})
    alphas, betas = await sandbox_of(api, alpha), await sandbox_of(api, beta)
    # Alice's registration answers exactly as a key nobody registered does.
    answers = []
    for key in (alice, fresh):
        resp = await api.client.post("/ssh-keys", headers=alpha, json={"publicKey": key.with_suffix(".pub").read_text()})
        body = await resp.json()
        answers.append((resp.status, sorted(body["data"]) if "data" in body else body))
    assert answers[0] == answers[1] and answers[0][0] == 201, answers
    mine = [k for k in (await api.data("GET", "/ssh-keys", headers=alpha))["sshKeys"] if k["name"] == "id_alice@test"]
    assert len(mine) == 1 and mine[0]["orgId"] == "org_alpha" and mine[0]["id"] != squat["id"]
    assert (await gw.ssh(alice, alphas, "echo alpha"))[:2] == (0, "alpha\n")
    assert (await gw.ssh(alice, betas, "echo beta"))[:2] == (0, "beta\n")  # beta's registration: beta's own
    # Alpha removes hers: beta's registration opens nothing of alpha's.
    await api.data("DELETE", f"/ssh-keys/{mine[0]['id']}", headers=alpha)
    code, out, err = await gw.ssh(alice, alphas, "echo alpha")
    assert code == 255 and out == "" and "Permission denied (publickey)" in err, (code, out, err)
    assert (await gw.ssh(alice, betas, "echo beta"))[:2] == (0, "beta\n")
    # Beta's list holds beta's record only; a second registration in one organization is refused.
    assert [k["orgId"] for k in (await api.data("GET", "/ssh-keys", headers=beta))["sshKeys"]] == ["org_beta"]
    again = await api.call("POST", "/ssh-keys", headers=beta, json={"publicKey": alice.with_suffix(".pub").read_text()},
                           expect=400)
    assert "in this organization" in again["message"] and "another" not in again["message"]


MARK = "other-project-secret-5e1d"


def _snapshot_routes(api: Api) -> list[web.AbstractRoute]:
    """Every route about snapshots, checkpoints or forks, but the public ones."""
    return [r for r in routes_of(api) if canonical(r) not in PUBLIC_ROUTES
            and any(word in r.resource.canonical for word in ("snapshot", "checkpoint", "/fork"))]


async def test_a_project_limited_key_reaches_no_snapshot_of_another_project(api: Api) -> None:
    """Snapshots recorded ``projectId: null``, so a key limited to project ``web`` listed,
    read, downloaded and created from snapshots of project ``other`` and of org-level
    sandboxes. A snapshot (a fork's too) belongs to its sandbox's project; checkpoints are
    their sandbox's. Every snapshot, checkpoint and fork route, given another project's ids
    by the web key, answers as an id that never existed does, and changes nothing."""
    await new_org(api, "alpha")
    admin = bearer((await new_key(api, "org_alpha", "admin"))["secret"])
    web_id = (await api.data("POST", "/projects", headers=admin, json={"name": "web"}, expect=201))["id"]
    other_id = (await api.data("POST", "/projects", headers=admin, json={"name": "other"}, expect=201))["id"]
    webkey = bearer((await api.data("POST", "/keys", headers=admin, expect=201,
                                    json={"role": "member", "projects": ["web"]}))["secret"])
    files = {"files": [{"path": "secret.txt", "content": base64.b64encode(MARK.encode()).decode()}]}

    async def sandbox(headers: dict[str, str], **spec: Any) -> str:
        sid = (await api.data("POST", "/sandbox", headers=headers, json=spec, expect=201))["sandboxId"]
        await api.call("POST", f"/fs/{sid}", headers=headers, json=files)
        return str(sid)

    async def snapshot(headers: dict[str, str], sid: str, name: str, tag: str = "v1") -> dict[str, Any]:
        return dict(await api.data("POST", f"/sandbox/{sid}/snapshot", headers=headers, expect=201,
                                   json={"name": name, "tag": tag}))

    theirs_sbx = await sandbox(admin, projectId="other")
    org_sbx = await sandbox(admin)
    snap_other = await snapshot(admin, theirs_sbx, "othersnap")
    snap_org = await snapshot(admin, org_sbx, "orgsnap")
    assert (snap_other.get("projectId"), snap_org.get("projectId")) == (other_id, None)
    checkpoint = (await api.data("POST", f"/sandbox/{theirs_sbx}/checkpoint", headers=admin, json={"name": "cp"},
                                 expect=201))["id"]
    forked = await api.data("POST", f"/sandbox/{theirs_sbx}/fork", headers=admin, json={"count": 1}, expect=201)
    fork_snap = await api.data("GET", f"/sandbox/snapshots/{forked['snapshotId']}", headers=admin)
    assert fork_snap["projectId"] == other_id and forked["sandboxes"][0]["projectId"] == other_id
    build = await api.data("POST", "/sandbox/snapshots/build", headers=admin, json={"runtime": "base:latest"},
                           expect=201)
    # What the web key may have: its own sandbox's snapshot and fork, and a web sandbox made
    # (by the admin) from another project's snapshot, whose lineage must stop at its own.
    mine = await sandbox(webkey)
    snap_web = await snapshot(webkey, mine, "websnap")
    assert snap_web["projectId"] == web_id
    web_fork = await api.data("POST", f"/sandbox/{mine}/fork", headers=webkey, json={"count": 1}, expect=201)
    assert (await api.data("GET", f"/sandbox/snapshots/{web_fork['snapshotId']}", headers=webkey))[
        "projectId"] == web_id
    web_build = await api.data("POST", "/sandbox/snapshots/build", headers=webkey, json={"runtime": "base:latest"},
                               expect=201)
    built = await api.data("POST", f"/sandbox/snapshots/{web_build['snapshotId']}/finalize", headers=webkey,
                           json={"env": {"A": "1"}})
    assert built["projectId"] == web_id
    grown = await sandbox(admin, projectId="web", snapshot=snap_other["snapshotId"])
    snap_grown = await snapshot(admin, grown, "grown")
    lineage = await api.data("GET", f"/sandbox/snapshots/lineage?snapshot={snap_grown['snapshotId']}", headers=webkey)
    assert [e["snapshotId"] for e in lineage["lineage"]] == [snap_grown["snapshotId"]], lineage

    theirs = [snap_other["snapshotId"], snap_org["snapshotId"], forked["snapshotId"], build["snapshotId"]]
    secrets = {MARK, *theirs, checkpoint, "othersnap", "orgsnap"}
    listed = await api.call("GET", "/sandbox/snapshots?limit=1000&forks=true", headers=webkey)  # forks' too
    assert {s["snapshotId"] for s in listed["data"]["snapshots"]} == {
        snap_web["snapshotId"], web_fork["snapshotId"], snap_grown["snapshotId"], built["snapshotId"]}, listed
    for name in ("othersnap", "orgsnap", "fork-" + theirs_sbx[-12:]):
        assert (await api.data("GET", f"/sandbox/snapshots?name={name}&forks=true", headers=webkey))["total"] == 0
    swept = 0
    for route in _snapshot_routes(api):
        for snapshot_id in theirs:
            for sandbox_id in (theirs_sbx, org_sbx):
                ids = {**MISSING, "snapshot_id": snapshot_id, "sandbox_id": sandbox_id, "checkpoint_id": checkpoint}
                body = {"name": "x", "tag": "v1", "count": 1, "runtime": "base:latest"}
                query = f"?snapshot={snapshot_id}&name=othersnap&sandboxId={sandbox_id}"
                kw: dict[str, Any] = {"json": body} if route.method in ("POST", "PUT", "PATCH") else {}
                resp = await api.client.request(route.method, fill(route, ids) + query, headers=webkey, **kw)
                text = await resp.text()
                path = fill(route, ids)
                assert not [s for s in secrets if s in text and s not in path + query], (route.method, path, text[:300])
                if params_of(route):
                    other = await api.client.request(route.method, fill(route, MISSING) + query.replace(
                        snapshot_id, MISSING["snapshot_id"]), headers=webkey, **kw)
                    assert resp.status >= 400 and resp.status == other.status, (route.method, path, resp.status, text)
                swept += 1
    assert swept >= 4 * 2 * 10
    # Creating from another project's snapshot, by id or by name, is as from one that never was.
    nothing = await api.call("POST", "/sandbox", headers=webkey, json={"snapshot": MISSING["snapshot_id"]},
                             expect=404)
    for ref in (*theirs, "othersnap:v1", "orgsnap", "@alpha/othersnap:v1"):
        refused = await api.call("POST", "/sandbox", headers=webkey, json={"snapshot": ref}, expect=404)
        assert refused["code"] == nothing["code"], refused
    # Taking othersnap:v1 for its own snapshot does not take the tag from the other project's.
    await snapshot(webkey, mine, "othersnap")
    for snapshot_id in theirs[:3]:
        snap = await api.data("GET", f"/sandbox/snapshots/{snapshot_id}", headers=admin)
        assert snap["status"] == "ready", snap
    assert (await api.data("GET", f"/sandbox/snapshots/{snap_other['snapshotId']}", headers=admin))["tag"] == "v1"
    assert (await api.data("GET", f"/sandbox/checkpoints/{theirs_sbx}", headers=admin))["checkpoints"][0]["id"] \
        == checkpoint


def env_patch(tag: str, count: int = 30_000, size: int = 1024) -> bytes:
    """``{"env": {...}}`` of ``count`` variables of ``size`` bytes each (names unique per tag)."""
    value = json.dumps("v" * size)
    return ('{"env": {' + ",".join(f'"{tag}_{i}": {value}' for i in range(count)) + "}}").encode()


@pytest.mark.parametrize("driver_name", ["local"])
async def test_unbounded_env_names_and_inputs_are_refused_by_name(api: Api) -> None:
    """Three PATCH /sandbox/env of 30,000 variables x 1 KB were accepted: the server's memory
    grew by 210 MB and kept it, the event log by 115 MB, and the sandbox's commands then
    failed with E2BIG. Each is now a 400 naming env, before anything is kept; an env and a
    command at the limits still run (the limits are inside what Linux's execve takes)."""
    sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest", "env": {"KEEP": "1"}},
                          expect=201))["sandboxId"]
    events_before = (await api.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100"))["events"]
    tracemalloc.start()
    held = []
    try:
        for tag in ("A", "B", "C"):
            resp = await api.client.patch(f"/sandbox/env/{sid}", data=io.BytesIO(env_patch(tag)),
                                          headers={**AUTH, "Content-Type": "application/json"})
            body = await resp.json()
            assert (resp.status, body.get("field")) == (400, "env"), (resp.status, str(body)[:300])
            resp.release()
            del resp, body
            gc.collect()
            held.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    # After the first, what is held is its last request's transient (aiohttp keeps the body it
    # read until the next one); another refusal adds nothing to it.
    grown = held[-1] - held[0]
    assert grown < 8 * 2**20, f"two more refusals left the server {grown / 2**20:.1f} MiB bigger"
    assert (await api.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100"))["events"] == events_before
    engine = api.client.app[ENGINE]
    assert (await engine.reads.require(sid)).spec.env == {"KEEP": "1"}

    from hutch.core import limits  # the limits, once they exist (the attack above needs none)

    # At the limits, a command runs: the largest single variable, the env filled to its budget,
    # and an argv filled to its own (every string counted with its NUL and pointer, as execve does).
    big = "B" * (limits.MAX_ARG_STRLEN - len("BIG=") - 1)
    fill_env = {"BIG": big, "KEEP": None}
    used = limits.env_bytes({"BIG": big})
    i = 0
    while used + limits.env_bytes({f"F{i:04d}": "x" * 1000}) <= limits.ENV_BYTES and len(fill_env) < limits.ENV_VARS:
        fill_env[f"F{i:04d}"] = "x" * 1000
        used += limits.env_bytes({f"F{i:04d}": "x" * 1000})
        i += 1
    env = (await api.data("PATCH", f"/sandbox/env/{sid}", json={"env": fill_env}))["env"]
    assert limits.ENV_BYTES - 1100 < limits.env_bytes(env) <= limits.ENV_BYTES
    script = 'echo "${#BIG} $# ${#1}"'
    arg = "a" * (limits.MAX_ARG_STRLEN - 1)
    argv = ["sh", "-c", script, "x"]
    while limits.argv_bytes([*argv, arg]) <= limits.ARGV_BYTES:
        argv.append(arg)
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": argv})
    done = await api.wait_execution(ex["executionId"])
    assert (done["status"], done.get("exitCode")) == ("completed", 0), done
    assert (await api.stream(ex["stdoutStreamUrl"])).decode() == f"{len(big)} {len(argv) - 4} {len(arg)}\n"
    # One byte past each limit: a 400 naming the field, nothing recorded.
    over = [
        ("PATCH", f"/sandbox/env/{sid}", {"env": {"ONE_MORE": "x" * 2000}}, "env"),
        ("PATCH", f"/sandbox/env/{sid}", {"env": {"BIG": big + "B"}}, "env.BIG"),
        ("PATCH", f"/sandbox/env/{sid}", {"env": {"N" * (limits.ENV_NAME_CHARS + 1): "1"}}, "env"),
        ("POST", f"/sandbox/{sid}/execute", {"command": [*argv, arg]}, "command"),
        ("POST", f"/sandbox/{sid}/execute", {"command": ["echo", arg + "a"]}, "command[1]"),
        ("POST", f"/sandbox/sandboxes/{sid}/jobs", {"command": ["echo", arg + "a"]}, "command[1]"),
        ("POST", "/sandbox", {"env": {"BIG": big + "B"}}, "env.BIG"),
        ("POST", "/sandbox", {"command": {"exec": ["echo", arg + "a"]}}, "command.exec[1]"),
        ("POST", "/sandbox", {"name": "n" * (limits.NAME_CHARS + 1)}, "name"),
        ("POST", "/sandbox", {"description": "d" * (limits.TEXT_CHARS + 1)}, "description"),
        ("POST", "/sandbox", {"metadata": {"m": "x" * limits.METADATA_BYTES}}, "metadata"),
        ("POST", "/sandbox", {"metadata": {str(k): k for k in range(limits.METADATA_ITEMS + 1)}}, "metadata"),
        ("POST", "/sandbox", {"metadata": nested(limits.METADATA_DEPTH + 1)}, "metadata"),
        ("POST", f"/fs/{sid}", {"files": [{"path": "p" * (limits.PATH_BYTES + 1), "content": ""}]}, "files[0].path"),
        ("POST", f"/sandbox/{sid}/snapshot", {"name": "s", "description": "d" * (limits.TEXT_CHARS + 1)},
         "description"),
        ("POST", "/ssh-keys", {"publicKey": "ssh-ed25519 " + "A" * limits.PUBLIC_KEY_CHARS}, "publicKey"),
        ("POST", "/streams", {"name": "n" * (limits.NAME_CHARS + 1)}, "name"),
    ]
    for method, path, body, field in over:
        answer = await api.call(method, path, json=body, expect=400)
        assert answer["field"] == field, (method, path, field, answer)
        assert "INTERNAL" not in answer["code"]
    assert (await engine.reads.require(sid)).spec.env == env
    assert (await api.data("GET", "/sandbox"))["total"] == 1


def nested(levels: int) -> dict[str, Any]:
    """``{"n": {"n": ...}}``, ``levels`` objects deep."""
    out: dict[str, Any] = {}
    for _ in range(levels - 1):
        out = {"n": out}
    return out


async def test_fields_that_look_like_ours_are_refused_naming_the_one_meant(api: Api) -> None:
    """A key created with ``expiresAt`` (the field is ``expires``) silently never expired. On
    hutch's own routes every field it does not take is refused; on the Agentuity wire's, those
    that look like one it takes (a typo, another spelling) are, naming the one meant, while
    what @agentuity/core 2.0.21 sends (tests/compat) stays accepted."""
    await new_org(api, "alpha")
    admin = bearer((await new_key(api, "org_alpha", "admin"))["secret"])
    sid = (await api.data("POST", "/sandbox", headers=admin, json={}, expect=201))["sandboxId"]
    refused = [
        ("POST", "/keys", {"role": "member", "expiresAt": "1h"}, "expiresAt", "expires"),
        ("POST", "/keys", {"role": "member", "project": ["x"]}, "project", "projects"),
        ("POST", "/keys", {"role": "member", "color": "red"}, "color", None),
        ("POST", "/ssh-keys", {"public_key": "ssh-ed25519 AAAA"}, "public_key", "publicKey"),
        ("POST", "/projects", {"name": "web", "descr": "x"}, "descr", None),
        ("POST", f"/sandbox/{sid}/fork", {"copies": 2}, "copies", None),
        ("POST", "/sandbox", {"envs": {"A": "1"}}, "envs", "env"),
        ("POST", "/sandbox", {"resources": {"memroy": "1Gi"}}, "resources.memroy", "memory"),
        ("POST", "/sandbox", {"timeout": {"idel": "5m"}}, "timeout.idel", "idle"),
        ("POST", "/sandbox", {"network": {"enable": True}}, "network.enable", "enabled"),
        ("POST", f"/sandbox/{sid}/execute", {"command": ["true"], "timeoutSeconds": 5}, "timeoutSeconds", "timeout"),
        ("POST", f"/sandbox/{sid}/execute", {"command": ["true"], "files": [{"path": "a", "contents": ""}]},
         "files[0].contents", "content"),
        ("PATCH", f"/sandbox/env/{sid}", {"env": {}, "Env": {"A": "1"}}, "Env", "env"),
    ]
    for method, path, body, field, meant in refused:
        answer = await api.call(method, path, headers=admin, json=body, expect=400)
        assert answer["field"] == field, (method, path, answer)
        assert (meant is None) or f"did you mean {meant}" in answer["message"], answer
    # Nothing was made by any of them.
    assert (await api.data("GET", "/keys", headers=admin))["total"] == 1
    assert (await api.data("GET", "/sandbox", headers=admin))["total"] == 1
    # What the real client sends on the wire routes, its own fields included, is taken.
    made = await api.data("POST", "/sandbox", headers=admin, expect=201, json={
        "runtime": "base:latest", "projectId": None, "scopes": [], "orgId": "org_alpha",
        "resources": {"memory": "256Mi", "cpu": "1", "disk": "1Gi"}, "network": {"enabled": False},
        "stream": {"timestamps": False}, "timeout": {"idle": "10m", "execution": "5m"},
        "command": {"exec": ["true"], "mode": "interactive", "files": []}, "metadata": {"anything": {"goes": 1}}})
    job = await api.call("POST", f"/sandbox/sandboxes/{made['sandboxId']}/jobs", headers=admin, expect=201,
                         json={"command": ["true"], "streams": {}})
    assert job["data"]["jobId"]
    await api.call("POST", "/streams", headers=admin, expect=201,
                   json={"name": "n", "metadata": {"a": "b"}, "headers": {"content-type": "text/plain"}, "ttl": 60})
    build = await api.data("POST", "/sandbox/snapshots/build", headers=admin, expect=201, json={
        "runtime": "base:latest", "name": "b", "git": {"branch": "main"}, "encrypt": True, "force": True})
    await api.data("POST", f"/sandbox/snapshots/{build['snapshotId']}/finalize", headers=admin, json={
        "sizeBytes": 0, "fileCount": 0, "files": [], "env": {"A": "1"}, "metadata": {"k": "v"}})


async def test_a_key_that_expires_makes_no_key_that_outlives_it(api: Api) -> None:
    """An admin key handed out for a day (a contractor's, a CI job's) made an admin key with
    no expiry, or one a year out: its holder kept the organization after the day was over,
    and nobody's revocation list said so. A new key expires no later than the key making it
    (by default at the same time); a later or no expiry asked for is 400 naming ``expires``."""
    await new_org(api, "alpha")
    day = await new_key(api, "org_alpha", "admin", expires="1d")
    admin = bearer(day["secret"])
    for path, attempt in (("/keys", {"role": "member", "expires": "2d"}),
                          ("/keys", {"role": "admin", "expires": "2999-01-01"}),
                          ("/cli/apikey", {"name": "x", "expiresAt": "2999-01-01T00:00:00Z"})):  # the official CLI's
        refused = await api.call("POST", path, headers=admin, json=attempt, expect=400)  # before: 201
        assert refused["field"] == "expires" and day["expiresAt"] in refused["message"], refused
    default = await api.data("POST", "/keys", headers=admin, json={"role": "admin"}, expect=201)
    assert default["expiresAt"] == day["expiresAt"]  # before: None, a key for ever
    cli = await api.data("POST", "/cli/apikey", headers=admin, json={"name": "y"})
    assert api.client.server.app[TENANTS].directory.keys[cli["id"]].expires_at == day["expiresAt"]
    sooner = await api.data("POST", "/keys", headers=admin, json={"role": "member", "expires": "1h"}, expect=201)
    assert sooner["expiresAt"] < day["expiresAt"]
    forever = await new_key(api, "org_alpha", "admin")  # a key without an expiry makes any
    assert (await api.data("POST", "/keys", headers=bearer(forever["secret"]), json={"role": "admin"},
                           expect=201))["expiresAt"] is None


def ed25519_line(comment: str) -> str:
    """An OpenSSH public key line (a well-formed blob; no private key is needed to register one)."""
    blob = b"".join(len(part).to_bytes(4, "big") + part for part in (b"ssh-ed25519", bytes(range(32))))
    return f"ssh-ed25519 {base64.b64encode(blob).decode()} {comment}"


async def test_names_that_would_rewrite_a_reader_s_terminal_are_refused(api: Api) -> None:
    """A member named an SSH key (or an admin a key) ``\\x1b]52;c;…\\x07`` (writes the reader's
    clipboard), ``\\x1b[2J`` (clears the screen), ``ok\\nkey_… admin`` (a forged line) or with
    U+202E (reverses what follows): ``hutch key list`` and ``hutch ssh-key list`` print names as
    they are, so the next admin reading the list ran the escape. Names are labels a person
    reads: control characters and bidirectional overrides are a 400 naming the field."""
    await new_org(api, "alpha")
    admin = bearer((await new_key(api, "org_alpha", "admin"))["secret"])
    member = bearer((await new_key(api, "org_alpha", "member"))["secret"])
    for bad in ("\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2gK\x07", "a\x1b[2Jb", "ok\nkey_x  hk_  admin", "cv\u202egpj.exe",
                "nul\x00", "c1\x9b31m"):
        refused = await api.call("POST", "/keys", headers=admin, json={"role": "member", "name": bad}, expect=400)
        assert refused["field"] == "name", refused  # before: 201
        refused = await api.call("POST", "/ssh-keys", headers=member, json={"publicKey": ed25519_line("me"),
                                                                             "name": bad}, expect=400)
        assert refused["field"] == "name", refused
    refused = await api.call("POST", "/ssh-keys", headers=member,
                             json={"publicKey": ed25519_line("me\x1b[2J")}, expect=400)  # the label defaults to it
    assert refused["field"] == "publicKey", refused
    for fine in ("ci \u2013 deploy", "Zoë's laptop", "构建"):  # other letters and punctuation stay names
        assert (await api.data("POST", "/keys", headers=admin, json={"role": "member", "name": fine},
                               expect=201))["name"] == fine


async def test_a_key_s_rate_and_burst_are_numbers_a_bucket_can_hold(api: Api) -> None:
    """``{"rate": 5e-324}`` made a key whose every request after its first was a 500 (a wait of
    infinite seconds in ``Retry-After``), ``1e-300`` a ``Retry-After`` of 300 digits, and
    ``{"burst": 0.5}`` was kept as 0 and silently replaced by the default. Rate and burst are
    refused outside what a token bucket means (a 400 naming the field and the bounds); a key
    recorded with such a rate before answers 429 with a wait a client can read."""
    await new_org(api, "alpha")
    admin = bearer((await new_key(api, "org_alpha", "admin"))["secret"])
    for body, field in (({"rate": 5e-324}, "rate"), ({"rate": 1e-300}, "rate"), ({"rate": 1e300}, "rate"),
                        ({"burst": 0.5}, "burst"), ({"burst": 1e300}, "burst"), ({"burst": 2.5}, "burst")):
        refused = await api.call("POST", "/keys", headers=admin, json={"role": "member", **body}, expect=400)
        assert refused["field"] == field, refused  # before: 201
    made = await api.data("POST", "/keys", headers=admin, json={"role": "member", "rate": 0.001, "burst": 1.0},
                          expect=201)
    assert (made["rate"], made["burst"]) == (0.001, 1)
    directory = api.client.server.app[TENANTS].directory
    directory.put(attrs.evolve(directory.keys[made["id"]], rate=5e-324))  # as recorded before the check
    await api.call("GET", "/sandbox", headers=bearer(made["secret"]))
    resp = await api.client.get("/sandbox", headers=bearer(made["secret"]))
    assert resp.status == 429 and len(resp.headers["Retry-After"]) <= 4, (resp.status, await resp.text())


async def test_a_key_names_each_of_its_projects_once(api: Api) -> None:
    """``"projects": ["web"] * 99_999`` (under the body's 100,000 values) made a key whose record
    held the project's id 99,999 times: 3.5 MB in the log for ever, in every replica's
    directory, in every ``GET /keys``, one request each. A project named twice is one."""
    await new_org(api, "alpha")
    admin = bearer((await new_key(api, "org_alpha", "admin"))["secret"])
    web_ = await api.data("POST", "/projects", headers=admin, json={"name": "web"}, expect=201)
    made = await api.data("POST", "/keys", headers=admin, expect=201,
                          json={"role": "member", "projects": ["web", web_["id"], *["web"] * 5_000]})
    assert made["projects"] == [web_["id"]]  # before: 5,002 of them
