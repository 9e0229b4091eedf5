"""E2B's egress options (``allow_internet_access``, ``network``, ``update_network``) with the
real ``e2b`` SDK become hutch's network spec, as hutch's own API then reports it; what hutch
cannot keep is refused naming the field. (E2B's own network tests need the internet, which
this machine does not reach: tests/e2b/upstream/EXCLUDED. What the rules let through is held
from inside sandboxes in tests/adversarial/test_local_egress_rules.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from e2b import Sandbox, SandboxNetworkOpts
from e2b.exceptions import SandboxException

from tests.e2b.conftest import E2bServer


def _network(server: E2bServer, sbx: Sandbox) -> tuple[bool, list[str] | None]:
    """What hutch's own API says of the sandbox's network: enabled, and its allow-list."""
    sb = server.server.data("GET", f"/sandbox/sbx_{sbx.sandbox_id}")  # E2B's id: hutch's without sbx_
    return sb["networkEnabled"], sb.get("networkAllow")


def _hutch_id(sbx: Sandbox) -> str:
    """hutch's id of an E2B sandbox (E2B's may be it without its sbx_ prefix)."""
    return sbx.sandbox_id if sbx.sandbox_id.startswith("sbx_") else f"sbx_{sbx.sandbox_id}"


def _rules(server: E2bServer, sbx: Sandbox) -> tuple[bool, list[str] | None, list[str] | None]:
    """hutch's own API's enabled, allow-list and deny-list of the sandbox."""
    sb = server.server.data("GET", f"/sandbox/{_hutch_id(sbx)}")
    return sb["networkEnabled"], sb.get("networkAllow"), sb.get("networkDeny")


@pytest.fixture(scope="module")
def networked(e2b_env: E2bServer) -> Iterator[Sandbox]:
    """One sandbox with network, for the refusals (each leaves it as it was)."""
    sbx = Sandbox.create(timeout=300, allow_internet_access=True)
    yield sbx
    sbx.kill()


def _network_events(server: E2bServer, sbx: Sandbox) -> int:
    events = server.server.data("GET", f"/sandbox/sandboxes/{_hutch_id(sbx)}/events?limit=100")["events"]
    return sum(e["type"] == "network" for e in events)


def test_e2bs_egress_rules_become_hutchs(e2b_env: E2bServer) -> None:
    """Deny everything: no network, whatever allow_internet_access says; deny everything but
    a list: hutch's allow-list; allow_internet_access alone: on or off."""
    closed = Sandbox.create(timeout=30, allow_internet_access=True,
                            network=SandboxNetworkOpts(deny_out=lambda ctx: [ctx.all_traffic]))
    listed = Sandbox.create(timeout=30, network=SandboxNetworkOpts(
        deny_out=lambda ctx: [ctx.all_traffic], allow_out=["1.1.1.1", "pypi.org"], allow_public_traffic=False))
    open_ = Sandbox.create(timeout=30, allow_internet_access=True)
    try:
        assert _network(e2b_env, closed) == (False, None)
        assert closed.get_info().allow_internet_access is False
        assert _network(e2b_env, listed) == (True, ["1.1.1.1/32", "pypi.org"])
        assert _network(e2b_env, open_) == (True, None)
    finally:
        closed.kill()
        listed.kill()
        open_.kill()


def test_a_deny_list_of_particular_destinations_is_kept_and_allow_beats_it(e2b_env: E2bServer) -> None:
    denying = Sandbox.create(timeout=30, network=SandboxNetworkOpts(deny_out=["192.0.2.9", "198.51.100.0/24"]))
    both = Sandbox.create(timeout=30, network=SandboxNetworkOpts(deny_out=["192.0.2.0/24"], allow_out=["192.0.2.7"]))
    try:
        assert _rules(e2b_env, denying) == (True, None, ["192.0.2.9/32", "198.51.100.0/24"])
        assert denying.get_info().network == {"deny_out": ["192.0.2.9/32", "198.51.100.0/24"]}
        # allow beats deny, and hutch's allow-list never opens more than it lists
        assert _rules(e2b_env, both) == (True, ["192.0.2.7/32"], None)
        assert both.get_info().network == {"allow_out": ["192.0.2.7/32"], "deny_out": ["0.0.0.0/0"]}
    finally:
        denying.kill()
        both.kill()


def test_update_network_replaces_a_running_sandboxs_rules(e2b_env: E2bServer) -> None:
    """Each update replaces every rule (what it leaves out is cleared, as E2B's), is recorded
    as a ``network`` event and shows in hutch's API and E2B's info at once."""
    with Sandbox.create(timeout=30, allow_internet_access=True) as sbx:
        sbx.update_network({"deny_out": ["192.0.2.9"]})
        assert _rules(e2b_env, sbx) == (True, None, ["192.0.2.9/32"])
        sbx.update_network({"allow_out": ["192.0.2.7"], "deny_out": ["0.0.0.0/0"]})
        assert _rules(e2b_env, sbx) == (True, ["192.0.2.7/32"], None)
        sbx.update_network({"allow_internet_access": False})
        assert _rules(e2b_env, sbx) == (False, None, None)
        assert sbx.get_info().allow_internet_access is False
        sbx.update_network({})  # every rule cleared: the network it was made with, unrestricted
        assert _rules(e2b_env, sbx) == (True, None, None)
        assert _network_events(e2b_env, sbx) == 4
        Sandbox.update_network(sbx.sandbox_id, {"deny_out": ["203.0.113.0/24"]})  # the class method
        assert _rules(e2b_env, sbx) == (True, None, ["203.0.113.0/24"])


