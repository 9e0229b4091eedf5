"""The audit stream a create returns: every event of the sandbox, who acted, no secrets."""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.api.conftest import KEY, STORE, WIRE, Api

KEY_ID = "key_" + hashlib.sha256(KEY.encode()).hexdigest()[:12]


def records(body: bytes) -> list[dict]:
    return [json.loads(line) for line in body.splitlines()]


@pytest.mark.runs_on(*STORE)  # read from either log
async def test_create_returns_an_audit_stream_of_who_did_what(api: Api) -> None:
    created = await api.data("POST", "/sandbox", json={"name": "audited", "env": {"TOKEN": "s3cret"}}, expect=201)
    sid = created["sandboxId"]
    assert created["auditStreamId"] and created["auditStreamUrl"].endswith(created["auditStreamId"])
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["echo", "hi"]})
    await api.wait_execution(ex["executionId"])
    # Still running: without follow, the stream is what happened so far.
    now = records(await api.stream(created["auditStreamUrl"] + "?follow=false"))
    # A runtime built on its first use (nomad: its image, on a fresh machine) adds its steps.
    kinds = [r["type"] for r in now if r["type"] != "runtime:build"]
    assert kinds == ["create", "lifecycle:started", "execution:started", "execution:finished"]
    await api.call("DELETE", f"/sandbox/{sid}")
    # Followed (the default), it ends with the sandbox.
    trail = records(await api.stream(created["auditStreamUrl"]))
    assert [r["type"] for r in trail][-2:] == ["destroy", "lifecycle:terminated"]
    assert all(r["sandboxId"] == sid and r["actor"] == KEY_ID for r in trail)
    positions = [r["position"] for r in trail]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    first = trail[0]["detail"]
    assert first["name"] == "audited" and first["envNames"] == ["TOKEN"]
    assert "s3cret" not in json.dumps(trail)


@pytest.mark.runs_on(*WIRE)  # the token's MAC
async def test_an_audit_stream_url_is_a_capability(api: Api) -> None:
    created = await api.data("POST", "/sandbox", json={}, expect=201)
    bad = created["auditStreamUrl"][:-4] + "0000"
    path = "/" + bad.split("://", 1)[1].split("/", 1)[1]
    resp = await api.client.get(path)
    assert resp.status == 404
