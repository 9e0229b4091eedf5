"""E2B's egress options (``allow_internet_access``, ``network``) with the real ``e2b`` SDK
become hutch's network spec, as hutch's own API then reports it; what hutch cannot keep is
refused naming the field. (E2B's own network tests need the internet, which this machine
does not reach: tests/e2b/upstream/EXCLUDED.)"""

from __future__ import annotations

from typing import Any

import pytest
from e2b import Sandbox, SandboxNetworkOpts
from e2b.exceptions import SandboxException

from tests.e2b.conftest import E2bServer


def _network(server: E2bServer, sbx: Sandbox) -> tuple[bool, list[str] | None]:
    """What hutch's own API says of the sandbox's network: enabled, and its allow-list."""
    sb = server.server.data("GET", f"/sandbox/sbx_{sbx.sandbox_id}")  # E2B's id: hutch's without sbx_
    return sb["networkEnabled"], sb.get("networkAllow")


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


@pytest.mark.parametrize(("network", "says"), [
    ({"deny_out": ["8.8.8.8"]}, "network.denyOut: hutch limits egress with an allow-list"),
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


def test_a_running_sandboxs_egress_cannot_be_changed(e2b_env: E2bServer) -> None:
    with Sandbox.create(timeout=30) as sbx:
        with pytest.raises(SandboxException, match="501: network: hutch sets a sandbox's egress rules when"):
            sbx.update_network({"deny_out": ["8.8.8.8"]})
        other = e2b_env.key_of_new_org("e2bnetother")
        code, answer = e2b_env.call("PUT", f"/sandboxes/{sbx.sandbox_id}/network", {}, key=other)
        assert code == 404, answer  # another organization's sandbox is not there at all
