"""Second adversarial pass, tenancy on every route of a real ``hutch serve`` (local driver), on
both profiles: keys limited to a project, read-only keys, no key (and dead ones), the URLs
that are capabilities (streams, audit streams, stdin between replicas, presigned uploads),
and one tenant's waiting clients against the others' requests.

The first pass swept every route with another organization's admin key and the role matrix
(tests/api/test_tenancy.py); this one takes the ids of *another project of the same
organization* to every route, walks /openapi.json (so a route added later is swept too)
and attacks the administration of keys from inside a project."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.adversarial.pass2 import World, start_world

pytestmark = pytest.mark.isolation

MARK = "ml-project-secret-8c2e"
MISSING = {"sandbox_id": "sbx_" + "0" * 26, "execution_id": "exec_" + "0" * 26, "job_id": "job_" + "0" * 26,
           "snapshot_id": "snp_" + "0" * 26, "checkpoint_id": "ckpt_" + "0" * 26, "key_id": "key_" + "0" * 26,
           "ssh_key_id": "ssk_" + "0" * 26, "project_id": "proj_" + "0" * 26, "org_id": "org_nobody",
           "stream_id": "stin_" + "0" * 32, "token": "stm_x", "name": "cobol:1", "ref": "nothing", "tail": "agents", "node": "n_nobody"}


@pytest.fixture(scope="module", params=["embedded", "production"])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    yield from start_world(tmp_path_factory.mktemp(f"pass2-tenancy-{request.param}"), request.param)


@pytest.fixture(scope="module")
def ml(world: World) -> dict[str, str]:
    """Things of alpha's ``ml`` project (and organization-wide ones) a ``web`` key must not reach."""
    sid = world.sandbox("ml", who="alpha_admin", runtime="base:latest", projectId="ml", name=MARK,
                        env={"MARK": MARK}, metadata={"m": MARK})
    world.data("alpha_admin", "POST", f"/fs/{sid}",
               {"files": [{"path": "secret.txt", "content": base64.b64encode(MARK.encode()).decode()}]})
    ex = world.data("alpha_admin", "POST", f"/sandbox/{sid}/execute", {"command": ["echo", MARK]})
    world.data("alpha_admin", "GET", f"/sandbox/execution/{ex['executionId']}?wait=30s")
    job = world.data("alpha_admin", "POST", f"/sandbox/sandboxes/{sid}/jobs", {"command": ["sleep", "600"]})
    snap = world.data("alpha_admin", "POST", f"/sandbox/{sid}/snapshot", {"name": "mlsnap"})
    checkpoint = world.data("alpha_admin", "POST", f"/sandbox/{sid}/checkpoint", {"name": "cp"})
    owner = world.data("boot", "POST", "/keys?orgId=org_alpha", {"role": "admin", "name": "owner"})
    ssh = world.data("alpha_admin", "POST", "/ssh-keys", {"publicKey": world.keygen("id_owner").with_suffix(
        ".pub").read_text()})
    return {"sandbox_id": sid, "execution_id": ex["executionId"], "job_id": job["jobId"],
            "snapshot_id": snap["snapshotId"], "checkpoint_id": checkpoint["id"], "key_id": owner["id"],
            "ssh_key_id": ssh["id"], "project_id": world.projects["ml"], "org_id": "org_alpha",
            "stream_id": MISSING["stream_id"], "token": MISSING["token"], "name": "cobol:1", "ref": "mlsnap",
            "tail": "agents", "owner_secret": owner["secret"], "fingerprint": ssh["fingerprint"], "node": "n_nobody"}


def operations(world: World) -> list[tuple[str, str, bool]]:
    """(method, path template, public) of every operation /openapi.json describes."""
    doc = world.call(None, "GET", "/openapi.json")[1]
    out = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            out.append((method.upper(), path, op.get("security") == []))
    assert len(out) > 90, len(out)
    return out


def fill(template: str, ids: dict[str, str]) -> str:
    return re.sub(r"{(\w+)}", lambda m: urllib.parse.quote(ids[m.group(1)], safe=""), template)


