"""Tenancy through the wire: organizations, projects, keys and roles, quotas, rate limits.

The cross-tenant sweep and the role matrix walk the application's own route table: a route
added later is in them without anyone writing a case for it, and a route that forgets the
organization check fails them."""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any

import asyncssh
import pytest
from aiohttp import web

from hutch.api.access import PUBLIC, access_of
from hutch.api.keys import ENGINE, TENANTS
from hutch.api.replication import FORWARD_TOKEN, FORWARDED, forward_token
from hutch.core.tenancy import Access
from tests.api.conftest import STORE, WIRE, Api, AppFactory

pytestmark = pytest.mark.runs_on(*STORE)  # the tenancy rules over the store: no driver is involved

MARK = "alpha-private-7f3a"  # in A's names, env and files: must never show in B's answers


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def new_org(api: Api, name: str) -> str:
    org = await api.data("POST", "/orgs", json={"name": name}, expect=201)
    assert org["id"] == f"org_{name}"
    return str(org["id"])


async def new_key(api: Api, org_id: str, role: str, **extra: Any) -> dict[str, Any]:
    """A key of ``org_id`` made by the bootstrap key acting for that organization."""
    return await api.data("POST", f"/keys?orgId={org_id}", json={"role": role, **extra}, expect=201)


def routes_of(api: Api) -> list[web.AbstractRoute]:
    app = api.client.server.app
    return [r for r in app.router.routes() if r.method != "HEAD"]


def params_of(route: web.AbstractRoute) -> list[str]:
    return [m.split(":")[0] for m in re.findall(r"{([^}]+)}", route.resource.canonical)]


def fill(route: web.AbstractRoute, values: dict[str, str]) -> str:
    path = route.resource.canonical
    for param in params_of(route):
        assert param in values, f"the sweep has no value for {{{param}}} of {route.method} {path}: add one"
        path = re.sub(r"{" + param + r"(:[^}]*)?}", values[param], path)
    return path


# Routes anyone may call, each for a reason; a new public route fails here until it is added.
PUBLIC_ROUTES = {
    ("GET", "/"),  # a redirect to the Web App
    ("GET", "/healthz"),
    ("GET", "/streams/{stream_id}"),  # output stream URLs: the unguessable id is the capability
    ("GET", "/streams/audit/{sandbox_id}/{token}"),  # HMAC of the sandbox id under the server's secret
    ("GET", "/streams/{stream_id}/stdin"),  # between replicas: an HMAC of the id under their shared secret
    ("GET", "/sandbox/snapshots/public"),  # public snapshots are public by design
    ("GET", "/sandbox/snapshots/public/{ref}"),
    ("*", "/proxy/{sandbox_id}"),  # port URLs: public like Agentuity's sandbox URLs
    ("*", "/proxy/{sandbox_id}/{tail}"),
    ("POST", "/cli/validate/apt-dependencies"),  # the Agentuity CLI sends no key; it checks names only
    ("GET", "/app"),  # the Web App's page and its static files: nothing but the code
    ("GET", "/app/static/{name}"),
    ("POST", "/app/session"),  # signing in: the API key in the body is the credential
    ("GET", "/openapi.json"),  # the API's description: no secret
    ("GET", "/"),  # a redirect to the Web App: a person opening the address gets the app, not a 401
}

# What each route needs beyond the rule "GET reads, everything else writes".
ADMIN_ROUTES = {
    ("POST", "/orgs"): Access.SERVER,
    ("PATCH", "/orgs/{org_id}/quota"): Access.SERVER,
    ("GET", "/nodes"): Access.SERVER,  # where sandboxes run: the operator's
    ("POST", "/nodes/{node}/drain"): Access.SERVER,
    ("POST", "/projects"): Access.ADMIN,
    ("GET", "/keys"): Access.ADMIN,
    ("POST", "/keys"): Access.ADMIN,
    ("DELETE", "/keys/{key_id}"): Access.ADMIN,
    ("POST", "/cli/apikey"): Access.ADMIN,
    ("GET", "/cli/apikey"): Access.ADMIN,
    ("GET", "/cli/apikey/{key_id}"): Access.ADMIN,
    ("DELETE", "/cli/apikey/{key_id}"): Access.ADMIN,
    ("GET", "/sandbox/{sandbox_id}/terminal"): Access.WRITE,  # a websocket GET that runs commands
    ("DELETE", "/app/session"): Access.READ,  # signing out of the Web App: any key
}


