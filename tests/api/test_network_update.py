"""A sandbox's egress rules through hutch's API: ``network.deny`` at create, and
``PUT /sandbox/{id}/network`` replacing a live sandbox's rules (an event, ``network``, in its
log; GET shows the rules in force). What the rules let through is held from inside sandboxes
in tests/adversarial/test_local_egress_rules.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import WIRE, Api
from tests.api.test_tenancy import bearer, new_key, new_org


async def _types(api: Api, sid: str) -> list[str]:
    return [e["type"] for e in (await api.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100"))["events"]]


@pytest.mark.runs_on(*WIRE)  # refused while parsing, before the sandbox is looked at
@pytest.mark.parametrize(("body", "field", "words"), [
    ({}, "enabled", "required"),
    ({"enabled": "yes"}, "enabled", "true or false"),
    ({"enabled": True, "deny": ["example.com"]}, "network.deny", "not host names"),
    ({"enabled": True, "deny": ["2001:db8::1"]}, "network.deny", "IPv4 only"),
    ({"enabled": True, "deny": "10.0.0.1"}, "network.deny", "expected a list"),
    ({"enabled": True, "deny": []}, "network.deny", "at least one"),
    ({"enabled": True, "allow": ["1.1.1.1"], "deny": ["8.8.8.8"]}, "network.deny", "give one of them"),
    ({"enabled": False, "deny": ["8.8.8.8"]}, "network.deny", "network.enabled: true"),
    ({"enabled": True, "port": 9000}, "port", "not a field"),
])
async def test_a_bad_update_is_refused_naming_the_field(api: Api, body: dict[str, Any], field: str,
                                                        words: str) -> None:
    sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
    err = await api.call("PUT", f"/sandbox/{sid}/network", json=body, expect=400)
    assert err["field"] == field and words in err["message"], err
    assert "network" not in await _types(api, sid)


@pytest.mark.runs_on(*WIRE)
async def test_a_create_with_a_deny_list_and_an_allow_list_is_refused(api: Api) -> None:
    err = await api.call("POST", "/sandbox", expect=400, json={
        "runtime": "base:latest", "network": {"enabled": True, "allow": ["1.1.1.1"], "deny": ["8.8.8.8"]}})
    assert err["field"] == "network.deny", err
    err = await api.call("POST", "/sandbox", expect=400, json={
        "runtime": "base:latest", "network": {"deny": ["8.8.8.8"]}})
    assert err["field"] == "network.deny" and "network.enabled: true" in err["message"], err


@pytest.mark.runs_on(*WIRE)
async def test_an_update_is_recorded_and_gives_no_network_to_a_sandbox_made_without(api: Api) -> None:
    sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
    err = await api.call("PUT", f"/sandbox/{sid}/network", json={"enabled": True}, expect=501)
    assert err["field"] == "network" and "made without outbound network" in err["message"], err
    assert "network" not in await _types(api, sid)
    got = await api.data("PUT", f"/sandbox/{sid}/network", json={"enabled": False})
    assert got["sandboxId"] == sid and got["networkEnabled"] is False, got
    assert (await _types(api, sid)).count("network") == 1
    # Another organization's sandbox is not there; a read-only key changes nothing.
    await new_org(api, "netother")
    other = bearer((await new_key(api, "org_netother", "admin"))["secret"])
    await api.call("PUT", f"/sandbox/{sid}/network", json={"enabled": False}, headers=other, expect=404)
    reader = bearer((await new_key(api, "org_local", "read-only"))["secret"])
    await api.call("PUT", f"/sandbox/{sid}/network", json={"enabled": False}, headers=reader, expect=403)
    assert (await _types(api, sid)).count("network") == 1


@pytest.mark.runs_on("local-embedded", "nomad-production")  # both drivers replace live rules
async def test_a_deny_list_is_kept_and_an_update_replaces_it(api: Api) -> None:
    made = await api.data("POST", "/sandbox", expect=201, json={
        "runtime": "base:latest", "network": {"enabled": True, "deny": ["192.0.2.9", "198.51.100.0/24"]}})
    sid = made["sandboxId"]
    got = await api.data("GET", f"/sandbox/{sid}")
    assert (got["networkEnabled"], got["networkDeny"], got.get("networkAllow")) == (
        True, ["192.0.2.9/32", "198.51.100.0/24"], None), got
    got = await api.data("PUT", f"/sandbox/{sid}/network", json={"enabled": True, "allow": ["192.0.2.7"]})
    assert (got["networkAllow"], got.get("networkDeny")) == (["192.0.2.7/32"], None), got
    err = await api.call("PUT", f"/sandbox/{sid}/network", expect=400,
                         json={"enabled": True, "allow": ["no-such-host.invalid"]})
    assert err["field"] == "network.allow" and "no-such-host.invalid" in err["message"], err
    got = await api.data("PUT", f"/sandbox/{sid}/network", json={"enabled": False})
    assert (got["networkEnabled"], got.get("networkAllow"), got.get("networkDeny")) == (False, None, None), got
    assert (await _types(api, sid)).count("network") == 2  # the refused one is not recorded
    await api.call("DELETE", f"/sandbox/{sid}")