BODY = {"command": ["cat", "secret.txt"], "name": "x", "path": "secret.txt", "files": [], "env": {"X": "1"},
        "tag": "t", "role": "member", "count": 1, "runtime": "base:latest"}


def test_a_project_limited_admin_administers_only_its_projects(world: World, ml: dict[str, str]) -> None:
    """An admin key limited to project ``web`` made an organization-wide admin key (``POST
    /keys`` without ``projects``, and ``POST /cli/apikey``): a way out of its project into
    every project of the organization. It also listed every key of the organization and
    revoked keys outside its project (the owner's). Now the keys it makes are limited to its
    projects (its own when none are named; others refused by name), and it sees and revokes
    only keys that are limited to its projects, as it sees only their sandboxes."""
    web = world.projects["web"]
    made = world.data("web_admin", "POST", "/keys", {"role": "admin"})
    assert made["projects"] == [web], made
    status, answer = world.call(made["secret"], "GET", f"/sandbox/{ml['sandbox_id']}")
    assert status == 404, answer
    for body in ({"role": "admin", "projects": ["ml"]}, {"role": "member", "projects": ["web", "ml"]},
                 {"role": "read-only", "projects": [world.projects["ml"]]}):
        status, answer = world.call("web_admin", "POST", "/keys", body)
        assert (status, answer.get("field")) == (400, "projects"), (body, answer)
    cli = world.data("web_admin", "POST", "/cli/apikey", {"name": "cli", "role": "admin"})
    listed = {k["id"]: k for k in world.data("web_admin", "GET", "/keys")["keys"]}
    assert listed[cli["id"]]["projects"] == [web], listed[cli["id"]]
    status, answer = world.call("web_admin", "POST", "/cli/apikey", {"name": "cli", "projectId": "ml"})
    assert (status, answer.get("field")) == (400, "projectId"), answer
    # It sees only keys inside its projects: not the owner's, not alpha's org-wide keys.
    assert all(k["projects"] and set(k["projects"]) <= {web} for k in listed.values()), listed
    assert ml["key_id"] not in listed and world.key_ids["alpha_admin"] not in listed
    cli_listed = world.data("web_admin", "GET", "/cli/apikey")
    assert ml["key_id"] not in str(cli_listed) and world.key_ids["alpha_admin"] not in str(cli_listed)
    for method, path in (("DELETE", f"/keys/{ml['key_id']}"), ("GET", f"/cli/apikey/{ml['key_id']}"),
                         ("DELETE", f"/cli/apikey/{ml['key_id']}")):
        status, answer = world.call("web_admin", method, path)
        missing = world.call("web_admin", method, path.replace(ml["key_id"], MISSING["key_id"]))
        assert (status, answer["code"]) == (missing[0], missing[1]["code"]) == (404, missing[1]["code"]), answer
    assert world.call(ml["owner_secret"], "GET", "/keys")[0] == 200  # the owner's key still works
    # Projects are the organization's: a key limited to some makes none.
    status, answer = world.call("web_admin", "POST", "/projects", {"name": "grab"})
    assert (status, answer["code"]) == (403, "FORBIDDEN"), answer
    # Inside its project it administers: revokes the key it made.
    assert world.data("web_admin", "DELETE", f"/keys/{made['id']}")["revokedAt"]


def test_a_project_limited_key_sees_and_removes_only_its_projects_ssh_keys(world: World, ml: dict[str, str]) -> None:
    """A member limited to ``web`` listed every SSH key of the organization and removed the
    owner's (organization-wide) one, locking her out of the gateway. It sees and removes only
    SSH keys registered within its projects."""
    mine = world.data("web_member", "POST", "/ssh-keys", {"publicKey": world.keygen("id_webm").with_suffix(
        ".pub").read_text()})
    listed = world.data("web_member", "GET", "/ssh-keys")["sshKeys"]
    assert mine["id"] in {k["id"] for k in listed} and ml["ssh_key_id"] not in str(listed), listed
    status, answer = world.call("web_member", "DELETE", f"/ssh-keys/{ml['ssh_key_id']}")
    assert (status, answer["code"]) == (404, "SSH_KEY_NOT_FOUND") or status == 404, answer
    assert ml["ssh_key_id"] in str(world.data("alpha_admin", "GET", "/ssh-keys"))
    assert world.data("web_member", "DELETE", f"/ssh-keys/{mine['id']}")["id"] == mine["id"]