async def _text(resp: Any) -> str:
    """The body, or for a stream that never ends (server-sent events) what came in 0.5 s."""
    if resp.content_type != "text/event-stream":
        return str(await resp.text())
    got = b""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(0.5):
            while chunk := await resp.content.readany():
                got += chunk
    resp.close()
    return got.decode(errors="replace")


def canonical(route: web.AbstractRoute) -> tuple[str, str]:
    return route.method, re.sub(r"{([^}:]+):[^}]*}", r"{\1}", route.resource.canonical)


@pytest.mark.runs_on(*WIRE)  # the route table alone
def test_every_route_declares_what_it_needs(api: Api) -> None:
    public, mismatched = set(), []
    for route in routes_of(api):
        key = canonical(route)
        access = access_of(route.method, route.handler)
        if access == PUBLIC:
            public.add(key)
            continue
        expected = ADMIN_ROUTES.get(key, Access.READ if route.method == "GET" else Access.WRITE)
        if access != expected:
            mismatched.append((key, access, expected))
    assert public == PUBLIC_ROUTES
    assert not mismatched


async def two_orgs(api: Api) -> tuple[dict[str, str], dict[str, str]]:
    await new_org(api, "alpha")
    await new_org(api, "beta")
    a = await new_key(api, "org_alpha", "admin")
    b = await new_key(api, "org_beta", "admin")
    return bearer(a["secret"]), bearer(b["secret"])