def test_update_network_gives_no_network_to_a_sandbox_made_without(e2b_env: E2bServer) -> None:
    with Sandbox.create(timeout=30) as sbx:  # hutch's default: no network
        with pytest.raises(SandboxException, match=r"501: network: sandbox .* was made without outbound network"):
            sbx.update_network({"deny_out": ["8.8.8.8"]})
        sbx.update_network({"allow_internet_access": False})  # off: what it has
        assert _rules(e2b_env, sbx) == (False, None, None)
        assert _network_events(e2b_env, sbx) == 1


@pytest.mark.parametrize(("update", "status", "says"), [
    ({"rules": {"x.com": [{"transform": {"headers": {"a": "b"}}}]}}, 501, "network.rules: hutch does not offer"),
    ({"dnsServers": ["1.1.1.1"]}, 501, "network.dnsServers: hutch does not offer"),
    ({"egressProxy": {"address": "p.example.com:1080"}}, 501, "network.egressProxy: hutch does not offer"),
    ({"denyOut": ["example.com"]}, 501, "network.denyOut: 'example.com': a deny-list takes IPv4 addresses"),
    ({"denyOut": "8.8.8.8"}, 400, "network.denyOut: expected a list"),
    ({"allow_internet_access": "no"}, 400, "allow_internet_access: expected true or false"),
    ({"maskRequestHost": "x.example.com"}, 400, "network.maskRequestHost: not a field"),
])
def test_an_update_hutch_cannot_keep_is_refused_naming_the_field(e2b_env: E2bServer, networked: Sandbox,
                                                                 update: dict[str, Any], status: int, says: str) -> None:
    code, answer = e2b_env.call("PUT", f"/sandboxes/{networked.sandbox_id}/network", update)
    assert (code, answer["code"]) == (status, status) and says in answer["message"], answer
    assert _rules(e2b_env, networked) == (True, None, None) and _network_events(e2b_env, networked) == 0


@pytest.mark.parametrize(("network", "says"), [
    ({"deny_out": ["example.com"]}, "network.denyOut: 'example.com': a deny-list takes IPv4 addresses"),
    ({"allow_out": ["*.example.com"]}, "network.allowOut: '*.example.com': wildcards are not supported"),
    ({"allow_out": ["2001:db8::1"]}, "network.allowOut: '2001:db8::1': sandboxes have IPv4 only"),
    ({"mask_request_host": "x.example.com"}, "network.maskRequestHost: hutch does not offer host masking"),
])
def test_egress_rules_hutch_cannot_keep_are_refused_naming_them(e2b_env: E2bServer, network: dict[str, Any],
                                                                says: str) -> None:
    before = {s.sandbox_id for s in Sandbox.list().next_items()}
    with pytest.raises(SandboxException, match=says.replace(".", r"\.").replace("*", r"\*")):
        Sandbox.create(timeout=30, network=network)  # type: ignore[arg-type]
    assert {s.sandbox_id for s in Sandbox.list().next_items()} == before  # nothing made


@pytest.mark.parametrize(("body", "status", "says"), [
    ({"network": {"allowOut": "1.1.1.1"}}, 400, "network.allowOut: expected a list"),
    ({"network": {"denyOut": [7]}}, 400, "network.denyOut: expected a list"),
    ({"network": {"allowPublicTraffic": "no"}}, 400, "network.allowPublicTraffic: expected true or false"),
    ({"network": {"blockAll": True}}, 400, "network.blockAll: not a field of a sandbox's network"),
    ({"network": []}, 400, "network: expected an object"),
    ({"network": {"rules": {"x.com": [{"transform": {"headers": {"a": "b"}}}]}}}, 501, "network.rules: hutch does"),
    ({"allow_internet_access": "yes"}, 400, "allow_internet_access: expected true or false"),
])
def test_a_malformed_network_is_refused_in_e2bs_shape(e2b_env: E2bServer, body: dict[str, Any], status: int,
                                                      says: str) -> None:
    code, answer = e2b_env.call("POST", "/sandboxes", {"templateID": "base", "timeout": 30, **body})
    assert (code, answer["code"]) == (status, status) and says in answer["message"], answer


def test_another_organizations_sandbox_is_not_there_to_update(e2b_env: E2bServer, networked: Sandbox) -> None:
    other = e2b_env.key_of_new_org("e2bnetother")
    code, answer = e2b_env.call("PUT", f"/sandboxes/{networked.sandbox_id}/network", {"denyOut": ["0.0.0.0/0"]},
                                key=other)
    assert code == 404, answer  # another organization's sandbox is not there at all
    assert _rules(e2b_env, networked) == (True, None, None) and _network_events(e2b_env, networked) == 0
