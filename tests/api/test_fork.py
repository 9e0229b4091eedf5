"""Fork (service/fork.py): N sandboxes with the parent's files and env at one instant."""

from __future__ import annotations

import base64

import pytest

from tests.api.conftest import REAL, STORE, Api


async def _cat(api: Api, sid: str, path: str) -> bytes | None:
    resp = await api.client.get(f"/fs/{sid}?path={path}", headers={"Authorization": "Bearer test-key"})
    return await resp.read() if resp.status == 200 else None


@pytest.mark.runs_on(*STORE, *REAL)  # real files copied apart; the record in both stores
async def test_copies_start_from_the_instant_and_stay_apart(api: Api) -> None:
    parent = (await api.data("POST", "/sandbox", expect=201,
                             json={"runtime": "base:latest", "name": "explore", "env": {"STAGE": "one"},
                                   "metadata": {"team": "x"}}))["sandboxId"]
    content = base64.b64encode(b"shared\n").decode()
    await api.call("POST", f"/fs/{parent}", json={"files": [{"path": "notes.txt", "content": content}]})
    forked = await api.data("POST", f"/sandbox/{parent}/fork", json={"count": 3}, expect=201)
    copies = [s["sandboxId"] for s in forked["sandboxes"]]
    assert len(set(copies)) == 3 and parent not in copies
    assert [s["name"] for s in forked["sandboxes"]] == ["explore-1", "explore-2", "explore-3"]
    for sid in copies:
        info = await api.data("GET", f"/sandbox/{sid}?waitForStatus=idle&waitMs=60000")
        assert info["status"] == "idle" and info["metadata"] == {"team": "x", "forkedFrom": parent}
        assert info["snapshot"]["id"] == forked["snapshotId"]
        assert await _cat(api, sid, "notes.txt") == b"shared\n"
    # A write in one copy is invisible in the others and in the parent.
    await api.call("POST", f"/fs/{copies[0]}", json={"files": [{"path": "notes.txt", "content":
                                                                  base64.b64encode(b"mine\n").decode()}]})
    assert await _cat(api, copies[0], "notes.txt") == b"mine\n"
    assert await _cat(api, copies[1], "notes.txt") == b"shared\n"
    assert await _cat(api, parent, "notes.txt") == b"shared\n"
    # The parentage is in the log: each copy's create names the snapshot of the instant.
    events = (await api.data("GET", f"/sandbox/sandboxes/{copies[2]}/events"))["events"]
    spec = events[0]["event"]["spec"]
    assert spec["snapshotId"] == forked["snapshotId"] and spec["metadata"]["forkedFrom"] == parent
    assert spec["env"] == {"STAGE": "***"}
    # The instant's snapshot is a record, not a base a user made: a listing shows it when asked.
    listed = [s["snapshotId"] for s in (await api.data("GET", "/sandbox/snapshots"))["snapshots"]]
    assert forked["snapshotId"] not in listed
    listed = [s["snapshotId"] for s in (await api.data("GET", "/sandbox/snapshots?forks=true"))["snapshots"]]
    assert forked["snapshotId"] in listed
    for sid in [parent, *copies]:
        await api.call("DELETE", f"/sandbox/{sid}")


@pytest.mark.runs_on(*STORE)  # refusals over the store
async def test_bad_counts_and_gone_parents(api: Api) -> None:
    sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
    for count in (0, 21, "2", True, 1.5):
        body = await api.call("POST", f"/sandbox/{sid}/fork", json={"count": count}, expect=400)
        assert body["field"] == "count" if "field" in body else "count" in body["message"]
    await api.call("DELETE", f"/sandbox/{sid}")
    await api.call("POST", f"/sandbox/{sid}/fork", json={"count": 1}, expect=404)
    total = (await api.data("GET", "/sandbox?live=true"))["total"]
    assert total == 0  # nothing half-made


@pytest.mark.runs_on(*STORE)  # the service's quota over the store
async def test_a_fork_fits_the_quota_whole_or_not_at_all(api: Api) -> None:
    await api.data("POST", "/orgs", json={"name": "forks"}, expect=201)
    key = (await api.data("POST", "/keys?orgId=org_forks", json={"role": "admin"}, expect=201))["secret"]
    auth = {"Authorization": f"Bearer {key}"}
    await api.data("PATCH", "/orgs/org_forks/quota", json={"sandboxes": 3})
    sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201, headers=auth))["sandboxId"]
    refused = await api.call("POST", f"/sandbox/{sid}/fork", json={"count": 3}, expect=403, headers=auth)
    assert refused["code"] == "QUOTA_EXCEEDED" and "these 3" in refused["message"]
    assert (await api.data("GET", "/sandbox?live=true", headers=auth))["total"] == 1
    assert (await api.data("GET", "/sandbox/snapshots", headers=auth))["total"] == 0  # no snapshot either
    made = await api.data("POST", f"/sandbox/{sid}/fork", json={"count": 2}, expect=201, headers=auth)
    assert len(made["sandboxes"]) == 2


@pytest.mark.runs_on(*STORE)  # the service's quota over the store
async def test_forks_racing_for_the_last_slots_leave_no_half_made_fork(api: Api) -> None:
    """Two forks that each fit the quota when checked, but not together: the one (or both)
    refused once their copies are made leaves no copy running and no snapshot of its instant."""
    import asyncio

    await api.data("POST", "/orgs", json={"name": "race"}, expect=201)
    key = (await api.data("POST", "/keys?orgId=org_race", json={"role": "admin"}, expect=201))["secret"]
    auth = {"Authorization": f"Bearer {key}"}
    await api.data("PATCH", "/orgs/org_race/quota", json={"sandboxes": 3})
    sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201, headers=auth))["sandboxId"]
    answers = await asyncio.gather(*(
        api.client.post(f"/sandbox/{sid}/fork", json={"count": 2}, headers=auth) for _ in range(2)))
    made = [(await r.json())["data"] for r in answers if r.status == 201]
    refused = [await r.json() for r in answers if r.status != 201]
    assert refused and all(r["code"] == "QUOTA_EXCEEDED" for r in refused), refused
    live = {s["sandboxId"] for s in (await api.data("GET", "/sandbox?live=true&limit=100", headers=auth))["sandboxes"]}
    assert live == {sid} | {s["sandboxId"] for m in made for s in m["sandboxes"]}  # no copy of a refused fork
    instants = {s["snapshotId"] for s in (await api.data("GET", "/sandbox/snapshots?forks=true",
                                                          headers=auth))["snapshots"]}
    assert instants == {m["snapshotId"] for m in made}  # nor the snapshot it took