@pytest.mark.runs_on(*STORE, "local-embedded")  # and the routes a real driver answers
async def test_cross_tenant_sweep_walks_every_route(api: Api) -> None:
    """B's admin key, given every id of A on every route, learns nothing and changes nothing:
    each answer is the one an id that never existed gets, never 2xx, never A's data."""
    a, b = await two_orgs(api)
    project = await api.data("POST", "/projects", json={"name": "web"}, headers=a, expect=201)
    created = await api.data("POST", "/sandbox", headers=a, expect=201, json={
        "name": MARK, "env": {"MARK": MARK}, "projectId": "web", "metadata": {"m": MARK}})
    sid = created["sandboxId"]
    assert (await api.data("GET", f"/sandbox/{sid}", headers=a))["projectId"] == project["id"]
    await api.call("POST", f"/fs/{sid}", headers=a, json={"files": [{"path": "secret.txt", "content": "YWxwaGE="}]})
    ex = await api.data("POST", f"/sandbox/{sid}/execute", headers=a, json={"command": ["echo", MARK]})
    await api.data("GET", f"/sandbox/execution/{ex['executionId']}?wait=10s", headers=a)
    job = await api.data("POST", f"/sandbox/sandboxes/{sid}/jobs", headers=a, json={"command": ["sleep", "60"]},
                         expect=201)
    snap = await api.data("POST", f"/sandbox/{sid}/snapshot", headers=a, json={"name": "alphasnap"}, expect=201)
    caps_checkpoint = await api.client.post(f"/sandbox/{sid}/checkpoint", json={"name": "cp1"}, headers=a)
    checkpoint = (await caps_checkpoint.json())["data"]["id"] if caps_checkpoint.status == 201 else "ckpt_none"
    stream = (await api.call("POST", "/streams", headers=a, json={"name": "in"}, expect=201))["id"]
    member = await api.data("POST", "/keys", headers=a, json={"role": "member"}, expect=201)
    public_key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    ssh_key = await api.data("POST", "/ssh-keys", headers=a, json={"publicKey": public_key}, expect=201)

    # A runtime name is the catalog's, no organization's: an unknown one keeps the sweep side-effect free.
    mine = {"name": "cobol:1", "ssh_key_id": ssh_key["id"], "sandbox_id": sid, "execution_id": ex["executionId"], "job_id": job["jobId"], "checkpoint_id": checkpoint, "snapshot_id": snap["snapshotId"], "key_id": member["id"],
            "org_id": "org_alpha", "stream_id": stream, "project_id": project["id"], "tail": "agents", "node": "n1"}
    missing = {"name": "cobol:1", "ssh_key_id": "ssk_" + "0" * 26, "sandbox_id": "sbx_" + "0" * 26, "execution_id": "exec_" + "0" * 26, "job_id": "job_" + "0" * 26,
               "checkpoint_id": "ckpt_" + "0" * 26, "snapshot_id": "snp_" + "0" * 26, "key_id": "key_" + "0" * 26,
               "org_id": "org_nobody", "stream_id": "stin_" + "0" * 32, "project_id": "proj_" + "0" * 26,
               "tail": "agents", "node": "n_nobody"}
    secrets = {MARK, sid, snap["snapshotId"], ex["executionId"], member["id"], project["id"], stream, ssh_key["id"],
               ssh_key["fingerprint"]}
    query = f"?path=/workspace/secret.txt&snapshot={snap['snapshotId']}&name=alphasnap&projectId=web"
    body = {"command": ["cat", "/workspace/secret.txt"], "name": "x", "path": "secret.txt", "files": [],
            "env": {"X": "1"}, "tag": "t", "role": "member"}
    swept = 0
    for route in routes_of(api):
        if access_of(route.method, route.handler) == PUBLIC:
            continue
        params = params_of(route)
        methods = ["GET", "POST", "PUT", "PATCH", "DELETE"] if route.method == "*" else [route.method]
        for method in methods:
            kw: dict[str, Any] = {"json": body} if method in ("POST", "PUT", "PATCH") else {}
            resp = await api.client.request(method, fill(route, mine) + query, headers=b, **kw)
            text = await _text(resp)
            leaked = [s for s in secrets if s in text and s not in fill(route, mine)]
            assert not leaked, (method, route.resource.canonical, resp.status, text[:300])
            if params:
                other = await api.client.request(method, fill(route, missing) + query, headers=b, **kw)
                assert resp.status >= 400, (method, route.resource.canonical, resp.status, text[:300])
                assert resp.status == other.status, (method, route.resource.canonical, resp.status, text[:300])
                if other.status != 404:  # refused before any lookup (a bad body): still no oracle
                    assert (await resp.json())["code"] == (await other.json())["code"]
            swept += 1
    assert swept >= 40
    # ... and A's things are as A left them.
    sb = await api.data("GET", f"/sandbox/{sid}", headers=a)
    assert sb["status"] in ("idle", "running") and sb["name"] == MARK
    assert (await api.data("GET", f"/sandbox/sandboxes/{sid}/jobs/{mine['job_id']}", headers=a))["status"] == "running"
    assert (await api.data("GET", f"/sandbox/snapshots/{snap['snapshotId']}", headers=a))["name"] == "alphasnap"
    keys = await api.data("GET", "/keys", headers=a)
    assert [k["revokedAt"] for k in keys["keys"] if k["id"] == member["id"]] == [None]
    # Lists of B hold nothing of A's, and A's lists hold A's.
    assert (await api.data("GET", "/sandbox", headers=b))["total"] == 0
    assert (await api.data("GET", "/sandbox/snapshots", headers=b))["total"] == 0
    assert (await api.data("GET", "/sandbox", headers=a))["total"] == 1


