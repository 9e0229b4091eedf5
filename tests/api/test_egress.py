"""network.allow through the API: validated and refused by name, a name that does not
resolve refused before anything is made, the list shown by get. What it lets through is
checked from the sandbox's side in tests/isolation/test_local_network.py (root),
test_local_rootless.py and tests/nomad/test_nomad_network.py."""

from __future__ import annotations

import pytest

from tests.api.conftest import REAL, WIRE, Api


@pytest.mark.runs_on(*WIRE)  # refused while parsing
async def test_bad_allow_lists_are_refused_by_name(api: Api) -> None:
    for network, words in (
        ({"enabled": True, "allow": "pypi.org"}, "expected a list"),
        ({"enabled": True, "allow": []}, "at least one"),
        ({"enabled": True, "allow": ["*.pypi.org"]}, "wildcards"),
        ({"enabled": True, "allow": ["2001:db8::/32"]}, "IPv4 only"),
        ({"enabled": True, "allow": ["bad_name!"]}, "not a host name"),
        ({"allow": ["pypi.org"]}, "network.enabled: true"),
        ({"enabled": True, "allow": [f"h{i}.example" for i in range(65)]}, "at most 64"),
    ):
        err = await api.call("POST", "/sandbox", json={"runtime": "base:latest", "network": network}, expect=400)
        assert err["field"] == "network.allow" and words in err["message"], (network, err)


@pytest.mark.runs_on(*WIRE)  # resolved before anything is recorded
async def test_a_name_that_does_not_resolve_makes_nothing(api: Api, driver_name: str) -> None:
    before = (await api.data("GET", "/sandbox"))["total"]
    err = await api.call("POST", "/sandbox", expect=400, json={
        "runtime": "base:latest", "network": {"enabled": True, "allow": ["no-such-host.invalid"]}})
    assert err["field"] == "network.allow" and "no-such-host.invalid" in err["message"], err
    assert (await api.data("GET", "/sandbox"))["total"] == before


@pytest.mark.runs_on(*WIRE, *REAL)  # the fake refuses it; the real drivers take it
async def test_the_list_is_kept_and_shown(api: Api, driver_name: str) -> None:
    body = {"runtime": "base:latest", "network": {"enabled": True, "allow": ["10.9.8.7", "LOCALHOST", "10.0.0.0/8"]}}
    if driver_name == "fake":  # no network at all: the field that cannot be honoured is named
        err = await api.call("POST", "/sandbox", json=body, expect=501)
        assert err["field"] == "network.enabled", err
        return
    sid = (await api.data("POST", "/sandbox", json=body, expect=201))["sandboxId"]
    got = await api.data("GET", f"/sandbox/{sid}")
    assert got["networkAllow"] == ["10.9.8.7/32", "localhost", "10.0.0.0/8"] and got["networkEnabled"], got