def test_a_project_limited_key_on_every_route_finds_nothing_of_another_project(world: World,
                                                                               ml: dict[str, str]) -> None:
    """Every operation of /openapi.json that takes a key, given the ids of project ``ml`` (its
    sandbox, execution, job, snapshot, checkpoint; the owner's key and SSH key) by keys limited
    to ``web`` (admin and member): each answers exactly as for an id that never existed, and
    no answer holds anything of ``ml``'s."""
    secrets = {MARK, ml["sandbox_id"], ml["execution_id"], ml["job_id"], ml["snapshot_id"], ml["checkpoint_id"],
               ml["key_id"], ml["ssh_key_id"], ml["fingerprint"], "mlsnap"}
    swept = 0
    for method, template, public in operations(world):
        if public or template in ("/app/live", "/orgs/{org_id}", "/services/stats/{org_id}"):
            continue  # the organization's own (tested below); a stream that never ends
        for who in ("web_admin", "web_member"):
            kw: dict[str, Any] = {"body": BODY} if method in ("POST", "PUT", "PATCH") else {}
            query = f"?snapshot={ml['snapshot_id']}&sandboxId={ml['sandbox_id']}&name=mlsnap&path=secret.txt"
            path = fill(template, ml)
            status, answer = world.call(who, method, path + query, **kw)
            text = str(answer)
            leaked = [s for s in secrets if s in text and s not in path + query]
            assert not leaked, (who, method, template, status, text[:300])
            if "{" in template:
                other, other_answer = world.call(who, method, fill(template, MISSING) + query, **kw)
                assert status >= 400 and status == other, (who, method, template, status, text[:300])
                if isinstance(answer, dict) and isinstance(other_answer, dict):
                    assert answer.get("code") == other_answer.get("code"), (who, method, template, answer)
            swept += 1
    assert swept >= 150, swept
    # ml's things are as they were.
    assert world.data("alpha_admin", "GET", f"/sandbox/{ml['sandbox_id']}")["name"] == MARK
    job = world.data("alpha_admin", "GET", f"/sandbox/sandboxes/{ml['sandbox_id']}/jobs/{ml['job_id']}")
    assert job["status"] == "running"
    assert world.data("alpha_admin", "GET", f"/sandbox/snapshots/{ml['snapshot_id']}")["name"] == "mlsnap"
    assert world.call(ml["owner_secret"], "GET", "/keys")[0] == 200


AUTH_VARIANTS = ["", "Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "Bearer hk_not-a-key", "bearer  hk_", "Token x",
                 "Bearer " + "A" * 4000, "Bearer \u00e9t\u00e9"]


def test_no_key_a_dead_key_or_a_mangled_header_opens_no_route(world: World, ml: dict[str, str]) -> None:
    """Without a key, with a revoked or an expired key, with another auth scheme, a mangled
    or enormous header, a key in the query string or in a cookie that is no session: every
    operation that takes a key answers 401 (never 2xx, never a 500), naming nothing."""
    revoked = world.data("alpha_admin", "POST", "/keys", {"role": "admin"})
    world.data("alpha_admin", "DELETE", f"/keys/{revoked['id']}")
    expiring = world.data("alpha_admin", "POST", "/keys", {"role": "admin", "expires": "2s"})
    time.sleep(2.5)
    variants = [*AUTH_VARIANTS, f"Bearer {revoked['secret']}", f"Bearer {expiring['secret']}"]
    # No session either: a key as the cookie, a forged one, bytes that are not UTF-8 (a 500 before).
    cookies = [f"hutch_session={world.keys['alpha_admin']}", "hutch_session=\u00e9t\u00e9.\u00e9",
               "hutch_session=e30." + "0" * 64, "__Host-hutch_session=x.y; hutch_csrf=\u00ff"]
    swept = 0
    for method, template, public in operations(world):
        if public:
            continue
        path = fill(template, ml)
        for i, auth in enumerate(variants):
            headers = {"Authorization": auth} if auth else {}
            status, answer = world.call(None, method, path + f"?apiKey={world.keys['alpha_admin']}",
                                        headers={**headers, "Cookie": cookies[i % len(cookies)],
                                                 "X-CSRF-Token": "\u00e9"},
                                        body=BODY if method in ("POST", "PUT", "PATCH") else None)
            assert status == 401, (method, template, auth[:30], status, str(answer)[:200])
            assert MARK not in str(answer) and answer.get("code") == "UNAUTHORIZED", answer
            swept += 1
    assert swept >= 75 * len(variants), swept