async def test_public_snapshots_stay_public_but_not_writable(api: Api) -> None:
    a, b = await two_orgs(api)
    sid = (await api.data("POST", "/sandbox", headers=a, json={}, expect=201))["sandboxId"]
    snap = await api.data("POST", f"/sandbox/{sid}/snapshot", headers=a, json={"name": "shared", "public": True},
                          expect=201)
    snap_id = snap["snapshotId"]
    assert (await api.data("GET", f"/sandbox/snapshots/{snap_id}", headers=b))["name"] == "shared"
    public = await api.data("GET", "/sandbox/snapshots/public", headers=b)
    assert [s["snapshotId"] for s in public["snapshots"]] == [snap_id]
    assert public["snapshots"][0]["fullName"] == "@alpha/shared:latest"
    made = await api.data("POST", "/sandbox", headers=b, json={"snapshot": snap_id}, expect=201)
    assert (await api.data("GET", f"/sandbox/{made['sandboxId']}", headers=b))["org"]["id"] == "org_beta"
    await api.call("PATCH", f"/sandbox/snapshots/{snap_id}", headers=b, json={"tag": "mine"}, expect=404)
    await api.call("DELETE", f"/sandbox/snapshots/{snap_id}", headers=b, expect=404)
    assert (await api.data("GET", "/sandbox/snapshots", headers=b))["total"] == 0  # B's own list: B's own


async def test_org_id_selects_only_what_a_key_may_act_for(api: Api) -> None:
    _a, b = await two_orgs(api)
    refused = await api.call("GET", "/sandbox?orgId=org_alpha", headers=b, expect=403)
    assert "orgId" in refused["message"] and "org_alpha" in refused["message"]
    same = await api.call("GET", "/sandbox?orgId=org_nosuch", headers=b, expect=403)  # no existence oracle
    assert same["message"].replace("org_nosuch", "X") == refused["message"].replace("org_alpha", "X")
    await api.call("POST", "/sandbox", headers=b, json={"orgId": "org_alpha"}, expect=403)  # in the body too
    await api.call("GET", "/sandbox?orgId=org_beta", headers=b)  # its own: fine
    # The bootstrap key acts for any organization it names.
    made = await api.data("POST", "/sandbox?orgId=org_beta", json={}, expect=201)
    assert (await api.data("GET", f"/sandbox/{made['sandboxId']}", headers=b))["org"] == {"id": "org_beta",
                                                                                           "name": "beta"}
    await api.call("GET", f"/sandbox/{made['sandboxId']}", expect=404)  # it acts for org_local by default


async def test_role_matrix_walks_every_route(api: Api) -> None:
    """Each role on each route: allowed (anything but FORBIDDEN) or refused (403 FORBIDDEN) as
    the route declares; ids that do not exist keep the sweep free of side effects."""
    await new_org(api, "alpha")
    admin = bearer((await new_key(api, "org_alpha", "admin"))["secret"])
    keys = {"admin": admin, "member": bearer((await new_key(api, "org_alpha", "member"))["secret"]),
            "read-only": bearer((await new_key(api, "org_alpha", "read-only"))["secret"])}
    grants = {"admin": {Access.READ, Access.WRITE, Access.ADMIN}, "member": {Access.READ, Access.WRITE},
              "read-only": {Access.READ}}
    missing = {"name": "cobol:1", "ssh_key_id": "ssk_" + "0" * 26, "sandbox_id": "sbx_" + "0" * 26, "execution_id": "exec_" + "0" * 26, "job_id": "job_" + "0" * 26,
               "checkpoint_id": "ckpt_" + "0" * 26, "snapshot_id": "snp_" + "0" * 26, "key_id": "key_" + "0" * 26,
               "org_id": "org_alpha", "stream_id": "stin_" + "0" * 32, "project_id": "proj_" + "0" * 26,
               "tail": "agents", "node": "n_nobody"}
    bad = {"runtime": "no such runtime!", "name": "Not A Name!", "role": "nope", "command": 5, "tag": "..",
           "sandboxes": -1}
    checked = 0
    for route in routes_of(api):
        access = access_of(route.method, route.handler)
        if access == PUBLIC:
            continue
        for role, headers in keys.items():
            kw: dict[str, Any] = {"json": bad} if route.method in ("POST", "PUT", "PATCH") else {}
            resp = await api.client.request(route.method, fill(route, missing), headers=headers, **kw)
            body = await resp.json() if resp.content_type == "application/json" else {}
            resp.close()  # a stream that never ends (/app/live) is not read here
            refused = resp.status == 403 and body.get("code") == "FORBIDDEN"
            assert refused is (access not in grants[role]), (role, route.method, route.resource.canonical,
                                                            resp.status, body)
            checked += 1
    assert checked >= 120


