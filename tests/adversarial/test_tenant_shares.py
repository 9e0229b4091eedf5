"""What one tenant may take of what every tenant of a server shares (its sockets, its memory,
its disk), attacked as a tenant would: through the routes and capabilities its own key and
sandboxes hand it, in process."""

from __future__ import annotations

import pytest

from hutch.api.at_once import SETTING
from hutch.api.keys import AT_ONCE, TENANTS
from tests.api.conftest import KEY, WIRE, Api


def _path(url: str) -> str:
    return "/" + url.split("://", 1)[1].split("/", 1)[1]


@pytest.mark.runs_on(*WIRE)
async def test_an_audit_stream_is_one_of_its_organizations_requests_at_once(api: Api) -> None:
    """An audit stream URL carries no key and follows its sandbox for as long as it lives: it
    was the one capability read counted in no organization's share (HUTCH_MAX_REQUESTS_PER_ORG),
    so a tenant could hold as many followers of its own idle sandbox as the server had sockets
    (and each its backlog), past the bound that keeps the others served."""
    made = await api.data("POST", "/sandbox", json={}, expect=201)
    audit = _path(made["auditStreamUrl"])
    app = api.client.server.app
    at_once = app[AT_ONCE]
    org = app[TENANTS].authenticate(KEY).org_id
    at_once.limit = 1
    with at_once.slot(org):  # its share held by its other requests
        refused = await api.client.get(audit)  # following: before, a 200 that went on for ever
        assert refused.status == 429, (refused.status, refused.headers)
        assert SETTING in (await refused.json())["message"]
        assert refused.headers.get("Connection") == "close"
    read = await api.client.get(audit + "?follow=false")  # its share free again: read as before
    assert read.status == 200, await read.text()
    assert b"sandbox" in await read.read()
    assert at_once.held(org) == 0
    # An audit URL with a wrong token stays a 404, whoever's share is full.
    with at_once.slot(org):
        forged = await api.client.get(audit.rsplit("/", 1)[0] + "/" + "0" * 64)
        assert forged.status == 404