def test_capability_urls_open_only_what_they_name(world: World, ml: dict[str, str]) -> None:
    """The URLs that need no key are capabilities: a stream id's MAC, an audit token, the
    replicas' stdin token, a presigned upload's token. Each opens only what it was made for:
    one sandbox's audit token is no other's, a stream id with its kind or MAC changed is
    404, the replicas' stdin route is 404 without their token, and an upload token of one
    build uploads to no other (nor does a stream id or an audit token serve as one)."""
    beta_sbx = world.sandbox("beta", runtime="base:latest")
    made = world.data("beta_member", "POST", f"/sandbox/{beta_sbx}/execute", {"command": ["echo", "beta-out"]})
    world.data("beta_member", "GET", f"/sandbox/execution/{made['executionId']}?wait=30s")
    out_id = made["stdoutStreamUrl"].rsplit("/", 1)[1]
    assert world.stream(made["stdoutStreamUrl"]) == b"beta-out\n"
    alpha = world.data("alpha_admin", "GET", f"/sandbox/{ml['sandbox_id']}")
    alpha_out = alpha["stdoutStreamUrl"].rsplit("/", 1)[1]
    forged = [out_id[:-1] + ("0" if out_id[-1] != "0" else "1"),  # the MAC changed
              out_id[:-33] + "e" + out_id[-32:],  # stderr's kind, stdout's MAC
              out_id.upper(), out_id + "0", out_id[:-2], "stm_" + "0" * 60,
              alpha_out[:-32] + out_id[-32:],  # alpha's sandbox, beta's MAC
              "../" + out_id, out_id + "/../" + alpha_out]
    for stream_id in forged:
        status, answer = world.call(None, "GET", "/streams/" + urllib.parse.quote(stream_id, safe=""))
        assert status == 404 and b"beta-out" not in (answer if isinstance(answer, bytes) else str(answer).encode()), \
            (stream_id, status, answer)
    # Audit streams: the token is the sandbox's own.
    made_sb = world.data("beta_member", "POST", "/sandbox", {"runtime": "base:latest"})
    token = made_sb["auditStreamUrl"].rsplit("/", 1)[1]
    for sandbox_id in (ml["sandbox_id"], beta_sbx, MISSING["sandbox_id"]):
        status, _ = world.call(None, "GET", f"/streams/audit/{sandbox_id}/{token}?follow=false")
        assert status == 404, sandbox_id
    status, body = world.call(None, "GET", f"/streams/audit/{made_sb['sandboxId']}/{token}?follow=false")
    assert status == 200 and made_sb["sandboxId"].encode() in body
    assert world.call("beta_member", "DELETE", f"/sandbox/{made_sb['sandboxId']}")[0] == 200
    # The replicas' stdin route: nothing without their token (the stream exists, alpha's).
    stdin = world.call("alpha_admin", "POST", "/streams", {"name": "in"})[1]["id"]
    for headers in ({}, {"X-Hutch-Replica-Token": "0" * 64}, {"X-Hutch-Replica-Token": token},
                    {"X-Hutch-Replica-Token": "\u00e9"}):
        status, _ = world.call(None, "GET", f"/streams/{stdin}/stdin", headers=headers)
        assert status == 404, headers
    # Presigned uploads: the token is its build's.
    mine = world.data("beta_member", "POST", "/sandbox/snapshots/build", {"runtime": "base:latest"})
    theirs = world.data("alpha_admin", "POST", "/sandbox/snapshots/build", {"runtime": "base:latest"})
    my_token = urllib.parse.parse_qs(urllib.parse.urlsplit(mine["uploadUrl"]).query)["token"][0]
    for token_ in (my_token, out_id, token, "", "\u00e9"):
        status, answer = world.call(None, "PUT", f"/sandbox/snapshots/{theirs['snapshotId']}/upload?token="
                                    + urllib.parse.quote(token_), raw=b"x" * 10,
                                    headers={"Content-Type": "application/octet-stream"})
        assert status in (401, 403, 404), (token_, status, answer)
    status, answer = world.call(None, "PUT", f"/sandbox/snapshots/{mine['snapshotId']}/upload?token={my_token}",
                                raw=b"not a tarball", headers={"Content-Type": "application/octet-stream"})
    assert status < 500, answer