async def test_keys_are_shown_once_listed_and_revoked(api: Api) -> None:
    await new_org(api, "alpha")
    admin = await new_key(api, "org_alpha", "admin", name="ci")
    assert admin["secret"].startswith("hk_") and admin["prefix"] == admin["secret"][:10]
    a = bearer(admin["secret"])
    project = await api.data("POST", "/projects", headers=a, json={"name": "web"}, expect=201)
    reader = await api.data("POST", "/keys", headers=a, expect=201,
                            json={"role": "read-only", "projects": ["web"], "expires": "30d", "name": "dash"})
    assert reader["projects"] == [project["id"]] and reader["expiresAt"]
    listed = await api.call("GET", "/keys", headers=a)
    assert "secret" not in str(listed) and "Hash" not in str(listed) and admin["secret"] not in str(listed)
    assert {k["name"] for k in listed["data"]["keys"]} == {"ci", "dash"}
    # The bootstrap key's own list is org_local's (empty here): keys are per organization.
    assert (await api.data("GET", "/keys"))["total"] == 0
    revoked = await api.data("DELETE", f"/keys/{reader['id']}", headers=a)
    assert revoked["revokedAt"]
    gone = await api.call("GET", "/sandbox", headers=bearer(reader["secret"]), expect=401)
    assert "revoked" in gone["message"]
    again = await api.call("DELETE", f"/keys/{reader['id']}", headers=a, expect=400)
    assert "revoked already" in again["message"]
    for body, field in (({"role": "owner"}, "role"), ({"role": "member", "expires": "yesterday"}, "expires"),
                        ({"role": "member", "projects": ["nope"]}, "projects"),
                        ({"role": "member", "rate": -1}, "rate")):
        err = await api.call("POST", "/keys", headers=a, json=body, expect=400)
        assert err["field"] == field, err
    err = await api.call("POST", "/orgs", json={"name": "Alpha!"}, expect=400)
    assert "name" in err["message"]
    await api.call("POST", "/orgs", json={"name": "alpha"}, expect=400)  # exists
    await api.call("POST", "/orgs", headers=a, json={"name": "gamma"}, expect=403)  # not the server's admin
    orgs = await api.data("GET", "/orgs", headers=a)
    assert [o["id"] for o in orgs["orgs"]] == ["org_alpha"]
    assert {o["id"] for o in (await api.data("GET", "/orgs"))["orgs"]} == {"org_local", "org_alpha"}


async def test_project_keys_see_and_make_only_their_projects(api: Api) -> None:
    await new_org(api, "alpha")
    a = bearer((await new_key(api, "org_alpha", "admin"))["secret"])
    web_ = await api.data("POST", "/projects", headers=a, json={"name": "web"}, expect=201)
    await api.data("POST", "/projects", headers=a, json={"name": "ml"}, expect=201)
    other = (await api.data("POST", "/sandbox", headers=a, json={"projectId": "ml"}, expect=201))["sandboxId"]
    scoped = bearer((await api.data("POST", "/keys", headers=a, json={"role": "member", "projects": ["web"]},
                                    expect=201))["secret"])
    mine = (await api.data("POST", "/sandbox", headers=scoped, json={}, expect=201))["sandboxId"]
    assert (await api.data("GET", f"/sandbox/{mine}", headers=scoped))["projectId"] == web_["id"]
    await api.call("GET", f"/sandbox/{other}", headers=scoped, expect=404)
    await api.call("POST", "/sandbox", headers=scoped, json={"projectId": "ml"}, expect=400)
    listed = await api.data("GET", "/sandbox", headers=scoped)
    assert [s["sandboxId"] for s in listed["sandboxes"]] == [mine]
    assert [p["name"] for p in (await api.data("GET", "/projects", headers=scoped))["projects"]] == ["web"]
    err = await api.call("POST", "/sandbox", headers=a, json={"projectId": "nope"}, expect=400)
    assert err["field"] == "projectId"


async def test_quotas_name_the_limit_and_leave_nothing_half_made(api: Api) -> None:
    await new_org(api, "alpha")
    a = bearer((await new_key(api, "org_alpha", "admin"))["secret"])
    member = bearer((await new_key(api, "org_alpha", "member"))["secret"])
    await api.call("PATCH", "/orgs/org_alpha/quota", headers=member, json={"sandboxes": 1}, expect=403)
    await api.call("PATCH", "/orgs/org_alpha/quota", headers=a, json={"sandboxes": 1}, expect=403)  # the operator's
    org = await api.data("PATCH", "/orgs/org_alpha/quota", json={"sandboxes": 1, "memoryBytes": 2**30})
    assert org["quota"]["sandboxes"] == 1 and org["usage"]["sandboxes"] == 0
    first = (await api.data("POST", "/sandbox", headers=member, json={"resources": {"memory": "512Mi"}},
                            expect=201))["sandboxId"]
    over = await api.call("POST", "/sandbox", headers=member, json={"name": "second"}, expect=403)
    assert over["code"] == "QUOTA_EXCEEDED" and over["quota"] == "sandboxes" and over["limit"] == 1
    assert "sandboxes" in over["message"] and "may have 1" in over["message"]
    listed = await api.data("GET", "/sandbox?includeDeleted=true", headers=a)
    assert [s["sandboxId"] for s in listed["sandboxes"]] == [first]  # nothing half-made
    await api.call("PATCH", "/orgs/org_alpha/quota", json={"sandboxes": None})
    mem = await api.call("POST", "/sandbox", headers=member, json={"resources": {"memory": "1Gi"}}, expect=403)
    assert mem["quota"] == "memory_bytes" and "may have 1Gi; live sandboxes use 512Mi" in mem["message"]
    await api.data("POST", "/sandbox", headers=member, json={"resources": {"memory": "256Mi"}}, expect=201)
    # Ending a sandbox gives its share back.
    await api.call("DELETE", f"/sandbox/{first}", headers=member)
    await api.data("POST", "/sandbox", headers=member, json={"resources": {"memory": "512Mi"}}, expect=201)
    # Snapshot storage.
    await api.data("PATCH", "/orgs/org_alpha/quota", json={"memoryBytes": None})
    sid = (await api.data("POST", "/sandbox", headers=member, json={}, expect=201))["sandboxId"]
    await api.call("POST", f"/fs/{sid}", headers=member, json={"files": [{"path": "big", "content": "QUJD" * 100}]})
    stored = (await api.data("GET", "/orgs/org_alpha"))["usage"]["storageBytes"]  # its sandboxes' records
    await api.data("PATCH", "/orgs/org_alpha/quota", json={"snapshotBytes": stored + 10})
    snap = await api.call("POST", f"/sandbox/{sid}/snapshot", headers=member, json={"name": "s"}, expect=403)
    assert snap["quota"] == "snapshot_bytes"
    assert (await api.data("GET", "/sandbox/snapshots", headers=member))["total"] == 0
    await api.call("PATCH", "/orgs/org_alpha/quota", json={"disk": 5}, expect=400)
    # Another organization's quota is not in the way of this one.
    assert (await api.data("GET", "/orgs/org_local"))["quota"]["sandboxes"] is None


async def test_rate_limit_answers_429_with_retry_after(api: Api) -> None:
    await new_org(api, "alpha")
    slow = bearer((await new_key(api, "org_alpha", "read-only", rate=1, burst=3))["secret"])
    statuses = []
    for _ in range(5):
        resp = await api.client.get("/sandbox", headers=slow)
        statuses.append(resp.status)
        if resp.status == 429:
            assert int(resp.headers["Retry-After"]) >= 1
            body = await resp.json()
            assert body["code"] == "RATE_LIMITED" and "1 requests a second" in body["message"]
    assert statuses[:3] == [200, 200, 200] and 429 in statuses[3:]
    await api.call("GET", "/sandbox")  # other keys are not slowed by it
    await asyncio.sleep(1.1)
    assert (await api.client.get("/sandbox", headers=slow)).status == 200