def test_one_tenants_waiting_clients_do_not_slow_the_others(world: World) -> None:
    """Every event of every organization woke every long-poll of the server, and each woken
    long-poll read the store again: beta holding 800 long-polls on its own running command
    made each of alpha's commands cost the server 13-17 times the CPU (0.004 s -> 0.053 s,
    embedded; on PostgreSQL each wake is a query). And each held request looked at its
    connection five times a second: 1,000 of them, doing nothing, took 11% of a core. A wait
    is now woken by its own sandbox's events only, and looks at its connection once a second:
    alpha's commands cost what they cost alone (beyond what the waits cost anyway), and the
    waits themselves little."""

    def cpu() -> float:
        fields = Path(f"/proc/{world.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, clock ticks

    alpha_sbx = world.sandbox("alpha-work", who="alpha_admin", runtime="base:latest")
    beta_sbx = world.sandbox("beta-waits", runtime="base:latest")

    async def alpha_work(session: aiohttp.ClientSession, rounds: int = 15) -> tuple[float, float]:
        """(server CPU seconds, wall seconds) for ``rounds`` of alpha's commands."""
        headers = {"Authorization": f"Bearer {world.keys['alpha_admin']}"}
        start, began = cpu(), time.monotonic()
        for _ in range(rounds):
            async with session.post(f"/sandbox/{alpha_sbx}/execute", json={"command": ["true"]},
                                    headers=headers) as resp:
                ex = (await resp.json())["data"]["executionId"]
            async with session.get(f"/sandbox/execution/{ex}?wait=30s", headers=headers) as resp:
                assert (await resp.json())["data"]["status"] == "completed"
        return cpu() - start, time.monotonic() - began

    async def attack() -> tuple[float, float, float]:
        beta = {"Authorization": f"Bearer {world.keys['beta_member']}"}
        async with aiohttp.ClientSession(world.url, connector=aiohttp.TCPConnector(limit=0)) as session:
            await alpha_work(session, 3)  # warm
            alone = (await alpha_work(session))[0] / 15
            async with session.post(f"/sandbox/{beta_sbx}/execute", json={"command": ["sleep", "600"]},
                                    headers=beta) as resp:
                ex = (await resp.json())["data"]["executionId"]
            polls = [asyncio.ensure_future(session.get(f"/sandbox/execution/{ex}?wait=300s", headers=beta))
                     for _ in range(1000)]
            try:
                # What the waits cost by themselves, a second, once all of them are held (on
                # PostgreSQL, taking 1,000 long-polls in takes seconds of queries).
                idle = 1.0
                for _ in range(30):
                    before = cpu()
                    await asyncio.sleep(1)
                    idle = cpu() - before
                    if idle < 0.06:
                        break
                spent, wall = await alpha_work(session)
                crowded = (spent - idle * wall) / 15
            finally:
                for poll in polls:
                    poll.cancel()
                await asyncio.gather(*polls, return_exceptions=True)
                async with session.post(f"/sandbox/execution/{ex}/cancel", headers=beta):
                    pass
            return alone, idle, crowded

    alone, idle, crowded = asyncio.run(attack())
    assert crowded < 3 * alone + 0.02, f"alpha's command cost {alone:.3f} s of server CPU alone, {crowded:.3f} s " \
                                       f"with beta's 1,000 long-polls waiting"
    assert idle < 0.06, f"1,000 waiting long-polls cost the server {idle:.1%} of a core doing nothing"


def test_concurrent_snapshots_cannot_pass_the_storage_quota(world: World) -> None:
    """Ten snapshots of a 700 KB workspace asked at once, under a 1 MiB storage quota: all ten
    were taken (7 MB stored; one at a time, the second is refused), because each checked the
    quota before any of them was recorded. The check and the record it allows are now one, as
    for sandbox creates: one is taken, nine are 403 QUOTA_EXCEEDED, and the usage stays
    within the quota."""
    org = f"q{int(time.time() * 1000) % 10**8}"
    world.data("boot", "POST", "/orgs", {"name": org})
    key = world.data("boot", "POST", f"/keys?orgId=org_{org}", {"role": "member"})["secret"]
    world.data("boot", "PATCH", f"/orgs/org_{org}/quota", {"snapshotBytes": 2**20})
    sid = world.data(key, "POST", "/sandbox", {"runtime": "base:latest"})["sandboxId"]
    code, _, err = world.run(key, sid, "head -c 700000 /dev/urandom > /home/agentuity/w.bin")
    assert code == 0, err

    async def race() -> list[tuple[int, Any]]:
        async with aiohttp.ClientSession(world.url) as session:
            async def one(i: int) -> tuple[int, Any]:
                async with session.post(f"/sandbox/{sid}/snapshot", json={"name": f"s{i}"},
                                        headers={"Authorization": f"Bearer {key}"}) as resp:
                    return resp.status, await resp.json()
            return await asyncio.gather(*(one(i) for i in range(10)))

    answers = asyncio.run(race())
    taken = [a for status, a in answers if status == 201]
    refused = [a for status, a in answers if status != 201]
    assert len(taken) == 1, f"{len(taken)} snapshots taken under a quota that holds one"
    assert {(a["code"], a.get("quota")) for a in refused} == {("QUOTA_EXCEEDED", "snapshot_bytes")}, refused
    usage = world.data(key, "GET", f"/orgs/org_{org}")["usage"]
    assert usage["storageBytes"] <= 2**20, usage


def test_concurrent_uploads_cannot_pass_the_storage_quota(world: World) -> None:
    """Four snapshot builds' uploads of 900 KB sent at once under a 1 MiB storage quota were
    all stored (3,600,000 bytes counted, kept until the builds expire an hour later; sent
    again, kept again): each upload's room was reckoned at its start. An organization's
    uploads with a storage quota now take their room one at a time: one is stored, the others
    are 403 QUOTA_EXCEEDED, and the usage stays within the quota."""
    org = f"u{int(time.time() * 1000) % 10**8}"
    world.data("boot", "POST", "/orgs", {"name": org})
    key = world.data("boot", "POST", f"/keys?orgId=org_{org}", {"role": "member"})["secret"]
    world.data("boot", "PATCH", f"/orgs/org_{org}/quota", {"snapshotBytes": 2**20})
    builds = [world.data(key, "POST", "/sandbox/snapshots/build", {"runtime": "base:latest"})["snapshotId"]
              for _ in range(4)]
    payload = bytes(range(256)) * 3516  # 900,096 bytes

    async def race() -> list[int]:
        async with aiohttp.ClientSession(world.url) as session:
            async def one(snapshot_id: str) -> int:
                async with session.put(f"/sandbox/snapshots/{snapshot_id}/upload", data=payload,
                                       headers={"Authorization": f"Bearer {key}",
                                                "Content-Type": "application/octet-stream"}) as resp:
                    return resp.status
            return await asyncio.gather(*(one(b) for b in builds))

    statuses = asyncio.run(race())
    assert sorted(statuses) == [200, 403, 403, 403], statuses
    usage = world.data(key, "GET", f"/orgs/org_{org}")["usage"]
    assert usage["storageBytes"] <= 2**20, usage


def test_another_organizations_ids_in_queries_and_bodies_find_nothing(world: World, ml: dict[str, str]) -> None:
    """Ids of alpha's given by beta where a route takes them in the query or the body rather
    than the path: a history's ``asOf`` event, list filters (``projectId``, ``snapshotId``,
    ``sandboxId``, ``name``), a lineage, a snapshot to create from (by id, name, full name), a
    project to create in, a stdin stream to read from or write to, a project for a key. Each
    answers exactly as the same request with an id that never existed (the id aside)."""
    alpha_event = world.data("alpha_admin", "GET", f"/sandbox/sandboxes/{ml['sandbox_id']}/events?limit=1")[
        "events"][0]["eventId"]
    stdin = world.call("alpha_admin", "POST", "/streams", {"name": "in"})[1]["id"]
    mine = world.sandbox("beta", runtime="base:latest")
    theirs = {"evt": alpha_event, "proj": world.projects["ml"], "snp": ml["snapshot_id"], "sbx": ml["sandbox_id"],
              "stdin": stdin, "name": "mlsnap", "full": "@alpha/mlsnap:latest"}
    nothing = {"evt": "evt_" + "0" * 26, "proj": MISSING["project_id"], "snp": MISSING["snapshot_id"],
               "sbx": MISSING["sandbox_id"], "stdin": MISSING["stream_id"], "name": "nosnap",
               "full": "@alpha/nosnap:latest"}
    cases: list[tuple[str, str, str, Any]] = [
        ("beta_member", "GET", f"/sandbox/{mine}?asOf={{evt}}", None),
        ("beta_member", "GET", "/sandbox?projectId={proj}", None),
        ("beta_member", "GET", "/sandbox?snapshotId={snp}", None),
        ("beta_member", "GET", "/sandbox/stats?projectId={proj}", None),
        ("beta_member", "GET", "/cli/sandbox?projectId={proj}", None),
        ("beta_member", "GET", "/sandbox/snapshots?sandboxId={sbx}", None),
        ("beta_member", "GET", "/sandbox/snapshots?name={name}", None),
        ("beta_member", "GET", "/sandbox/snapshots/lineage?snapshot={snp}", None),
        ("beta_member", "GET", "/sandbox/snapshots/public/{snp}", None),
        ("beta_member", "POST", "/sandbox", {"snapshot": "{snp}"}),
        ("beta_member", "POST", "/sandbox", {"snapshot": "{full}"}),
        ("beta_member", "POST", "/sandbox", {"snapshot": "{name}:latest"}),
        ("beta_member", "POST", "/sandbox", {"projectId": "{proj}"}),
        ("beta_member", "POST", f"/sandbox/{mine}/execute", {"command": ["cat"], "stream": {"stdin": "{stdin}"}}),
        ("beta_member", "PUT", "/streams/{stdin}", None),
        ("beta_member", "POST", "/sandbox/snapshots/build", {"runtime": "base:latest", "projectId": "{proj}"}),
        ("beta_admin", "POST", "/keys", {"role": "member", "projects": ["{proj}"]}),
        ("beta_admin", "POST", "/cli/apikey", {"name": "x", "projectId": "{proj}"}),
    ]

    def put(template: Any, ids: dict[str, str]) -> Any:
        """The body with each ``{name}`` in its strings filled in."""
        if isinstance(template, str):
            return template.format(**ids)
        if isinstance(template, dict):
            return {k: put(v, ids) for k, v in template.items()}
        if isinstance(template, list):
            return [put(v, ids) for v in template]
        return template

    for who, method, path, body in cases:
        answers = []
        for ids in (theirs, nothing):
            kw: dict[str, Any] = {"raw": b"x"} if method == "PUT" else {"body": put(body, ids)}
            answers.append(world.call(who, method, path.format(**ids), **kw))
        (status, answer), (other_status, other) = answers
        text, other_text = json.dumps(answer), json.dumps(other)
        for key in theirs:
            text = text.replace(theirs[key], "<id>")
            other_text = other_text.replace(nothing[key], "<id>")
        assert (status, text) == (other_status, other_text), (method, path, status, text[:300], other_text[:300])
        assert MARK not in text