async def test_server_default_rate_applies_to_keys_without_their_own(make_api: AppFactory) -> None:
    api = await make_api(rate_limit="2:2")
    await new_org(api, "alpha")
    key = bearer((await new_key(api, "org_alpha", "member"))["secret"])
    got = [(await api.client.get("/sandbox", headers=key)).status for _ in range(4)]
    assert got[:2] == [200, 200] and 429 in got[2:]


async def test_each_replica_takes_its_share_of_a_key_s_rate(api: Api) -> None:
    """Behind a balancer over two replicas, a key gets its rate, not twice it: each replica
    allows half (api/replication.py tells the tenants how many replicas live)."""
    await new_org(api, "alpha")
    key = bearer((await new_key(api, "org_alpha", "read-only", rate=2, burst=4))["secret"])
    api.client.server.app[TENANTS].replicas = 2
    got = [(await api.client.get("/sandbox", headers=key)) for _ in range(3)]
    assert [r.status for r in got] == [200, 200, 429]
    assert "2 replicas each allowing its share" in (await got[2].json())["message"]


async def test_a_request_another_replica_relayed_is_not_counted_twice(api: Api) -> None:
    """The replica a request came in through counted it; the owner it is relayed to does not,
    when the relay's token says so. The header alone is anyone's to send: counted."""
    await new_org(api, "alpha")
    key = bearer((await new_key(api, "org_alpha", "read-only", rate=1, burst=1))["secret"])
    engine = api.client.server.app[ENGINE]
    token = forward_token(engine, "replica-b", "GET", "/sandbox?limit=5")
    relayed = {**key, FORWARDED: "replica-b", FORWARD_TOKEN: token}
    assert (await api.client.get("/sandbox?limit=5", headers=key)).status == 200  # the burst's one
    for _ in range(3):
        assert (await api.client.get("/sandbox?limit=5", headers=relayed)).status == 200
    forged = {**key, FORWARDED: "replica-b", FORWARD_TOKEN: token[:-1] + ("0" if token[-1] != "0" else "1")}
    assert (await api.client.get("/sandbox?limit=5", headers=forged)).status == 429
    other_request = {**key, FORWARDED: "replica-b", FORWARD_TOKEN: token}  # signed for another path
    assert (await api.client.get("/sandbox?limit=6", headers=other_request)).status == 429


async def test_audit_records_name_org_project_and_key(api: Api) -> None:
    await new_org(api, "alpha")
    admin = await new_key(api, "org_alpha", "admin")
    a = bearer(admin["secret"])
    project = await api.data("POST", "/projects", headers=a, json={"name": "web"}, expect=201)
    created = await api.data("POST", "/sandbox", headers=a, json={"projectId": "web"}, expect=201)
    import json

    lines = [json.loads(x) for x in (await api.stream(created["auditStreamUrl"] + "?follow=false")).splitlines()]
    assert lines[0]["type"] == "create"
    assert {(r["orgId"], r["projectId"], r["keyId"]) for r in lines} == {("org_alpha", project["id"], admin["id"])}


async def test_a_directory_write_is_decided_under_its_organization_s_lock(api: Api) -> None:
    """Requests racing for one name or one SSH key: one is recorded, the others are refused by
    the check the first one made true (service/tenancy.TenancyWrites decides under the lock)."""
    await new_org(api, "alpha")
    a = bearer((await new_key(api, "org_alpha", "admin"))["secret"])
    public_key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    for path, body in (("/ssh-keys", {"publicKey": public_key}), ("/projects", {"name": "web"})):
        answers = await asyncio.gather(*(api.client.post(path, headers=a, json=body) for _ in range(4)))
        assert sorted(r.status for r in answers) == [201, 400, 400, 400], path
    assert len((await api.data("GET", "/ssh-keys", headers=a))["sshKeys"]) == 1
    assert [p["name"] for p in (await api.data("GET", "/projects", headers=a))["projects"]] == ["web"]
